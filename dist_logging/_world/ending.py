"""After a fatal error, end the process at interpreter exit in bounded time, instead of in torch's teardown.

Why: a process group's C++ object is freed during interpreter finalization (the garbage
collection of ``torch.distributed``'s module state), and ``~ProcessGroupGloo`` waits, without a
deadline, until its work queue is empty and its worker threads joined. A gloo worker blocked in
``gloo::transport::tcp::UnboundBuffer::waitRecv`` on a peer that went silent (its host cut off
or frozen: nothing is refused, nothing arrives) returns only at that group's timeout, and the
works queued behind it wait their full timeout in turn: two ranks, one of them stopped, four
all_reduces left in flight on a group with an 8 s timeout held the other's exit for 80 s; the
default group's timeout is 10 minutes (``init_process_group_from_env``) or 30 (torch's gloo
default). The main thread then sits in ``Py_FinalizeEx -> finalize_modules -> ... ->
c10d::ProcessGroupGloo::~ProcessGroupGloo``, past every Python hook, until SIGKILL.

What: when this process hit a fatal error (:func:`note_fatal_error`: a logging collective of
:class:`~dist_logging.dist.LoggingGroup` failed and its group was abandoned; other rooms, e.g.
the postmortem after SIGTERM, call it too), the ``atexit`` hook below ends the process with
``os._exit(1)`` once the hooks registered after it ran (Loggers, user code imported later), after
a bounded flush of what can still be flushed: what registered with :func:`on_fatal_exit`
(``FileLogger``'s buffered lines), Python's ``logging`` handlers, ``sys.stdout`` and ``sys.stderr``.
It writes one line on stderr saying so. Nothing accepted for upload is lost: an upload's file is
in its staging folder (journaled) from the moment it was accepted, and what did not land stays
there for ``dist-logging drain``. The flush is itself bounded
(:data:`FLUSH_SECONDS`): a handler that blocks gets the stacks of every thread dumped on stderr
and the process ends with ``_exit(1)`` (``faulthandler``'s native watchdog thread). A process
with no fatal error exits exactly as before.

The exit status is 1 whatever the script was exiting with: after a fatal error the run failed,
and a launcher (torchrun, SLURM) must see it.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable, Optional

__all__ = [
    'note_fatal_error',
    'fatal_error',
    'forget_fatal_error',
    'on_fatal_exit',
    'on_fatal_exit_wait',
    'FLUSH_SECONDS',
    'DELIVERY_WAIT_SECONDS',
    'EXIT_STATUS',
]

#: The longest the flush before the forced exit may take; past it the process ends all the same.
FLUSH_SECONDS = 5.0
#: The longest the exit after a fatal error waits for deliveries in progress (:func:`on_fatal_exit_wait`:
#: a postmortem set being uploaded), before the flush.
DELIVERY_WAIT_SECONDS = 20.0
#: The status a process ends with after a fatal error.
EXIT_STATUS = 1

_fatal: Optional[BaseException] = None
_lock = threading.Lock()
_flushes: list[Callable[[], None]] = []
_waits: list[Callable[[float], object]] = []


def on_fatal_exit(flush: Callable[[], None]) -> None:
    """Call ``flush()`` (within the bounded flush, before ``logging``'s) when the process ends after a
    fatal error: for what would otherwise be written only when Python objects are finalized (e.g.
    ``FileLogger`` lines logged since the last ``batch_end`` of a Logger never closed). Its exceptions are
    ignored. Register module-level functions: the list is kept for the life of the process.

    Args:
        flush: a callable without arguments.
    """
    _flushes.append(flush)


def on_fatal_exit_wait(wait: Callable[[float], object]) -> None:
    """Call ``wait(timeout)`` when the process ends after a fatal error, before the flush: for work in
    progress that must finish first (a postmortem set being uploaded). The waits share one deadline,
    :data:`DELIVERY_WAIT_SECONDS`; each must return within the timeout it is given (the process ends at
    the deadline plus :data:`FLUSH_SECONDS` all the same). Its exceptions are ignored. Register module-level
    functions: the list is kept for the life of the process.

    Args:
        wait: a callable taking the seconds it may wait.
    """
    _waits.append(wait)


def note_fatal_error(error: BaseException) -> None:
    """Record that this process hit a fatal error: at interpreter exit it ends with status 1 in bounded
    time (see the module docstring). The first error is kept; later calls do nothing.

    Args:
        error: the error (its first line is printed when the process ends).
    """
    global _fatal
    with _lock:
        if _fatal is None:
            _fatal = error


def fatal_error() -> Optional[BaseException]:
    """The fatal error noted in this process, or None."""
    return _fatal


def forget_fatal_error() -> Optional[BaseException]:
    """Forget the fatal error noted in this process (it then exits as it would have without one).

    For a process that recovered on purpose: it destroyed the groups whose collectives failed, or
    it runs many scenarios in turn (a test suite). Returns the error forgotten, or None.
    """
    global _fatal
    with _lock:
        error, _fatal = _fatal, None
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f'{type(error).__name__}: {text.splitlines()[0] if text else ""}'[:500]


def _end_after_fatal_error() -> None:
    """(atexit) After a fatal error: bounded flush, one line on stderr, ``os._exit``."""
    error = _fatal
    if error is None:
        return
    if _waits:  # deliveries in progress (a postmortem set) land first, bounded
        faulthandler.dump_traceback_later(DELIVERY_WAIT_SECONDS + FLUSH_SECONDS, exit=True)
        deadline = time.monotonic() + DELIVERY_WAIT_SECONDS
        for wait in list(_waits):
            try:
                wait(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - ending anyway
                pass
    faulthandler.dump_traceback_later(FLUSH_SECONDS, exit=True)  # a flush that blocks still ends the process
    for flush in list(_flushes):
        try:
            flush()
        except Exception:  # noqa: BLE001 - ending anyway: flush what can be flushed
            pass
    try:
        logging.shutdown()  # registered before us (at ``import logging``), so it would run after: run it now
    except Exception:  # noqa: BLE001 - ending anyway
        pass
    try:
        sys.stderr.write(
            f'dist_logging: ending this process (exit status {EXIT_STATUS}) after a fatal error: '
            f'{_first_line(error)}. Skipping the teardown of torch.distributed, which waits for collectives '
            'that cannot complete; uploads that did not land stay in their staging folders: run '
            '`dist-logging drain <staging folder>` (see docs/gather.md).\n'
        )
    except Exception:  # noqa: BLE001 - stderr may be closed
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - closed or broken: nothing more to flush
            pass
    os._exit(EXIT_STATUS)


# Registered when dist_logging.dist is first imported, before the package's other exit hooks: atexit runs
# hooks last-in first-out, so the store line's goodbye, the release of the Loggers' groups and every hook
# registered later (Loggers, user code) run before this one.
atexit.register(_end_after_fatal_error)
