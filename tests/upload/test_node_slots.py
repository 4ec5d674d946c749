"""The per-machine cap on concurrent uploads (DIST_LOGGING_NODE_UPLOAD_SLOTS)."""

import threading

import pytest

from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.upload.node_slots import ENV_VAR, NodeUploadSlots
from dist_logging.upload.retry import Interrupted
from upload._stores import TestStore


def _upload_many(tmp_path, store, use_procs, count=6):
    uploader = RemoteUploaderDownloader(
        object_store=store,
        num_concurrent_uploads=3,
        use_procs=use_procs,
        upload_staging_folder=str(tmp_path / 'staging'),
    )
    logger = Logger([uploader], run_name='r')
    for i in range(count):
        path = tmp_path / f'f{i}'
        path.write_bytes(b'x' * 1000)
        logger.upload_file(f'obj{i}', path)
    logger.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize('use_procs,slots', [(False, 1), (False, 2), (True, 1)])
def test_node_cap_bounds_uploads_in_flight(tmp_path, monkeypatch, use_procs, slots):
    monkeypatch.setenv(ENV_VAR, str(slots))
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), delay=0.15)
    _upload_many(tmp_path, store, use_procs)
    assert all(store.successes(f'obj{i}') == 1 for i in range(6))
    assert store.max_concurrency() == slots


@pytest.mark.timeout(120)
def test_without_a_cap_workers_overlap(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), delay=0.15)
    _upload_many(tmp_path, store, use_procs=False)
    assert store.max_concurrency() > 1


@pytest.mark.parametrize('raw', ['0', '-2', 'many'])
def test_bad_setting_fails_at_construction(tmp_path, monkeypatch, raw):
    monkeypatch.setenv(ENV_VAR, raw)
    with pytest.raises(ValueError, match=f"{ENV_VAR}='{raw}'"):
        RemoteUploaderDownloader(str(tmp_path / 'bucket'), upload_staging_folder=str(tmp_path / 'staging'))


@pytest.mark.timeout(30)
def test_waiting_for_a_slot_is_interruptible(tmp_path):
    slots = NodeUploadSlots(1, folder=str(tmp_path))
    stop = threading.Event()
    with slots.hold():
        stop.set()
        with pytest.raises(Interrupted):
            with slots.hold(stop):
                pass
    with slots.hold(stop) as index:  # released: free again
        assert index == 0
