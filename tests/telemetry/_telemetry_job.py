"""Helpers of the telemetry tests: a torchrun job in the background, a real Prometheus server, scraping."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Optional

from torchrun_helper import base_env, free_port, torchrun_command

HERE = pathlib.Path(__file__).resolve().parent
PROMETHEUS = shutil.which('prometheus') or ('/usr/bin/prometheus' if os.path.exists('/usr/bin/prometheus') else None)
SKIP_PROMETHEUS = (
    "Debian's prometheus server is not installed (apt-get install prometheus; `make install` does it as root)"
)


class Background:
    """A process started in a session of its own, ended by its pid (and its group's) at exit."""

    def __init__(
        self,
        cmd: list[str],
        env: Optional[dict] = None,
        cwd: Optional[pathlib.Path] = None,
        log: Optional[pathlib.Path] = None,
    ):
        self.log = log
        out = open(log, 'w') if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f'{self.proc.args} did not end within {timeout} s:\n{self.output()}')

    def output(self) -> str:
        return self.log.read_text()[-8000:] if self.log and self.log.exists() else ''

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def __enter__(self) -> 'Background':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class Job(Background):
    """The torchrun job; ending it also ends its workers by pid (they run in sessions of their own)."""

    out: pathlib.Path

    def kill(self) -> None:
        if self.proc.poll() is None:  # given up on: its workers may still run (a job that ended took them along)
            super().kill()
            kill_workers(self.out)


def start_job(out: pathlib.Path, metrics_port: int, sync_timeout: float = 10) -> Job:
    """The 2-rank scenario (telemetry_scenario.py) under torchrun, in the background."""
    out.mkdir(parents=True, exist_ok=True)
    env = base_env(out, {'METRICS_PORT': str(metrics_port), 'SYNC_TIMEOUT': str(sync_timeout)})
    job = Job(torchrun_command(HERE / 'telemetry_scenario.py', 2), env, out, out / 'job.log')
    job.out = out
    return job


def kill_workers(out: pathlib.Path) -> None:
    """End the job's workers by pid (torchrun starts them in sessions of their own)."""
    for rank in (0, 1):
        pid_file = out / f'pid{rank}'
        if pid_file.exists():
            try:
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def scrape(url: str, timeout: float = 5) -> dict[str, list[Any]]:
    """The endpoint's families parsed by prometheus_client's parser: name -> samples."""
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(url, timeout=timeout).read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(body)}


def by_rank(samples: list[Any]) -> dict[int, float]:
    return {int(s.labels['rank']): s.value for s in samples}


def wait_for(what: str, check: Callable[[], Any], timeout: float, job: Optional[Background] = None) -> Any:
    """Poll ``check`` (exceptions count as not yet) until it returns something truthy, within ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = f'returned {result!r}'
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f'the job ended while waiting for {what}:\n{job.output()}')
        time.sleep(0.3)
    raise AssertionError(f'{what}: not within {timeout} s (last: {last!r})\n{job.output() if job else ""}')


class Prometheus(Background):
    """Debian's Prometheus server scraping ``targets`` every second, with its own config and storage."""

    def __init__(self, tmp: pathlib.Path, targets: list[str]):
        tmp.mkdir(parents=True, exist_ok=True)
        config = tmp / 'prometheus.yml'
        config.write_text(
            'global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n'
            'scrape_configs:\n  - job_name: dist_logging\n    static_configs:\n'
            f'      - targets: {json.dumps(targets)}\n'
        )
        self.port = free_port()
        super().__init__(
            [
                PROMETHEUS,
                f'--config.file={config}',
                f'--storage.tsdb.path={tmp / "data"}',
                f'--web.listen-address=127.0.0.1:{self.port}',
            ],
            cwd=tmp,
            log=tmp / 'prometheus.log',
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` from Prometheus' HTTP API."""
        url = f'http://127.0.0.1:{self.port}/api/v1/query?' + urllib.parse.urlencode({'query': expr})
        answer = json.loads(urllib.request.urlopen(url, timeout=5).read())
        assert answer['status'] == 'success', answer
        return answer['data']['result']
