"""A 2-process Lightning DDP fit (20 steps) with DistLoggingLogger and ModelCheckpoint.

``python lightning_scenario.py launcher``: Lightning's own launcher starts rank 1 (no RANK variable).
``torchrun --nproc_per_node=2 lightning_scenario.py torchrun``: torchrun starts both ranks.
The first mode builds the Logger from a factory, the second from a config dict. Lightning's
CSVLogger runs alongside as the reference for the metrics and steps Lightning hands to loggers.
Each rank writes ``$OUT_DIR/rank{r}.json``.
"""

import json
import os
import pathlib
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from _integration_helpers import RecordingLocalStore  # noqa: E402
from dist_logging import Logger, dist  # noqa: E402
from dist_logging.destinations.file import FileLogger  # noqa: E402
from dist_logging.destinations.remote import RemoteUploaderDownloader  # noqa: E402
from dist_logging.integrations.lightning import DistLoggingLogger  # noqa: E402

OUT = pathlib.Path(os.environ['OUT_DIR'])
FILE_TEMPLATE = 'runs/{run_name}/rank{rank}.jsonl'
MEAN_TEMPLATE = 'runs/{run_name}/mean-rank{rank}.jsonl'


class TinyRegression(LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log('train_loss', loss)
        prediction = self.net(x).detach()
        self.log_dict(
            {'pred_mean': prediction.mean(), 'target_mean': y.mean(), 'abs_err': (prediction - y).abs().mean()}
        )
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log('val_loss', torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log('test_loss', torch.nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch, batch_idx):
        # Lightning takes no self.log in predict: a user logs through the logger itself.
        self.loggers[0].log_metrics({'predict_batch': batch_idx}, step=self.global_step)
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class CountingLogger(DistLoggingLogger):
    """Records, per log_metrics call, the keys and the collectives the Logger issued during it."""

    calls: list = []

    def log_metrics(self, metrics, step=None):
        group = self.experiment._group
        before = group.collective_count
        super().log_metrics(metrics, step)
        self.calls.append([sorted(metrics), group.collective_count - before])


def build_logger():
    return Logger(
        [
            FileLogger(FILE_TEMPLATE, format='jsonl'),
            RemoteUploaderDownloader(
                object_store=RecordingLocalStore(str(OUT / 'bucket')), upload_staging_folder=str(OUT / 'staging')
            ),
        ]
    )


def main(mode: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(80, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2, num_workers=0)
    if mode == 'launcher':
        adapter = DistLoggingLogger(build_logger)
    else:
        adapter = DistLoggingLogger(
            config={
                'destinations': [{'type': 'file', 'filename': FILE_TEMPLATE, 'format': 'jsonl', 'ranks': 'all'}],
                'upload': {'bucket_uri': str(OUT / 'bucket'), 'upload_staging_folder': str(OUT / 'staging')},
            }
        )
    loggers = [adapter, CSVLogger(str(OUT / 'csv'), name='ref', version='')]
    if mode == 'torchrun':
        # A second adapter that combines every metric across ranks (one collective per logging step).
        config = {'destinations': [{'type': 'file', 'filename': MEAN_TEMPLATE, 'format': 'jsonl', 'ranks': 'all'}]}
        mean_loggers = []

        def build_mean_logger():
            mean_loggers.append(Logger.from_config(config))
            return mean_loggers[-1]

        loggers.append(CountingLogger(build_mean_logger, reduce='mean', upload_checkpoints=False))
    checkpoint = ModelCheckpoint(every_n_train_steps=5, save_top_k=-1, save_last=True)
    trainer = Trainer(
        strategy='ddp',
        accelerator='cpu',
        devices=2,
        max_steps=20,
        log_every_n_steps=5,
        logger=loggers,
        callbacks=[checkpoint],
        default_root_dir=str(OUT),
        limit_val_batches=2,
        limit_test_batches=2,
        limit_predict_batches=2,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyRegression()
    trainer.fit(model, data)
    rank = dist.get_global_rank() if dist.is_initialized() else int(os.environ.get('LOCAL_RANK', '0'))
    output = {
        'rank': rank,
        'run_name': adapter.version,
        'checkpoint_dir': checkpoint.dirpath,
        'env_rank': os.environ.get('RANK'),
        'mode': mode,
        'threads_after': {'fit': our_threads()},
    }
    if mode == 'torchrun':
        output['mean_collectives'] = [logger._group.collective_count for logger in mean_loggers]
        output['mean_calls'] = list(loggers[-1].calls)
        # The later stages with the same Trainer and logger objects: one run, the same per-rank files.
        output['versions'] = [adapter.version]
        for stage in ('validate', 'test', 'predict'):
            getattr(trainer, stage)(model, data)
            output['versions'].append(adapter.version)
            output['threads_after'][stage] = our_threads()
    (OUT / f'rank{rank}.json').write_text(json.dumps(output))


def our_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(('upload-', 'dist_logging')))


if __name__ == '__main__':
    main(sys.argv[1])
