"""Run under torchrun (2 processes): an Accelerate loop with DistLoggingTracker by instance and by name.

The named tracker's config comes from DIST_LOGGING_CONFIG (set by the test). Each rank writes
``$OUT_DIR/rank{r}.json``: the collectives issued inside tracker calls, and whether it built a Logger.
"""

import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _integration_helpers import CollectiveCounter, RecordingLocalStore  # noqa: E402

counter = CollectiveCounter()  # before accelerate, dist_logging or anything else holds a reference

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from dist_logging import Logger  # noqa: E402
from dist_logging.destinations.file import FileLogger  # noqa: E402
from dist_logging.destinations.remote import RemoteUploaderDownloader  # noqa: E402
from dist_logging.integrations.accelerate import DistLoggingTracker  # noqa: E402
from torchrun_helper import dump_rank_output  # noqa: E402

OUT = pathlib.Path(os.environ['OUT_DIR'])
BUCKET = OUT / 'bucket'
built = []


def build_logger():
    built.append(True)
    return Logger(
        [
            FileLogger('runs/instance/rank{rank}.jsonl', format='jsonl'),
            RemoteUploaderDownloader(
                object_store=RecordingLocalStore(str(BUCKET)), upload_staging_folder=str(OUT / 'staging')
            ),
        ],
        run_name='instance-run',
    )


def main():
    accelerator = Accelerator(log_with=[DistLoggingTracker(logger=build_logger), 'dist_logging'], cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with counter.counting():
        accelerator.init_trackers('named-run', config={'lr': 0.1, 'hf_token': 'hf_abcdefghijklmnopqrstuvwxyz0123'})
    generator = torch.Generator().manual_seed(accelerator.process_index)
    for step in range(20):
        x = torch.randn(8, 4, generator=generator)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        with counter.counting():
            accelerator.log({'loss': loss.item(), 'phase': 'train'}, step=step)
    rank = accelerator.process_index
    trackers = [type(t).__name__ for t in accelerator.trackers]
    with counter.counting():
        accelerator.end_training()
    dump_rank_output({'collectives': counter.calls, 'built': len(built), 'trackers': trackers, 'rank_seen': rank})


if __name__ == '__main__':
    main()
