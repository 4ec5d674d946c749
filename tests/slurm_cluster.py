"""A private, one-node SLURM cluster for tests: munged + slurmctld + slurmd from Debian's packages.

Everything lives in one folder (config, munge key and socket, state, spool, logs); the daemons
listen on 127.0.0.1 on free ports, run in the foreground as children of the test process, and
are stopped by their pids. :func:`start_cluster` raises :class:`ClusterUnavailable` with the
reason when the packages are missing, the user is not root, or a daemon does not come up.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import time
from typing import Optional

from torchrun_helper import free_port

CPUS = 4  # 4 tasks on a 2-core machine: slurmd takes the configured count (config_overrides)


class ClusterUnavailable(RuntimeError):
    """The cluster cannot start here; the message says why (tests skip with it)."""


class SlurmCluster:
    """A running private cluster. ``env`` points SLURM's commands at it (``SLURM_CONF``)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.conf = root / 'slurm.conf'
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split('.')[0]

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'SBATCH_', 'SRUN_'))}
        env['SLURM_CONF'] = str(self.conf)
        return env

    def run(self, cmd: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, env=kwargs.pop('env', self.env), capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def logs(self) -> str:
        parts = []
        for name in ('munged.log', 'slurmctld.log', 'slurmd.log'):
            path = self.root / name
            if path.exists():
                parts.append(f'--- {name}\n' + path.read_text(errors='replace')[-3000:])
        return '\n'.join(parts)

    def wait_job(self, job_id: str, timeout: float = 120) -> str:
        """Wait (bounded) until ``job_id`` leaves the queue; its final state (``scontrol show job``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(['scontrol', 'show', 'job', job_id]).stdout
            for token in out.split():
                if token.startswith('JobState='):
                    state = token.split('=', 1)[1]
                    if state not in ('PENDING', 'RUNNING', 'CONFIGURING', 'COMPLETING'):
                        return state
            time.sleep(0.3)
        raise AssertionError(f'job {job_id} did not finish within {timeout} s\n{self.logs()}')

    def stop(self) -> None:
        if self.procs and self.procs[-1].poll() is None:
            try:  # jobs a failed test left behind (only this private cluster's: SLURM_CONF is ours)
                self.run(['scancel', '--quiet', '--user', 'root'], timeout=30)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        self.procs.clear()


def _write_config(cluster: SlurmCluster) -> None:
    root = cluster.root
    for sub in ('state', 'spool'):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    key = root / 'munge.key'
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ctld_port, slurmd_port = free_port(), free_port()
    # Job ids unique across the private clusters of one test run (as a real cluster's are): a job's
    # rendezvous port is derived from its id, and two clusters both counting from 1 would collide.
    first_job_id = random.randrange(1000, 60_000_000)
    cluster.conf.write_text(f"""\
ClusterName=dltest
FirstJobId={first_job_id}
SlurmctldHost={cluster.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName={cluster.node} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN
PartitionName=debug Nodes={cluster.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")


def missing_commands() -> list[str]:
    return [c for c in ('munged', 'slurmctld', 'slurmd', 'srun', 'sbatch', 'scontrol') if shutil.which(c) is None]


def start_cluster(root: pathlib.Path, timeout: float = 60) -> SlurmCluster:
    """Start munged, slurmctld and slurmd on ``root``; wait until the node is idle.

    Raises:
        ClusterUnavailable: with the reason (missing commands, not root, a daemon that does not start).
    """
    missing = missing_commands()
    if missing:
        raise ClusterUnavailable(
            f'SLURM/munge commands not installed: {missing} (make install installs Debian\'s '
            'slurm-wlm and munge when run as root)'
        )
    if os.geteuid() != 0:
        raise ClusterUnavailable('a private SLURM needs root here (slurmd runs jobs as their user)')
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    cluster = SlurmCluster(root)
    _write_config(cluster)
    env = cluster.env
    try:
        cluster.procs.append(
            subprocess.Popen(
                [
                    'munged',
                    '--foreground',
                    '--force',
                    f'--key-file={root}/munge.key',
                    f'--socket={root}/munge.socket',
                    f'--pid-file={root}/munged.pid',
                    f'--log-file={root}/munged.log',
                    f'--seed-file={root}/munge.seed',
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_for(lambda: (root / 'munge.socket').exists(), 15, 'munged socket', cluster)
        cluster.procs.append(
            subprocess.Popen(
                ['slurmctld', '-D', '-i', '-f', str(cluster.conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_for(
            lambda: cluster.run(['scontrol', 'ping'], timeout=10).stdout.count('UP') > 0, timeout, 'slurmctld', cluster
        )
        cluster.procs.append(
            subprocess.Popen(
                ['slurmd', '-D', '-f', str(cluster.conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_for(
            lambda: 'idle' in cluster.run(['sinfo', '-h', '-o', '%T'], timeout=10).stdout,
            timeout,
            'slurmd (node idle)',
            cluster,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(check, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise ClusterUnavailable(
                    f'{proc.args[0]} exited with {proc.returncode} while waiting for {what}\n{cluster.logs()}'
                )
        try:
            if check():
                return
        except (subprocess.TimeoutExpired, OSError):
            pass
        time.sleep(0.3)
    raise ClusterUnavailable(f'{what} did not come up within {timeout} s\n{cluster.logs()}')


def first_job_id(sbatch_output: str) -> Optional[str]:
    """The job id in ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    text = sbatch_output.strip().split(';')[0]
    return text if text.isdigit() else None
