"""Rank and world facts for every launcher, and the one place that issues collectives.

Every function here works without a process group. Rank facts come from
``torch.distributed`` when a default process group is initialized, otherwise
from the launcher's environment: torchrun's variables (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``), else SLURM's
(an ``srun`` task), else Open MPI's, else MPICH / Intel MPI / PMIx's, otherwise
they describe a single process (rank 0 of a world of 1). torchrun wins when
sources disagree (``srun torchrun``); see docs/launchers.md.
:func:`init_process_group_from_env` starts a process group from any of them.

Collectives used by the Logger (gathering metrics, agreeing on the run name,
checking hyperparameters) run on a dedicated gloo group over CPU tensors that is
created lazily, so logging never enqueues work on the training group (e.g.
NCCL) or its GPU stream. Each collective has a timeout; when some rank does not
arrive the others raise :class:`~dist_logging.errors.DistributedLoggingError`
naming the missing ranks instead of blocking forever.

This module is the public face; the rooms live in ``dist_logging/_world/``: ``launchers`` (what each
launcher's environment says), ``facts`` (the getters and :func:`init_process_group_from_env`), ``group``
(:class:`LoggingGroup`), ``watch`` (each process's beat in the rendezvous store), ``diagnose`` (who is missing
from a collective), ``gloo_exit`` (the exit-time wait for gloo's worker threads),
``ending`` (after a fatal error, the process ends at exit in bounded time: :func:`note_fatal_error`).
"""

from __future__ import annotations

# First: its exit hook must be registered before the package's others (atexit runs them last-in first-out).
from dist_logging._world.ending import (
    DELIVERY_WAIT_SECONDS,
    EXIT_STATUS,
    FLUSH_SECONDS,
    fatal_error,
    forget_fatal_error,
    note_fatal_error,
    on_fatal_exit,
    on_fatal_exit_wait,
)
from dist_logging._world import gloo_exit as _gloo_exit  # noqa: F401 - registers the exit-time wait for gloo's threads
from dist_logging._world.facts import (
    LaunchFacts,
    expand_hostlist,
    get_attempt,
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_num_nodes,
    get_world_size,
    init_process_group_from_env,
    is_available,
    is_initialized,
    launch_facts,
    launcher,
    select_reduction_device,
)
from dist_logging._world.facts import rendezvous_address as _rendezvous_address  # noqa: F401 - tests/test_dist.py
from dist_logging._world.group import LoggingGroup

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
    'LoggingGroup',
    'note_fatal_error',
    'fatal_error',
    'forget_fatal_error',
    'on_fatal_exit',
    'on_fatal_exit_wait',
    'FLUSH_SECONDS',
    'DELIVERY_WAIT_SECONDS',
    'EXIT_STATUS',
]
