"""The run's name, identical on every rank: given, from the environment, derived from the launcher, or agreed on.

Used by the Logger and by ``setup_logging`` (which must name the same folder without a Logger).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from typing import Any, Optional, Protocol

from dist_logging import dist


class ObjectBroadcaster(Protocol):
    """What naming a run needs of a group: :meth:`dist_logging.dist.LoggingGroup.broadcast_object`, or a stand-in."""

    def broadcast_object(self, obj: Any, what: str) -> Any:
        """Return rank zero's ``obj`` on every rank (``what`` names the collective in errors)."""
        ...


def resolve_run_name(run_name: Optional[str], group: ObjectBroadcaster) -> str:
    """The run name, identical on every rank: given, from the environment, or agreed on.

    Raises:
        ValueError: a given name that is empty or holds a path separator, braces or NUL.
    """
    if run_name is None:
        run_name = os.environ.get('DIST_LOGGING_RUN_NAME') or None
    if run_name is not None:
        if not isinstance(run_name, str) or not run_name.strip():
            raise ValueError(f'run_name must be a non-empty string, got {run_name!r}')
        if any(c in run_name for c in '/\\{}\x00') or run_name in ('.', '..'):
            raise ValueError(f'run_name {run_name!r} must not contain "/", "\\", braces or NUL, or be "." / ".."')
        return run_name
    # The launcher's job id (torchrun's run id, else the SLURM job and step, else MPI's job id) is
    # the same on every rank of a job and kept by restarts and requeues; MASTER_ADDR:MASTER_PORT
    # is also the same on every rank of one job.
    derived = dist.launch_facts().run_name
    if derived is not None:
        return derived
    if 'MASTER_PORT' in os.environ:
        run_id = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ['MASTER_PORT']}"
        return 'run-' + hashlib.sha1(run_id.encode()).hexdigest()[:10]
    generated = time.strftime('run-%Y%m%d-%H%M%S-') + uuid.uuid4().hex[:6]
    if dist.get_world_size() > 1:
        # No shared id in the environment: agree on rank zero's name (a collective).
        generated = group.broadcast_object(generated, 'agreeing on the run name')
    return generated
