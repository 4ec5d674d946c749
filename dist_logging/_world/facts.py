"""Rank and world facts for every launcher, and starting a process group from them.

Every function here works without a process group. Rank facts come from
``torch.distributed`` when a default process group is initialized, otherwise
from the launcher's environment (see :mod:`dist_logging.dist`).
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional, Union

import torch
import torch.distributed as torch_dist

from dist_logging._world.launchers import ENVIRONMENT_VARIABLES, LaunchFacts, expand_hostlist
from dist_logging._world.launchers import launch_facts as _launch_facts

__all__ = [
    'get_global_rank',
    'get_local_rank',
    'get_world_size',
    'get_local_world_size',
    'get_node_rank',
    'get_num_nodes',
    'get_attempt',
    'launcher',
    'launch_facts',
    'LaunchFacts',
    'expand_hostlist',
    'init_process_group_from_env',
    'is_initialized',
    'is_available',
    'select_reduction_device',
]


def is_available() -> bool:
    """Whether ``torch.distributed`` is compiled into this torch build."""
    return torch_dist.is_available()


def is_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def launch_facts() -> LaunchFacts:
    """This process's facts as its launcher's environment describes them (no process group consulted).

    Sources, first present wins: torchrun's variables (``RANK``, ``WORLD_SIZE``, ...), SLURM's
    (an ``srun`` task), Open MPI's, MPICH / Intel MPI / PMIx's, else a single process; see
    docs/launchers.md. The getters below prefer an initialized process group's rank and world size.

    Raises:
        ValueError: a launcher variable that is not an integer, or that contradicts another (named).
    """
    global _facts_cache
    data = getattr(os.environ, '_data', None)
    if _ENV_KEYS_RAW is not None and isinstance(data, dict):
        values = tuple(map(data.get, _ENV_KEYS_RAW))  # C-level lookups: the getters stay cheap
    else:
        values = tuple(map(os.environ.get, ENVIRONMENT_VARIABLES))
    cached_values, facts = _facts_cache
    if values == cached_values and facts is not None:
        return facts
    env = {
        name: (os.fsdecode(value) if isinstance(value, bytes) else value)
        for name, value in zip(ENVIRONMENT_VARIABLES, values)
        if value is not None
    }
    facts = _launch_facts(env)
    _facts_cache = (values, facts)
    return facts


# The facts, cached on the values of the variables they are computed from (a changed variable, e.g.
# one init_process_group_from_env exports, is seen at the next call). os.environ._data holds the raw
# (on POSIX, bytes) environment; elsewhere os.environ itself is read.
_ENV_KEYS_RAW = tuple(os.fsencode(name) for name in ENVIRONMENT_VARIABLES) if os.name == 'posix' else None
_facts_cache: tuple[Any, Optional[LaunchFacts]] = ((), None)


def launcher() -> str:
    """Which launcher started this process: ``'torchrun'``, ``'slurm'``, ``'openmpi'``, ``'mpich'``
    (also Intel MPI), ``'pmix'``, ``'env'`` (``RANK``/``WORLD_SIZE`` set by something else) or
    ``'single'``.

    Raises:
        ValueError: as :func:`launch_facts`.
    """
    return launch_facts().launcher


def get_attempt() -> str:
    """Which attempt of the job this process belongs to: ``'0'`` for the first; after a torchrun
    restart (``TORCHELASTIC_RESTART_COUNT``) or a SLURM requeue (``SLURM_RESTART_COUNT``) the
    count; ``'<requeues>.<restarts>'`` when both happened.

    Raises:
        ValueError: as :func:`launch_facts`.
    """
    return launch_facts().attempt


def get_global_rank() -> int:
    """The rank of this process in the whole job (0 when not distributed)."""
    if is_initialized():
        return torch_dist.get_rank()
    return launch_facts().rank


def get_world_size() -> int:
    """The number of processes in the whole job (1 when not distributed)."""
    if is_initialized():
        return torch_dist.get_world_size()
    return launch_facts().world_size


def get_local_rank() -> int:
    """The rank of this process on its node (0 when not distributed)."""
    return launch_facts().local_rank


def get_local_world_size() -> int:
    """The number of processes on this node (1 when not distributed)."""
    return launch_facts().local_world_size


def get_node_rank() -> int:
    """The index of this node (0 when not distributed).

    torchrun exports ``GROUP_RANK`` (other launchers of torch's variables ``NODE_RANK``), SLURM
    ``SLURM_NODEID``; MPI exports none, so it is derived from the global rank and the local
    world size (as it is when torch's variables name no node).
    """
    facts = launch_facts()
    if is_initialized() and facts.launcher in ('openmpi', 'mpich', 'pmix', 'single'):
        return torch_dist.get_rank() // max(facts.local_world_size, 1)
    return facts.node_rank


def get_num_nodes() -> int:
    """The number of nodes (SLURM's count; else assuming every node runs the same number of ranks)."""
    facts = launch_facts()
    if facts.launcher == 'slurm':
        return facts.num_nodes
    return max(get_world_size() // max(facts.local_world_size, 1), 1)


_DEFAULT_INIT_TIMEOUT = datetime.timedelta(minutes=10)  # torch's own default for gloo and NCCL
#: The environment variable sizing torch's flight recorder (torch >= 2.6; older: TORCH_NCCL_TRACE_BUFFER_SIZE).
FLIGHT_RECORDER_VARIABLE = 'TORCH_FR_BUFFER_SIZE'
#: Entries :func:`init_process_group_from_env` asks the flight recorder to keep unless the environment says.
FLIGHT_RECORDER_ENTRIES = 2000


def _derived_port(seed: str) -> int:
    """A port in 20000..32767 from ``seed`` (a job id), the same on every rank of the job.

    Deterministic (no communication is possible before the group exists); two steps of one
    SLURM job running at once get different ports because the step id is in the seed. Below
    Linux's ephemeral range (32768-60999 by default), from which the kernel hands out the ports of
    outgoing connections and of sockets bound to port 0 (gloo's own, a store client's): such a
    socket on rank 0's host can never hold the derived port and fail the rendezvous.
    """
    import zlib

    return 20000 + zlib.crc32(seed.encode()) % 12768


def rendezvous_address(facts: LaunchFacts, env: Any) -> tuple[str, str]:
    """``(MASTER_ADDR, MASTER_PORT)`` for ``facts``: the environment's, else derived from the launcher's.

    Raises:
        ValueError: naming what is missing and how to provide it.
    """
    addr, port = env.get('MASTER_ADDR') or None, env.get('MASTER_PORT') or None
    if addr is None:
        if facts.launcher == 'slurm':
            nodelist = env.get('SLURM_STEP_NODELIST') or env.get('SLURM_JOB_NODELIST') or env.get('SLURM_NODELIST')
            if not nodelist:
                raise ValueError(
                    'init_process_group_from_env: SLURM sets neither SLURM_STEP_NODELIST nor '
                    'SLURM_JOB_NODELIST; export MASTER_ADDR (the host of rank 0)'
                )
            addr = expand_hostlist(nodelist)[0]  # srun places task 0 on the step's first node
        elif facts.num_nodes == 1 or facts.world_size == 1:
            addr = '127.0.0.1'
        else:
            raise ValueError(
                f'init_process_group_from_env: {facts.launcher} runs {facts.world_size} ranks on '
                f'{facts.num_nodes} nodes and exports no address for rank 0: export MASTER_ADDR (the '
                'host name of rank 0, e.g. mpirun -x MASTER_ADDR=$(hostname))'
            )
    if port is None:
        seed = facts.run_id or env.get('PMI_PORT')
        if facts.world_size == 1 and seed is None:
            import socket

            with socket.socket() as sock:  # one process: any free port will do
                sock.bind(('127.0.0.1', 0))
                port = str(sock.getsockname()[1])
        elif seed is None:
            raise ValueError(
                f'init_process_group_from_env: {facts.launcher} exports no id shared by every rank to '
                'derive a port from: export MASTER_PORT (e.g. mpirun -x MASTER_PORT=29500)'
            )
        else:
            port = str(_derived_port(seed))
    return addr, port


def init_process_group_from_env(
    backend: Optional[str] = None, timeout: Union[float, datetime.timedelta] = _DEFAULT_INIT_TIMEOUT
) -> LaunchFacts:
    """Initialize ``torch.distributed`` from whichever launcher started this process (no torchrun needed).

    For ``srun python train.py`` (SLURM), ``mpirun python train.py`` (Open MPI, MPICH, Intel MPI)
    or torchrun alike: exports torch's ``env://`` variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) from
    the launcher's, then calls ``torch.distributed.init_process_group``. Variables already set
    are kept (torchrun's, or a ``MASTER_ADDR``/``MASTER_PORT`` of your own).

    * ``MASTER_ADDR``: on SLURM the first host of ``SLURM_STEP_NODELIST`` (else
      ``SLURM_JOB_NODELIST``), expanded as ``scontrol show hostnames`` does; under MPI on one
      node ``127.0.0.1``; under MPI on several nodes it must be exported.
    * ``MASTER_PORT``: derived from the job's id (SLURM job and step, Open MPI/PMIx job id,
      Hydra's ``PMI_PORT``) into 20000..32767 (below Linux's ephemeral ports), the same on every rank.
    * Under torchrun, each restart gets its own key prefix in torchrun's store: the agent keeps
      one store across restarts, and with the previous attempt's keys still in it a restarted
      gloo group tries to connect to the dead ranks (seen with torch 2.13).
    * ``TORCH_FR_BUFFER_SIZE``: set to 2000 (torch's flight recorder keeps the last 2,000 collectives
      for postmortems, see docs/postmortem.md) unless the environment sets it; ``0`` turns it off.
    * ``backend``: default ``'nccl'`` when CUDA is available, else ``'gloo'``. With CUDA the
      current device becomes ``local_rank % device_count()`` (right both when every task sees
      all GPUs and when SLURM gives each task its own).

    Args:
        backend: the process group's backend; ``None`` picks as above.
        timeout: seconds (or a ``timedelta``) for the rendezvous and collectives of the group.

    Returns:
        The launcher's facts this process joined with (``.launcher``, ``.rank``, ...).

    Raises:
        RuntimeError: a default process group exists already, or ``torch.distributed`` is unavailable.
        ValueError: a missing or malformed variable (named, with how to provide it), or a bad timeout.
    """
    if not is_available():
        raise RuntimeError('init_process_group_from_env: this torch build has no torch.distributed')
    if is_initialized():
        raise RuntimeError('init_process_group_from_env: a default process group is initialized already')
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = datetime.timedelta(seconds=timeout)
    if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(
            f'init_process_group_from_env: timeout must be a positive number of seconds or a timedelta, got {timeout!r}'
        )
    facts = launch_facts()
    addr, port = rendezvous_address(facts, os.environ)
    exported = {
        'MASTER_ADDR': addr,
        'MASTER_PORT': port,
        'RANK': str(facts.rank),
        'WORLD_SIZE': str(facts.world_size),
        'LOCAL_RANK': str(facts.local_rank),
        'LOCAL_WORLD_SIZE': str(facts.local_world_size),
        'GROUP_RANK': str(facts.node_rank),
    }
    for name, value in exported.items():
        os.environ.setdefault(name, value)
    # The flight recorder (torch's ring of the last collectives, read by postmortems: docs/postmortem.md).
    # torch reads the variable when the group is made; a value the user set (0: off) is kept.
    os.environ.setdefault(FLIGHT_RECORDER_VARIABLE, str(FLIGHT_RECORDER_ENTRIES))
    use_cuda = torch.cuda.is_available()
    if backend is None:
        backend = 'nccl' if use_cuda else 'gloo'
    if use_cuda and 'nccl' in str(backend).lower():
        torch.cuda.set_device(facts.local_rank % torch.cuda.device_count())
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True':
        # torchrun's agent keeps one store across restarts, and the previous attempt's keys are
        # still in it: gloo would connect to the dead ranks' old addresses (torch 2.13). A prefix
        # per attempt gives every attempt clean keys.
        base = torch_dist.TCPStore(
            os.environ['MASTER_ADDR'],
            int(os.environ['MASTER_PORT']),
            facts.world_size,
            is_master=False,
            timeout=timeout,
        )
        store = torch_dist.PrefixStore(f'dist_logging/attempt{facts.restarts}', base)
        torch_dist.init_process_group(
            backend=backend, store=store, rank=facts.rank, world_size=facts.world_size, timeout=timeout
        )
    else:
        torch_dist.init_process_group(
            backend=backend, init_method='env://', rank=facts.rank, world_size=facts.world_size, timeout=timeout
        )
    return facts


def select_reduction_device(backend: str, cuda_available: bool) -> torch.device:
    """The device metric reductions run on for a default group of ``backend``.

    CUDA (in the default NCCL group) only when the default group is NCCL and CUDA is
    available; the CPU (in a gloo group) for every other backend.
    """
    if str(backend).lower() == 'nccl' and cuda_available:
        return torch.device('cuda', torch.cuda.current_device())
    return torch.device('cpu')
