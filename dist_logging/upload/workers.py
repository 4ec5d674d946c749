"""Upload workers: a scheduler with per-name ordering over a thread pool or spawned processes.

:class:`UploadScheduler` takes frozen :class:`UploadTask` records (never live
objects) and guarantees at most one upload in flight per remote name: a newer
task for a busy name waits, and a task still waiting when an even newer one
arrives is *superseded* (reported, so its snapshot is deleted) instead of being
uploaded, so an object never ends with older bytes after newer ones.

Executors:

* :class:`ThreadExecutor` (default): ``num_workers`` daemon threads sharing the store (which must be
  thread-safe). A thread that dies is replaced.
* :class:`ProcessExecutor` (``use_procs=True``): ``num_workers`` child Python processes, each with its own
  copy of the store, fed one task at a time over a socket pair. Children do not import torch (see
  :mod:`dist_logging.upload._child`), die with their parent, and a child that dies is replaced; its task is retried.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, wait as wait_connections
from typing import Any, Callable, NamedTuple, Optional

from dist_logging.object_store import supports_overwrite
from dist_logging.upload.node_slots import node_slots_from_env
from dist_logging.upload.rate_limit import node_rate_from_env
from dist_logging.upload.priority import LOWERED, lower_current_thread
from dist_logging.upload.retry import Interrupted, RetryPolicy, call_with_retries

__all__ = ['UploadTask', 'WorkerDied', 'UploadScheduler', 'ThreadExecutor', 'ProcessExecutor', 'run_upload']

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The worker running an upload died (a crashed thread or a killed process)."""


class UploadTask(NamedTuple):
    """One upload, as handed to a worker: plain values only (a named tuple: cheap to build and to pickle).

    Attributes:
        id: the journal id.
        name: the object name in the store.
        path: the file to upload (the snapshot, or the original for an in-place hand-over).
        size: its size in bytes, or -1 when not measured at the call (a hard-linked hand-over).
        overwrite: whether an existing object may be replaced.
        resumed: queued by an earlier process (it may already have landed).
        deaths: how many workers died running it so far.
        store: for thread executors only, a store overriding the executor's (used by ``drain``).
        owned: ``path`` is a snapshot the uploader owns (a ``copy=True`` copy, deleted after the
            upload, never written again): a store may place it by linking it instead of copying.
        staging_folder: the ``upload_staging_folder`` the job chose (None: the default): where
            the machine-wide upload caps keep their state (see :mod:`dist_logging._private_dirs`).
    """

    id: int
    name: str
    path: str
    size: int
    overwrite: bool
    resumed: bool = False
    deaths: int = 0
    store: Any = None
    owned: bool = False
    staging_folder: Optional[str] = None


def _already_landed(store: Any, task: UploadTask) -> bool:
    try:
        size = task.size if task.size >= 0 else os.stat(task.path).st_size
        return store.get_object_size(task.name) == size
    except Exception:  # noqa: BLE001 - cannot tell: keep the FileExistsError
        return False


def _check_then_put(store: Any, task: UploadTask, put_started: list[bool], callback: Any = None) -> None:
    """One attempt through a store whose ``upload_object`` has no ``overwrite`` keyword (Composer's protocol).

    ``overwrite=False`` is enforced here: the object must be missing (``get_object_size`` raises
    ``FileNotFoundError``) before the first put. Once a put was started, later attempts skip the
    check: what is there may be that attempt's partial object, which the retry replaces.
    """
    if not task.overwrite and not put_started:
        try:
            store.get_object_size(task.name)
        except FileNotFoundError:
            pass
        else:
            raise FileExistsError(
                f'{store.get_uri(task.name)} already exists and overwrite=False (checked before '
                'the upload: this store has no atomic overwrite=False)'
            )
    put_started.append(True)
    if callback is None:
        store.upload_object(task.name, task.path)
    else:
        store.upload_object(task.name, task.path, callback)


_OWNED_SUPPORT: dict[type, bool] = {}


def _accepts_owned(store: Any) -> bool:
    """Whether ``store.upload_object`` takes ``owned=`` (LocalObjectStore does; most stores do not).

    The first ``upload_object`` up the class's MRO with an explicit signature decides: a subclass
    that wraps it with ``(*args, **kwargs)`` and calls ``super()`` inherits the answer, a store
    written for Composer (no ``owned``) never gets the keyword. Cached per class.
    """
    cls = type(store)
    known = _OWNED_SUPPORT.get(cls)
    if known is None:
        import inspect

        known = False
        for klass in cls.__mro__:
            method = klass.__dict__.get('upload_object')
            if method is None:
                continue
            try:
                params = inspect.signature(method).parameters
            except (TypeError, ValueError):
                break
            owned = params.get('owned')
            if owned is not None:
                known = owned.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                break
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                break
        _OWNED_SUPPORT[cls] = known
    return known


def run_upload(store: Any, task: UploadTask, policy: RetryPolicy, stop: Optional[threading.Event] = None) -> None:
    """Upload ``task`` to ``store`` with retries. Runs on a worker.

    With ``overwrite=False``, a ``FileExistsError`` on a retry or on a resumed task
    whose object already has the snapshot's size is taken as "an earlier attempt
    landed before its confirmation was lost", not as a collision. A store without an
    ``overwrite`` keyword (written for Composer) gets check-then-put (:func:`_check_then_put`).

    Raises:
        The upload's last error, or :class:`~dist_logging.upload.retry.Interrupted`.
    """

    slots = node_slots_from_env(task.staging_folder)
    rate = node_rate_from_env(task.staging_folder)
    owned = task.owned and _accepts_owned(store)
    native = supports_overwrite(store)
    put_started: list[bool] = []

    def attempt(number: int) -> None:
        with slots.hold(stop) if slots is not None else contextlib.nullcontext():
            progress = None
            if rate is not None:
                rate.charge(0, stop)  # wait out the machine's debt (e.g. a store that reported late)
                progress = rate.progress_callback(stop)
            _attempt(number, progress)
            if progress is not None:  # what the store moved but did not report
                progress.settle(task.size if task.size >= 0 else _size_or_zero(task.path))

    def _attempt(number: int, progress: Any) -> None:
        kwargs = {} if progress is None else {'callback': progress}
        if not native:
            try:
                _check_then_put(store, task, put_started, progress)
            except FileExistsError:
                if task.resumed and _already_landed(store, task):
                    return
                raise
            return
        try:
            if owned:
                store.upload_object(task.name, task.path, overwrite=task.overwrite, owned=True, **kwargs)
            else:
                store.upload_object(task.name, task.path, overwrite=task.overwrite, **kwargs)
        except FileExistsError:
            if not task.overwrite and (number > 1 or task.resumed) and _already_landed(store, task):
                return
            raise

    call_with_retries(attempt, policy, stop, store)


def _size_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


ResultCallback = Callable[[UploadTask, Optional[BaseException]], None]


class ThreadExecutor:
    """Runs tasks on ``num_workers`` daemon threads; calls ``on_result(task, exc_or_None)`` on the worker.

    With ``priority='low'`` or ``'idle'`` each thread lowers its own CPU and I/O priority as it
    starts (:mod:`dist_logging.upload.priority`).
    """

    def __init__(
        self,
        store: Any,
        policy: RetryPolicy,
        num_workers: int,
        on_result: ResultCallback,
        name: str = 'upload',
        priority: str = 'normal',
    ):
        self._store, self._policy, self._on_result, self._name = store, policy, on_result, name
        self._priority = priority
        self._queue: 'queue.SimpleQueue[Optional[UploadTask]]' = queue.SimpleQueue()
        self._stop = threading.Event()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()
        # Threads start at the first task: an uploader that never uploads leaves no thread behind.
        self._num_workers = num_workers
        self._started = False

    def _spawn(self) -> None:
        with self._threads_lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=self._loop, name=f'{self._name}-{len(self._threads)}', daemon=True)
            self._threads.append(thread)
        thread.start()

    def dispatch(self, task: UploadTask) -> None:
        if not self._started:
            with self._threads_lock:
                start, self._started = not self._started and not self._stopping, True
            if start:
                for _ in range(self._num_workers):
                    self._spawn()
        self._queue.put(task)

    def _loop(self) -> None:
        task: Optional[UploadTask] = None
        if self._priority in LOWERED:
            lower_current_thread(self._priority)
        try:
            while True:
                task = self._queue.get()
                if task is None:
                    return
                store = task.store if task.store is not None else self._store
                error: Optional[BaseException] = None
                try:
                    if self._stop.is_set():
                        raise Interrupted('upload not started: the uploader was stopped')
                    run_upload(store, task, self._policy, self._stop)
                except Exception as exc:  # noqa: BLE001 - reported to the scheduler
                    error = exc
                self._on_result(task, error)
                task = None
        except BaseException as exc:
            # The thread is dying (SystemExit from a store, a bug in a callback...): report its task
            # and put a new thread in its place so the other uploads do not stall.
            if not self._stopping:
                self._spawn()
            if task is not None:
                died = WorkerDied(f'upload thread died: {type(exc).__name__}: {exc}')
                died.__cause__ = exc
                self._on_result(task, died)
            if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise

    def shutdown(self, abort: bool = False, timeout: Optional[float] = None) -> None:
        """Stop the threads (after the queued tasks, or at once with ``abort``, interrupting backoffs);
        ``timeout`` bounds the whole wait for them, not each thread's."""
        self._stopping = True
        if abort:
            self._stop.set()
        with self._threads_lock:
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))


_BOOT = r'''
import importlib.util, os, sys
root, fd, priority = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# Import dist_logging's upload code without running the package __init__ (which imports torch):
# the real __init__ runs only if something asks the package for a top-level name.
pkg_dir = os.path.join(root, 'dist_logging')
spec = importlib.util.spec_from_file_location('dist_logging', os.path.join(pkg_dir, '__init__.py'),
                                              submodule_search_locations=[pkg_dir])
pkg = importlib.util.module_from_spec(spec)
def _load_real_package(name, _pkg=pkg, _spec=spec):
    _pkg.__dict__.pop('__getattr__', None)
    _spec.loader.exec_module(_pkg)
    return getattr(_pkg, name)
pkg.__getattr__ = _load_real_package
sys.modules['dist_logging'] = pkg
from dist_logging.upload._child import serve
serve(fd, priority)
'''


class _Slot:
    __slots__ = ('proc', 'conn', 'task')

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen] = None
        self.conn: Optional[Connection] = None
        self.task: Optional[UploadTask] = None


class ProcessExecutor:
    """Runs tasks in ``num_workers`` child processes; ``on_result`` is called on a manager thread.

    The store and policy are pickled once here (so a store that cannot be pickled
    fails at construction) and unpickled in each child, which builds its own clients.
    With ``priority='low'`` or ``'idle'`` each child lowers its own CPU and I/O priority as it starts.
    """

    def __init__(
        self,
        store: Any,
        policy: RetryPolicy,
        num_workers: int,
        on_result: ResultCallback,
        name: str = 'upload',
        priority: str = 'normal',
    ):
        self._payload = pickle.dumps((store, policy))
        self._priority = priority
        self._on_result = on_result
        self._slots = [_Slot() for _ in range(num_workers)]
        self._ready: collections.deque[UploadTask] = collections.deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._abort = False
        self._broken: Optional[BaseException] = None
        self._root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._started = threading.Event()
        self._manager = threading.Thread(target=self._manage, name=f'{name}-procs', daemon=True)
        self._manager.start()

    # Children are started from the manager thread: PR_SET_PDEATHSIG ties a child to the
    # thread that forked it, and this thread lives as long as the executor.
    def _spawn(self, slot: _Slot) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            slot.proc = subprocess.Popen(
                [sys.executable, '-c', _BOOT, self._root, str(child_sock.fileno()), self._priority],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child_sock.close()
        slot.conn = Connection(parent_sock.detach())
        slot.conn.send(list(sys.path))
        slot.conn.send_bytes(self._payload)
        slot.task = None

    def dispatch(self, task: UploadTask) -> None:
        with self._lock:
            broken = self._broken
            if broken is None:
                self._ready.append(task)
        if broken is not None:
            self._on_result(task, WorkerDied(f'upload process manager failed: {broken}'))
            return
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b'x')
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def _manage(self) -> None:
        try:
            self._manage_loop()
        except BaseException as exc:  # noqa: BLE001 - never leave tasks hanging
            log.exception('upload process manager failed')
            with self._lock:
                self._broken = exc
                orphans = [slot.task for slot in self._slots if slot.task is not None] + list(self._ready)
                self._ready.clear()
                for slot in self._slots:
                    slot.task = None
            for slot in self._slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
            for task in orphans:
                self._on_result(task, WorkerDied(f'upload process manager failed: {type(exc).__name__}: {exc}'))
        finally:
            self._started.set()

    def _manage_loop(self) -> None:
        for slot in self._slots:
            self._spawn(slot)
        self._started.set()
        while True:
            with self._lock:
                for slot in self._slots:
                    if slot.task is None and self._ready and not self._abort:
                        task = self._ready.popleft()
                        assert slot.conn is not None  # every slot was spawned before the loop
                        try:
                            slot.conn.send(task)
                            slot.task = task
                        except OSError:
                            self._ready.appendleft(task)  # the child is gone; its EOF is handled below
                busy = any(slot.task is not None for slot in self._slots)
                if self._stopping and (self._abort or (not busy and not self._ready)):
                    break
            # A child that dies closes its end of the socket: its connection becomes readable (EOF).
            waited: list[Any] = [self._wake_r] + [slot.conn for slot in self._slots]  # a pipe fd and connections
            ready = wait_connections(waited, timeout=5.0)
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            for slot in self._slots:
                assert slot.proc is not None  # every slot was spawned before the loop
                if slot.conn in ready or slot.proc.poll() is not None:
                    self._poll_slot(slot)
        for slot in self._slots:
            self._stop_child(slot)
        with self._lock:
            leftover = list(self._ready)
            self._ready.clear()
        for task in leftover:
            self._on_result(task, Interrupted('upload not started: the uploader was stopped'))

    def _poll_slot(self, slot: _Slot) -> None:
        conn, proc = slot.conn, slot.proc
        assert conn is not None and proc is not None  # every slot was spawned before the manager loop polls it
        try:
            if conn.poll():
                upload_id, error = conn.recv()
                task, slot.task = slot.task, None
                if task is not None and task.id == upload_id:
                    self._on_result(task, error)
                return
        except (EOFError, OSError):
            pass  # the child is gone
        if proc.poll() is None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        task, slot.task = slot.task, None
        code = proc.returncode
        conn.close()
        if not self._stopping or task is not None or self._ready:
            log.warning('upload worker process %d exited with %s; starting a new one', proc.pid, code)
            self._spawn(slot)
        if task is not None:
            reason = f'signal {-code}' if code < 0 else f'exit code {code}'
            self._on_result(task, WorkerDied(f'upload worker process died ({reason})'))

    def _stop_child(self, slot: _Slot) -> None:
        proc, conn = slot.proc, slot.conn
        if proc is None:
            return
        assert conn is not None  # _spawn sets the connection right after the process
        if self._abort:
            proc.kill()
        else:
            try:
                conn.send(None)
            except OSError:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        conn.close()
        if slot.task is not None:
            task, slot.task = slot.task, None
            self._on_result(task, Interrupted('upload interrupted: the uploader was stopped'))

    def shutdown(self, abort: bool = False, timeout: Optional[float] = None) -> None:
        """Stop the children (after the queued tasks, or at once with ``abort``)."""
        with self._lock:
            self._stopping = True
            self._abort = self._abort or abort
        self._wake()
        self._manager.join(timeout)
        if not self._manager.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    def child_pids(self) -> list[int]:
        """The process ids of the current children (for tests and diagnostics)."""
        self._started.wait(30)
        return [slot.proc.pid for slot in self._slots if slot.proc is not None]


class UploadScheduler:
    """Orders uploads per name over an executor and tracks what is outstanding.

    Callbacks (called on worker/manager threads, must not raise):
    ``on_done(task)`` when it landed, ``on_failed(task, exc)`` when it failed for good,
    ``on_superseded(task)`` when a newer upload of the same name replaced it before it started.

    Args:
        store: the object store (shared by threads, pickled for processes).
        policy: the retry policy.
        num_workers: threads or processes.
        use_procs: processes instead of threads.
        priority: ``'idle'`` or ``'low'`` (workers lower their CPU and I/O priority) or ``'normal'``.
    """

    def __init__(
        self,
        store: Any,
        policy: RetryPolicy,
        num_workers: int,
        *,
        use_procs: bool = False,
        on_done: Callable[[UploadTask], None],
        on_failed: Callable[[UploadTask, BaseException], None],
        on_superseded: Callable[[UploadTask], None],
        name: str = 'upload',
        priority: str = 'normal',
    ):
        self.policy = policy
        self._on_done, self._on_failed, self._on_superseded = on_done, on_failed, on_superseded
        self._cond = threading.Condition(threading.Lock())
        self._inflight: dict[str, UploadTask] = {}
        self._waiting: dict[str, UploadTask] = {}
        # Leftovers of an earlier process that a newer upload of their name superseded while they ran
        # (ids), and names whose leftover landed in this process: see `submit`.
        self._stale: set[int] = set()
        self._landed_leftovers: set[str] = set()
        self.outstanding = 0
        executor_cls = ProcessExecutor if use_procs else ThreadExecutor
        self.executor = executor_cls(store, policy, num_workers, self._result, name, priority)

    def submit(self, task: UploadTask) -> None:
        """Queue ``task``; returns at once.

        A new (not ``resumed``) task supersedes its name's upload queued by an earlier process
        (a restarted job's own leftover): if that one is waiting it is dropped; if it is running
        and fails, its failure is dropped (warned); if it landed, in this process, before or after
        this call, the new task replaces it even with ``overwrite=False``: last wins.
        """
        superseded = None
        with self._cond:
            self.outstanding += 1
            current = self._inflight.get(task.name)
            if not task.resumed:
                if current is not None and current.resumed:
                    self._stale.add(current.id)
                if task.name in self._landed_leftovers:
                    self._landed_leftovers.discard(task.name)
                    task = task._replace(overwrite=True)
            start = current is None
            if start:
                self._inflight[task.name] = task
            else:
                superseded = self._waiting.get(task.name)
                self._waiting[task.name] = task
                if superseded is not None:
                    self.outstanding -= 1
                    self._cond.notify_all()
        if start:
            self.executor.dispatch(task)
        elif superseded is not None:
            self._safe(self._on_superseded, superseded)

    def _result(self, task: UploadTask, error: Optional[BaseException]) -> None:
        if isinstance(error, WorkerDied) and task.deaths + 1 < self.policy.num_attempts:
            log.warning('upload of %r: %s; retrying it on another worker', task.name, error)
            self.executor.dispatch(task._replace(deaths=task.deaths + 1))
            return
        with self._cond:
            stale = task.id in self._stale
            self._stale.discard(task.id)
        if error is None:
            self._safe(self._on_done, task)
        elif stale:
            log.warning(
                'upload of %r left by an earlier process failed (%s: %s); a newer upload of that name replaces it',
                task.name,
                type(error).__name__,
                error,
            )
            self._safe(self._on_superseded, task)
        else:
            self._safe(self._on_failed, task, error)
        with self._cond:
            following = self._waiting.pop(task.name, None)
            if error is None and task.resumed:
                if following is not None and not following.resumed:
                    following = following._replace(overwrite=True)  # it replaces its own leftover's bytes
                elif following is None:
                    self._landed_leftovers.add(task.name)
            if following is None:
                self._inflight.pop(task.name, None)
            else:
                self._inflight[task.name] = following
            self.outstanding -= 1
            self._cond.notify_all()
        if following is not None:
            self.executor.dispatch(following)

    @staticmethod
    def _safe(callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - a bookkeeping error must not kill a worker
            log.exception('upload bookkeeping callback %r failed', callback)

    def is_pending(self, name: str) -> bool:
        """Whether an upload of ``name`` is running or waiting (its result callback has not returned yet)."""
        return name in self._inflight

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until nothing is outstanding; returns False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.outstanding == 0, timeout)

    def shutdown(self, abort: bool = False, timeout: Optional[float] = None) -> None:
        """Stop the executor: after the outstanding uploads, or at once (``abort``; they fail as interrupted)."""
        self.executor.shutdown(abort=abort, timeout=timeout)
