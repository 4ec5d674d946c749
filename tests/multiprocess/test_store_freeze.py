"""Issue 31 on one host: the rendezvous store stops answering (torchrun's agent, which hosts it, is stopped)
while a peer is frozen. The surviving rank's batch_end raises within sync_timeout + slack and the
process ends, without SIGKILL; and a SIGTERM ends a rank blocked in the logging path within seconds,
with what FileLogger held on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from dist_logging._world.watch import process_state

from torchrun_helper import base_env, torchrun_command, write_script

pytestmark = pytest.mark.timeout(180)

SYNC_TIMEOUT = 5.0
SLACK = 2 * 2.0 + 0.75 + 3.0  # two store reads (2 s each), 1.5 beat periods, a loaded machine

SCENARIO = '''
import json, os, signal, sys, time
import torch.distributed as torch_dist
from dist_logging import Logger, dist
from dist_logging.destinations import FileLogger

mode, out = sys.argv[1], os.environ['OUT_DIR']
dist.init_process_group_from_env(timeout=60)
rank = torch_dist.get_rank()
logger = Logger(FileLogger(out + '/rank{rank}.txt'), run_name='freeze', sync_timeout=float(sys.argv[2]))
with open(f'{out}/pid{rank}', 'w') as handle:
    handle.write(str(os.getpid()))
step = 0
try:
    for step in range(1, 1000):
        logger.log_metrics({'loss': float(rank)}, reduce='mean')
        logger.log_metrics({f'token_{step}': step})
        with open(f'{out}/entered{rank}', 'w') as handle:
            handle.write(str(step))
        logger.batch_end()
        if step == 4 and rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        if step == 4 and rank == 0 and mode == 'store':
            os.kill(os.getppid(), signal.SIGSTOP)  # torchrun's agent: it hosts the rendezvous store
        time.sleep(0.1)
except Exception as exc:
    with open(f'{out}/error{rank}.json', 'w') as handle:
        json.dump({'type': type(exc).__name__, 'message': str(exc), 'wall': time.time(), 'step': step}, handle)
    raise
'''


def _start(tmp_path, mode, sync_timeout):
    script = write_script(tmp_path, SCENARIO)
    out = tmp_path / 'out'
    out.mkdir()
    cmd = torchrun_command(script, 2, [mode, str(sync_timeout)])
    job = subprocess.Popen(
        cmd,
        env=base_env(out),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return job, out


def _stop(job, out):
    """Thaw and end everything the job left: torchrun's agent and its process group, and each worker by the pid
    it wrote (torchrun starts its workers in sessions of their own, so a worker that stopped itself would
    otherwise outlive the agent, stopped, forever)."""
    pids = [int(path.read_text()) for path in out.glob('pid*') if path.read_text().strip()]
    pids = [pid for pid in pids if _runs_scenario(pid, out.parent)]  # not a pid reused by another process
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    job.wait(timeout=30)


def _runs_scenario(pid, folder):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as handle:
            return str(folder).encode() in handle.read()
    except OSError:
        return False


def _wait(predicate, timeout, what):
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f'timed out waiting for {what}'
        time.sleep(0.05)
    return time.monotonic() - start


def _gone(pid):
    return process_state(pid) is None  # ended, or a zombie its launcher has not reaped yet


def _step(path):
    return int(path.read_text() or 0) if path.exists() else 0


def test_a_stopped_store_and_a_frozen_peer_end_in_a_named_error_and_the_process_exits(tmp_path):
    job, out = _start(tmp_path, 'store', SYNC_TIMEOUT)
    try:
        _wait(lambda: _step(out / 'entered0') >= 5 and _step(out / 'entered1') >= 4, 90, 'step 5')
        frozen_at = time.time()
        _wait(lambda: (out / 'error0.json').exists(), SYNC_TIMEOUT + SLACK + 5, "rank 0's error")
        error = json.loads((out / 'error0.json').read_text())
        pid = int((out / 'pid0').read_text())
        exited_after = _wait(lambda: _gone(pid), 20, 'rank 0 to exit') + (time.time() - frozen_at)
    finally:
        _stop(job, out)
    raised_after = error['wall'] - frozen_at
    print(
        f'[one host] store and peer frozen: raised after {raised_after:.2f} s, process gone {exited_after:.2f} s '
        'after the freeze'
    )
    assert error['type'] == 'DistributedLoggingError', error
    assert raised_after < SYNC_TIMEOUT + SLACK, error
    assert 'cannot tell which other ranks are missing' in error['message'], error
    assert 'is stopped (SIGSTOP)' in error['message'], error  # rank 1, seen in /proc on this host
    assert exited_after < SYNC_TIMEOUT + SLACK + 10


def test_sigterm_ends_a_rank_blocked_in_the_logging_path_and_flushes_its_file(tmp_path):
    job, out = _start(tmp_path, 'peer', 60.0)  # rank 1 frozen; rank 0 would wait 60 s
    try:
        _wait(lambda: _step(out / 'entered0') >= 5, 90, 'rank 0 to block at a flush')
        time.sleep(1.0)  # inside batch_end, waiting for rank 1
        pid, step = int((out / 'pid0').read_text()), _step(out / 'entered0')
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        ended_after = _wait(lambda: _gone(pid), 10, 'rank 0 to end on SIGTERM')
        assert time.monotonic() - sent < 5
    finally:
        _stop(job, out)
    print(f'[one host] SIGTERM while blocked in batch_end: process gone after {ended_after:.2f} s')
    assert ended_after < 3
    assert f'token_{step}' in (out / 'rank0.txt').read_text()  # logged before the blocking call: flushed
