"""A per-machine cap on concurrent uploads, shared by every rank (process) of the node.

Each rank runs ``num_concurrent_uploads`` workers, so a node of 8 ranks runs 32
uploads at once by default; past what the NIC and disk can serve, more streams add
only contention and buffer memory (see benchmarks/README.md, "Scaling past one node").
Setting ``DIST_LOGGING_NODE_UPLOAD_SLOTS=S`` caps the node at ``S`` uploads in
flight: a worker takes one of ``S`` lock files (``filelock``, so it works across
processes and threads) for each upload attempt and gives it back after, never
during a retry backoff. Only workers wait for a slot; ``upload_file`` never does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
from typing import Iterator, Optional

import filelock

from dist_logging import _private_dirs
from dist_logging.upload.retry import Interrupted

__all__ = ['ENV_VAR', 'NodeUploadSlots', 'node_slots_from_env', 'parse_slots']

ENV_VAR = 'DIST_LOGGING_NODE_UPLOAD_SLOTS'
_POLL_SECONDS = 0.02


class NodeUploadSlots:
    """``slots`` lock files in ``folder``; holding one is the right to run one upload attempt.

    Args:
        slots: how many uploads may run at once on this machine (>= 1).
        folder: where the lock files live; every rank of the node must use the same one
            (default: ``node-upload-slots/`` in the per-user private folder, see
            :mod:`dist_logging._private_dirs`). A given folder is created if missing but not checked.

    Raises:
        ValueError: ``slots`` < 1.
        PermissionError: the default folder is not private to this user (names it and says why).
    """

    def __init__(self, slots: int, folder: Optional[str] = None):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f'node upload slots must be an int >= 1, got {slots!r}')
        self.slots = slots
        if folder:
            os.makedirs(folder, exist_ok=True)
            self.folder = folder
        else:
            self.folder = _private_dirs.private_dir('node-upload-slots')

    @contextlib.contextmanager
    def hold(self, stop: Optional[threading.Event] = None) -> Iterator[int]:
        """Wait for a free slot (polling), hold it for the ``with`` block, yield its index.

        Raises:
            Interrupted: ``stop`` was set while waiting.
        """
        first = random.randrange(self.slots)  # spread the ranks over the slots
        while True:
            for offset in range(self.slots):
                index = (first + offset) % self.slots
                lock = filelock.FileLock(
                    os.path.join(self.folder, f'slot-{index}.lock'), mode=0o600, thread_local=False
                )
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    continue
                try:
                    yield index
                finally:
                    lock.release()
                return
            if stop is not None:
                if stop.wait(_POLL_SECONDS):
                    raise Interrupted('upload not started: the uploader was stopped while waiting for a node slot')
            else:
                threading.Event().wait(_POLL_SECONDS)


def node_slots_from_env(staging_folder: Optional[str] = None) -> Optional[NodeUploadSlots]:
    """The node's slots as configured by ``DIST_LOGGING_NODE_UPLOAD_SLOTS`` (None: no cap).

    Args:
        staging_folder: the job's ``upload_staging_folder`` when it chose one: the slots then
            live in its machine folder (see :func:`dist_logging._private_dirs.state_dir`), unless
            ``DIST_LOGGING_TMPDIR`` is set. The folder is checked on every call.

    Raises:
        ValueError: the variable is set to something other than a positive integer (names it).
        PermissionError: the slots' folder is not private to this user (names it and says why).
    """
    slots = parse_slots(os.environ.get(ENV_VAR, ''))
    if slots is None:
        return None
    folder = _private_dirs.private_dir('node-upload-slots', root=_private_dirs.state_dir(staging_folder))
    return _slots_for(slots, folder)


@functools.lru_cache(maxsize=8)
def _slots_for(slots: int, folder: str) -> NodeUploadSlots:
    return NodeUploadSlots(slots, folder)


def parse_slots(raw: str) -> Optional[int]:
    """``DIST_LOGGING_NODE_UPLOAD_SLOTS``'s value as an int (None: unset or empty: no cap).

    Raises:
        ValueError: not a positive integer (names the text).
    """
    if raw.strip() == '':
        return None
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise ValueError(f'{ENV_VAR}={raw!r}: expected a positive integer (uploads in flight per machine)')
    return slots
