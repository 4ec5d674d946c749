"""The scheduler and executors: per-name ordering, superseding, dead workers replaced."""

from __future__ import annotations

import os
import threading

import pytest

from dist_logging.upload.retry import RetryPolicy
from dist_logging.upload.workers import UploadScheduler, UploadTask
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(60)

FAST = RetryPolicy(num_attempts=3, initial_backoff=0.01)


class Recorder:
    def __init__(self):
        self.done, self.failed, self.superseded = [], {}, []
        self.lock = threading.Lock()

    def kwargs(self):
        return dict(
            on_done=lambda t: self.done.append(t.id),
            on_failed=lambda t, e: self.failed.__setitem__(t.id, e),
            on_superseded=lambda t: self.superseded.append(t.id),
        )


def _task(tmp_path, upload_id, name, data):
    path = tmp_path / f'snap{upload_id}'
    path.write_bytes(data)
    return UploadTask(upload_id, name, str(path), len(data), True)


def test_one_in_flight_per_name_newest_wins(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), gate=str(gate))
    rec = Recorder()
    scheduler = UploadScheduler(store, FAST, 4, **rec.kwargs())
    for i in range(1, 6):
        scheduler.submit(_task(tmp_path, i, 'latest', f'v{i}'.encode()))
    scheduler.submit(_task(tmp_path, 9, 'other', b'o'))
    assert not scheduler.wait(0.3)  # 'latest' v1 is held at the gate; 'other' is not blocked by it
    gate.unlink()
    assert scheduler.wait(20)
    scheduler.shutdown()
    assert store.read('latest') == b'v5'
    assert sorted(rec.done) == [1, 5, 9] and sorted(rec.superseded) == [2, 3, 4] and not rec.failed
    assert store.attempts('latest') == 2  # v1 (already running) and v5


def test_dead_thread_is_replaced_and_task_retried(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=1, error='exit')
    rec = Recorder()
    scheduler = UploadScheduler(store, FAST, 1, **rec.kwargs())
    scheduler.submit(_task(tmp_path, 1, 'a', b'a'))
    scheduler.submit(_task(tmp_path, 2, 'b', b'b'))
    assert scheduler.wait(20)
    scheduler.shutdown()
    assert sorted(rec.done) == [1, 2] and not rec.failed
    assert store.read('a') == b'a' and store.read('b') == b'b'


def test_failures_are_reported_not_raised(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=99, error='denied')
    rec = Recorder()
    scheduler = UploadScheduler(store, FAST, 2, **rec.kwargs())
    scheduler.submit(_task(tmp_path, 1, 'a', b'a'))
    assert scheduler.wait(20)
    scheduler.shutdown()
    assert isinstance(rec.failed[1], PermissionError) and store.attempts('a') == 1


@pytest.mark.timeout(90)
def test_process_workers_survive_a_killed_child(tmp_path):
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), fail_first=1, error='kill')
    rec = Recorder()
    scheduler = UploadScheduler(store, FAST, 2, use_procs=True, **rec.kwargs())
    pids = scheduler.executor.child_pids()
    assert len(pids) == 2 and os.getpid() not in pids
    for i, name in enumerate(['k', 'x', 'y', 'z'], 1):
        scheduler.submit(_task(tmp_path, i, name, name.encode() * 3))
    assert scheduler.wait(60)
    assert sorted(rec.done) == [1, 2, 3, 4], rec.failed
    assert all(store.read(n) == n.encode() * 3 for n in 'kxyz')
    assert set(scheduler.executor.child_pids()) != set(pids)  # the killed children were replaced
    scheduler.shutdown()
