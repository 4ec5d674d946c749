"""PyTorch Lightning DDP with dist_logging: metrics, hyperparameters and checkpoint uploads.

    torchrun --standalone --nproc_per_node=2 launch/lightning_example.py --config configs/per_rank.yaml
    python launch/lightning_example.py          # Lightning starts the second process itself

Checkpoints land in <cwd>/dist_logging/<run_name>/checkpoints and, uploaded while training goes
on, in the config's bucket under <run_name>/checkpoints/.
"""

from __future__ import annotations

import argparse
import pathlib

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from dist_logging.integrations.lightning import DistLoggingLogger

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Regression(LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log('train_loss', loss)  # this rank's value (per-rank files keep it)
        self.log('train_loss_mean', loss, sync_dist=True)  # Lightning's mean across ranks
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=str(ROOT / 'configs' / 'per_rank.yaml'), help='Logger config (YAML)')
    parser.add_argument('--max-steps', type=int, default=50)
    parser.add_argument('--devices', type=int, default=2, help='processes (torchrun: --nproc_per_node)')
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=generator)
    data = DataLoader(TensorDataset(x, x @ torch.randn(16, 1, generator=generator)), batch_size=16)
    trainer = Trainer(
        strategy='ddp',
        accelerator='cpu',
        devices=args.devices,
        max_steps=args.max_steps,
        log_every_n_steps=10,
        logger=DistLoggingLogger(config=args.config),
        callbacks=[ModelCheckpoint(every_n_train_steps=25, save_top_k=-1, save_last=True)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), data)  # teardown finalizes the logger: waits for uploads, raises UploadError


if __name__ == '__main__':
    main()
