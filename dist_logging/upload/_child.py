"""The main loop of an upload worker process (started by :class:`~dist_logging.upload.workers.ProcessExecutor`).

Protocol over one socket: the parent sends its ``sys.path`` (so the store's class
can be imported), then the pickled ``(store, policy)``, then one
:class:`~dist_logging.upload.workers.UploadTask` at a time (``None`` to stop);
the child answers each task with ``(task.id, None or exception)``.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    # Linux: get SIGKILL when the parent dies, so a killed rank leaves no uploader behind to race
    # a later drain. Elsewhere the EOF on the socket stops the child after its current upload.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort
        pass


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001
        return RuntimeError(f'{type(error).__module__}.{type(error).__name__}: {error}')


def serve(fd: int, priority: str = 'normal') -> None:
    _die_with_parent()
    if os.getppid() == 1:  # the parent died before prctl took effect
        return
    if priority in ('idle', 'low'):
        from dist_logging.upload.priority import lower_current_thread

        lower_current_thread(priority, whole_process=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    sys.path[:] = list(dict.fromkeys(conn.recv() + sys.path))
    from dist_logging.upload.workers import run_upload

    store, policy = pickle.loads(conn.recv_bytes())
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            error = None
            try:
                run_upload(store, task, policy)
            except Exception as exc:  # noqa: BLE001 - sent to the parent
                error = _portable(exc)
            try:
                conn.send((task.id, error))
            except (EOFError, OSError):
                break
    finally:
        try:
            store.close()
        except Exception:  # noqa: BLE001
            pass
