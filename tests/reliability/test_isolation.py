"""Destination failure isolation with real destinations.

A destination that raises (in ``log_metrics`` and the other hooks) does not stop the others from
getting the call; its error is reported once, not per call, and re-raised at ``close()`` (after
every destination closed and every upload landed) unless the destination is optional. An uploader
whose earlier uploads failed does not stop the other uploaders from getting the next file.
``tests/test_logger.py`` checks the same with recording destinations.
"""

from __future__ import annotations

import json
import warnings

import pytest

from dist_logging import Logger, LoggerDestination, UploadError
from dist_logging.destinations import FileLogger, InMemoryLogger, RemoteUploaderDownloader
from dist_logging.upload.retry import RetryPolicy
from reliability._common import bucket_objects, sha256, write
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(60)


class Exploding(LoggerDestination):
    def __init__(self, **kwargs):
        super().__init__(ranks='all', **kwargs)
        self.calls = 0

    def log_metrics(self, metrics, step=None):
        self.calls += 1
        raise OSError(f'disk on fire (call {self.calls})')

    def log_hyperparameters(self, hyperparameters):
        raise ValueError('cannot store hparams')

    def log_table(self, columns, rows, name='Table', step=None):
        raise RuntimeError('no tables here')


@pytest.mark.parametrize('optional', [False, True])
def test_raising_destination_does_not_stop_the_others(tmp_path, optional):
    memory = InMemoryLogger()
    file_logger = FileLogger(
        str(tmp_path / 'logs' / '{run_name}-rank{rank}.jsonl'),
        format='jsonl',
        remote_file_name='{run_name}/log-rank{rank}.jsonl',
    )
    rud = RemoteUploaderDownloader(f'file://{tmp_path}/bucket', upload_staging_folder=str(tmp_path / 'staging'))
    broken = Exploding(optional=optional)
    logger = Logger([broken, memory, file_logger, rud], run_name='iso')
    data = write(tmp_path / 'ckpt', b'weights')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        logger.log_hyperparameters({'lr': 0.1})
        for step in range(50):
            logger.log_metrics({'loss': 1.0 / (step + 1)}, step=step)
            logger.log_table(['a'], [[step]], name='t', step=step)
            logger.batch_end()
        logger.upload_file('{run_name}/ckpt.bin', data)
    assert broken.calls == 50
    reported = [str(w.message) for w in caught if 'Exploding' in str(w.message)]
    assert len(reported) == 1, reported  # once, not per call (nor per hook)
    assert 'cannot store hparams' in reported[0] and ('ignored' if optional else 're-raised') in reported[0]
    assert [v for _, v in memory.data['loss']] == [1.0 / (s + 1) for s in range(50)]
    assert memory.hyperparameters == {'lr': 0.1}
    if optional:
        logger.close()
    else:
        with pytest.raises(ValueError, match='cannot store hparams'):
            logger.close()
    # the others were closed and their uploads landed before the error was raised
    landed = bucket_objects(tmp_path / 'bucket')
    assert landed['iso/ckpt.bin'] == sha256(b'weights')
    lines = [json.loads(line) for line in (tmp_path / 'bucket' / 'iso' / 'log-rank0.jsonl').read_text().splitlines()]
    assert sum(1 for line in lines if line['kind'] == 'metric') == 50


def test_failed_uploader_does_not_keep_the_next_file_from_the_other_uploaders(tmp_path):
    failing = TestStore(
        str(tmp_path / 'bucket-a'), str(tmp_path / 'state-a'), fail_first=1, error='denied', fail_prefix='first'
    )
    a = RemoteUploaderDownloader(object_store=failing, upload_staging_folder=str(tmp_path / 'staging-a'))
    b = RemoteUploaderDownloader(f'file://{tmp_path}/bucket-b', upload_staging_folder=str(tmp_path / 'staging-b'))
    a.retry_policy = RetryPolicy(num_attempts=1)
    logger = Logger([a, b], run_name='two')
    logger.upload_file('first.bin', write(tmp_path / 'first', b'1'))
    assert a.wait_for_uploads(20)  # 'first.bin' failed on a (access denied)
    with pytest.raises(UploadError, match='first.bin'):
        logger.upload_file('second.bin', write(tmp_path / 'second', b'2'))  # reported at the next call...
    logger.close()
    # ... and both uploaders still got the second file
    assert bucket_objects(tmp_path / 'bucket-a') == {'second.bin': sha256(b'2')}
    assert bucket_objects(tmp_path / 'bucket-b') == {'first.bin': sha256(b'1'), 'second.bin': sha256(b'2')}
