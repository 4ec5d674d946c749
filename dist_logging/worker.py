"""The one background-worker primitive: a named thread that runs submitted jobs in order, off the caller's thread.

Like CPython's ``QueueHandler``/``QueueListener`` port between a producer and an I/O thread: a bounded
queue (back-pressure instead of unbounded memory), jobs run one at a time in submission order, the
first failure is raised at the owner's next call (:meth:`BackgroundWorker.raise_errors`), and ``close``
runs what is queued and then ends the thread, waiting at most a deadline.

Used by every tracker destination (``destinations/_tracker.py``, MLflow's too) and by the straggler
report's thread (``stragglers/_report_thread.py``, which adds in-order results on top). Two loops stay
special, on purpose: the checkpoint committer (``checkpoint/_committer.py``) waits on shard landings
and a deadline per checkpoint, not on a job queue, and the rank watch (``_world/watch.py``) beats on a
fixed period and must keep beating while every queue is stuck (it is how a stuck rank is told apart
from a dead one).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Optional

__all__ = ['BackgroundWorker', 'SerialWorker']

_STOP = object()


class BackgroundWorker:
    """Runs submitted jobs one at a time, in submission order, on a named daemon thread.

    A job that raises is recorded and the next ones still run; the owner surfaces the
    failures with :meth:`raise_errors` (at its next call or at close). The queue is
    bounded: when the worker falls this far behind, :meth:`submit` waits for room
    (back-pressure) rather than growing memory without limit or dropping data.

    Args:
        owner: the owner's name, for messages (and the thread's name unless ``thread_name`` is given).
        max_queue: jobs that may wait before :meth:`submit` blocks (>= 1).
        thread_name: the thread's name (default ``'dist_logging-<owner>'``).
        what: how :meth:`raise_errors` names the jobs (``'background call(s)'``).
        start: start the thread now; otherwise at the first :meth:`submit` or :meth:`start`.

    Raises:
        ValueError: ``max_queue`` below 1.
    """

    def __init__(
        self,
        owner: str,
        max_queue: int = 10_000,
        *,
        thread_name: Optional[str] = None,
        what: str = 'background call(s)',
        start: bool = True,
    ):
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f'{owner}: max_queue must be an int >= 1, got {max_queue!r}')
        self.owner = owner
        self.what = what
        self._queue: 'queue.Queue[object]' = queue.Queue(maxsize=max_queue)
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=thread_name or f'dist_logging-{owner}', daemon=True)
        if start:
            self._thread.start()

    def start(self) -> int:
        """Start the thread if it is not running yet (idempotent).

        Returns:
            The thread's ident (e.g. to lend it a logging group).

        Raises:
            RuntimeError: the worker is closed.
        """
        if self._closed:
            raise RuntimeError(f'{self.owner}: the background worker is closed')
        if self._thread.ident is None:
            with self._lock:
                if self._thread.ident is None:
                    self._thread.start()
        return self._thread.ident  # type: ignore[return-value]

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; returns at once unless the queue is full.

        Args:
            job: called with no arguments on the worker's thread.

        Raises:
            RuntimeError: the worker is closed.
        """
        if self._closed:
            raise RuntimeError(f'{self.owner}: the background worker is closed')
        if self._thread.ident is None:
            self.start()
        self._queue.put(job)

    def raise_errors(self) -> None:
        """Raise the jobs' failures recorded since the last call, if any.

        Raises:
            RuntimeError: naming how many jobs failed, with the first failure as the cause
                and the others in its notes.
        """
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            error = RuntimeError(
                f'{self.owner}: {len(errors)} {self.what} failed; first: {type(errors[0]).__name__}: {errors[0]}'
            )
            for other in errors[1:4]:
                error.add_note(f'also: {type(other).__name__}: {other}')
            raise error from errors[0]

    def record_error(self, exc: BaseException) -> None:
        """Record a failure as if a job had raised it (for work the owner ran inline instead).

        Args:
            exc: the failure, raised by the next :meth:`raise_errors`.
        """
        with self._lock:
            self._errors.append(exc)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Run what is queued, then stop the thread. Idempotent.

        Args:
            timeout: seconds to wait for the thread (None: until it ends).

        Returns:
            Whether the thread ended within ``timeout`` (always True with ``None``).
        """
        if not self._closed:
            self._closed = True
            if self._thread.ident is None:
                return True
            self._queue.put(_STOP)
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except BaseException as exc:  # noqa: BLE001 - recorded, raised by the owner
                self.record_error(exc)


#: The destinations' earlier name for the same primitive.
SerialWorker = BackgroundWorker
