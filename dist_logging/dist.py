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

# The export list is built from the rooms' own ``__all__`` (one list per room, kept beside its code); the star
# imports bring exactly those names here (type checkers read them the same way).
# First: its exit hook must be registered before the package's others (atexit runs them last-in first-out).
from dist_logging._world import ending as _ending
from dist_logging._world.ending import *  # noqa: F403 - the names of _ending.__all__
from dist_logging._world import gloo_exit as _gloo_exit  # noqa: F401 - registers the exit-time wait for gloo's threads
from dist_logging._world import facts as _facts
from dist_logging._world.facts import *  # noqa: F403 - the names of _facts.__all__
from dist_logging._world.facts import rendezvous_address as _rendezvous_address  # noqa: F401 - tests/test_dist.py
from dist_logging._world.group import LoggingGroup

# The rooms' public names, plus the logging group (its module's other names are internal to the package).
__all__ = ['LoggingGroup']
__all__ += _facts.__all__
__all__ += _ending.__all__
