"""Running upload workers below the training loop: lower CPU and I/O priority for the calling thread.

:func:`lower_current_thread` is called by each upload worker (thread or child process) as it
starts, unless the uploader was built with ``upload_priority='normal'``. What ``'low'`` does
(``'idle'``, the default, adds ``SCHED_IDLE``: see below):

* **Linux**: ``nice`` is per thread (a kernel task), so ``os.setpriority(PRIO_PROCESS, tid, 19)``
  lowers this thread only -- the training threads of the same process keep their priority.
  Threads the worker starts later (boto3's multipart transfer threads) inherit it. CFS gives a
  nice-19 task about 1.5 % of a core it shares with a nice-0 task, and all of an idle core: the
  uploads still run, but the step's threads go first. The I/O priority is set with the
  ``ioprio_set`` system call to **best-effort, level 7** (the lowest best-effort level), also per
  thread. The *idle* class was not chosen: with BFQ an idle-class task can be starved for as long
  as any other process keeps the disk busy (a data loader, another rank's checkpoint write), and a
  checkpoint that never uploads is worse than one that uploads slowly. I/O priorities only take
  effect with an I/O scheduler that honours them (BFQ; mq-deadline honours the class, not the
  level; ``none`` ignores them), and page-cache writeback is done by kernel threads, not by us.
* **macOS and other BSDs**: ``setpriority(PRIO_PROCESS, ...)`` applies to the *whole process*,
  so calling it from a worker thread would slow the training loop itself. Threads are left alone
  there; worker *processes* (``use_procs=True``) lower their own CPU priority.
* **Windows**: nothing is changed.

``upload_priority='idle'`` adds, on Linux, the ``SCHED_IDLE`` scheduling policy per worker thread
(``sched_setscheduler(tid, SCHED_IDLE)``; unprivileged, it only lowers). The difference to nice 19
is when the step's threads get the core back: a training thread that wakes (an intra-op worker
at the start of a parallel region, the main thread after a collective) preempts a ``SCHED_IDLE``
task at once, whereas a nice-19 task may finish its time slice first (a few ms with EEVDF). For
a step made of parallel regions, which run as fast as their slowest thread, those slices add
up. ``SCHED_IDLE`` is not strict idleness: the scheduler still gives such a task a minimal share
(weight 3 against 1024 for nice 0), so uploads progress even on a saturated node. Elsewhere
``'idle'`` is ``'low'``.

A failure (an unknown architecture for ``ioprio_set``, a seccomp filter, ...) is logged once at
debug level and the worker runs at normal priority: priority is an optimisation, never a reason
for an upload to fail.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import threading
from typing import Optional

__all__ = [
    'PRIORITIES',
    'LOWERED',
    'WORKER_NICE',
    'IOPRIO_CLASS_BE',
    'IOPRIO_LOWEST_LEVEL',
    'check_priority',
    'lower_current_thread',
    'get_ioprio',
    'thread_nice',
    'thread_policy',
]

log = logging.getLogger(__name__)

PRIORITIES = ('idle', 'low', 'normal')
LOWERED = ('idle', 'low')  # the levels at which workers lower their priority
WORKER_NICE = 19
IOPRIO_CLASS_BE = 2
IOPRIO_LOWEST_LEVEL = 7
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread only

# ioprio_set / ioprio_get system call numbers (not in Python's os module).
_SYSCALLS = {'x86_64': (251, 252), 'amd64': (251, 252), 'aarch64': (30, 31), 'arm64': (30, 31)}

_warned: set[str] = set()
_warn_lock = threading.Lock()
_libc = None


def check_priority(value: object) -> str:
    """Return ``value`` if it is a valid ``upload_priority``.

    Raises:
        ValueError: anything but ``'idle'``, ``'low'`` or ``'normal'`` (naming the bad value).
    """
    if not isinstance(value, str) or value not in PRIORITIES:
        raise ValueError(f"upload_priority must be one of {', '.join(map(repr, PRIORITIES))}, got {value!r}")
    return value


def _debug_once(key: str, message: str, *args: object) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.debug(message, *args)


def _syscall_numbers() -> Optional[tuple[int, int]]:
    if not sys.platform.startswith('linux'):
        return None
    return _SYSCALLS.get(platform.machine().lower())


def _call_libc_syscall(number: int, *args: int) -> int:
    global _libc
    import ctypes

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def get_ioprio(tid: int = 0) -> Optional[tuple[int, int]]:
    """``(class, level)`` of thread ``tid`` (0: the calling thread), or None where it cannot be read."""
    numbers = _syscall_numbers()
    if numbers is None:
        return None
    value = _call_libc_syscall(numbers[1], _IOPRIO_WHO_PROCESS, tid)
    return value >> _IOPRIO_CLASS_SHIFT, value & ((1 << _IOPRIO_CLASS_SHIFT) - 1)


def _set_ioprio(ioprio_class: int, level: int) -> None:
    numbers = _syscall_numbers()
    if numbers is None:
        _debug_once(
            'ioprio', 'upload workers keep their I/O priority: no ioprio_set on %s/%s', sys.platform, platform.machine()
        )
        return
    try:
        _call_libc_syscall(numbers[0], _IOPRIO_WHO_PROCESS, 0, (ioprio_class << _IOPRIO_CLASS_SHIFT) | level)
    except (OSError, AttributeError) as exc:
        _debug_once('ioprio-failed', 'upload workers keep their I/O priority: ioprio_set failed: %s', exc)


def thread_nice(tid: Optional[int] = None) -> int:
    """The nice value of thread ``tid`` (default: the calling thread) on Linux; the process's elsewhere."""
    if sys.platform.startswith('linux'):
        return os.getpriority(os.PRIO_PROCESS, tid if tid is not None else threading.get_native_id())
    return os.getpriority(os.PRIO_PROCESS, 0)


def thread_policy(tid: Optional[int] = None) -> Optional[int]:
    """The scheduling policy of thread ``tid`` (default: the calling thread; e.g. ``os.SCHED_IDLE``),
    or None where it cannot be read."""
    if not hasattr(os, 'sched_getscheduler'):
        return None
    return os.sched_getscheduler(tid if tid is not None else threading.get_native_id())


def lower_current_thread(level: str = 'low', *, whole_process: bool = False) -> None:
    """Lower the CPU and I/O priority of the calling thread (see the module docstring). Never raises.

    Args:
        level: ``'low'`` (nice 19, best-effort I/O level 7) or ``'idle'`` (the same plus
            ``SCHED_IDLE`` on Linux).
        whole_process: the caller is a worker *process* whose every thread is a worker: on
            platforms where priorities are per process (macOS), lower the process then.
    """
    try:
        if sys.platform.startswith('linux'):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, max(WORKER_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
            _set_ioprio(IOPRIO_CLASS_BE, IOPRIO_LOWEST_LEVEL)
            if level == 'idle':
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except (OSError, AttributeError) as exc:
                    _debug_once('sched-idle-failed', 'upload workers keep their scheduling policy: %s', exc)
        elif whole_process and hasattr(os, 'setpriority'):
            os.setpriority(os.PRIO_PROCESS, 0, max(WORKER_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
        else:
            _debug_once(
                'platform',
                'upload worker threads keep their priority on %s (priorities are per '
                'process there; the training process is not slowed down)',
                sys.platform,
            )
    except Exception as exc:  # noqa: BLE001 - priority is an optimisation, never a failure
        _debug_once('nice-failed', 'upload workers keep their CPU priority: %s', exc)
