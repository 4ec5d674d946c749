"""The Logger's rank-report methods (:meth:`section`, :meth:`rank_report`), kept beside the machinery they use.

:class:`RankReportMethods` is a base class of :class:`~dist_logging.Logger`; it reads the
Logger's ``_ranks`` attribute (a :class:`~dist_logging.stragglers.reporter.RankReporter`, or None
when ``rank_report_every`` is None).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Union

from dist_logging.stragglers.report import RankReport
from dist_logging.stragglers.reporter import NullSection, RankReporter
from dist_logging.stragglers.timer import Section

__all__ = ['RankReportMethods']


class RankReportMethods:
    """Section timing and the rank report on the Logger (see docs/stragglers.md)."""

    _ranks: Optional[RankReporter]

    def section(self, name: str, wait: bool = False) -> Union[Section, NullSection]:
        """Time a block on this rank: a context manager, a decorator, or ``start()`` / ``stop()``.

        Mark the work of a step (``'data'``, ``'forward'``, ``'backward'``, ``'optimizer'``);
        sections nest. A rank's busy time per step, what ranks are compared by, is the sum of
        its top-level work sections. ``wait=True`` marks a block where the rank waits for
        others (a collective, a barrier): waiting, not busy (the straggler is the rank that
        waits least). With no section marked, busy time is the step's wall time minus the
        Logger's own collectives and the wait sections, which names nobody when the ranks
        synchronize every step (DDP): mark sections. No collective, no synchronization: on
        CUDA, events read at a later report; on CPU, the wall clock. With
        ``rank_report_every=None`` the section only checks its name.

        Args:
            name: 1 to 64 characters of letters, digits, ``_ . -`` (it becomes ``ranks/<name>/...``).
            wait: whether the block is waiting for other ranks.

        Returns:
            The section (reused for the same name); ``with logger.section('forward'): ...`` or
            ``@logger.section('data')``.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: a bad or reserved name (``busy``, ``step``, ``memory``, ``stragglers``).
            RuntimeError: (on leaving) sections closed out of nesting order.
        """
        if self._ranks is None:
            return NullSection(name, wait)
        return self._ranks.section(name, wait)

    def rank_report(self) -> Optional[RankReport]:
        """The last rank report (every ``rank_report_every`` batches), or None before the first or when off.

        On rank zero it is complete: spread of busy time, step and each section across ranks,
        the slowest ranks with their hosts, the stragglers and their verdicts (``chronic``,
        ``one-off``), e.g. ``report.chronic_hosts`` to exclude on restart. On other ranks it
        holds each series' minimum and maximum and this rank's own scores (``complete=False``).
        Waits for a report the report thread is making (its collectives wait at most ``sync_timeout``).

        Raises:
            DistributedLoggingError: that report failed (a rank did not take part in time).
        """
        if self._ranks is None:
            return None
        self._ranks.emit_built(self, wait=True)  # the report in the making (built off the training thread), too
        return self._ranks.last

    def rank_report_step(self, batch: Optional[int] = None) -> None:
        """Count one training step for the rank report, for loops that do not call :meth:`batch_end`.

        Framework adapters whose framework moves the batch count call this once per optimizer step
        (:meth:`batch_end` does it itself; never both). Call it on every rank at the same steps:
        every ``rank_report_every``-th call hands a window to the report thread, whose collectives need every
        rank's. Does nothing when reports are off.

        Args:
            batch: the batch count to label a report with (default: the Logger's).

        Raises:
            DistributedLoggingError: an earlier report failed: a rank did not take part within ``sync_timeout``
                (raised at the first call after the report thread gave up).
        """
        if self._ranks is not None:
            self._ranks.batch_end(self, batch)

    def _timed_flush(self, flush: Callable[[int], Any], batch: int) -> None:
        """Run ``batch_end``'s flush, counting its time as the Logger's own collective (not busy)."""
        if self._ranks is None or self._ranks.timer.work_marked:  # busy time comes from sections: no need
            flush(batch)
            return
        started = time.perf_counter()
        try:
            flush(batch)
        finally:
            self._ranks.add_collective(time.perf_counter() - started)
