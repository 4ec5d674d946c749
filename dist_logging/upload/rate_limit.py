"""A per-machine cap on upload bandwidth, shared by every rank (process) of the node.

Checkpoints uploaded at full speed compete with the training job for the NIC (NCCL's
inter-node traffic, data loading) and for the disk. ``DIST_LOGGING_UPLOAD_BYTES_PER_S``
caps the bytes per second that the uploads of all processes of a machine hand to their
object stores together: ``100MB``, ``1.5GiB``, ``250000000`` (decimal ``k``/``M``/``G``/``T``
and binary ``KiB``/``MiB``/``GiB``/``TiB`` suffixes, an optional trailing ``B``). Unset or empty:
no cap. It sits next to ``DIST_LOGGING_NODE_UPLOAD_SLOTS`` (uploads in flight per machine).

How it works: a shared schedule (the "virtual scheduling" form of a token bucket) lives in a
small file in a per-user, node-local private folder (:mod:`dist_logging._private_dirs`). Each chunk a worker
sends reserves its share of the schedule under a file lock (``filelock``: works across processes, released if a process
dies) and then waits, on the worker, until its turn; ``upload_file`` never waits for it. The
bytes are counted as the stores report them through their progress callback (every store
here reports as it goes; a store that reports only at the end is charged then, and the
next upload of the machine waits for that debt); whatever a store never reports is charged
when the attempt ends. A quiet machine may send up to a quarter of a second's worth at once.
Every byte of an object counts, also for a ``copy=True`` snapshot that a local bucket places
by hard link: the cap is on object bytes per second, whatever moves them.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import threading
import time
from typing import Optional

import filelock

from dist_logging import _private_dirs
from dist_logging.upload.retry import Interrupted

__all__ = ['ENV_VAR', 'NodeUploadRate', 'parse_byte_rate', 'node_rate_from_env']

ENV_VAR = 'DIST_LOGGING_UPLOAD_BYTES_PER_S'
BURST_SECONDS = 0.25
# The machine's schedule: when the monotonic clock started (wall time, to tell another boot's
# file) and when the bytes granted so far are paid for (monotonic).
_STATE = struct.Struct('<dd')
_UNITS = {'': 1, 'k': 10**3, 'm': 10**6, 'g': 10**9, 't': 10**12, 'ki': 2**10, 'mi': 2**20, 'gi': 2**30, 'ti': 2**40}
_RATE = re.compile(r'^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgt]i?)?b?\s*$', re.IGNORECASE)


def parse_byte_rate(text: str) -> float:
    """``'100MB'`` -> 1e8, ``'1.5GiB'`` -> 1.5 * 2**30, ``'4096'`` -> 4096.0 (bytes per second).

    Raises:
        ValueError: not a positive number of bytes with an optional unit (names the text).
    """
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f'{ENV_VAR}={text!r}: expected bytes per second, e.g. 250000000, 100MB or 1.5GiB')
    rate = float(match.group(1)) * _UNITS[(match.group(2) or '').lower()]
    if rate < 1:
        raise ValueError(f'{ENV_VAR}={text!r}: the cap must be at least 1 byte per second')
    return rate


class NodeUploadRate:
    """A machine-wide byte-rate schedule shared through a file in ``folder``.

    Args:
        bytes_per_s: the cap for the whole machine (> 0).
        folder: where the schedule and its lock live; every rank of the node must use the same
            one (default: ``node-upload-rate/`` in the per-user private folder, see
            :mod:`dist_logging._private_dirs`). A given folder is created if missing but not checked;
            the schedule file is opened without following a symlink and must be this user's.
        burst_seconds: how many seconds' worth of bytes a quiet machine may send at once.

    Raises:
        ValueError: ``bytes_per_s`` or ``burst_seconds`` out of range (names the value).
        PermissionError: the default folder is not private to this user (names it and says why).
    """

    def __init__(self, bytes_per_s: float, folder: Optional[str] = None, *, burst_seconds: float = BURST_SECONDS):
        if isinstance(bytes_per_s, bool) or not isinstance(bytes_per_s, (int, float)) or not bytes_per_s > 0:
            raise ValueError(f'upload byte rate must be a number > 0, got {bytes_per_s!r}')
        if not 0 <= burst_seconds < 3600:
            raise ValueError(f'burst_seconds must be in [0, 3600), got {burst_seconds!r}')
        self.bytes_per_s = float(bytes_per_s)
        self.burst_seconds = burst_seconds
        if folder:
            os.makedirs(folder, exist_ok=True)
            self.folder = folder
        else:
            self.folder = _private_dirs.private_dir('node-upload-rate')
        self._state_path = os.path.join(self.folder, 'schedule.bin')
        # filelock excludes processes; threads of one process share its lock object, so they
        # also queue on this one first.
        self._file_lock = filelock.FileLock(os.path.join(self.folder, 'schedule.lock'), mode=0o600, thread_local=False)
        self._thread_lock = threading.Lock()

    def reserve(self, nbytes: int) -> float:
        """Book ``nbytes`` on the machine's schedule; returns the seconds to wait before sending them.

        Reservations are served in the order they are made, across every process of the machine.

        Raises:
            PermissionError: ``schedule.bin`` is a symlink or not a private file of this user.
        """
        if nbytes <= 0:
            nbytes = 0
        with self._thread_lock, self._file_lock:
            now = time.monotonic()
            clock_start = time.time() - now
            fd = _private_dirs.open_private_file(self._state_path, os.O_RDWR, create=True)
            try:
                raw = os.pread(fd, _STATE.size, 0)
                written_start, paid_until = _STATE.unpack(raw) if len(raw) == _STATE.size else (clock_start, now)
                if abs(written_start - clock_start) > 60:  # written under another boot's clock
                    paid_until = now
                start = max(paid_until, now)
                os.pwrite(fd, _STATE.pack(clock_start, start + nbytes / self.bytes_per_s), 0)
            finally:
                os.close(fd)
        return max(0.0, start - self.burst_seconds - now)

    def charge(self, nbytes: int, stop: Optional[threading.Event] = None) -> None:
        """Reserve ``nbytes`` and wait for their turn (``charge(0)`` waits for the machine's debt).

        Raises:
            Interrupted: ``stop`` was set while waiting.
        """
        delay = self.reserve(nbytes)
        if delay <= 0:
            return
        if stop is None:
            time.sleep(delay)
        elif stop.wait(delay):
            raise Interrupted(f'upload stopped while waiting under the machine upload bandwidth cap ({ENV_VAR})')

    def progress_callback(self, stop: Optional[threading.Event] = None) -> 'ChargingProgress':
        """A ``callback(transferred_so_far, total)`` for one upload attempt that charges what it is told."""
        return ChargingProgress(self, stop)

    def __repr__(self) -> str:
        return f'NodeUploadRate({self.bytes_per_s:.0f} B/s, {self.folder!r})'


class ChargingProgress:
    """Charges a :class:`NodeUploadRate` for the bytes an object store reports (thread-safe).

    Stores call it as ``callback(transferred_so_far, total)`` (Composer's progress contract),
    possibly from several threads; each call charges the growth since the last one and waits
    for its turn on the calling thread, which slows the store's sending to the machine's cap.
    """

    def __init__(self, rate: NodeUploadRate, stop: Optional[threading.Event] = None):
        self.rate, self.stop = rate, stop
        self.charged = 0
        self._lock = threading.Lock()

    def __call__(self, transferred: int, total: int = -1) -> None:
        with self._lock:
            grew = transferred - self.charged
            if grew <= 0:
                return
            self.charged = transferred
        self.rate.charge(grew, self.stop)

    def settle(self, size: int) -> None:
        """Charge what the store moved but never reported (``size`` is the object's size); no wait."""
        with self._lock:
            rest, self.charged = size - self.charged, max(self.charged, size)
        if rest > 0:
            self.rate.reserve(rest)


def node_rate_from_env(staging_folder: Optional[str] = None) -> Optional[NodeUploadRate]:
    """The machine's cap as configured by ``DIST_LOGGING_UPLOAD_BYTES_PER_S`` (None: no cap).

    Args:
        staging_folder: the job's ``upload_staging_folder`` when it chose one: the schedule then
            lives in its machine folder (see :func:`dist_logging._private_dirs.state_dir`), unless
            ``DIST_LOGGING_TMPDIR`` is set. The folder is checked on every call.

    Raises:
        ValueError: the variable is set to something that is not a byte rate (names it).
        PermissionError: the schedule's folder is not private to this user (names it and says why).
    """
    raw = os.environ.get(ENV_VAR, '')
    if raw.strip() == '':
        return None
    rate = parse_byte_rate(raw)
    folder = _private_dirs.private_dir('node-upload-rate', root=_private_dirs.state_dir(staging_folder))
    return _rate_for(rate, folder)


@functools.lru_cache(maxsize=8)
def _rate_for(rate: float, folder: str) -> NodeUploadRate:
    return NodeUploadRate(rate, folder)
