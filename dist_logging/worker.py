"""One background thread per destination that runs its tracker calls in order, off the training loop."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Optional

__all__ = ['SerialWorker']

_STOP = object()


class SerialWorker:
    """Runs submitted jobs one at a time, in submission order, on a daemon thread.

    A job that raises is recorded and the next ones still run; the owner surfaces the
    failures with :meth:`raise_errors` (at its next call or at close). The queue is
    bounded: when the tracker falls this far behind, :meth:`submit` waits for room
    (back-pressure) rather than growing memory without limit or dropping data.

    Args:
        owner: the destination's name, for thread names and messages.
        max_queue: jobs that may wait before :meth:`submit` blocks (>= 1).
    """

    def __init__(self, owner: str, max_queue: int = 10_000):
        self.owner = owner
        self._queue: 'queue.Queue[object]' = queue.Queue(maxsize=max_queue)
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f'dist_logging-{owner}', daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; returns at once unless the queue is full.

        Raises:
            RuntimeError: the worker is closed.
        """
        if self._closed:
            raise RuntimeError(f'{self.owner}: the background worker is closed')
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
            error = RuntimeError(f'{self.owner}: {len(errors)} background call(s) failed; first: '
                                 f'{type(errors[0]).__name__}: {errors[0]}')
            for other in errors[1:4]:
                error.add_note(f'also: {type(other).__name__}: {other}')
            raise error from errors[0]

    def close(self, timeout: Optional[float] = None) -> bool:
        """Run what is queued, then stop the thread. Idempotent.

        Returns:
            Whether the thread ended within ``timeout`` (always True with ``None``).
        """
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
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
                with self._lock:
                    self._errors.append(exc)
