"""The rank reporter's report thread: runs jobs in order, off the training thread.

Handing a job over costs the training thread one ``SimpleQueue.put`` (no future, no lock of
its own), and checking for a result one ``empty()``: the report step should cost the step as
little as the steps between reports.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

__all__ = ['ReportThread']


class ReportThread:
    """One thread that calls ``run(*job)`` for each submitted job, in order; results come back in order.

    Submit and collect from one thread (the training thread). The thread starts with the first
    job and ends at :meth:`close`.

    Args:
        run: called on the report thread with each job's arguments; what it returns (or raises)
            is the job's result.
        name: the thread's name.

    Attributes:
        outstanding: jobs submitted whose results were not collected yet (an attribute, not a
            property: the reporter reads it at every step).
    """

    __slots__ = ('_run', '_name', '_jobs', '_results', 'outstanding', '_thread', '_closed')

    def __init__(self, run: Callable[..., Any], name: str):
        self._run = run
        self._name = name
        self._jobs: 'queue.SimpleQueue[Optional[tuple]]' = queue.SimpleQueue()
        self._results: 'queue.SimpleQueue[tuple[bool, Any]]' = queue.SimpleQueue()
        self.outstanding = 0
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def start(self) -> int:
        """Start the thread if it is not running yet; its ident (e.g. to lend it a logging group).

        Raises:
            RuntimeError: the thread was closed.
        """
        if self._closed:
            raise RuntimeError(f'{self._name}: the report thread was closed')
        if self._thread is None:
            # A daemon: an interpreter that exits without closing the Logger must not wait for a report's
            # collective (each ends by its own deadline anyway).
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        return self._thread.ident  # type: ignore[return-value]

    def submit(self, *job: Any) -> None:
        """Queue ``job`` (the arguments of one ``run`` call); starts the thread if needed.

        Raises:
            RuntimeError: the thread was closed.
        """
        self.start()
        self.outstanding += 1
        self._jobs.put(job)

    def ready(self) -> bool:
        """Whether the oldest outstanding job's result is there (never waits)."""
        return self.outstanding > 0 and not self._results.empty()

    def result(self, timeout: Optional[float] = None) -> Any:
        """The oldest outstanding job's result, waiting for it at most ``timeout`` seconds (None: until done).

        Raises:
            LookupError: no job is outstanding.
            TimeoutError: the result did not come within ``timeout``.
            Exception: what the job raised.
        """
        if not self.outstanding:
            raise LookupError('no report job is outstanding')
        try:
            ok, value = self._results.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f'{self._name}: no report within {timeout} s') from None
        self.outstanding -= 1
        if not ok:
            raise value
        return value

    def close(self, timeout: Optional[float] = None) -> None:
        """Let the thread finish the queued jobs and end; wait for it at most ``timeout`` seconds.
        Results not collected are dropped. Idempotent."""
        self._closed = True
        self.outstanding = 0
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                result: tuple[bool, Any] = (True, self._run(*job))
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that collects it
                result = (False, exc)
            self._results.put(result)
