"""The exit-time wait for gloo's worker threads (dist_logging/_gloo_exit.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from dist_logging._world import gloo_exit as _gloo_exit


def _fake_tasks(tmp_path, threads: dict[str, tuple[str, str]]):
    """A /proc/self/task look-alike: tid -> (comm, state); each thread has used 1000 ns of CPU."""
    for tid, (comm, state) in threads.items():
        (tmp_path / tid).mkdir()
        _set_thread(tmp_path, tid, comm, state, 1000)
    return str(tmp_path)


def _set_thread(tmp_path, tid, comm, state, cpu_ns):
    (tmp_path / tid / 'stat').write_text(f'{tid} ({comm}) {state} 1 2 3 0 -1 0 1 0 0 0 7 8 0 0 20\n')
    (tmp_path / tid / 'schedstat').write_text(f'{cpu_ns} 0 1\n')


def test_no_gloo_threads_returns_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(_gloo_exit, '_TASKS', _fake_tasks(tmp_path, {'1': ('python', 'R'), '2': ('a (b) c', 'R')}))
    started = time.monotonic()
    assert _gloo_exit.wait_for_idle_gloo_workers(timeout=5) is True
    assert time.monotonic() - started < 1


def test_thread_names_with_parentheses_and_the_cpu_time_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(
        _gloo_exit, '_TASKS', _fake_tasks(tmp_path, {'2': ('pt_gloo_runloop', 'S'), '3': ('x) (pt_gloo_runloop', 'R')})
    )
    assert _gloo_exit._gloo_workers() == {'2': ('S', 1000)}
    (tmp_path / '2' / 'schedstat').unlink()  # no schedstat: utime + stime in clock ticks
    assert _gloo_exit._gloo_workers() == {'2': ('S', 15)}


@pytest.mark.parametrize('busy', ['R', 'S'], ids=['runnable', 'asleep-but-running-between-polls'])
def test_a_busy_worker_is_waited_for_until_the_timeout(tmp_path, monkeypatch, busy):
    monkeypatch.setattr(
        _gloo_exit,
        '_TASKS',
        _fake_tasks(tmp_path, {'1': ('python', 'S'), '2': ('pt_gloo_runloop', 'S'), '3': ('pt_gloo_runloop', busy)}),
    )
    real_workers = _gloo_exit._gloo_workers
    cpu = iter(range(2000, 10**9, 1000))

    def workers_with_thread_3_running():  # e.g. waiting for the GIL at each poll, running in between
        _set_thread(tmp_path, '3', 'pt_gloo_runloop', busy, next(cpu))
        return real_workers()

    monkeypatch.setattr(_gloo_exit, '_gloo_workers', workers_with_thread_3_running)
    started = time.monotonic()
    assert _gloo_exit.wait_for_idle_gloo_workers(timeout=0.2) is False
    assert 0.2 <= time.monotonic() - started < 5


def test_returns_once_every_worker_stays_asleep(tmp_path, monkeypatch):
    tasks = _fake_tasks(tmp_path, {'2': ('pt_gloo_runloop', 'S'), '3': ('pt_gloo_runloop', 'R')})
    monkeypatch.setattr(_gloo_exit, '_TASKS', tasks)
    polls = []
    real_workers = _gloo_exit._gloo_workers

    def workers_then_idle():
        polls.append(1)
        if len(polls) == 4:  # the busy worker finishes its item and goes to sleep
            _set_thread(tmp_path, '3', 'pt_gloo_runloop', 'S', 5000)
        return real_workers()

    monkeypatch.setattr(_gloo_exit, '_gloo_workers', workers_then_idle)
    assert _gloo_exit.wait_for_idle_gloo_workers(timeout=10) is True
    assert len(polls) == 4 + _gloo_exit._IDLE_POLLS  # asleep, CPU time unchanged, on that many polls in a row


def test_threads_that_vanish_or_unreadable_proc_are_not_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(_gloo_exit, '_TASKS', str(tmp_path / 'missing'))
    assert _gloo_exit.wait_for_idle_gloo_workers(timeout=1) is True
    (tmp_path / 'tasks' / '7').mkdir(parents=True)  # a thread that ended: its folder, no stat
    monkeypatch.setattr(_gloo_exit, '_TASKS', str(tmp_path / 'tasks'))
    assert _gloo_exit.wait_for_idle_gloo_workers(timeout=1) is True


@pytest.mark.parametrize('bad', [-1, float('nan')])
def test_bad_timeout_is_named(bad):
    with pytest.raises(ValueError, match='timeout'):
        _gloo_exit.wait_for_idle_gloo_workers(timeout=bad)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc/self/task')
def test_real_gloo_group_workers_are_found_and_idle_after_a_collective(tmp_path):
    """A real (one-process) gloo group: its worker threads are seen, and are idle once the collective returned.

    Run in a subprocess: the group's threads must not outlive the test in the pytest worker.
    """
    script = textwrap.dedent(f"""
        import torch, torch.distributed as dist
        from dist_logging._world import gloo_exit as _gloo_exit
        dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        states = _gloo_exit._gloo_workers()
        assert states, 'no gloo worker thread found'
        assert _gloo_exit.wait_for_idle_gloo_workers(timeout=10) is True
        dist.destroy_process_group()
        print('workers', len(states))
    """)
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) >= 1  # gloo starts 2; a second may not be named yet under load


def test_importing_the_package_registers_the_wait_at_exit():
    script = textwrap.dedent("""
        import dist_logging
        from dist_logging._world import gloo_exit as _gloo_exit
        real = _gloo_exit._gloo_workers
        def reporting():
            print('looked for gloo workers at exit', flush=True)
            return real()
        _gloo_exit._gloo_workers = reporting
    """)
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'looked for gloo workers at exit'
