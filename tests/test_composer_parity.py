"""A destination written the way Composer's documentation writes them, used with only its imports changed.

The class below is what a Composer user has (hooks with Composer's signatures, no
``super().__init__()``, ``post_close()`` without arguments, ``upload_file`` without
``can_upload_files()``, ``int(state.timestamp.batch)``). Only the import lines differ:

    from composer.loggers import FileLogger, Logger, LoggerDestination   ->  dist_logging.destinations
    from composer.core import Event, State                               ->  dist_logging
    from composer.utils import dist, format_name_with_dist               ->  dist_logging
"""

from __future__ import annotations

import pathlib
from typing import Any, Optional

import numpy as np
import pytest
import torch

from dist_logging import Event, State, dist, format_name_with_dist
from dist_logging.destinations import FileLogger, Logger, LoggerDestination


class ComposerWrittenDestination(LoggerDestination):
    """Collects everything; uploads by copying into a folder, as a small Composer plugin would."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self.calls: list[tuple] = []
        self.run_name: Optional[str] = None

    def init(self, state: State, logger: Logger) -> None:
        self.run_name = state.run_name
        self.calls.append(('init', format_name_with_dist('{run_name}-rank{rank}', state.run_name)))

    def log_hyperparameters(self, hyperparameters: dict[str, Any]):
        self.calls.append(('hparams', dict(hyperparameters)))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self.calls.append(('metrics', dict(metrics), step))

    def log_traces(self, traces: dict[str, Any]):
        self.calls.append(('traces', dict(traces)))

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self.calls.append(('table', name, columns, rows, step))

    def log_images(
        self,
        images,
        name: str = 'Images',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks=None,
        mask_class_labels=None,
        use_table: bool = True,
    ):
        self.calls.append(('images', name, tuple(images.shape), step))

    def batch_end(self, state: State, logger: Logger) -> None:
        self.calls.append(('batch_end', int(state.timestamp.batch), dist.get_global_rank()))

    def epoch_end(self, state: State, logger: Logger) -> None:
        self.calls.append(('epoch_end', int(state.timestamp.epoch)))

    def fit_end(self, state: State, logger: Logger) -> None:
        self.calls.append(('fit_end',))

    def upload_file(self, state: State, remote_file_name: str, file_path: pathlib.Path, *, overwrite: bool):
        target = self.folder / remote_file_name
        if target.exists() and not overwrite:
            raise FileExistsError(remote_file_name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(file_path.read_bytes())
        self.calls.append(('upload', remote_file_name, file_path.name, overwrite))

    def close(self, state: State, logger: Logger) -> None:
        self.calls.append(('close',))

    def post_close(self) -> None:
        self.calls.append(('post_close',))


def _names(destination):
    return [call[0] for call in destination.calls]


def test_hooks_events_and_post_close_without_arguments(tmp_path):
    destination = ComposerWrittenDestination(tmp_path / 'bucket')
    logger = Logger([destination], run_name='parity')
    logger.log_hyperparameters({'lr': 0.1})
    logger.fit_start()
    logger.epoch_start()
    logger.log_metrics({'loss': 2.0})
    logger.log_table(['a'], [[1]], name='t')
    logger.log_images(torch.rand(2, 3, 4, 4, dtype=torch.bfloat16), name='im')
    logger.batch_end()
    logger.log_metrics({'loss': 1.0}, step=10)
    logger.epoch_end()
    logger.fit_end()
    logger.log_traces({'algo': 'on'})
    logger.close()
    assert destination.calls == [
        ('init', 'parity-rank0'),
        ('hparams', {'lr': 0.1}),
        ('metrics', {'loss': 2.0}, 0),  # step None -> the batch count, as Composer's Logger does
        ('table', 't', ['a'], [[1]], 0),
        ('images', 'im', (2, 3, 4, 4), 0),
        ('batch_end', 1, 0),
        ('metrics', {'loss': 1.0}, 10),
        ('epoch_end', 1),  # the timestamp already counts the finished epoch, as in Composer
        ('fit_end',),
        ('traces', {'algo': 'on'}),
        ('close',),
        ('post_close',),
    ]


def test_upload_file_reaches_it_without_can_upload_files(tmp_path):
    destination = ComposerWrittenDestination(tmp_path / 'bucket')
    (tmp_path / 'bar').write_text('payload')
    with Logger([destination], run_name='up') as logger:
        assert logger.has_file_upload_destination()
        logger.upload_file('{run_name}/foo', str(tmp_path / 'bar'), overwrite=True)
        logger.upload_file('{run_name}/foo', tmp_path / 'bar', overwrite=True)
        with pytest.raises(FileNotFoundError, match='missing'):  # at the call (docs/composer.md)
            logger.upload_file('x', tmp_path / 'missing')
    assert [c for c in destination.calls if c[0] == 'upload'] == [('upload', 'up/foo', 'bar', True)] * 2
    assert (tmp_path / 'bucket' / 'up' / 'foo').read_text() == 'payload'


def test_file_logger_uploads_its_log_to_it(tmp_path):
    # Composer's FileLogger test setup: a tracker that only overrides upload_file, buffer_size=1, flush_interval=1.
    tracker = ComposerWrittenDestination(tmp_path / 'bucket')
    file_logger = FileLogger(
        filename=str(tmp_path / 'output.log'),
        remote_file_name='{run_name}/rank{rank}.log',
        buffer_size=1,
        flush_interval=1,
    )
    with Logger([file_logger, tracker], run_name='fl') as logger:
        logger.log_hyperparameters({'foo': 3})
        logger.log_metrics({'loss': 2}, step=1)
        logger.batch_end()
    uploads = [c for c in tracker.calls if c[0] == 'upload']
    assert uploads and all(c[1:] == ('fl/rank0.log', 'output.log', True) for c in uploads)
    assert (tmp_path / 'bucket' / 'fl' / 'rank0.log').read_text() == (
        '[hyperparameter]: foo: 3 \n[metric][batch=1]: loss: 2 \n'
    )


def test_a_raising_destination_does_not_stop_the_others(tmp_path):
    class Broken(ComposerWrittenDestination):
        def log_metrics(self, metrics, step=None):
            raise RuntimeError('tracker down')

    broken, healthy = Broken(tmp_path / 'b'), ComposerWrittenDestination(tmp_path / 'h')
    logger = Logger([broken, healthy], run_name='iso')
    with pytest.warns(RuntimeWarning, match='tracker down'):
        logger.log_metrics({'loss': np.float32(1.0)})
    assert ('metrics', {'loss': 1.0}, 0) in healthy.calls
    with pytest.raises(RuntimeError, match='tracker down'):  # re-raised at close (docs/composer.md)
        logger.close()
    assert _names(broken)[-2:] == _names(healthy)[-2:] == ['close', 'post_close']


def test_run_event_override_still_closed():
    seen = []

    class HandlesItsOwnEvents(LoggerDestination):
        def run_event(self, event, state, logger):
            if event == Event.BATCH_END:
                seen.append(int(state.timestamp.batch))

        def close(self, state, logger):
            seen.append('close')

        def post_close(self):
            seen.append('post_close')

    with Logger([HandlesItsOwnEvents()], run_name='ev') as logger:
        logger.batch_end()
    assert seen == [1, 'close', 'post_close']


def test_name_templates_fill_as_composers(fake_rank, monkeypatch):
    from dist_logging import Timestamp, format_name_with_dist_and_time

    names = ['run_name', 'rank', 'node_rank', 'world_size', 'local_world_size', 'local_rank', 'extra']
    template = ','.join(f'{n}={{{n}}}' for n in names)
    assert format_name_with_dist(template, 'awesome_run', extra=42) == (
        'run_name=awesome_run,rank=0,node_rank=0,world_size=1,local_world_size=1,local_rank=0,extra=42'
    )
    times = [
        'epoch',
        'batch',
        'batch_in_epoch',
        'sample',
        'sample_in_epoch',
        'token',
        'token_in_epoch',
        'total_wct',
        'epoch_wct',
        'batch_wct',
    ]
    timestamp = Timestamp(
        batch=1,
        batch_in_epoch=1,
        sample=2,
        sample_in_epoch=2,
        token=3,
        token_in_epoch=3,
        total_wct=36000.0,
        epoch_wct=3000.0,
        batch_wct=5.0,
    )
    filled = format_name_with_dist_and_time(
        ','.join(f'{n}={{{n}}}' for n in names + times), 'awesome_run', timestamp, extra=42
    )
    assert filled.endswith(
        ',extra=42,epoch=0,batch=1,batch_in_epoch=1,sample=2,sample_in_epoch=2,token=3,'
        'token_in_epoch=3,total_wct=36000.0,epoch_wct=3000.0,batch_wct=5.0'
    )
    # two ranks and no node rank in the environment: a template that does not use it still fills
    fake_rank(rank=1, world_size=2)
    monkeypatch.delenv('GROUP_RANK')
    assert format_name_with_dist('{run_name},{world_size}', 'awesome_run') == 'awesome_run,2'


def test_init_sent_again_after_the_logger_opened_destinations(tmp_path):
    # Composer's tests (and some callbacks) send INIT themselves after building the Logger.
    file_logger = FileLogger(str(tmp_path / 'log.txt'), buffer_size=1)
    with Logger([file_logger], run_name='again') as logger:
        handle = file_logger._file
        file_logger.run_event(Event.INIT, logger.state, logger)
        logger.log_metrics({'loss': 1.0}, step=1)
        assert file_logger._file is handle
    assert (tmp_path / 'log.txt').read_text() == '[metric][batch=1]: loss: 1.0 \n'
