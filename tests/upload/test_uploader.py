"""The public upload port, dist_logging.upload.Uploader, used directly (no Logger, no destination):
callbacks, the staging bound woken by landings, names, close hooks, drain, validation."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest

from dist_logging.errors import UploadError
from dist_logging.upload import Uploader
from dist_logging.upload.retry import RetryPolicy
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(60)


def make(tmp_path, store=None, **kwargs) -> Uploader:
    store = store or TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'))
    uploader = Uploader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'), **kwargs)
    uploader.retry_policy = RetryPolicy(num_attempts=1)
    return uploader


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_callbacks_tell_each_upload_landed_or_failed(tmp_path):
    store = TestStore(
        str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=1, error='denied', fail_prefix='bad'
    )
    results: dict[str, object] = {}
    landed: list[str] = []
    with make(tmp_path, store) as uploader:
        uploader.add_landed_listener(landed.append)
        uploader.enqueue(write(tmp_path / 'a', b'aa'), 'good.bin', callback=results.__setitem__)
        uploader.enqueue(write(tmp_path / 'b', b'bb'), 'bad.bin', copy=False, callback=results.__setitem__)
        assert uploader.wait_for_uploads(30)
        assert results['good.bin'] is None and isinstance(results['bad.bin'], PermissionError)
        assert landed == ['good.bin'] and set(uploader.failed_uploads()) == {'bad.bin'}
        with pytest.raises(UploadError) as raised:
            uploader.shutdown()
    assert set(raised.value.failures) == {'bad.bin'}
    assert store.read('good.bin') == b'aa'


def test_the_staging_bound_waits_for_a_landing_and_counts_sized_links(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), gate=str(gate))
    uploader = make(tmp_path, store)
    uploader.enqueue(write(tmp_path / 'c', b'x' * 600), 'copied')  # a copy always counts
    uploader.enqueue(write(tmp_path / 'l', b'y' * 400), 'linked', copy=False, size=400)
    uploader.enqueue(write(tmp_path / 'u', b'z' * 300), 'unsized', copy=False)  # a link without size does not
    assert uploader.staged_bytes == 1000
    waited: list[tuple[int, int]] = []
    done = threading.Event()

    def save():
        uploader.wait_for_room(500, 1200, on_wait=lambda staged, limit: waited.append((staged, limit)))
        done.set()

    thread = threading.Thread(target=save)
    thread.start()
    assert not done.wait(0.5)  # 1000 + 500 > 1200: waits
    gate.unlink()  # the uploads land; each landing wakes the waiter
    assert done.wait(30)
    thread.join()
    assert waited == [(1000, 1200)] and uploader.staged_bytes <= 700  # room for 500 more under 1200
    assert uploader.wait_for_uploads(30) and uploader.staged_bytes == 0
    uploader.wait_for_room(10**9, 1)  # nothing staged: never waits, whatever the bound
    uploader.shutdown()


def test_a_name_is_refused_only_while_it_is_remembered(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), gate=str(gate))
    uploader = make(tmp_path, store)
    src = write(tmp_path / 'f', b'f')
    uploader.enqueue(src, 'once')
    with pytest.raises(FileExistsError, match="'once'"):
        uploader.enqueue(src, 'once')  # pending
    uploader.enqueue(src, 'once', overwrite=True)  # allowed: it replaces
    gate.unlink()
    assert uploader.wait_for_uploads(30)
    with pytest.raises(FileExistsError):
        uploader.enqueue(src, 'once')  # landed with overwrite=False: remembered
    uploader.shutdown()
    with pytest.raises(RuntimeError, match='closed'):
        uploader.enqueue(src, 'later')


def test_close_hooks_run_after_every_upload_landed_and_reported_failures_raise(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), delay=0.2)
    uploader = make(tmp_path, store)
    seen = []
    uploader.add_close_hook(lambda aborted: seen.append((aborted, store.successes('slow'))))
    uploader.enqueue(write(tmp_path / 's', b's'), 'slow')
    uploader.report_failure('folder/x', RuntimeError('its commit failed'))
    with pytest.raises(UploadError) as raised:
        uploader.shutdown()
    assert seen == [(False, 1)] and set(raised.value.failures) == {'folder/x'}
    uploader.shutdown()  # idempotent


def test_can_link_and_drain_of_what_a_dead_process_left(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=1, error='denied')
    uploader = make(tmp_path, store)
    (tmp_path / 'here').mkdir()
    assert uploader.can_link(str(tmp_path / 'here'))
    uploader.enqueue(write(tmp_path / 'd', b'dd'), 'left.bin')
    assert uploader.wait_for_uploads(30)
    with pytest.raises(UploadError):
        uploader.shutdown()  # failed: it stays in staging
    report = Uploader.drain(
        tmp_path / 'staging',
        object_store=TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state2')),
        progress_bar=False,
    )
    assert report.uploaded == ['left.bin'] and store.read('left.bin') == b'dd'
    assert not os.path.exists(tmp_path / 'staging' / 'rank0')


@pytest.mark.parametrize(
    'kwargs,error,match',
    [
        ({}, ValueError, 'exactly one'),
        ({'bucket_uri': 'magic://b'}, ValueError, "'magic'"),
        ({'bucket_uri': '/tmp/b', 'num_attempts': 0}, ValueError, 'num_attempts'),
        ({'bucket_uri': '/tmp/b', 'max_staged_bytes': True}, ValueError, 'max_staged_bytes'),
        ({'bucket_uri': '/tmp/b', 'upload_priority': 'loud'}, ValueError, 'loud'),
        ({'bucket_uri': '/tmp/b', 'run_name': 3}, TypeError, 'run_name'),
        ({'object_store': object()}, TypeError, 'upload_object'),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(kwargs, error, match):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with pytest.raises(error, match=match):
            Uploader(**kwargs)


def test_after_a_fatal_error_close_stops_waiting_for_a_bucket_that_does_not_answer(tmp_path, monkeypatch):
    """Issue 40: once the process noted a fatal error, close waits only while uploads land; what did not land
    stays in staging (reported in the UploadError) and drain delivers it later."""
    from dist_logging import dist
    from dist_logging.upload import _progress

    monkeypatch.setattr(_progress, 'FATAL_STALL_SECONDS', 1.0)
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=10**6, error='reset', delay=0.2)
    uploader = make(tmp_path, store)
    uploader.retry_policy = RetryPolicy(num_attempts=1000, initial_backoff=0.01, max_backoff=0.05)  # ~4 min
    uploader.enqueue(write(tmp_path / 'a', b'aa'), 'left.bin')
    deadline = time.monotonic() + 60
    while store.attempts('left.bin') < 2:  # the bucket fails (a loaded machine may start the worker late)
        assert time.monotonic() < deadline, 'the worker never tried twice'
        time.sleep(0.05)
    dist.note_fatal_error(RuntimeError('a logging collective failed'))  # forgotten after the test (conftest)
    started = time.monotonic()
    with pytest.raises(UploadError) as raised:
        uploader.shutdown()
    took = time.monotonic() - started
    assert set(raised.value.failures) == {'left.bin'}, raised.value
    assert took < 30, took  # liveness: the stall (1 s) plus stopping the workers, never the retries' 4 minutes
    assert store.successes('left.bin') == 0
    report = Uploader.drain(
        tmp_path / 'staging',
        object_store=TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state2')),
        progress_bar=False,
    )
    assert report.uploaded == ['left.bin'] and store.read('left.bin') == b'aa'


def test_after_a_fatal_error_close_still_waits_while_uploads_land(tmp_path, monkeypatch):
    from dist_logging import dist
    from dist_logging.upload import _progress

    monkeypatch.setattr(_progress, 'FATAL_STALL_SECONDS', 1.0)
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), delay=0.4)
    uploader = make(tmp_path, store, num_concurrent_uploads=1)
    names = [f'f{i}' for i in range(6)]  # 2.4 s of uploads, one landing every 0.4 s
    for name in names:
        uploader.enqueue(write(tmp_path / name, name.encode()), name)
    dist.note_fatal_error(RuntimeError('a logging collective failed'))
    uploader.shutdown()
    assert all(store.successes(name) == 1 for name in names)
