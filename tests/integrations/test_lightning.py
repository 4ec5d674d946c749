"""DistLoggingLogger: real 2-process Lightning DDP fits (Lightning's own launcher, and torchrun)."""

from __future__ import annotations

import csv
import json
import pathlib
import sys

import pytest

from _integration_helpers import read_jsonl, upload_records
from torchrun_helper import _run, base_env, read_rank_outputs, run_torchrun

HERE = pathlib.Path(__file__).resolve().parent
SCENARIO = HERE / 'lightning_scenario.py'
CHECKPOINTS = [
    'epoch=0-step=5.ckpt',
    'epoch=0-step=10.ckpt',
    'epoch=0-step=15.ckpt',
    'epoch=0-step=20.ckpt',
    'last.ckpt',
]
QUIET = {'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'WANDB_DISABLED': 'true'}


def check_fit(out: pathlib.Path, *, recorded_uploads: bool, stages: int = 1) -> None:
    outputs = read_rank_outputs(out)
    assert set(outputs) == {0, 1}
    run_name = outputs[0]['run_name']
    assert outputs[1]['run_name'] == run_name  # one run name on both ranks, agreed without RANK
    checkpoint_dir = pathlib.Path(outputs[0]['checkpoint_dir'])
    assert checkpoint_dir == out / 'dist_logging' / run_name / 'checkpoints'

    # Hyperparameters: once, from global rank zero only.
    logs = {rank: read_jsonl(out / 'runs' / run_name / f'rank{rank}.jsonl') for rank in (0, 1)}
    hparams = [r['data'] for r in logs[0] if r['kind'] == 'hparams']
    assert hparams == [{'lr': 0.05, 'hidden': 8}] * stages  # Lightning logs them at the start of every stage
    assert not [r for r in logs[1] if r['kind'] == 'hparams']

    # Metrics with Lightning's own steps: what its CSVLogger (on rank zero) recorded.
    with open(out / 'csv' / 'ref' / 'metrics.csv') as handle:
        reference = [
            (int(row['step']), float(row['train_loss'])) for row in csv.DictReader(handle) if row['train_loss']
        ]  # rows of the later stages carry other keys
    assert [step for step, _ in reference] == [4, 9, 14, 19]
    ours = [(r['step'], r['data']['train_loss']) for r in logs[0] if 'train_loss' in r.get('data', {})]
    assert [step for step, _ in ours] == [step for step, _ in reference]
    assert [value for _, value in ours] == pytest.approx([value for _, value in reference])
    # Rank 1's own values reached its own (per-rank) file, at the same steps.
    assert [r['step'] for r in logs[1] if 'train_loss' in r.get('data', {})] == [4, 9, 14, 19]
    for rank in (0, 1):
        assert outputs[rank]['threads_after']['fit'] == [], 'finalize left threads of ours running'

    # Every checkpoint in the bucket, byte-identical to what Lightning wrote (last.ckpt: the last one).
    assert sorted(p.name for p in checkpoint_dir.iterdir()) == sorted(CHECKPOINTS)
    for name in CHECKPOINTS:
        stored = out / 'bucket' / run_name / 'checkpoints' / name
        assert stored.read_bytes() == (checkpoint_dir / name).read_bytes(), name
    # Each rank's log was uploaded too, byte-identical.
    for rank in (0, 1):
        log_name = f'runs/{run_name}/rank{rank}.jsonl'
        assert (out / 'bucket' / log_name).read_bytes() == (out / log_name).read_bytes()

    if recorded_uploads:
        records = upload_records(out)
        checkpoint_uploads = [r for r in records if '/checkpoints/' in r['name']]
        assert {r['rank'] for r in checkpoint_uploads} == {0}  # after_save_checkpoint runs on rank zero
        names = [r['name'].rsplit('/', 1)[1] for r in checkpoint_uploads]
        for name in CHECKPOINTS[:-1]:
            assert names.count(name) == 1, (name, names)  # each top-k file once
        assert 1 <= names.count('last.ckpt') <= 4  # once per save, or superseded by a newer one: last wins


@pytest.mark.serial
def test_fit_with_lightnings_own_launcher(tmp_path):
    """``Trainer(strategy='ddp', devices=2)`` started as one process: Lightning starts rank 1 (no RANK set)."""
    env = base_env(tmp_path, QUIET)
    _run([sys.executable, str(SCENARIO), 'launcher'], env, 240, True, tmp_path)
    outputs = read_rank_outputs(tmp_path)
    assert outputs[0]['env_rank'] is None and outputs[1]['env_rank'] is None
    check_fit(tmp_path, recorded_uploads=True)


@pytest.mark.serial
def test_fit_under_torchrun_with_a_config(tmp_path):
    run_torchrun(SCENARIO, 2, tmp_path, args=['torchrun'], env=QUIET, timeout=240)
    check_fit(tmp_path, recorded_uploads=False, stages=4)

    # fit, then validate, test and predict with the same logger object: one run name on both ranks,
    # one file per rank that every stage appended to, no thread of ours left after any stage.
    outputs = read_rank_outputs(tmp_path)
    run_name = outputs[0]['run_name']
    run = tmp_path / 'runs' / run_name
    assert sorted(p.name for p in (tmp_path / 'runs').iterdir()) == [run_name]
    assert sorted(p.name for p in run.iterdir()) == [
        'mean-rank0.jsonl',
        'mean-rank1.jsonl',
        'rank0.jsonl',
        'rank1.jsonl',
    ]
    for rank in (0, 1):
        assert outputs[rank]['versions'] == [run_name] * 4
        assert all(threads == [] for threads in outputs[rank]['threads_after'].values()), outputs[rank]['threads_after']
        records = read_jsonl(run / f'rank{rank}.jsonl')
        keys = [key for r in records if r['kind'] == 'metric' for key in r['data']]
        for key in ('train_loss', 'val_loss', 'test_loss', 'predict_batch'):
            assert key in keys, (rank, key)
        assert (tmp_path / 'bucket' / f'runs/{run_name}/rank{rank}.jsonl').read_bytes() == (
            run / f'rank{rank}.jsonl'
        ).read_bytes()  # the bucket holds what the last stage left

    # The reduce='mean' adapter: collectives only inside log_metrics (which Lightning calls on every
    # rank), the same few per logging step whatever the keys, and the mean on rank zero.
    outputs = read_rank_outputs(tmp_path)
    for rank in (0, 1):
        calls = outputs[rank]['mean_calls']
        assert [keys for keys, _ in calls] == [['abs_err', 'epoch', 'pred_mean', 'target_mean', 'train_loss']] * 4
        assert outputs[rank]['mean_collectives'] == [sum(n for _, n in calls)]  # none from any other hook
        steady = {n for _, n in calls[1:]}  # the first flush may agree on the new keys
        assert len(steady) == 1 and 1 <= steady.pop() < 5  # not one per key
    assert outputs[0]['mean_calls'] == outputs[1]['mean_calls']
    run = tmp_path / 'runs' / outputs[0]['run_name']
    own = {
        rank: [
            r['data']['train_loss'] for r in read_jsonl(run / f'rank{rank}.jsonl') if 'train_loss' in r.get('data', {})
        ]
        for rank in (0, 1)
    }
    mean = [
        (r['step'], r['data']['train_loss'])
        for r in read_jsonl(run / 'mean-rank0.jsonl')
        if 'train_loss' in r.get('data', {})
    ]
    assert [step for step, _ in mean] == [4, 9, 14, 19]
    assert [value for _, value in mean] == pytest.approx([(a + b) / 2 for a, b in zip(own[0], own[1])])
    assert not [r for r in read_jsonl(run / 'mean-rank1.jsonl') if r['kind'] == 'metric']


# ---------------------------------------------------------------------- in-process checks (fast)


def test_logger_validates_its_arguments(monkeypatch):
    from dist_logging.integrations.lightning import DistLoggingLogger

    monkeypatch.delenv('DIST_LOGGING_CONFIG', raising=False)
    config = {'destinations': [{'type': 'in_memory'}]}
    with pytest.raises(ValueError, match="unknown reduce 'avg'"):
        DistLoggingLogger(config=config, reduce='avg')
    with pytest.raises(ValueError, match=r'must contain \{name\}'):
        DistLoggingLogger(config=config, checkpoint_name='{run_name}/ckpt')
    with pytest.raises(ValueError, match=r'unknown placeholder'):
        DistLoggingLogger(config=config, checkpoint_name='{run_name}/{nme}')
    with pytest.raises(TypeError, match='upload_checkpoints'):
        DistLoggingLogger(config=config, upload_checkpoints='yes')
    with pytest.raises(ValueError, match='DIST_LOGGING_CONFIG'):
        DistLoggingLogger()


def test_logger_maps_calls_in_one_process(tmp_path):
    import argparse

    from dist_logging import Logger
    from dist_logging.destinations.in_memory import InMemoryLogger
    from dist_logging.integrations.lightning import DistLoggingLogger
    from recording_uploader import RecordingUploader

    memory, uploads = InMemoryLogger(), RecordingUploader()
    adapter = DistLoggingLogger(lambda: Logger([memory, uploads], run_name='unit'))
    assert adapter.name == 'dist_logging' and adapter.version == 'unit' and adapter.save_dir is None
    adapter.log_hyperparams(argparse.Namespace(lr=0.1, password='hunter2'))
    adapter.log_metrics({'loss': 0.5, 'epoch': 0}, step=7)
    assert memory.hyperparameters['lr'] == 0.1 and memory.hyperparameters['password'] != 'hunter2'
    assert memory.data['loss'] == [(7, 0.5)]

    class FakeCheckpoint:  # the attributes Lightning's ModelCheckpoint exposes
        best_k_models: dict = {}
        best_model_path = ''
        last_model_path = ''
        _last_checkpoint_saved = ''

    callback = FakeCheckpoint()
    first = tmp_path / 'epoch=0-step=5.ckpt'
    first.write_bytes(b'one')
    callback.best_model_path = callback._last_checkpoint_saved = str(first)
    adapter.after_save_checkpoint(callback)
    last = tmp_path / 'last.ckpt'
    last.write_bytes(b'last-1')
    callback.last_model_path = callback._last_checkpoint_saved = str(last)
    adapter.after_save_checkpoint(callback)
    last.write_bytes(b'last-2')  # rewritten in place, same name
    adapter.after_save_checkpoint(callback)
    assert uploads.uploads == [
        ('unit/checkpoints/epoch=0-step=5.ckpt', b'one', True),
        ('unit/checkpoints/last.ckpt', b'last-1', True),
        ('unit/checkpoints/last.ckpt', b'last-2', True),
    ]
    built = adapter.experiment
    adapter.finalize('success')
    with pytest.raises(RuntimeError, match='closed'):
        built.log_metrics({'loss': 1.0})


def test_finalize_raises_upload_error_naming_the_checkpoint(tmp_path):
    from dist_logging import Logger, UploadError
    from dist_logging.destinations.remote import RemoteUploaderDownloader
    from dist_logging.integrations.lightning import DistLoggingLogger
    from dist_logging.object_store.local import LocalObjectStore

    class RefusingStore(LocalObjectStore):
        def upload_object(self, object_name, filename, callback=None, **kwargs):
            raise PermissionError(f'refused {object_name}')

    uploader = RemoteUploaderDownloader(
        object_store=RefusingStore(str(tmp_path / 'bucket')),
        upload_staging_folder=str(tmp_path / 'staging'),
        num_attempts=1,
    )
    adapter = DistLoggingLogger(lambda: Logger([uploader], run_name='unit'))
    checkpoint = tmp_path / 'epoch=0-step=5.ckpt'
    checkpoint.write_bytes(b'weights')

    class FakeCheckpoint:
        best_k_models: dict = {}
        best_model_path = _last_checkpoint_saved = str(checkpoint)
        last_model_path = ''

    adapter.after_save_checkpoint(FakeCheckpoint())
    with pytest.raises(UploadError, match=r'unit/checkpoints/epoch=0-step=5\.ckpt'):
        adapter.finalize('success')


def test_reduce_combines_through_the_loggers_flush():
    from dist_logging import Logger
    from dist_logging.destinations.in_memory import InMemoryLogger
    from dist_logging.integrations.lightning import DistLoggingLogger

    memory = InMemoryLogger()
    adapter = DistLoggingLogger(Logger([memory], run_name='unit'), reduce='mean')
    adapter.log_metrics({'loss': 2.0}, step=3)
    assert memory.data['loss'] == [(3, 2.0)]  # flushed at once (a world of one: no collective)


def test_a_checkpoint_is_in_durable_staging_when_the_hook_returns(tmp_path):
    """What a job killed right after the save leaves for ``dist-logging drain``: the snapshot and its journal record."""
    import threading

    from dist_logging import Logger
    from dist_logging.destinations.remote import RemoteUploaderDownloader
    from dist_logging.integrations.lightning import DistLoggingLogger
    from dist_logging.object_store.local import LocalObjectStore
    from dist_logging.upload.drain import list_pending

    release = threading.Event()

    class HeldStore(LocalObjectStore):
        def upload_object(self, *args, **kwargs):
            release.wait(30)
            super().upload_object(*args, **kwargs)

    staging = tmp_path / 'staging'
    adapter = DistLoggingLogger(
        lambda: Logger(
            [
                RemoteUploaderDownloader(
                    object_store=HeldStore(str(tmp_path / 'bucket')), upload_staging_folder=str(staging)
                )
            ],
            run_name='unit',
        )
    )
    checkpoint = tmp_path / 'last.ckpt'
    checkpoint.write_bytes(b'first')

    class FakeCheckpoint:
        best_k_models: dict = {}
        best_model_path = ''
        last_model_path = _last_checkpoint_saved = str(checkpoint)

    adapter.after_save_checkpoint(FakeCheckpoint())
    checkpoint.write_bytes(b'second, in place')  # Lightning rewrites last.ckpt in place at the next save
    pending = list_pending(str(staging))
    assert [p.remote_name for p in pending] == ['unit/checkpoints/last.ckpt']
    assert pathlib.Path(pending[0].snapshot_path).read_bytes() == b'first'  # a snapshot, not the live file
    release.set()
    adapter.finalize('success')  # also hands over what changed since the last save hook: last wins
    assert (tmp_path / 'bucket' / 'unit' / 'checkpoints' / 'last.ckpt').read_bytes() == b'second, in place'
    assert list_pending(str(staging)) == []


# ---------------------------------------------------------------------- one run per object; threads


def _our_threads() -> list[str]:
    """Live threads that dist_logging started (upload workers, tracker and MLflow workers)."""
    import threading

    return sorted(
        t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(('upload-', 'dist_logging'))
    )


def _file_and_bucket_config(tmp_path: pathlib.Path) -> dict:
    return {
        'destinations': [
            {
                'type': 'file',
                'filename': str(tmp_path / 'runs/{run_name}/rank{rank}.jsonl'),
                'remote_file_name': '{run_name}/rank{rank}.jsonl',
                'format': 'jsonl',
                'ranks': 'all',
            }
        ],
        'upload': {'bucket_uri': str(tmp_path / 'bucket'), 'upload_staging_folder': str(tmp_path / 'staging')},
    }


def test_fit_validate_test_predict_in_one_process_is_one_run_and_leaves_no_thread(tmp_path):
    """One adapter through the four stages of one Trainer: one run name, one file appended by each stage
    (uploaded after each), every stage's metrics in it, and no thread of ours once each stage finalized."""
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from _integration_helpers import read_jsonl
    from dist_logging.integrations.lightning import DistLoggingLogger

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({'lr': 0.1})
            self.net = torch.nn.Linear(2, 1)

        def _loss(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log('train_loss', loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log('val_loss', self._loss(batch))

        def test_step(self, batch, batch_idx):
            self.log('test_loss', self._loss(batch))

        def predict_step(self, batch, batch_idx):
            self.logger.log_metrics({'predicted_batches': batch_idx + 1}, step=self.global_step)
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(16, 2)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    before = _our_threads()
    adapter = DistLoggingLogger(config=_file_and_bucket_config(tmp_path), upload_checkpoints=False)
    assert _our_threads() == before  # building the adapter starts nothing
    trainer = Trainer(
        accelerator='cpu',
        devices=1,
        max_steps=4,
        log_every_n_steps=1,
        logger=adapter,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = Tiny()
    versions = []
    trainer.fit(model, data)
    versions.append(adapter.version)  # read between stages: builds nothing
    assert _our_threads() == before
    trainer.validate(model, data)
    versions.append(adapter.version)
    trainer.test(model, data)
    versions.append(adapter.version)
    trainer.predict(model, data)
    versions.append(adapter.version)
    assert _our_threads() == before, 'finalize left threads of ours running'
    assert len(set(versions)) == 1
    run_name = versions[0]
    assert [p.name for p in (tmp_path / 'runs').iterdir()] == [run_name]  # one run folder, one file
    records = read_jsonl(tmp_path / 'runs' / run_name / 'rank0.jsonl')
    keys = {key for r in records if r['kind'] == 'metric' for key in r['data']}
    assert {'train_loss', 'val_loss', 'test_loss', 'predicted_batches'} <= keys
    assert [r['data'] for r in records if r['kind'] == 'hparams'] == [{'lr': 0.1}] * 4  # logged by every stage
    # The bucket holds the log as the last stage left it (every stage's lines, appended).
    assert (tmp_path / 'bucket' / run_name / 'rank0.jsonl').read_bytes() == (
        tmp_path / 'runs' / run_name / 'rank0.jsonl'
    ).read_bytes()


def test_threads_end_with_the_adapter_not_finalized(tmp_path):
    """No thread of ours after: del of a never-used adapter; del of a used one never finalized (its uploads
    drained first); close(); unpickling a copy of a used adapter (the copy keeps the run name)."""
    import gc
    import pickle

    from dist_logging.integrations.lightning import DistLoggingLogger

    before = _our_threads()
    never_used = DistLoggingLogger(config=_file_and_bucket_config(tmp_path))
    del never_used
    gc.collect()
    assert _our_threads() == before

    used = DistLoggingLogger(config=_file_and_bucket_config(tmp_path))
    used.log_metrics({'loss': 1.0}, step=1)
    checkpoint = tmp_path / 'model.ckpt'
    checkpoint.write_bytes(b'weights')
    used.experiment.upload_file('{run_name}/model.ckpt', str(checkpoint))
    assert _our_threads() != before  # the first upload started the workers
    run_name = used.version
    running = _our_threads()
    copy = pickle.loads(pickle.dumps(used))
    assert _our_threads() == running and copy.version == run_name  # the copy starts nothing, keeps the run
    del used
    gc.collect()
    assert _our_threads() == before, 'garbage collection left threads of ours running'
    assert (tmp_path / 'bucket' / run_name / 'model.ckpt').read_bytes() == b'weights'  # drained, as close() does
    assert (tmp_path / 'bucket' / run_name / 'rank0.jsonl').exists()

    copy.log_metrics({'loss': 2.0}, step=2)
    assert copy.experiment.run_name == run_name
    copy.close()
    assert _our_threads() == before
    records = [json.loads(line) for line in (tmp_path / 'runs' / run_name / 'rank0.jsonl').read_text().splitlines()]
    assert [r['data']['loss'] for r in records if r['kind'] == 'metric'] == [1.0, 2.0]  # one file, appended


def test_a_given_logger_is_closed_at_the_first_finalize(tmp_path):
    from dist_logging import Logger
    from dist_logging.destinations.in_memory import InMemoryLogger
    from dist_logging.integrations.lightning import DistLoggingLogger

    adapter = DistLoggingLogger(Logger([InMemoryLogger()], run_name='given'))
    adapter.log_metrics({'loss': 1.0}, step=1)
    adapter.finalize('success')
    assert adapter.version == 'given'
    with pytest.raises(RuntimeError, match='pass a factory'):
        adapter.log_metrics({'loss': 1.0}, step=2)


EXIT_SCRIPT = r'''
import os, sys, time
from dist_logging import Logger
from dist_logging.destinations.file import FileLogger
from dist_logging.destinations.remote import RemoteUploaderDownloader
from dist_logging.integrations.lightning import DistLoggingLogger
from dist_logging.object_store.local import LocalObjectStore

out = sys.argv[1]

class SlowStore(LocalObjectStore):
    def upload_object(self, *args, **kwargs):
        time.sleep(0.5)  # still uploading when the script ends
        super().upload_object(*args, **kwargs)

adapter = DistLoggingLogger(lambda: Logger([
    FileLogger(os.path.join(out, 'runs/{run_name}/rank{rank}.txt'), remote_file_name='{run_name}/rank{rank}.txt'),
    RemoteUploaderDownloader(object_store=SlowStore(os.path.join(out, 'bucket')),
                             upload_staging_folder=os.path.join(out, 'staging'))], run_name='at-exit'))
adapter.log_metrics({'loss': 1.0}, step=1)
path = os.path.join(out, 'model.ckpt')
with open(path, 'wb') as f:
    f.write(b'weights')
adapter.experiment.upload_file('{run_name}/model.ckpt', path)
print('exiting without finalize', flush=True)
'''


def test_interpreter_exit_drains_the_uploads_of_an_adapter_never_finalized(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, '-c', EXIT_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / 'bucket' / 'at-exit' / 'model.ckpt').read_bytes() == b'weights'
    log = (tmp_path / 'bucket' / 'at-exit' / 'rank0.txt').read_text()  # closed, flushed and uploaded at exit
    assert '[metric][batch=1]: loss: 1.0' in log


def test_logger_state_callback_resumes_a_fit_from_its_checkpoint(tmp_path):
    """A real fit to step 6 with a checkpoint at 3 and 6; a second fit from the step-3 checkpoint (a new adapter, as
    after a relaunch) resumes the Logger at 3 through ``LoggerState``: the log has a resume marker and the merged
    view shows each step once, the resumed fit's values winning."""
    import io

    import torch
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from dist_logging import Logger
    from dist_logging._cli_logs.merge import merge_logs
    from dist_logging.destinations import FileLogger
    from dist_logging.integrations.lightning import DistLoggingLogger, LoggerState

    class Tiny(LightningModule):
        def __init__(self, tag: float):
            super().__init__()
            self.tag = tag
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log('tag', self.tag)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(40, 2)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    log = str(tmp_path / 'logs-rank{rank}.txt')

    def fit(tag: float, max_steps: int, ckpt_path=None) -> None:
        adapter = DistLoggingLogger(lambda: Logger(FileLogger(log), run_name='lit'), upload_checkpoints=False)
        checkpoints = ModelCheckpoint(dirpath=str(tmp_path / 'ckpt'), every_n_train_steps=3, save_top_k=-1)
        trainer = Trainer(
            accelerator='cpu',
            devices=1,
            max_steps=max_steps,
            log_every_n_steps=1,
            logger=adapter,
            callbacks=[checkpoints, LoggerState(adapter)],
            default_root_dir=str(tmp_path),
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Tiny(tag), data, ckpt_path=ckpt_path)

    fit(1.0, 6)
    (step3,) = (tmp_path / 'ckpt').glob('*step=3.ckpt')
    assert torch.load(step3, weights_only=False)['callbacks']['LoggerState']['timestamp']['batch'] > 0
    fit(2.0, 8, ckpt_path=str(step3))
    text = (tmp_path / 'logs-rank0.txt').read_text()
    assert '[resume]: ===== resumed at step' in text
    out = io.StringIO()
    merge_logs([str(tmp_path / 'logs-rank0.txt')], out, collapse=False)
    tags = [
        (int(line.split('[batch=')[1].split(']')[0]), float(line.split('tag: ')[1]))
        for line in out.getvalue().splitlines()
        if ' tag: ' in line
    ]
    steps = [step for step, _ in tags]
    assert steps == sorted(set(steps)), tags  # each step once
    assert tags[-1][1] == 2.0 and tags[0][1] == 1.0
