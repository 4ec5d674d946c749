"""The lifecycle shared by destinations that call an experiment tracker (W&B, Comet, Neptune) off the training loop."""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Callable, Optional

from dist_logging.destination import LoggerDestination, ranks_from_rank_zero_only
from dist_logging.worker import SerialWorker

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['TrackerDestination']


class TrackerDestination(LoggerDestination):
    """A destination whose tracker calls all run, in order, on one :class:`SerialWorker`.

    The subclass opens its tracker run in ``init`` and then calls :meth:`_start_worker`;
    log calls hand their tracker calls to :meth:`_submit`. ``close()`` (or ``post_close()``
    when ``close()`` was not called) ends the run once: the jobs of :meth:`_final_jobs`
    run after everything queued, the worker stops (then :meth:`_worker_stopped` releases
    what the jobs used), and background failures are raised.

    Subclasses set ``tracker_owner`` (the name in messages and the worker thread's name).
    """

    tracker_owner = 'TrackerDestination'
    # Composer's CometMLLogger creates its experiment in its constructor (its NeptuneLogger the run on first
    # access), so code written for them calls the hooks of one no Logger opened. A subclass that sets this
    # opens its run at such a first call.
    opens_on_first_use = False
    _worker: Optional[SerialWorker] = None
    _state: Optional['State'] = None
    _ended = False  # the run was ended (close); a later init opens a new one

    @staticmethod
    def _ranks_from_rank_zero_only(ranks: Optional[str], rank_zero_only: bool, owner: str) -> str:
        """The rank policy from Composer's ``rank_zero_only`` switch and ``ranks=``.

        ``rank_zero_only=True`` is the default of Composer's signatures, so with ``ranks=``
        given it only counts when it says False (every rank), which contradicts ``'zero'``
        or ``'local_zero'``.

        Raises:
            ValueError: as :func:`~dist_logging.destination.ranks_from_rank_zero_only`.
        """
        return ranks_from_rank_zero_only(
            ranks, None if ranks is not None and rank_zero_only is True else rank_zero_only, 'zero', owner
        )

    def _restore_run(self, saved: Optional[str], current: Optional[str], what: str) -> bool:
        """Whether a run id from :meth:`load_state_dict` is to be used when the run opens.

        False when there is none, or when the run is open already: then a different saved run
        is reported (warning) and the open run is kept (it cannot be swapped mid-run).
        """
        if saved is None:
            return False
        if self._worker is not None and not self._ended:
            if saved != current:
                warnings.warn(
                    f'{self.tracker_owner}.load_state_dict: this destination is logging to {what} '
                    f'{current!r} already; the saved {what} {saved!r} is not switched to (load the '
                    'state before building the Logger)',
                    RuntimeWarning,
                    stacklevel=3,
                )
            return False
        return True

    def _start_worker(self, state: 'State') -> None:
        """Mark the run open for ``state`` and start its background worker (the end of ``init``)."""
        self._state, self._ended = state, False
        self._worker = SerialWorker(self.tracker_owner)

    def _open_if_alone(self) -> None:
        """Open the run for a first call made without a Logger (see ``opens_on_first_use``): on a rank the
        ``ranks`` policy includes, named from the environment (``DIST_LOGGING_RUN_NAME`` or the launcher's
        job id, else a generated name: no collective is issued). Not after close, never twice.

        Raises:
            RuntimeError: the run cannot be named without a collective (several ranks, no shared job id).
        """
        if self._worker is not None or self._ended or not self.opens_on_first_use:
            return
        from dist_logging._logger.routing import rank_included
        from dist_logging._logger.run_name import resolve_run_name
        from dist_logging.state import State

        if rank_included(self.ranks):
            self.init(State(resolve_run_name(None, _NoCollective(self.tracker_owner))), None)

    def _check_open(self) -> None:
        """Raise unless the run is open; raise the background failures recorded so far.

        Raises:
            RuntimeError: the destination is not open (or already closed), or a background
                tracker call failed (its error is the cause).
        """
        worker = self._worker
        if worker is None and self.opens_on_first_use:
            self._open_if_alone()
            worker = self._worker
        if worker is None or self._ended:
            raise RuntimeError(
                f'{self.tracker_owner} is not open: it is opened by the Logger (init) and closed at close()'
            )
        worker.raise_errors()

    def _submit(self, job: Callable[[], None]) -> None:
        """Queue a tracker call on the worker after :meth:`_check_open`.

        Raises:
            RuntimeError: as :meth:`_check_open`.
        """
        self._check_open()
        self._worker.submit(job)  # type: ignore[union-attr]

    def _training_step(self, step: Optional[int]) -> int:
        """``step`` if given, else the Logger's batch count (0 before the run is open)."""
        if step is not None:
            return int(step)
        return self._state.timestamp.batch if self._state is not None else 0

    def _final_jobs(self, failed: bool) -> list[Callable[[], None]]:
        """The tracker calls that end the run, queued after everything else.

        Args:
            failed: an exception is propagating (the run ends as failed where the tracker can say so).
        """
        raise NotImplementedError

    def _worker_stopped(self) -> None:
        """Release what the background jobs used, once the worker ran them all (default: nothing)."""

    def close(self, state: 'State', logger: 'Logger') -> None:
        """End the run: run what is queued and the tracker's final calls, then stop the worker.

        Raises:
            RuntimeError: a background tracker call failed (its error is the cause).
        """
        self._end_run()

    def post_close(self, state: Optional['State'] = None, logger: Optional['Logger'] = None) -> None:
        """End the run if :meth:`close` did not (Composer ends it here).

        Raises:
            RuntimeError: a background tracker call failed (its error is the cause).
        """
        self._end_run()

    def _end_run(self) -> None:
        """Run what is queued and the final jobs, stop the worker. Once; a no-op when not open.

        Raises:
            RuntimeError: a background tracker call failed (its error is the cause).
        """
        worker = self._worker
        if worker is None or self._ended:
            return
        self._ended = True
        for job in self._final_jobs(failed=sys.exc_info()[0] is not None):
            worker.submit(job)
        worker.close()
        self._worker_stopped()
        worker.raise_errors()


class _NoCollective:
    """Stands in for the logging group where no collective may run: a destination used without a Logger."""

    def __init__(self, owner: str):
        self.owner = owner

    def broadcast_object(self, obj: object, what: str) -> object:
        raise RuntimeError(
            f'{self.owner} used without a Logger on several ranks cannot agree on a run name '
            '(no collective without a Logger): set DIST_LOGGING_RUN_NAME, or build a Logger'
        )
