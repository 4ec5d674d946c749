"""Two hosts on one machine, for tests: network namespaces on a bridge, each with its own hostname and /tmp.

A :class:`Host` is a long-lived holder process (``sleep``) started by ``ip netns exec <ns> unshare --uts
--mount``: it names the host (``hostname``), mounts a private tmpfs on ``/tmp`` and binds a shared
``/etc/hosts`` naming every host (the repository and the interpreter stay visible when they lie
under ``/tmp``); commands run on the host with ``nsenter`` into the holder's network,
mount and UTS namespaces (same PID namespace, so the test sees every process by its pid). The hosts'
veth pairs join a bridge in the machine's namespace, whose address serves moto (S3) to both hosts.

A partition is ``ip link set <the host's bridge-side veth> down``: packets are dropped silently,
nothing is refused. Freezing a host is SIGSTOP to every process in its network namespace.

Every name carries the test process's pid (``dlb<pid>`` bridge, ``dln<pid><i>`` namespaces, ``dlv<pid><i>``
veths): parallel workers never collide, and :func:`sweep_stale` removes what a killed run left behind
(names whose pid is gone). Root only: :func:`unavailable` says why the rig cannot run here.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Mapping, Optional, Sequence

from dist_logging._world.watch import process_state

TESTS_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
_NAME = re.compile(r'^dl[bnvp](\d+)')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(['ip', *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> Optional[str]:
    """Why the rig cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return 'the two-host rig needs root (network namespaces, veth, bridge, mounts)'
    for tool in ('ip', 'unshare', 'nsenter'):
        if shutil.which(tool) is None:
            return f'the two-host rig needs {tool!r} on PATH'
    probe = f'dln{os.getpid()}probe'
    try:
        _ip('netns', 'add', probe)
        _ip('netns', 'del', probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f'cannot create network namespaces here: {getattr(exc, "stderr", exc)}'
    return None


def _under_tmp(*paths) -> list[str]:
    """The given folders that lie under /tmp, without those inside another of them."""
    found = sorted({os.path.realpath(str(p)) for p in paths if os.path.realpath(str(p)).startswith('/tmp/')})
    return [p for p in found if not any(p != q and p.startswith(q + '/') for q in found)]


def sweep_stale() -> None:
    """Remove rig namespaces and links left by test processes that no longer run."""
    for name in _ip('netns', 'list', check=False).stdout.split():
        match = _NAME.match(name)
        if match and process_state(int(match.group(1))) is None:
            _kill_namespace(name)
            _ip('netns', 'del', name, check=False)
    for line in _ip('-o', 'link', 'show', check=False).stdout.splitlines():
        name = line.split(':')[1].strip().split('@')[0] if ':' in line else ''
        match = _NAME.match(name)
        if match and process_state(int(match.group(1))) is None:
            _ip('link', 'del', name, check=False)


def _kill_namespace(ns: str, sig: int = signal.SIGKILL) -> list[int]:
    pids = [int(p) for p in _ip('netns', 'pids', ns, check=False).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


class Host:
    """One host: a network namespace, a hostname, a private /tmp; see the module docstring."""

    def __init__(self, rig: 'Rig', index: int):
        self.index = index
        self.name = f'host{index}'
        self.ns = f'dln{rig.tag}{index}'
        self.outer = f'dlv{rig.tag}{index}'  # the bridge-side end of its veth pair
        self.ip = f'{rig.subnet}.{10 + index}'
        self.holder: Optional[subprocess.Popen] = None

    def start(self, rig: 'Rig') -> None:
        inner = f'dlp{rig.tag}{self.index}'
        _ip('netns', 'add', self.ns)
        _ip('link', 'add', self.outer, 'type', 'veth', 'peer', 'name', inner)
        _ip('link', 'set', inner, 'netns', self.ns)
        _ip('-n', self.ns, 'link', 'set', inner, 'name', 'eth0')
        _ip('-n', self.ns, 'addr', 'add', f'{self.ip}/24', 'dev', 'eth0')
        _ip('-n', self.ns, 'link', 'set', 'eth0', 'up')
        _ip('-n', self.ns, 'link', 'set', 'lo', 'up')
        _ip('link', 'set', self.outer, 'master', rig.bridge)
        _ip('link', 'set', self.outer, 'up')
        # What the hosts run from stays visible when it lies under /tmp (a clone there): bound to a stash
        # outside /tmp first, then moved back over the host's private tmpfs (a bind cannot come from
        # another mount namespace, and after the tmpfs the original is hidden).
        keep = _under_tmp(REPO_ROOT, sys.prefix, sys.base_prefix)
        stashes = [rig.workdir / f'keep-{self.name}-{i}' for i in range(len(keep))]
        for stash in stashes:
            stash.mkdir(parents=True, exist_ok=True)
        stash_in = ''.join(f'mount --bind {path} {stash} && ' for path, stash in zip(keep, stashes))
        move_back = ''.join(f' && mkdir -p {path} && mount --move {stash} {path}' for path, stash in zip(keep, stashes))
        setup = (
            f'hostname {self.name} && {stash_in}mount -t tmpfs -o mode=1777 tmpfs /tmp{move_back} && '
            f'mount --bind {rig.hosts_file} /etc/hosts && echo ready && exec sleep 100000'
        )
        self.holder = subprocess.Popen(
            [
                'ip',
                'netns',
                'exec',
                self.ns,
                'unshare',
                '--uts',
                '--mount',
                '--propagation',
                'private',
                'sh',
                '-c',
                setup,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.holder.stdout.readline().strip()
        if line != 'ready':
            raise RuntimeError(f'{self.name}: the holder did not start: {line} {self.holder.stdout.read()}')

    def command(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on this host (its network, mounts and hostname)."""
        return ['nsenter', f'--target={self.holder.pid}', '--net', '--mount', '--uts', '--', *cmd]

    def popen(self, cmd: Sequence[str], env: Mapping[str, str], log: pathlib.Path) -> subprocess.Popen:
        handle = open(log, 'wb')
        try:
            return subprocess.Popen(
                self.command(cmd), env=dict(env), stdout=handle, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT)
            )
        finally:
            handle.close()

    def run(self, cmd: Sequence[str], env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(cmd), env=dict(env), capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT)
        )

    def path(self, path: str) -> pathlib.Path:
        """``path`` (absolute) as this host sees it, readable from the test process (through its holder's
        ``/proc/<pid>/root``: the host's private /tmp included)."""
        return pathlib.Path(f'/proc/{self.holder.pid}/root') / path.lstrip('/')

    def pids(self) -> list[int]:
        """Every process on this host except its holder."""
        pids = [int(p) for p in _ip('netns', 'pids', self.ns, check=False).stdout.split()]
        return [p for p in pids if self.holder is None or p != self.holder.pid]

    def cut(self) -> None:
        """Partition this host from the bridge (silent drops both ways)."""
        _ip('link', 'set', self.outer, 'down')

    def heal(self) -> None:
        _ip('link', 'set', self.outer, 'up')

    def freeze(self) -> list[int]:
        """SIGSTOP every process on this host; returns their pids."""
        return [pid for pid in self.pids() if _signal(pid, signal.SIGSTOP)]

    def thaw(self) -> None:
        for pid in self.pids():
            _signal(pid, signal.SIGCONT)

    def stop(self) -> None:
        _kill_namespace(self.ns, signal.SIGCONT)
        _kill_namespace(self.ns)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
            self.holder.stdout.close()
        _ip('netns', 'del', self.ns, check=False)
        _ip('link', 'del', self.outer, check=False)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class Rig:
    """``count`` hosts on a bridge; moto S3 on the bridge address. Use as a context manager."""

    def __init__(self, workdir: pathlib.Path, count: int = 2):
        self.tag = f'{os.getpid()}{random.randrange(10)}'[-9:]
        self.bridge = f'dlb{self.tag}'
        self.subnet = f'10.{random.randrange(100, 250)}.{random.randrange(1, 250)}'
        self.bridge_ip = f'{self.subnet}.1'
        self.workdir = workdir
        self.hosts_file = workdir / 'etc-hosts'
        self.hosts = [Host(self, i) for i in range(1, count + 1)]
        self.s3 = None
        self.bucket: Optional[str] = None  # set by the ``rig`` fixture (tests/hosts/conftest.py)

    def __enter__(self) -> 'Rig':
        sweep_stale()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text('127.0.0.1 localhost\n' + ''.join(f'{h.ip} {h.name}\n' for h in self.hosts))
        try:
            _ip('link', 'add', self.bridge, 'type', 'bridge')
            _ip('addr', 'add', f'{self.bridge_ip}/24', 'dev', self.bridge)
            _ip('link', 'set', self.bridge, 'up')
            for host in self.hosts:
                host.start(self)
            self.s3 = _bridge_s3(self.bridge_ip)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        for host in self.hosts:
            host.stop()
        if self.s3 is not None:
            self.s3.stop()
        _ip('link', 'del', self.bridge, check=False)

    def env(self, host: Host, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        """The environment of a process on ``host``: the repo importable, S3 at the bridge, gloo on eth0."""
        sys.path.insert(0, str(TESTS_DIR))
        from torchrun_helper import base_env

        env = base_env(self.workdir / 'out', extra)
        from s3_server import CREDENTIALS

        env.update({'GLOO_SOCKET_IFNAME': 'eth0', 'AWS_ENDPOINT_URL': self.s3.endpoint, 'NO_PROXY': '*', **CREDENTIALS})
        env.pop('AWS_PROFILE', None)
        env.pop('AWS_ENDPOINT_URL_S3', None)
        return env

    def torchrun(
        self,
        host: Host,
        script: pathlib.Path,
        nproc: int,
        port: int,
        args: Sequence[str] = (),
        extra_env: Optional[Mapping[str, str]] = None,
    ) -> subprocess.Popen:
        """``torchrun --nnodes N`` of ``script`` on ``host``, the c10d rendezvous on the first host."""
        cmd = [
            sys.executable,
            '-m',
            'torch.distributed.run',
            f'--nnodes={len(self.hosts)}',
            f'--nproc-per-node={nproc}',
            '--rdzv-backend=c10d',
            f'--rdzv-endpoint={self.hosts[0].ip}:{port}',
            '--rdzv-id=rig',
            f'--local-addr={host.ip}',
            '--max-restarts=0',
            # torchrun stops a failed rank's siblings at its next look: 3 s lets each rank report its own error
            '--monitor-interval=3',
            str(script),
            *args,
        ]
        return host.popen(cmd, self.env(host, extra_env), self.workdir / f'torchrun-{host.name}.log')


def _bridge_s3(ip: str):
    """moto's S3 server on the bridge address (reachable from every host until it is cut off)."""
    import logging

    sys.path.insert(0, str(TESTS_DIR))
    from s3_server import MotoS3

    logging.getLogger('werkzeug').setLevel(logging.ERROR)  # one line per request otherwise
    return MotoS3(ip=ip).start()


def wait_for(predicate, timeout: float, what: str, poll: float = 0.1) -> float:
    """Poll ``predicate`` until true; returns the seconds it took. Raises AssertionError after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f'timed out after {timeout:g} s waiting for {what}')
        time.sleep(poll)
    return time.monotonic() - start


# ---------------------------------------------------------------------------- what a scenario left
# The scenarios (host_scenario.py) write ``start-rank<r>.json``, ``progress-rank<r>`` and ``result-rank<r>.json``
# into ``rig.workdir / 'out'``; the hosts' torchrun logs are ``rig.workdir / 'torchrun-<host>.log'``.


def outputs(rig: Rig, prefix: str, world: int) -> dict[int, Optional[dict]]:
    """Rank -> the JSON a scenario wrote as ``<prefix>-rank<r>.json`` (None while it has not)."""
    found = {}
    for r in range(world):
        path = rig.workdir / 'out' / f'{prefix}-rank{r}.json'
        found[r] = json.loads(path.read_text()) if path.exists() else None
    return found


def progress(rig: Rig, world: int) -> list[int]:
    """The last step each rank finished (0 before its first)."""
    steps = []
    for r in range(world):
        path = rig.workdir / 'out' / f'progress-rank{r}'
        steps.append(int(path.read_text() or 0) if path.exists() else 0)
    return steps


def logs(rig: Rig) -> str:
    """The tail of every host's torchrun log, for assertion messages."""
    return '\n'.join(
        f'--- {p.name}\n{p.read_text(errors="replace")[-3000:]}' for p in sorted(rig.workdir.glob('*.log'))
    )


def landed(rig: Rig) -> set[str]:
    """Every object name in the rig's bucket."""
    client = rig.s3.client()
    return {
        item['Key']
        for page in client.get_paginator('list_objects_v2').paginate(Bucket=rig.bucket)
        for item in page.get('Contents', [])
    }


def drain(rig: Rig, host: Host, staging: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``dist-logging drain <staging> --no-progress`` run on ``host`` (its /tmp, its network)."""
    cmd = [sys.executable, '-m', 'dist_logging', 'drain', staging, '--no-progress']
    return host.run(cmd, rig.env(host), timeout=timeout)
