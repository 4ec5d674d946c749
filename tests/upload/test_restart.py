"""A restarted job and its own leftovers; a run whose uploads all landed leaves no staging behind."""

from __future__ import annotations

import getpass
import os
import tempfile
import warnings

import pytest

from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store import S3ObjectStore
from dist_logging.state import State
from dist_logging.upload.drain import drain
from dist_logging.upload.retry import RetryPolicy
from dist_logging.upload.staging import RankStaging
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(60)

QUICK = RetryPolicy(num_attempts=2, initial_backoff=0.0)


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def uploader(tmp_path, store, staging='staging') -> RemoteUploaderDownloader:
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / staging))
    rud.retry_policy = QUICK
    return rud


def leave_a_failed_upload(tmp_path, name: str, data: bytes) -> None:
    """A first run whose upload of ``name`` fails for good: it stays in staging."""
    failing = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state-1'), fail_first=99, error='denied')
    first = uploader(tmp_path, failing)
    first.upload_file(State('r'), name, write(tmp_path / 'old', data))
    with pytest.raises(UploadError):
        first.shutdown()


def test_the_bucket_did_not_exist_yet(s3_bucket, _moto_session, tmp_path, monkeypatch):
    """The issue's story: the first run's bucket is missing; the restart (bucket created) uploads the new bytes."""
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))  # the default staging folder, inside tmp_path
    endpoint, bucket = s3_bucket
    _moto_session.client().delete_bucket(Bucket=bucket)

    def run(data: bytes) -> Logger:
        rud = RemoteUploaderDownloader(f's3://{bucket}/runs', backend_kwargs={'endpoint_url': endpoint})
        rud.retry_policy = QUICK
        logger = Logger(rud, run_name='restart-me')
        logger.upload_file('{run_name}/ckpt.pt', write(tmp_path / 'ckpt', data))  # overwrite=False
        return logger

    with pytest.raises(UploadError, match='NoSuchBucket'):
        run(b'first run').close()
    base = tmp_path / f'dist_logging-{getpass.getuser()}'
    assert (base / 'restart-me' / 'staging' / 'rank0' / 'journal.jsonl').exists()
    _moto_session.client().create_bucket(Bucket=bucket)
    with pytest.warns(RuntimeWarning, match=r"'restart-me/ckpt.pt'\) supersedes .* earlier process") as caught:
        logger = run(b'second run')  # no FileExistsError at the call
    assert len([w for w in caught if 'supersedes' in str(w.message)]) == 1
    logger.close()
    with S3ObjectStore(bucket, 'runs', endpoint_url=endpoint) as store:
        store.download_object('restart-me/ckpt.pt', str(tmp_path / 'back'))
    assert (tmp_path / 'back').read_bytes() == b'second run'
    assert os.listdir(base) == []  # no staging folder behind: not the run's, not its staging


def test_a_leftover_still_uploading_is_replaced(tmp_path):
    leave_a_failed_upload(tmp_path, 'ckpt.pt', b'old bytes')
    gate = tmp_path / 'gate'
    gate.touch()  # holds the resumed upload in the store until the new call was made
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state-2'), gate=str(gate))
    rud = uploader(tmp_path, store)
    rud.upload_file(State('r'), 'other.txt', write(tmp_path / 'other', b'o'))  # starts: the leftover resumes
    with pytest.warns(RuntimeWarning, match='supersedes'):
        rud.upload_file(State('r'), 'ckpt.pt', write(tmp_path / 'new', b'new bytes'))
    with pytest.raises(FileExistsError):  # within one process the rule stays: a queued name is refused
        rud.upload_file(State('r'), 'ckpt.pt', str(tmp_path / 'new'))
    gate.unlink()
    rud.shutdown()
    assert store.read('ckpt.pt') == b'new bytes'  # the leftover landed first, then the new call replaced it
    assert not os.path.exists(tmp_path / 'staging' / 'rank0')


def test_a_leftover_that_fails_again_is_dropped(tmp_path):
    leave_a_failed_upload(tmp_path, 'ckpt.pt', b'old bytes')
    gate = tmp_path / 'gate'
    gate.touch()
    # The resumed upload's attempt is refused for good; the new call's upload (attempt 2) lands.
    store = TestStore(
        str(tmp_path / 'bucket'),
        str(tmp_path / 'state-2'),
        gate=str(gate),
        fail_first=1,
        error='denied',
        fail_prefix='ckpt',
    )
    rud = uploader(tmp_path, store)
    rud.upload_file(State('r'), 'other.txt', write(tmp_path / 'other', b'o'))
    with pytest.warns(RuntimeWarning, match='supersedes'):
        rud.upload_file(State('r'), 'ckpt.pt', write(tmp_path / 'new', b'new bytes'))
    gate.unlink()
    rud.shutdown()  # no UploadError: the failed upload was the leftover the new call replaced
    assert store.read('ckpt.pt') == b'new bytes' and store.attempts('ckpt.pt') == 2


def test_a_reported_leftover_failure_is_dropped_by_the_new_call(tmp_path):
    leave_a_failed_upload(tmp_path, 'ckpt.pt', b'old bytes')
    still_failing = TestStore(
        str(tmp_path / 'bucket'), str(tmp_path / 'state-2'), fail_first=1, error='denied', fail_prefix='ckpt'
    )
    rud = uploader(tmp_path, still_failing)
    rud.start('r')  # the leftover resumes and fails before the job's first call
    rud.wait_for_uploads(30)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        rud.upload_file(State('r'), 'ckpt.pt', write(tmp_path / 'new', b'new bytes'))  # no UploadError for it
    rud.shutdown()
    assert still_failing.read('ckpt.pt') == b'new bytes'


def test_staging_is_removed_only_when_everything_landed(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'))
    rud = uploader(tmp_path, store)
    rud.upload_file(State('r'), 'a', write(tmp_path / 'a', b'a'))
    rud.shutdown()
    assert os.listdir(tmp_path / 'staging') == []  # the rank folder went; the folder the user named stays
    leave_a_failed_upload(tmp_path, 'b', b'b')
    assert os.path.exists(tmp_path / 'staging' / 'rank0' / 'journal.jsonl')  # what did not land stays
    drain(str(tmp_path / 'staging'), object_store=store, progress_bar=False)
    assert os.listdir(tmp_path / 'staging') == []  # drained: gone too


def test_a_foreign_file_keeps_the_rank_folder(tmp_path):
    staging = RankStaging(str(tmp_path / 'staging'), 0)
    (tmp_path / 'staging' / 'rank0' / 'notes.txt').write_text('mine')
    staging.close()
    assert not staging.removed and (tmp_path / 'staging' / 'rank0' / 'notes.txt').read_text() == 'mine'
    again = RankStaging(str(tmp_path / 'staging'), 0)  # and a removed folder can be opened again
    (tmp_path / 'staging' / 'rank0' / 'notes.txt').unlink()
    again.close()
    assert again.removed and not (tmp_path / 'staging' / 'rank0').exists()
    RankStaging(str(tmp_path / 'staging'), 0).close()


def test_a_lock_on_a_deleted_lock_file_is_not_ownership(tmp_path):
    import filelock

    from dist_logging.upload.staging import _holds_current_lock

    path = str(tmp_path / '.lock')
    lock = filelock.FileLock(path, thread_local=False)
    lock.acquire()
    assert _holds_current_lock(lock, path)
    os.unlink(path)  # what a closing owner does when the folder empties
    assert not _holds_current_lock(lock, path)
    open(path, 'w').close()  # someone else's new lock file at the same path
    assert not _holds_current_lock(lock, path)
    lock.release()
