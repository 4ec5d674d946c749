"""The black box on real torchrun jobs (gloo): a hang, a desync, a crash and a clean run (4 ranks), a SIGTERM (3).

Each test asserts what lands in the bucket (a local folder; for the crash, S3 on moto's server) and what
``dist-logging diagnose`` prints and returns. Workers are ended by pid at the end (torchrun gives them
sessions of their own).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time

import pytest

from dist_logging.postmortem import rank_of_path
from s3_server import aws_credentials, s3_server  # noqa: F401 - fixtures
from torchrun_helper import base_env, torchrun_command

pytestmark = pytest.mark.timeout(330)  # a 4-rank job; ~35 s on a 2-core machine shared by a few jobs

SCENARIO = pathlib.Path(__file__).with_name('pm_scenario.py')
NPROC = 4
START_SECONDS = 180.0  # bounds, not timings: the shared test machine may be heavily loaded
LAND_SECONDS = 90.0


def _line_of(marker: str) -> int:
    for number, line in enumerate(SCENARIO.read_text().splitlines(), 1):
        if marker in line:
            return number
    raise AssertionError(marker)


def _headers(bucket: pathlib.Path, run: str) -> dict[int, dict]:
    found = {}
    for path in bucket.glob(f'{run}/postmortem/attempt-*/rank-*/header.json'):
        try:
            header = json.loads(path.read_text())
        except ValueError:
            continue  # being written
        found[header['rank']] = header
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except FileNotFoundError:
        return False


def _sigterm_when_ready(out: pathlib.Path, deadline: float, nproc: int) -> dict[int, float]:
    """SIGTERM every worker once all are at the incident; worker pid -> when it was signalled."""
    while time.monotonic() < deadline and len(list(out.glob('ready*'))) < nproc:
        time.sleep(0.2)
    time.sleep(1.5)  # the others enter the all_reduce, rank 3 its sleep
    signalled = {}
    for path in out.glob('pid*'):
        pid = int(path.read_text())
        os.kill(pid, signal.SIGTERM)
        signalled[pid] = time.monotonic()
    return signalled


def _run(
    tmp_path: pathlib.Path, mode: str, wait_sets: int, *, nproc: int = NPROC, uri: str = ''
) -> tuple[pathlib.Path, str, subprocess.Popen]:
    """Run ``pm_scenario.py MODE`` on ``nproc`` ranks to ``uri`` (default: the folder ``tmp_path/bucket``)."""
    bucket, out = tmp_path / 'bucket', tmp_path / 'out'
    bucket.mkdir()
    out.mkdir()
    run = f'pm-{mode}'
    env = base_env(out, {'DIST_LOGGING_TMPDIR': str(tmp_path / 'state')})
    env.pop('TORCH_FR_BUFFER_SIZE', None)
    cmd = torchrun_command(SCENARIO, nproc, [mode, uri or str(bucket), run])
    proc = subprocess.Popen(
        cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        # The bounds count from the moment every rank is up (its Logger made): starting 1 + nproc interpreters
        # that import torch took 100 s on the 2-core machine under load, and that is not what is tested here.
        started = time.monotonic() + START_SECONDS
        while time.monotonic() < started and proc.poll() is None and len(list(out.glob('pid*'))) < nproc:
            time.sleep(0.2)
        deadline = time.monotonic() + LAND_SECONDS
        if mode == 'sigterm':
            signalled = _sigterm_when_ready(out, deadline, nproc)
            while time.monotonic() < deadline and any(_alive(pid) for pid in signalled):
                time.sleep(0.2)
            proc.ended_by_themselves = not any(_alive(pid) for pid in signalled)  # type: ignore[attr-defined]
        elif wait_sets:
            while time.monotonic() < deadline and len(_headers(bucket, run)) < wait_sets:
                time.sleep(0.2)
            time.sleep(0.5)  # the header is handed over last; let its neighbours' uploads finish
        else:
            proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        pids = [int(p.read_text()) for p in out.glob('pid*') if p.read_text().strip()]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _kill(pids)
        proc.communicate(timeout=30)
    return bucket, run, proc


def _diagnose(uri: str, *extra: str) -> subprocess.CompletedProcess:
    """``dist-logging diagnose`` in this process (a new interpreter costs many seconds on a loaded machine)."""
    import contextlib
    import io

    from dist_logging.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(['diagnose', uri, *extra])
    return subprocess.CompletedProcess(['dist-logging', 'diagnose', uri, *extra], code, out.getvalue(), err.getvalue())


def _culprits(first_line: str) -> set[int]:
    import re

    return {int(n) for n in re.findall(r'(?<!\w)rank (\d+)', first_line)}


def _assert_sets(bucket: pathlib.Path, run: str, ranks: set[int]) -> dict[int, dict]:
    """Every rank of ``ranks`` (the whole job) left a complete set, and nobody else."""
    headers = _headers(bucket, run)
    assert set(headers) == ranks, headers.keys()
    for rank, header in headers.items():
        assert header['world_size'] == len(ranks) and header['host'] and header['pid'] > 0
        assert header['attempt'] == '0' or header['attempt'] == 0
        folder = bucket / run / 'postmortem' / 'attempt-0'
        assert (folder / f'rank-{rank}' / 'stacks.txt').read_text().count('File "') > 0
        assert (folder / 'fr' / f'fr_trace_rank_{rank}').exists()
        assert header['flight_recorder'] == 'on'
        assert any(ranks <= set(group['ranks']) for group in header['groups'])
        for path in folder.rglob('*'):
            if path.is_file():
                assert rank_of_path(str(path.relative_to(folder))) is not None
    return headers


def _torch_loader_reads(folder: pathlib.Path) -> None:
    import argparse

    from torch.distributed.flight_recorder.components.loader import read_dir

    details, _ = read_dir(argparse.Namespace(trace_dir=str(folder), prefix=None))
    assert len(details) == NPROC


def test_hang(tmp_path):
    bucket, run, _ = _run(tmp_path, 'hang', NPROC)
    headers = _assert_sets(bucket, run, set(range(NPROC)))
    assert {h['reason'] for h in headers.values()} == {'hang'}
    _torch_loader_reads(bucket / run / 'postmortem' / 'attempt-0' / 'fr')
    result = _diagnose(str(bucket / run))
    first = result.stdout.splitlines()[0]
    assert result.returncode == 1, result.stdout + result.stderr
    assert first.startswith('hang:') and _culprits(first) == {3}, first
    assert 'all_reduce' in first and f'pm_scenario.py:{_line_of("CULPRIT-HANG")}' in first, first
    assert f'(host {headers[3]["host"]})' in first
    as_json = json.loads(_diagnose(str(bucket), '--run', run, '--json').stdout)
    assert as_json['culprits'] == [3] and as_json['kind'] == 'hang'


def test_desync(tmp_path):
    bucket, run, _ = _run(tmp_path, 'desync', NPROC)
    _assert_sets(bucket, run, set(range(NPROC)))
    result = _diagnose(str(bucket), '--run', run)
    first = result.stdout.splitlines()[0]
    assert result.returncode == 1, result.stdout + result.stderr
    assert first.startswith('desync:') and _culprits(first) == {3}, first
    assert 'broadcast' in first and 'all_reduce' in first


def _mirror(server, bucket: str, prefix: str, folder: pathlib.Path) -> None:
    """Download every object under ``prefix`` of the S3 bucket into ``folder`` (keys without the prefix)."""
    client = server.client()
    for page in client.get_paginator('list_objects_v2').paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get('Contents', []):
            path = folder / item['Key'][len(prefix) :]
            path.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item['Key'], str(path))


def test_crash(tmp_path, s3_server, monkeypatch):
    """One rank raises; its Logger uploads to S3 (moto's server over HTTP): every rank's set lands in the bucket
    under ``runs/{run}/postmortem/attempt-0/``, and ``diagnose s3://...`` reads them there, naming the raiser."""
    s3_bucket = s3_server.create_bucket()
    monkeypatch.setenv('AWS_ENDPOINT_URL', s3_server.endpoint)  # the ranks' and diagnose's S3 endpoint
    _, run, proc = _run(tmp_path, 'crash', 0, uri=f's3://{s3_bucket}/runs')
    assert proc.returncode != 0
    bucket = tmp_path / 'mirror'
    _mirror(s3_server, s3_bucket, 'runs/', bucket)
    # Every rank's set lands: the raising rank's (its exception) and the survivors' (their gloo error, torchrun's
    # SIGTERM arriving while they capture it, or the hang watchdog): consequences, which diagnose does not name.
    headers = _assert_sets(bucket, run, set(range(NPROC)))
    for rank in range(NPROC - 1):
        assert headers[rank]['reason'] in ('exception', 'sigterm', 'hang'), headers[rank]
    assert headers[3]['reason'] == 'exception' and headers[3]['exception']['type'] == 'ValueError'
    assert 'boom on purpose' in (bucket / run / 'postmortem' / 'attempt-0' / 'rank-3' / 'exception.txt').read_text()
    result = _diagnose(f's3://{s3_bucket}/runs/{run}')
    first = result.stdout.splitlines()[0] if result.stdout else ''
    assert result.returncode == 1, result.stdout + result.stderr
    assert first.startswith('crash:') and _culprits(first) == {3}, first
    assert 'ValueError: boom on purpose' in first and f'pm_scenario.py:{_line_of("CULPRIT-CRASH")}' in first
    by_bucket = _diagnose(f's3://{s3_bucket}/runs', '--run', run, '--json')
    assert by_bucket.returncode == 1 and json.loads(by_bucket.stdout)['culprits'] == [3], by_bucket.stdout


def test_clean_run_leaves_nothing(tmp_path):
    bucket, run, proc = _run(tmp_path, 'clean', 0)  # 4 ranks, as the scenarios
    assert proc.returncode == 0, proc.stdout.read() if proc.stdout else ''
    assert not (bucket / run / 'postmortem').exists()
    result = _diagnose(str(bucket / run))
    assert result.returncode == 0 and result.stdout.startswith('no postmortem'), result.stdout + result.stderr


def test_sigterm_while_waiting_in_a_gloo_collective(tmp_path):
    """A scheduler's SIGTERM reaches ranks stuck in all_reduce (no Python handler can run there) and a rank in
    a sleep: every rank captures, its set lands, and every process ends by itself (no SIGKILL). 3 ranks: two
    waiting in the collective, one sleeping (a fourth adds a process start, nothing to check)."""
    nproc = 3
    bucket, run, proc = _run(tmp_path, 'sigterm', 0, nproc=nproc)
    assert proc.ended_by_themselves
    headers = _assert_sets(bucket, run, set(range(nproc)))
    assert {h['reason'] for h in headers.values()} == {'sigterm'}
    result = _diagnose(str(bucket / run))
    first = result.stdout.splitlines()[0]
    assert result.returncode == 1 and first.startswith('hang:') and _culprits(first) == {nproc - 1}, result.stdout
