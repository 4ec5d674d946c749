"""Flush buffered log lines when SIGTERM arrives, then let SIGTERM do what it did before.

torchrun stops the surviving ranks of a failed attempt with SIGTERM (SLURM does the same at a
job's time limit or ``scancel``). Per-rank files already reach the operating system at every
``batch_end``; this handler also hands over what was written since, before the process ends.

Objects register with :func:`register` and implement ``_flush_on_signal()``; they are held
weakly. The handler is installed (from the main thread only: Python allows no other) when the
first object registers, in front of whatever handler was there, and removed again when the last
one unregisters, if it is still the current handler. After flushing it calls the previous
handler: a Python callable is called; ``SIG_IGN`` keeps ignoring; the default (or a handler
installed from C, which Python cannot call) is restored and the signal raised again, so the
process ends by SIGTERM as it would have without us.

The upload journal needs nothing here: every journal record is one unbuffered ``write`` (and
an ``fdatasync`` with ``fsync=True``) at the moment it is made.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from typing import Any

from dist_logging import dist

__all__ = ['register', 'unregister', 'flush_all']

_registered: 'weakref.WeakSet[Any]' = weakref.WeakSet()
_lock = threading.Lock()
_previous: Any = None
_installed = False


def flush_all() -> None:
    """Flush every registered owner (the process is ending: SIGTERM, or the exit after a fatal error)."""
    for owner in list(_registered):
        try:
            owner._flush_on_signal()
        except Exception:  # noqa: BLE001 - the process is ending; flush what can be flushed
            pass


def _handler(signum: int, frame: Any) -> None:
    flush_all()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def register(owner: Any) -> None:
    """Flush ``owner`` (``owner._flush_on_signal()``) when SIGTERM arrives; installs the handler when
    called from the main thread (elsewhere the owner is flushed once a main-thread registration installs it)."""
    global _previous, _installed
    with _lock:
        _registered.add(owner)
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            current = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _handler)
        except (ValueError, OSError):  # no signals here (e.g. an embedded interpreter)
            return
        _previous, _installed = current, True


def unregister(owner: Any) -> None:
    """Stop flushing ``owner``; the last one out restores the previous handler (main thread, if still ours)."""
    global _previous, _installed
    with _lock:
        _registered.discard(owner)
        if _registered or not _installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is _handler:
                signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            return
        _previous, _installed = None, False


# The exit after a fatal error skips the finalization of Python objects: flush the owners' lines first.
dist.on_fatal_exit(flush_all)
