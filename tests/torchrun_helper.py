"""Launching real ``torchrun`` jobs from tests: free ports, temp dirs, bounded time.

A scenario is a Python script (a file, or source text written to a temp file). Each
rank usually writes its observations as JSON into ``OUT_DIR`` (an environment
variable set here) and the test reads them back with :func:`read_rank_outputs`.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
from typing import Iterable, Mapping, Optional, Sequence, Union

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def write_script(tmp_path: pathlib.Path, source: str, name: str = 'scenario.py') -> pathlib.Path:
    """Write dedented ``source`` to ``tmp_path/name`` and return its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def base_env(out_dir: pathlib.Path, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ)
    env['OUT_DIR'] = str(out_dir)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests"), env.get('PYTHONPATH', '')]).rstrip(
        os.pathsep
    )
    env['OMP_NUM_THREADS'] = '1'
    env.pop('DIST_LOGGING_RUN_NAME', None)
    for key in (
        'RANK',
        'LOCAL_RANK',
        'WORLD_SIZE',
        'LOCAL_WORLD_SIZE',
        'GROUP_RANK',
        'NODE_RANK',
        'MASTER_ADDR',
        'MASTER_PORT',
        'TORCHELASTIC_RUN_ID',
    ):
        env.pop(key, None)
    # A suite run inside a SLURM job or under mpirun must not hand the launcher's facts to its jobs.
    for key in list(env):
        if key.startswith(('SLURM_', 'OMPI_', 'PMI_', 'PMIX_', 'MPI_LOCAL', 'TORCHELASTIC_')):
            env.pop(key)
    if extra:
        env.update(extra)
    return env


def torchrun_command(
    script: pathlib.Path,
    nproc: int,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    node_rank: Optional[int] = None,
    rdzv_port: Optional[int] = None,
    max_restarts: int = 0,
) -> list[str]:
    cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={nproc}', f'--max_restarts={max_restarts}']
    if nnodes == 1 and rdzv_port is None:
        cmd.append('--standalone')
    else:
        cmd += [
            f'--nnodes={nnodes}',
            '--rdzv_backend=c10d',
            f'--rdzv_endpoint=127.0.0.1:{rdzv_port}',
            '--rdzv_id=test-job',
        ]
        if node_rank is not None:
            cmd.append(f'--node_rank={node_rank}')
    return cmd + [str(script), *args]


def run_torchrun(
    script: Union[str, pathlib.Path],
    nproc: int,
    out_dir: pathlib.Path,
    *,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 120,
    check: bool = True,
    cwd: Optional[pathlib.Path] = None,
    max_restarts: int = 0,
) -> subprocess.CompletedProcess:
    """Run ``script`` under ``torchrun --standalone --nproc_per_node=nproc`` and wait (bounded).

    ``max_restarts``: torchrun's ``--max_restarts`` (a failed worker group is restarted that many times).

    Raises:
        AssertionError: with the job's output, if it fails (``check``) or times out.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(pathlib.Path(script), nproc, args, max_restarts=max_restarts)
    return _run(cmd, base_env(out_dir, env), timeout, check, cwd or out_dir)


def _run(
    cmd: list[str], env: dict[str, str], timeout: float, check: bool, cwd: pathlib.Path
) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f'torchrun timed out after {timeout} s: {cmd}\nstdout:\n{stdout}\nstderr:\n{stderr[-8000:]}'
        )
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f'torchrun exited {proc.returncode}: {cmd}\nstdout:\n{stdout}\nstderr:\n{stderr[-8000:]}')
    return result


def run_two_nodes(
    script: Union[str, pathlib.Path],
    nproc_per_node: int,
    out_dir: pathlib.Path,
    *,
    args: Sequence[str] = (),
    timeout: float = 180,
) -> list[subprocess.CompletedProcess]:
    """Run ``script`` as a two-node job on this machine (two torchrun agents, c10d rendezvous on loopback)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = base_env(out_dir)
    procs = []
    for node in (0, 1):
        cmd = torchrun_command(pathlib.Path(script), nproc_per_node, args, nnodes=2, node_rank=node, rdzv_port=port)
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                cwd=out_dir,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f'two-node torchrun timed out after {timeout} s')
    for result in results:
        if result.returncode != 0:
            raise AssertionError(
                f'node exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-8000:]}'
            )
    return results


def read_rank_outputs(out_dir: pathlib.Path, pattern: str = 'rank*.json') -> dict[int, dict]:
    """Global rank -> the JSON each rank wrote as ``out_dir/rank{r}.json``."""
    outputs = {}
    for path in sorted(out_dir.glob(pattern)):
        data = json.loads(path.read_text())
        outputs[int(data['rank'])] = data
    return outputs


def dump_rank_output(data: dict, names: Iterable[str] = ()) -> None:
    """Called inside a scenario: write ``data`` (plus the rank) to ``$OUT_DIR/rank{RANK}.json``."""
    rank = int(os.environ.get('RANK', '0'))
    out = pathlib.Path(os.environ['OUT_DIR']) / f'rank{rank}.json'
    payload = dict(data, rank=rank)
    tmp = out.with_suffix('.tmp')
    tmp.write_text(json.dumps(payload, default=str))
    os.replace(tmp, out)
