"""The Logger's checkpoint methods (torch's ``Stateful`` protocol and :meth:`resume_at`), beside the resume machinery.

:class:`ResumeMethods` is a base class of :class:`~dist_logging.Logger`, as
:class:`~dist_logging.stragglers.api.RankReportMethods` is: it reads and sets the Logger's routing attributes
(``_routes``, ``_batch_routes``, ``_router``, ``_dispatch``), ``state``, ``_resumes`` and ``_pending_resume``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from dist_logging import dist
from dist_logging._logger.resume import PendingResume, PendingRoutes, logger_state, parse_state
from dist_logging._logger.routing import Router
from dist_logging.destination import LogLevel
from dist_logging.state import State, Timestamp

__all__ = ['ResumeMethods']


class ResumeMethods:
    """Checkpointing the Logger and resuming it (see the "Resume" section of docs/destinations.md)."""

    state: State
    _resumes: int
    _pending_resume: Optional[PendingResume]
    _closed: bool
    _router: Router
    _routes: Any
    _batch_routes: Any
    _dispatch: Callable[..., Any]
    _check_open: Callable[[], None]

    if TYPE_CHECKING:  # the Logger's read-only property, declared for type checkers only

        @property
        def run_name(self) -> str: ...

    def state_dict(self) -> dict[str, Any]:
        """The Logger's state, for a checkpoint (torch's ``Stateful`` protocol, as ``dcp.save`` calls it).

        Put the Logger itself in the DCP state dict, beside the model: ``dcp.save({'model': ...,
        'optim': ..., 'logger': logger}, ...)`` calls this on every rank. It holds the run name, the
        :class:`~dist_logging.Timestamp` counters (epoch, batch, samples, tokens and their per-epoch
        parts; not the wall-clock fields), the attempt that saved it and the number of resumes so far:
        plain numbers and strings that agree across the ranks of a synchronous job (``dcp.save`` keeps
        one copy of each). Its keys never change, so ``dcp.load`` may take it as the template. No
        collective; also picklable by ``torch.save`` for checkpoints of one's own.

        Returns:
            ``{'format', 'run_name', 'timestamp': {...}, 'attempt', 'resumes'}``.
        """
        return logger_state(self.run_name, self.state.timestamp, dist.get_attempt(), self._resumes)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from a checkpoint: restore the counters saved by :meth:`state_dict` (``dcp.load`` calls it).

        Every rank: the timestamp continues from the saved one and every destination active here gets
        its :meth:`~dist_logging.LoggerDestination.on_resume` hook just before the first step logged after
        this call (or the next ``batch_end``), so that each step is shown once, the resumed run's values
        winning (TensorBoard purges the later steps, ``FileLogger`` writes a marker, ...; see the
        "Resume" section of docs/destinations.md). No collective.

        Args:
            state_dict: what :meth:`state_dict` returned when the checkpoint was saved.

        Raises:
            TypeError: not a mapping.
            ValueError: a missing, unknown or bad key (names it).
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        timestamp, run_name, saved_attempt, resumes = parse_state(state_dict)
        if run_name != self.run_name:
            warnings.warn(
                f'Logger.load_state_dict: the checkpoint was saved by run {run_name!r}, this Logger is '
                f'run {self.run_name!r}: its destinations continue under {self.run_name!r} (pass '
                f'run_name={run_name!r} to the Logger to continue the saved run\'s logs)',
                RuntimeWarning,
                stacklevel=2,
            )
        self._begin_resume(timestamp, resumes + 1, saved_attempt)

    def resume_at(self, step: int, *, epoch: int = 0, sample: int = 0, token: int = 0) -> None:
        """Resume at batch count ``step``, for checkpoints of one's own (as :meth:`load_state_dict` does).

        Call it on every rank after loading the model, before logging: ``logger.resume_at(ckpt['step'])``.
        With ``epoch > 0`` the per-epoch counters start at the epoch's start (zero); with ``epoch=0`` they
        equal the totals.

        Args:
            step: the number of batches the checkpoint had finished (``timestamp.batch``).
            epoch: finished epochs.
            sample: samples seen.
            token: tokens seen.

        Raises:
            ValueError: a negative or non-int value (names it).
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        for name, value in (('step', step), ('epoch', epoch), ('sample', sample), ('token', token)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f'Logger.resume_at: {name} must be an int >= 0, got {value!r}')
        first_epoch = epoch == 0
        timestamp = Timestamp(
            epoch=epoch,
            batch=step,
            batch_in_epoch=step if first_epoch else 0,
            sample=sample,
            sample_in_epoch=sample if first_epoch else 0,
            token=token,
            token_in_epoch=token if first_epoch else 0,
        )
        self._begin_resume(timestamp, self._resumes + 1, None)

    def _begin_resume(self, timestamp: Timestamp, resumes: int, saved_attempt: Optional[str]) -> None:
        self.state.timestamp = timestamp
        self._resumes = resumes
        self._pending_resume = PendingResume(timestamp.batch, resumes, dist.get_attempt(), saved_attempt, self.run_name)
        # Until the first step is logged the hot path takes the slow branch (no route), which settles the resume.
        self._batch_routes = None
        self._routes = PendingRoutes()  # type: ignore[assignment]

    def _settle_resume(self, first_step: Optional[int]) -> None:
        pending, self._pending_resume = self._pending_resume, None
        if self._closed:
            return
        self._routes = self._router.routes
        self._batch_routes = self._routes[LogLevel.BATCH]
        if pending is not None:
            self._dispatch(self._router.active, 'on_resume', pending.settle(first_step), self.state, self)
