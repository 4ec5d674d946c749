"""SIGKILL with uploads in flight (worker threads and worker processes), under real torchrun.

* One rank is killed: torchrun restarts the job (``--max_restarts=1``); the restarted ranks
  resume what their staging folders hold.
* The whole job is killed (every rank, then the launcher): a new launch on the same staging
  folder resumes everything.

Either way every accepted file ends in the store exactly once under its name, byte-identical
(objects appear whole or not at all), and nothing stays pending.
(``tests/multiprocess/test_upload_crash.py`` covers the third way back: ``drain`` without a job.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from dist_logging.upload.drain import list_pending
from reliability._common import TESTS_DIR, bucket_objects
from torchrun_helper import REPO_ROOT, base_env, read_rank_outputs, run_torchrun, torchrun_command, write_script
from upload._stores import TestStore

pytestmark = pytest.mark.multiprocess

NPROC = 2
M = 6

SCENARIO = '''
import hashlib, json, os, sys, time
from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from torchrun_helper import dump_rank_output
from upload._stores import TestStore

workers, root, M, phase = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank = int(os.environ['RANK'])
restart = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))
store = TestStore(root + '/bucket', root + '/store-state', delay=0.5)
rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=root + '/staging',
                               use_procs=(workers == 'procs'), num_concurrent_uploads=2)
logger = Logger(rud, run_name='death')  # a restarted rank resumes its staging folder here
if phase == 'crash' and restart == 0:
    sums = {}
    for i in range(M):
        data = os.urandom(300_000 + 1000 * i + rank)
        path = f'{root}/src/rank{rank}-{i}.bin'
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as handle:
            handle.write(data)
        logger.upload_file('ckpt/rank{rank}/file%d.bin' % i, path, copy=(i % 2 == 0))
        sums[f'ckpt/rank{rank}/file{i}.bin'] = hashlib.sha256(data).hexdigest()
    with open(f'{root}/sums-rank{rank}.json', 'w') as handle:
        json.dump(sums, handle)
    with open(f'{root}/ready-rank{rank}.tmp', 'w') as handle:
        handle.write(str(os.getpid()))
    os.replace(f'{root}/ready-rank{rank}.tmp', f'{root}/ready-rank{rank}')
    time.sleep(600)  # training goes on until it is killed
logger.close()  # the restarted / relaunched job: wait for what was resumed
dump_rank_output({'restart': restart, 'phase': phase})
'''


def _env(out):
    env = base_env(out)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    return env


def _wait_ready(tmp_path, proc, deadline=150):
    ready = [tmp_path / f'ready-rank{r}' for r in range(NPROC)]
    end = time.monotonic() + deadline
    while not all(p.exists() for p in ready):
        if proc.poll() is not None or time.monotonic() > end:
            return None
        time.sleep(0.05)
    time.sleep(0.3)  # some uploads land, others are in flight or queued
    return [int(p.read_text()) for p in ready]


def _landed(tmp_path) -> int:
    return sum(1 for p in (tmp_path / 'store-state').glob('landed-*'))


def _check_store(tmp_path, landed_at_kill):
    sums = {}
    for r in range(NPROC):
        sums.update(json.loads((tmp_path / f'sums-rank{r}.json').read_text()))
    assert len(sums) == NPROC * M
    assert landed_at_kill < len(sums), 'the kill came too late: nothing was in flight'
    assert bucket_objects(tmp_path / 'bucket') == sums  # every file, whole, under its name, nothing else
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'store-state'))
    # once: a resumed overwrite=False upload that finds its object does not upload it again
    assert all(store.successes(name) <= 1 for name in sums), {n: store.successes(n) for n in sums}
    assert list_pending(str(tmp_path / 'staging')) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize('workers', ['threads', 'procs'])
def test_sigkill_one_rank_then_torchrun_restarts(tmp_path, workers):
    script = write_script(tmp_path, SCENARIO)
    out = tmp_path / 'out'
    out.mkdir()
    cmd = torchrun_command(script, NPROC, [workers, str(tmp_path), str(M), 'crash'], max_restarts=1)
    proc = subprocess.Popen(
        cmd,
        env=_env(out),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        pids = _wait_ready(tmp_path, proc)
        assert pids is not None, 'ranks never got ready'
        os.kill(pids[1], signal.SIGKILL)  # one rank dies; torchrun stops the others and restarts all
        landed_at_kill = _landed(tmp_path)
        output = proc.communicate(timeout=200)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, output[-6000:]
    outputs = read_rank_outputs(out)
    assert sorted(outputs) == list(range(NPROC)) and all(o['restart'] == 1 for o in outputs.values())
    _check_store(tmp_path, landed_at_kill)


@pytest.mark.timeout(300)
@pytest.mark.parametrize('workers', ['threads', 'procs'])
def test_sigkill_whole_job_then_relaunch(tmp_path, workers):
    script = write_script(tmp_path, SCENARIO)
    out = tmp_path / 'out'
    out.mkdir()
    cmd = torchrun_command(script, NPROC, [workers, str(tmp_path), str(M), 'crash'])
    proc = subprocess.Popen(
        cmd,
        env=_env(out),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        pids = _wait_ready(tmp_path, proc)
        assert pids is not None, 'ranks never got ready'
    finally:
        for r in range(NPROC):  # every rank dies at once, then the launcher
            ready = tmp_path / f'ready-rank{r}'
            if ready.exists():
                try:
                    os.kill(int(ready.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        landed_at_kill = _landed(tmp_path)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert list_pending(str(tmp_path / 'staging')), 'nothing was left pending'
    run_torchrun(
        script,
        NPROC,
        out,
        args=[workers, str(tmp_path), str(M), 'resume'],
        env={'PYTHONPATH': _env(out)['PYTHONPATH']},
        timeout=200,
    )
    outputs = read_rank_outputs(out)
    assert sorted(outputs) == list(range(NPROC)) and all(o['phase'] == 'resume' for o in outputs.values())
    _check_store(tmp_path, landed_at_kill)
