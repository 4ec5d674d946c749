"""The adapters' rank-report sections: a real one-process Lightning fit with RankSections, and the HF callback's
hooks in the order the Trainer calls them (its torchrun job test is slow and serial)."""

from __future__ import annotations

import time

import pytest

from dist_logging import Logger
from dist_logging.destinations import InMemoryLogger


def test_lightning_fit_marks_data_forward_backward_optimizer(tmp_path):
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from dist_logging.integrations.lightning import DistLoggingLogger, RankSections

    class SlowBackward(torch.autograd.Function):
        """Backward work that shows above the noise (and above the median step's skew from the mean)."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(0.01)
            return grad

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(0.002)  # forward work that shows above the noise
            x, y = batch
            return torch.nn.functional.mse_loss(SlowBackward.apply(self.net(x)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    built = []

    def factory():
        built.append(Logger(InMemoryLogger(), run_name='lightning-ranks', rank_report_every=5))
        return built[-1]

    adapter = DistLoggingLogger(logger=factory, upload_checkpoints=False)
    with pytest.raises(TypeError, match='DistLoggingLogger'):
        RankSections(object())
    x = torch.randn(48, 2)
    trainer = Trainer(
        accelerator='cpu',
        devices=1,
        max_steps=12,
        log_every_n_steps=50,
        logger=adapter,
        callbacks=[RankSections(adapter)],
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4))
    assert len(built) == 1  # the hooks ran before finalize closed it: no second Logger was built
    logger = built[0]
    report = logger.rank_report()
    assert report is not None and report.window == 1 and report.batch == 10  # reports at the 5th and 10th batch
    assert set(report.own.sections) == {'data', 'forward', 'backward', 'optimizer'}
    seconds = report.own.sections
    assert seconds['forward'] >= 0.002 and seconds['backward'] >= 0.01
    # backward is a wait section (it holds DDP's gradient sync): busy is data + forward + optimizer. Busy is the
    # window's median step and the sections are its means, which may differ by a step's skew: hence the half
    assert report.own.busy_s < seconds['data'] + seconds['forward'] + seconds['optimizer'] + seconds['backward'] / 2
    steps = [step for step, _ in logger.destinations[0].data['ranks/busy/median_s']]
    assert steps == [5, 10]


def test_hf_callback_marks_sections_in_trainer_hook_order():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from dist_logging.integrations.transformers import DistLoggingCallback

    sink = InMemoryLogger()
    logger = Logger(sink, run_name='hf-ranks', rank_report_every=3)
    callback = DistLoggingCallback(logger=logger, upload_checkpoints=False)
    args, state, control = TrainingArguments(output_dir='unused', report_to=[]), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in range(1, 8):  # the order of Trainer._inner_training_loop, one optimizer step each
        callback.on_step_begin(args, state, control)
        time.sleep(0.02)  # forward + backward: 20 ms, so late wake-ups of the short sleeps cannot outgrow it
        callback.on_pre_optimizer_step(args, state, control)
        time.sleep(0.001)
        callback.on_optimizer_step(args, state, control)
        state.global_step = step
        callback.on_step_end(args, state, control)
        time.sleep(0.0005)  # logging, saving, the next batch
    callback.on_train_end(args, state, control)
    report = logger.rank_report()
    assert (report.batch, report.window) == (6, 1)  # every 3rd optimizer step, labelled with global_step
    assert set(report.own.sections) == {'data', 'forward_backward', 'optimizer'}
    assert report.own.sections['forward_backward'] >= 0.02
    assert report.own.busy_s < report.own.sections['forward_backward']  # a wait section: not busy
    logger.close()
