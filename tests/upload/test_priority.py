"""Upload workers run below the training loop: SCHED_IDLE, nice 19 and best-effort I/O level 7, per worker thread
or process."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.upload.priority import (
    IOPRIO_CLASS_BE,
    IOPRIO_LOWEST_LEVEL,
    WORKER_NICE,
    get_ioprio,
    thread_nice,
    thread_policy,
)
from upload._probes import PriorityProbeStore

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith('linux'), reason='per-thread priorities are Linux-only'),
]


def _upload_and_probe(tmp_path, **kwargs):
    store = PriorityProbeStore(str(tmp_path / 'bucket'), str(tmp_path / 'probe'))
    rud = RemoteUploaderDownloader(
        object_store=store, upload_staging_folder=str(tmp_path / 'staging'), num_concurrent_uploads=2, **kwargs
    )
    src = tmp_path / 'ckpt.bin'
    src.write_bytes(b'weights')
    rud.upload_file(None, 'ckpt.bin', str(src))
    assert rud.wait_for_uploads(30)
    rud.shutdown()
    assert (tmp_path / 'bucket' / 'ckpt.bin').read_bytes() == b'weights'
    return json.loads((tmp_path / 'probe' / 'ckpt.bin.json').read_text())


def _main_thread():
    return thread_nice(), thread_policy(), get_ioprio()


@pytest.mark.parametrize('use_procs', [False, True], ids=['threads', 'procs'])
@pytest.mark.parametrize('level', [None, 'idle', 'low'])
def test_workers_run_at_the_lowest_priority_by_default(tmp_path, use_procs, level):
    before = _main_thread()
    seen = _upload_and_probe(tmp_path, use_procs=use_procs, **({'upload_priority': level} if level else {}))
    assert (seen['pid'] != os.getpid()) == use_procs
    assert seen['tid'] != threading.get_native_id()
    assert seen['nice'] == WORKER_NICE
    # 'idle' (the default) adds SCHED_IDLE; 'low' keeps the normal policy.
    assert seen['policy'] == (os.SCHED_OTHER if level == 'low' else os.SCHED_IDLE)
    if seen['ioprio'] is not None:  # x86_64 / aarch64
        assert tuple(seen['ioprio']) == (IOPRIO_CLASS_BE, IOPRIO_LOWEST_LEVEL)
    # The training thread is untouched: nice, policy and ioprio are per thread on Linux.
    assert _main_thread() == before


@pytest.mark.parametrize('use_procs', [False, True], ids=['threads', 'procs'])
def test_normal_priority_leaves_workers_alone(tmp_path, use_procs):
    nice, policy, ioprio = _main_thread()
    seen = _upload_and_probe(tmp_path, use_procs=use_procs, upload_priority='normal')
    assert seen['nice'] == nice and seen['policy'] == policy
    assert (tuple(seen['ioprio']) if seen['ioprio'] is not None else None) == ioprio


@pytest.mark.parametrize('bad', ['lowest', 'LOW', '', None, 19])
def test_bad_priority_is_refused_at_construction(tmp_path, bad):
    with pytest.raises(ValueError, match=repr(bad).replace('(', r'\(')):
        RemoteUploaderDownloader(str(tmp_path / 'bucket'), upload_priority=bad)


def test_unknown_architecture_degrades_to_cpu_priority_only(monkeypatch, caplog):
    from dist_logging.upload import priority

    monkeypatch.setattr(priority.platform, 'machine', lambda: 'riscv64')
    monkeypatch.setattr(priority, '_warned', set())
    seen = {}

    def worker():
        priority.lower_current_thread()
        priority.lower_current_thread()
        seen['nice'] = thread_nice()

    with caplog.at_level('DEBUG', logger=priority.__name__):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
    assert seen['nice'] == WORKER_NICE
    assert priority.get_ioprio() is None
    notes = [r for r in caplog.records if 'ioprio_set' in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelname == 'DEBUG'  # said once, quietly


def test_a_refused_sched_idle_keeps_nice_19(monkeypatch, caplog):
    """A sandbox that refuses sched_setscheduler: the worker still runs at nice 19, said once at debug level."""
    from dist_logging.upload import priority

    def refuse(*args):
        raise PermissionError(1, 'Operation not permitted')

    monkeypatch.setattr(priority.os, 'sched_setscheduler', refuse)
    monkeypatch.setattr(priority, '_warned', set())
    seen = {}

    def worker():
        priority.lower_current_thread('idle')
        priority.lower_current_thread('idle')
        seen.update(nice=thread_nice(), policy=thread_policy())

    with caplog.at_level('DEBUG', logger=priority.__name__):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
    assert seen == {'nice': WORKER_NICE, 'policy': os.SCHED_OTHER}
    notes = [r for r in caplog.records if 'scheduling policy' in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelname == 'DEBUG'
