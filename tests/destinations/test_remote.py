"""RemoteUploaderDownloader in one process: snapshots, errors, retries, resume, drain, back-pressure, S3."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest

from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.state import State
from dist_logging.upload.drain import drain, list_pending
from dist_logging.upload.retry import RetryPolicy
from dist_logging.upload.staging import StagingBusyError
from s3_server import _moto_session, aws_credentials, s3_bucket, s3_server  # noqa: F401 - fixtures
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(60)

FAST = RetryPolicy(num_attempts=3, initial_backoff=0.01)


def make(tmp_path, store=None, *, staging='staging', policy=FAST, **kwargs) -> RemoteUploaderDownloader:
    if store is None:
        kwargs.setdefault('bucket_uri', f'file://{tmp_path}/bucket')
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / staging), **kwargs)
    rud.retry_policy = policy
    return rud


def test_store(tmp_path, **kwargs) -> TestStore:
    return TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), **kwargs)


test_store.__test__ = False  # type: ignore[attr-defined]


def write(path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def staged_files(rud) -> list[str]:
    return sorted(os.listdir(os.path.join(rud.staging_dir, 'files')))


# ---------------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    'kwargs,match',
    [
        ({}, 'exactly one'),
        ({'bucket_uri': 'magic://b'}, "'magic'"),
        ({'bucket_uri': 'file://relative'}, 'absolute'),
        ({'bucket_uri': '/tmp/b', 'num_attempts': 0}, 'num_attempts'),
        ({'bucket_uri': '/tmp/b', 'num_concurrent_uploads': 0}, 'num_concurrent_uploads'),
        ({'bucket_uri': '/tmp/b', 'max_staged_bytes': 0}, 'max_staged_bytes'),
        ({'bucket_uri': '/tmp/b', 'ranks': 'some'}, 'ranks'),
        ({'bucket_uri': '/tmp/b', 'file_path_format_string': '{nope}/{remote_file_name}'}, 'nope'),
    ],
)
def test_validation_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RemoteUploaderDownloader(**kwargs)


def test_use_procs_needs_a_picklable_store(tmp_path):
    store = test_store(tmp_path)
    store.lock = threading.Lock()
    with pytest.raises(ValueError, match='picklable'):
        RemoteUploaderDownloader(object_store=store, use_procs=True)


# ---------------------------------------------------------------------------- the upload path
@pytest.mark.parametrize('use_procs', [False, True])
def test_logger_uploads_snapshots(tmp_path, use_procs):
    gate = tmp_path / 'gate'
    gate.touch()
    store = test_store(tmp_path, gate=str(gate))
    rud = make(tmp_path, store, use_procs=use_procs, file_path_format_string='prefix/{remote_file_name}')
    logger = Logger(rud, run_name='run1')
    copied = write(tmp_path / 'src' / 'copied.txt', b'moment of the call')
    handed = write(tmp_path / 'src' / 'handed.txt', b'handed over')
    logger.upload_file('{run_name}/copied-rank{rank}.txt', copied)
    logger.upload_file('{run_name}/handed.txt', handed, copy=False)
    # the caller rewrites and deletes its files while the uploads wait at the gate
    write(tmp_path / 'src' / 'copied.txt', b'rewritten later')
    os.unlink(handed)
    assert len(staged_files(rud)) == 2
    gate.unlink()
    logger.close()
    assert store.read('prefix/run1/copied-rank0.txt') == b'moment of the call'
    assert store.read('prefix/run1/handed.txt') == b'handed over'
    assert not os.path.exists(rud.staging_dir)  # everything landed: the rank's staging folder is gone


def test_copy_false_across_filesystems_uses_the_file_in_place(tmp_path, monkeypatch):
    from dist_logging.upload import uploader

    monkeypatch.setattr(uploader, 'link_file', lambda src, dst: False)  # as on EXDEV
    store = test_store(tmp_path)
    rud = make(tmp_path, store)
    rud.upload_file(State('r'), 'ckpt.pt', write(tmp_path / 'ckpt.pt', b'weights'), copy=False)
    rud.shutdown()
    assert store.read('ckpt.pt') == b'weights' and (tmp_path / 'ckpt.pt').exists()  # the original is kept


def test_overwrite_false_collisions(tmp_path):
    store = test_store(tmp_path)
    write(tmp_path / 'bucket' / 'exists.txt', b'old')
    rud = make(tmp_path, store)
    state = State('r')
    src = write(tmp_path / 'f', b'new')
    rud.upload_file(state, 'once.txt', src)
    with pytest.raises(FileExistsError, match='once.txt'):
        rud.upload_file(state, 'once.txt', src)  # queued by this rank already: refused at the call
    rud.upload_file(state, 'once.txt', src, overwrite=True)  # allowed with overwrite
    rud.upload_file(state, 'exists.txt', src)  # only the store knows: fails in the background
    with pytest.raises(UploadError) as info:
        rud.shutdown()
    assert set(info.value.failures) == {'exists.txt'}
    assert isinstance(info.value.failures['exists.txt'], FileExistsError)
    assert store.read('exists.txt') == b'old'
    assert [p.remote_name for p in list_pending(str(tmp_path / 'staging'))] == ['exists.txt']


def test_transient_errors_are_retried(tmp_path):
    store = test_store(tmp_path, fail_first=2, error='reset')
    rud = make(tmp_path, store, policy=RetryPolicy(num_attempts=3, initial_backoff=0.01))
    rud.upload_file(State('r'), 'flaky.txt', write(tmp_path / 'f', b'eventually'))
    rud.shutdown()  # no error: the third attempt landed
    assert store.attempts('flaky.txt') == 3 and store.read('flaky.txt') == b'eventually'


def test_permanent_errors_fail_at_once_and_surface_at_the_next_call(tmp_path):
    store = test_store(tmp_path, fail_first=1, error='denied', fail_prefix='denied')
    rud = make(tmp_path, store, policy=RetryPolicy(num_attempts=5, initial_backoff=0.01))
    state = State('r')
    rud.upload_file(state, 'denied.txt', write(tmp_path / 'a', b'a'))
    assert rud.wait_for_uploads(20)
    with pytest.raises(UploadError, match='denied.txt') as info:
        rud.upload_file(state, 'next.txt', write(tmp_path / 'b', b'b'))
    assert isinstance(info.value.failures['denied.txt'], PermissionError)
    assert store.attempts('denied.txt') == 1
    rud.shutdown()  # already reported: close does not raise it again
    assert store.read('next.txt') == b'b'  # the call that raised still queued its file
    assert [p.remote_name for p in list_pending(str(tmp_path / 'staging'))] == ['denied.txt']


def test_exhausted_retries_fail_at_close_and_stay_in_staging(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = test_store(tmp_path, fail_first=99, error='reset', gate=str(gate))
    rud = make(tmp_path, store, policy=RetryPolicy(num_attempts=2, initial_backoff=0.01))
    logger = Logger(rud, run_name='r')
    logger.upload_file('a.txt', write(tmp_path / 'a', b'a'))
    logger.upload_file('b.txt', write(tmp_path / 'b', b'b'))
    gate.unlink()
    with pytest.raises(UploadError) as info:
        logger.close()
    assert set(info.value.failures) == {'a.txt', 'b.txt'} and store.attempts('a.txt') == 2
    pending = list_pending(str(tmp_path / 'staging'))
    assert sorted(p.remote_name for p in pending) == ['a.txt', 'b.txt']
    assert all(open(p.snapshot_path, 'rb').read() in (b'a', b'b') for p in pending)


def test_same_name_many_calls_newest_bytes_win(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = test_store(tmp_path, gate=str(gate))
    rud = make(tmp_path, store)
    state = State('r')
    src = tmp_path / 'log.txt'
    for i in range(6):
        write(src, f'version {i}'.encode())
        rud.upload_file(state, 'log.txt', str(src), overwrite=True)
    assert len(staged_files(rud)) <= 2  # the one in flight and the newest; superseded ones deleted
    gate.unlink()
    rud.shutdown()
    assert store.read('log.txt') == b'version 5' and store.attempts('log.txt') == 2


def test_resume_by_a_new_uploader(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    failing = test_store(tmp_path, fail_first=99, error='denied', gate=str(gate))
    first = make(tmp_path, failing)
    state = State('r')
    first.upload_file(state, 'a.txt', write(tmp_path / 'a', b'A'))
    first.upload_file(state, 'b.txt', write(tmp_path / 'b', b'B'), copy=False)
    gate.unlink()
    with pytest.raises(UploadError):
        first.shutdown()
    # a killed writer may leave half a line at the end of the journal
    with open(os.path.join(first.staging_dir, 'journal.jsonl'), 'a') as handle:
        handle.write('{"op":"q","id":99,"name":"torn')
    working = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state2'))
    second = make(tmp_path, working)
    second.upload_file(state, 'c.txt', write(tmp_path / 'c', b'C'))  # starts it: a.txt and b.txt resume
    # A name the earlier run left queued does not refuse the restarted job: the new call supersedes it.
    with pytest.warns(RuntimeWarning, match=r"upload_file\('a.txt'\) supersedes .*earlier process"):
        second.upload_file(state, 'a.txt', write(tmp_path / 'a2', b'A2'))
    with pytest.raises(FileExistsError):  # within one process, overwrite=False of a queued name still refuses
        second.upload_file(state, 'a.txt', str(tmp_path / 'a2'))
    second.shutdown()
    assert [working.read(n) for n in ('a.txt', 'b.txt', 'c.txt')] == [b'A2', b'B', b'C']
    assert list_pending(str(tmp_path / 'staging')) == []


def test_staging_folder_is_locked_while_in_use(tmp_path):
    first = make(tmp_path)
    first.upload_file(State('r'), 'x', write(tmp_path / 'x', b'x'))
    second = make(tmp_path)
    with pytest.raises(StagingBusyError):
        second.upload_file(State('r'), 'y', str(tmp_path / 'x'))
    with pytest.raises(StagingBusyError):
        drain(str(tmp_path / 'staging'), progress_bar=False)
    first.shutdown()


def test_drain(tmp_path):
    # uploads to a file:// bucket fail while a *file* sits where their directory must go
    write(tmp_path / 'bucket' / 'blocked', b'not a directory')
    rud = make(tmp_path, policy=RetryPolicy(num_attempts=1))
    custom = make(tmp_path, test_store(tmp_path, fail_first=99, error='denied'), staging='staging2')
    state = State('r')
    reported = set()
    for name in ('blocked/one.txt', 'blocked/two.txt'):
        try:
            rud.upload_file(state, name, write(tmp_path / 'src' / name, name.encode()))
        except UploadError as exc:  # the first may fail before the second call
            reported |= set(exc.failures)
    custom.upload_file(state, 'custom.txt', write(tmp_path / 'custom', b'custom'))
    for uploader in (rud, custom):
        with pytest.raises(UploadError) as info:
            uploader.shutdown()
        reported |= set(info.value.failures)
    assert reported == {'blocked/one.txt', 'blocked/two.txt', 'custom.txt'}
    pending = list_pending(str(tmp_path / 'staging'))
    assert sorted(p.remote_name for p in pending) == ['blocked/one.txt', 'blocked/two.txt']
    assert {(p.rank, p.bucket_uri, p.size, p.overwrite) for p in pending} == {
        (0, f'file://{tmp_path}/bucket', 15, False)
    }

    with pytest.raises(UploadError, match='blocked/one.txt'):
        drain(str(tmp_path / 'staging'), progress_bar=False)  # still blocked: named, kept
    os.unlink(tmp_path / 'bucket' / 'blocked')
    report = drain(str(tmp_path / 'staging'), progress_bar=False)
    assert sorted(report.uploaded) == ['blocked/one.txt', 'blocked/two.txt'] and not report.failed
    assert (tmp_path / 'bucket' / 'blocked' / 'two.txt').read_bytes() == b'blocked/two.txt'
    assert list_pending(str(tmp_path / 'staging')) == []

    report = drain(str(tmp_path / 'staging2'), progress_bar=False)
    assert report.skipped_custom_store == ['custom.txt'] and not report.uploaded
    assert [p.bucket_uri for p in list_pending(str(tmp_path / 'staging2'))] == [None]
    fresh = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state3'))
    report = drain(str(tmp_path / 'staging2'), object_store=fresh, progress_bar=False)
    assert report.uploaded == ['custom.txt'] and fresh.read('custom.txt') == b'custom'


def test_back_pressure_waits_and_drops_nothing(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = test_store(tmp_path, gate=str(gate))
    rud = make(tmp_path, store, max_staged_bytes=10_000)
    state = State('r')
    srcs = [write(tmp_path / f's{i}', bytes([65 + i]) * 6000) for i in range(3)]
    rud.upload_file(state, 'f0', srcs[0])  # staging was empty: accepted
    returned = threading.Event()

    def second():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            rud.upload_file(state, 'f1', srcs[1])
            rud.upload_file(state, 'f2', srcs[2])
        second.warnings = [str(w.message) for w in caught]
        returned.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not returned.wait(0.5)  # 12 000 bytes would exceed 10 000: waiting
    gate.unlink()
    assert returned.wait(20)
    thread.join()
    rud.shutdown()
    assert [store.read(f'f{i}') for i in range(3)] == [bytes([65 + i]) * 6000 for i in range(3)]
    assert len(second.warnings) == 1 and 'max_staged_bytes' in second.warnings[0]


def test_download(tmp_path):
    rud = make(tmp_path)
    state = State('r')
    rud.upload_file(state, 'obj.bin', write(tmp_path / 'src', b'content'))
    assert rud.wait_for_uploads(20)
    dest = tmp_path / 'down' / 'obj.bin'
    rud.download_file('obj.bin', str(dest))
    assert dest.read_bytes() == b'content'
    with pytest.raises(FileExistsError):
        rud.download_file('obj.bin', str(tmp_path / 'src'))
    rud.download_file('obj.bin', str(tmp_path / 'src'), overwrite=True)
    assert (tmp_path / 'src').read_bytes() == b'content'
    with pytest.raises(FileNotFoundError):
        rud.download_file('missing.bin', str(tmp_path / 'never'))
    assert [n for n in os.listdir(tmp_path / 'down')] == ['obj.bin']
    rud.shutdown()


# ---------------------------------------------------------------------------- S3 (moto over HTTP)
def test_s3_end_to_end_and_drain_from_the_recorded_uri(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    kwargs = {'endpoint_url': endpoint, 'multipart_threshold': 5 * 1024 * 1024, 'multipart_chunksize': 5 * 1024 * 1024}
    rud = make(tmp_path, bucket_uri=f's3://{bucket}/runs', backend_kwargs=kwargs)
    logger = Logger(rud, run_name='s3run')
    big = os.urandom(6 * 1024 * 1024)
    logger.upload_file('{run_name}/big.bin', write(tmp_path / 'big', big), copy=False)
    logger.upload_file('{run_name}/small.txt', write(tmp_path / 'small', b'small'))
    logger.close()
    rud2 = make(tmp_path, bucket_uri=f's3://{bucket}/runs', backend_kwargs={'endpoint_url': endpoint}, staging='s2')
    rud2.download_file('s3run/big.bin', str(tmp_path / 'big.out'))
    assert (tmp_path / 'big.out').read_bytes() == big
    rud2.shutdown()


@pytest.mark.timeout(90)
def test_s3_server_down_then_back(tmp_path, s3_server):
    bucket = s3_server.create_bucket()
    quick = {
        'endpoint_url': s3_server.endpoint,
        'client_config': {'retries': {'total_max_attempts': 1}, 'connect_timeout': 2, 'read_timeout': 5},
    }
    rud = make(
        tmp_path,
        bucket_uri=f's3://{bucket}',
        backend_kwargs=quick,
        policy=RetryPolicy(num_attempts=6, initial_backoff=0.5, jitter=0.2),
    )
    state = State('r')
    s3_server.stop()
    rud.upload_file(state, 'during-outage.txt', write(tmp_path / 'a', b'survived'))
    time.sleep(1.0)
    s3_server.start()
    rud.shutdown()  # retried until the server came back
    assert s3_server.client().get_object(Bucket=bucket, Key='during-outage.txt')['Body'].read() == b'survived'

    # an outage longer than the retries: the upload stays in staging, and drain delivers it
    # by rebuilding the store from the URI and endpoint recorded in the journal
    rud = make(
        tmp_path,
        bucket_uri=f's3://{bucket}',
        backend_kwargs=quick,
        staging='s2',
        policy=RetryPolicy(num_attempts=2, initial_backoff=0.01),
    )
    s3_server.stop()
    rud.upload_file(state, 'drained.txt', write(tmp_path / 'b', b'drained'))
    with pytest.raises(UploadError, match='drained.txt'):
        rud.shutdown()
    s3_server.start()
    report = drain(str(tmp_path / 's2'), progress_bar=False)
    assert report.uploaded == ['drained.txt']
    assert s3_server.client().get_object(Bucket=bucket, Key='drained.txt')['Body'].read() == b'drained'


def test_composer_names_for_the_store_and_uris(tmp_path, s3_bucket):
    local = RemoteUploaderDownloader(
        str(tmp_path / 'bucket'),
        upload_staging_folder=str(tmp_path / 'staging'),
        file_path_format_string='{run_name}/rank{rank}/{remote_file_name}',
    )
    try:
        assert local.remote_backend is local.object_store
        assert (local.remote_backend_name, local.remote_bucket_name) == ('file', '')
        with Logger(local, run_name='names'):
            uri = local.get_uri_for_file('/ckpt/ep1.pt')  # a leading '/' is dropped, as in Composer
            assert uri == 'file://' + os.path.join(str(tmp_path / 'bucket'), 'names/rank0/ckpt/ep1.pt')
            with pytest.raises(ValueError, match=r'\.\.'):
                local.get_uri_for_file('../escape')
    finally:
        local.shutdown()
    endpoint, bucket = s3_bucket
    remote = RemoteUploaderDownloader(
        f's3://{bucket}/runs',
        backend_kwargs={'endpoint_url': endpoint},
        upload_staging_folder=str(tmp_path / 'staging-s3'),
    )
    try:
        assert (remote.remote_backend_name, remote.remote_bucket_name) == ('s3', bucket)
        assert remote.get_uri_for_file('a/b.txt') == f's3://{bucket}/runs/a/b.txt'
    finally:
        remote.shutdown()


def test_post_close_takes_no_arguments_as_in_composer(tmp_path):
    uploader = RemoteUploaderDownloader(str(tmp_path / 'bucket'), upload_staging_folder=str(tmp_path / 'staging'))
    logger = Logger(uploader, run_name='pc')
    (tmp_path / 'f.txt').write_text('1')
    logger.upload_file('f.txt', tmp_path / 'f.txt')
    uploader.close(logger.state, logger)
    uploader.post_close()  # waits for the upload, as Composer's does
    assert (tmp_path / 'bucket' / 'f.txt').read_text() == '1'
    logger.close()


def test_the_journal_records_the_bucket_uri_without_its_password():
    from dist_logging.upload.staging import store_record as _store_record

    class SftpLike:
        bucket_uri = 'sftp://alice:s3cr3t@host/runs'

    record = _store_record(SftpLike(), {'port': 22, 'password': 's3cr3t'})
    assert record.uri == 'sftp://alice@host/runs' and record.kwargs == {'port': 22}


# ---------------------------------------------------------------------------- memory
class NullStore:
    """Accepts every upload and keeps nothing: what stays in memory is the uploader's own."""

    bucket_uri = None

    def upload_object(self, name, path, overwrite=False, callback=None):
        pass

    def download_object(self, name, path, overwrite=False, callback=None):
        raise FileNotFoundError(name)

    def get_object_size(self, name):
        raise FileNotFoundError(name)

    def get_uri(self, name):
        return f'null://{name}'


@pytest.mark.timeout(300)
def test_memory_stays_flat_over_100_000_uploads(tmp_path):
    """Nothing the destination keeps grows with the number of uploads (it kept every name it ever queued)."""
    import gc
    import tracemalloc

    rud = make(tmp_path, NullStore(), num_concurrent_uploads=1)
    src = write(tmp_path / 'line.txt', b'x')
    state = State('r')

    def upload(start: int, stop: int) -> None:
        for i in range(start, stop):
            rud.upload_file(state, f'logs/{i}.txt', src, copy=False)  # a new name each time, overwrite=False
            if i % 250 == 249:
                assert rud.wait_for_uploads(60)  # what is in flight is not what this test measures

    def ours() -> int:
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, '*/dist_logging/*')])
        return sum(stat.size for stat in snapshot.statistics('filename'))

    upload(0, 70_000)  # untraced (tracing doubles the cost of an upload)
    tracemalloc.start()
    try:
        upload(70_000, 75_000)  # what the uploader keeps of recent names is all allocated while traced
        before = ours()
        upload(75_000, 100_000)
        grown = ours() - before
    finally:
        tracemalloc.stop()
    rud.shutdown()
    assert rud.uploaded_count == 100_000
    assert grown < 16 * 1024, f'dist_logging holds {grown} bytes more after 25,000 more uploads'
