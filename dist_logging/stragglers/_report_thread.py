"""The rank reporter's report thread: runs jobs in order, off the training thread, and hands their results back.

Built on the package's one background-worker primitive (:class:`~dist_logging.worker.BackgroundWorker`):
this adds the in-order results. Handing a job over costs the training thread one bounded-queue ``put``,
and checking for a result one ``empty()``: the report step should cost the step as little as the steps
between reports.
"""

from __future__ import annotations

import queue
from typing import Any, Callable, Optional

from dist_logging.worker import BackgroundWorker

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

    __slots__ = ('_run', '_name', '_worker', '_results', 'outstanding', '_closed')

    def __init__(self, run: Callable[..., Any], name: str):
        self._run = run
        self._name = name
        # A daemon (as every BackgroundWorker): an interpreter that exits without closing the Logger must
        # not wait for a report's collective (each ends by its own deadline anyway).
        self._worker = BackgroundWorker(name, thread_name=name, start=False)
        self._results: 'queue.SimpleQueue[tuple[bool, Any]]' = queue.SimpleQueue()
        self.outstanding = 0
        self._closed = False

    def start(self) -> int:
        """Start the thread if it is not running yet; its ident (e.g. to lend it a logging group).

        Returns:
            The thread's ident.

        Raises:
            RuntimeError: the thread was closed.
        """
        if self._closed:
            raise RuntimeError(f'{self._name}: the report thread was closed')
        return self._worker.start()

    def submit(self, *job: Any) -> None:
        """Queue ``job`` (the arguments of one ``run`` call); starts the thread if needed.

        Args:
            *job: the arguments of the ``run`` call.

        Raises:
            RuntimeError: the thread was closed.
        """
        self.start()
        self.outstanding += 1
        self._worker.submit(lambda: self._results.put(self._call(job)))

    def _call(self, job: tuple) -> tuple[bool, Any]:
        try:
            return True, self._run(*job)
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that collects it
            return False, exc

    def ready(self) -> bool:
        """Whether the oldest outstanding job's result is there (never waits)."""
        return self.outstanding > 0 and not self._results.empty()

    def result(self, timeout: Optional[float] = None) -> Any:
        """The oldest outstanding job's result, waiting for it at most ``timeout`` seconds (None: until done).

        Args:
            timeout: seconds to wait (None: until the job is done).

        Returns:
            What the job returned.

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

        Results not collected are dropped. Idempotent.

        Args:
            timeout: seconds to wait for the thread (None: until it ends).
        """
        self._closed = True
        self.outstanding = 0
        self._worker.close(timeout)
