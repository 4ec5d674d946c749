"""tests/destinations/test_mlflow.py again, on the lowest MLflow the ``mlflow`` extra allows (pyproject.toml).

The suite's environment has the newest MLflow. This test builds (once; cached in
``.venv-mlflow-lowest`` at the repository root, rebuilt when the pin or the parent environment
changes) a virtual environment holding that MLflow release and what it pins, in front of the
running environment's packages (a ``.pth`` line: torch and the rest come from there), and runs
the MLflow tests in it. The first build downloads about 100 MB (about a minute); later runs
take seconds. Skipped, with pip's words, when pip cannot reach a package index.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip('mlflow', reason='mlflow is not installed: pip install dist-logging[mlflow]')

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = ROOT / '.venv-mlflow-lowest'
# Packages MLflow 2.10 takes at any version but breaks with releases made after it; a user of that
# MLflow has versions of its time.
ERA_PINS = ('sqlalchemy>=1.4,<2.1', 'alembic!=1.10.0,<1.14')
UNREACHABLE = re.compile(
    r'NewConnectionError|Failed to establish|Temporary failure in name resolution|'
    r'Network is unreachable|Could not find a version that satisfies the requirement mlflow|'
    r'No matching distribution found for mlflow|ProxyError|timed out',
    re.IGNORECASE,
)

pytestmark = pytest.mark.timeout(900)


def lowest_mlflow() -> str:
    text = (ROOT / 'pyproject.toml').read_text()
    match = re.search(r'"mlflow>=([0-9][0-9.]*)"', text)
    assert match, 'pyproject.toml: the mlflow extra must say "mlflow>=<version>"'
    version = match.group(1)
    return version if version.count('.') >= 2 else version + '.0'


def _build(version: str, marker: dict) -> None:
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, '-m', 'venv', str(VENV)], check=True, timeout=300)
    python = VENV / 'bin' / 'python'
    site = subprocess.run(
        [str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    # After the venv's own packages: the running environment's (torch, numpy when unpinned, pytest...).
    pathlib.Path(site, 'zz_parent_environment.pth').write_text(marker['parent'] + '\n')
    # Few, short retries: without an index this skips in about a minute instead of hanging on retries.
    done = subprocess.run(
        [
            str(python),
            '-m',
            'pip',
            'install',
            '--quiet',
            '--disable-pip-version-check',
            '--retries',
            '2',
            '--timeout',
            '30',
            f'mlflow=={version}',
            *ERA_PINS,
        ],
        capture_output=True,
        text=True,
        timeout=840,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-2000:]
        shutil.rmtree(VENV, ignore_errors=True)
        if UNREACHABLE.search(output):
            pytest.skip(f'pip cannot reach a package index to install mlflow=={version}: {output[-500:]}')
        pytest.fail(f'installing mlflow=={version} failed:\n{output}')
    (VENV / 'marker.json').write_text(json.dumps(marker))


def ensure_venv(version: str) -> pathlib.Path:
    marker = {
        'mlflow': version,
        'pins': list(ERA_PINS),
        'parent': sysconfig.get_paths()['purelib'],
        'python': sys.version,
    }
    lock_path = ROOT / '.venv-mlflow-lowest.lock'
    with open(lock_path, 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building it: wait for that build
        try:
            current = json.loads((VENV / 'marker.json').read_text())
        except (OSError, ValueError):
            current = None
        if current != marker:
            _build(version, marker)
    return VENV / 'bin' / 'python'


def test_the_mlflow_tests_pass_on_the_lowest_mlflow_the_extra_allows(tmp_path):
    version = lowest_mlflow()
    python = ensure_venv(version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('MLFLOW_', 'PYTEST_'))}
    env.update(PYTHONPATH=str(ROOT), DIST_LOGGING_EXPECT_MLFLOW=version, HOME=str(tmp_path))
    done = subprocess.run(
        [
            str(python),
            '-m',
            'pytest',
            '-p',
            'no:xdist',
            '-p',
            'no:cacheprovider',
            '-q',
            '--basetemp',
            str(tmp_path / 'pytest'),
            str(ROOT / 'tests/destinations/test_mlflow.py'),
        ],
        # MLflow 2 makes ./mlruns in the working folder: keep it out of the repository.
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert ' passed' in done.stdout and ' skipped' not in done.stdout.splitlines()[-1], done.stdout[-2000:]
