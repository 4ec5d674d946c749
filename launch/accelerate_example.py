"""Hugging Face Accelerate with dist_logging as a tracker.

    torchrun --standalone --nproc_per_node=2 launch/accelerate_example.py --config configs/per_rank.yaml
    accelerate launch --num_processes 2 --cpu launch/accelerate_example.py

Accelerate calls trackers on the main process only, so only rank zero's destinations see the
metrics here; the tracker never issues a collective (Accelerate destroys the process group right
after ``end_training()`` finishes the trackers). The name works too: after
``import dist_logging.integrations.accelerate``, ``Accelerator(log_with='dist_logging')`` with
``init_kwargs={'dist_logging': {'config': ...}}`` or ``DIST_LOGGING_CONFIG`` set.
"""

from __future__ import annotations

import argparse
import pathlib

import torch
from accelerate import Accelerator

from dist_logging.integrations.accelerate import DistLoggingTracker

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=str(ROOT / 'configs' / 'per_rank.yaml'), help='Logger config (YAML)')
    parser.add_argument('--steps', type=int, default=50)
    args = parser.parse_args()

    # cpu=True: without a GPU, Accelerate only joins a torchrun job as MULTI_CPU when told so.
    accelerator = Accelerator(log_with=DistLoggingTracker(config=args.config), cpu=not torch.cuda.is_available())
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.init_trackers('accelerate-example', config={'lr': 1e-2, 'steps': args.steps})
    generator = torch.Generator().manual_seed(accelerator.process_index)
    for step in range(args.steps):
        x = torch.randn(32, 16, generator=generator).to(accelerator.device)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        # Average across ranks with Accelerate's own collective (on every rank), then log on the main process.
        mean_loss = accelerator.reduce(loss.detach(), reduction='mean')
        accelerator.log({'loss': mean_loss.item()}, step=step)
    accelerator.end_training()  # finishes the tracker (waits for uploads), then destroys the process group


if __name__ == '__main__':
    main()
