"""Real launchers without torchrun (issue 21): a private one-node SLURM (srun -n 2, srun -n 4, sbatch) and
Open MPI's mpirun, each running launcher_scenario.py: setup_logging first, then init_process_group_from_env,
log, reduce a metric, upload a per-rank file, time a section with rank reports on (issue 32).

Checked each time: the launcher is detected before the process group exists, console lines are printed
once, one file per rank (locally and in the bucket), the reduced value is right, the run name is the
same on every rank and derived from the job. One slurmctld serves every SLURM test (module fixture);
tests skip with the reason when the packages (``make install`` as root installs them) or root are missing.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

from slurm_cluster import ClusterUnavailable, first_job_id, start_cluster
from torchrun_helper import REPO_ROOT, base_env

# One worker runs the module (make test: --dist loadgroup), so the private SLURM cluster starts once.
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300), pytest.mark.xdist_group('slurm_cluster')]

SCENARIO = REPO_ROOT / 'tests' / 'multiprocess' / 'launcher_scenario.py'


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
    try:
        cluster = start_cluster(tmp_path_factory.mktemp('slurm'))
    except ClusterUnavailable as exc:
        pytest.skip(f'no private SLURM: {exc}')
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def _env(root: pathlib.Path, extra: dict | None = None) -> dict[str, str]:
    env = base_env(root)
    env.update(extra or {})
    return env


def _check_job(root: pathlib.Path, n: int, launcher: str, console: str) -> dict[int, dict]:
    outputs = {int(p.stem[8:]): json.loads(p.read_text()) for p in root.glob('out-rank*.json')}
    assert sorted(outputs) == list(range(n)), console
    run_names = {out['run_name'] for out in outputs.values()}
    assert len(run_names) == 1, run_names
    (run_name,) = run_names
    for rank, out in outputs.items():
        assert out['before'] == {'rank': rank, 'world_size': n, 'launcher': launcher}, out
        assert (out['launcher'], out['world_size']) == (launcher, n)
        assert out['python_log'] == f'{root}/py/{run_name}/rank{rank}.log'
        assert f'hello from rank {rank} of {n}' in pathlib.Path(out['python_log']).read_text()
    # one file per rank, locally and in the bucket
    assert sorted(p.name for p in (root / 'local' / run_name).glob('*.txt')) == [f'rank{r}.txt' for r in range(n)]
    uploaded = {p.name for p in (root / 'bucket' / run_name).iterdir()}
    assert sorted(p for p in uploaded if p.endswith('.txt')) == [f'rank{r}.txt' for r in range(n)]
    assert 'rank_history.jsonl' in uploaded, uploaded  # the rank reports' history, uploaded by rank zero
    for rank in range(n):
        assert f'my_rank: {rank} ' in (root / 'bucket' / run_name / f'rank{rank}.txt').read_text()
    # the reduced value (sum of rank + 1), emitted on rank zero
    expected = n * (n + 1) // 2
    assert f'rank_plus_one: {float(expected)} ' in (root / 'bucket' / run_name / 'rank0.txt').read_text()
    # console: printed once (rank zero), not once per rank
    assert console.count('scenario: hello from rank') == 1, console
    assert 'hello from rank 0' in console
    # rank reports: the second report (batch 5 is not one: every 2 steps after the warm-up step) on every rank;
    # rank zero's is complete and names every rank with its host
    host = socket.gethostname()
    for rank, out in outputs.items():
        report = out['report']
        assert (report['batch'], report['world_size'], report['own_rank'], report['own_host']) == (4, n, rank, host)
        assert report['complete'] == (rank == 0) and 'work' in report['series'] and 'busy' in report['series']
    assert outputs[0]['report']['slowest'] == [[r, host] for r in range(min(n, 5))], outputs[0]['report']
    return outputs


def _check_slurm_names(outputs: dict[int, dict]) -> None:
    job, step = outputs[0]['job'], outputs[0]['step']
    assert job and step is not None
    assert all(out['run_name'] == f'slurm-{job}-{step}' for out in outputs.values())


@pytest.mark.parametrize('n', [2, 4])
def test_srun(slurm, tmp_path, n):
    env = _env(tmp_path, {'SLURM_CONF': str(slurm.conf)})
    result = slurm.run(
        ['srun', '-n', str(n), '--time=3', sys.executable, str(SCENARIO), str(tmp_path)],
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:] + slurm.logs()
    outputs = _check_job(tmp_path, n, 'slurm', result.stdout + result.stderr)
    _check_slurm_names(outputs)
    assert {out['local_rank'] for out in outputs.values()} == set(range(n))  # one node


def test_sbatch(slurm, tmp_path):
    script = tmp_path / 'job.sh'
    script.write_text(f'#!/bin/bash\nsrun {sys.executable} {SCENARIO} {tmp_path}\n')
    env = _env(tmp_path, {'SLURM_CONF': str(slurm.conf)})
    submitted = slurm.run(
        ['sbatch', '--parsable', '-n', '2', '--time=3', f'--output={tmp_path}/job.out', str(script)],
        env=env,
        cwd=tmp_path,
    )
    job = first_job_id(submitted.stdout)
    assert job, submitted.stderr
    state = slurm.wait_job(job, timeout=240)
    console = (tmp_path / 'job.out').read_text()
    assert state == 'COMPLETED', console[-4000:] + slurm.logs()
    outputs = _check_job(tmp_path, 2, 'slurm', console)
    _check_slurm_names(outputs)
    assert outputs[0]['job'] == job


@pytest.mark.skipif(
    shutil.which('mpirun') is None,
    reason="mpirun not installed (Debian's openmpi-bin; make install installs it when run as root)",
)
def test_mpirun(tmp_path):
    cmd = ['mpirun', '-np', '2', '--oversubscribe']
    if os.geteuid() == 0:
        cmd.append('--allow-run-as-root')
    env = _env(tmp_path)
    result = subprocess.run(
        [*cmd, sys.executable, str(SCENARIO), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    outputs = _check_job(tmp_path, 2, 'openmpi', result.stdout + result.stderr)
    assert outputs[0]['run_name'].startswith('mpi-')
    assert outputs[0]['master'].startswith('127.0.0.1:')
