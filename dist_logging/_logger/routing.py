"""The Logger's rank policy and routing table, decided once at construction.

Which destinations a call reaches on this rank is computed here, once, so that a call no
destination takes on this rank costs the :class:`~dist_logging.Logger` two lookups. The
:class:`Router` also calls destinations so that one that raises never takes the others down:
its failure is recorded (reported once) and raised by ``Logger.close()``.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any, Callable, Sequence

from dist_logging import dist
from dist_logging.destination import Event, LoggerDestination, LogLevel, post_close_caller, validate_ranks

# The records keep the logger name they had when this lived in logger.py.
log = logging.getLogger('dist_logging.logger')

CLOSED_MESSAGE = 'this Logger is closed; log calls after close() are not accepted'


class ClosedRoutes:
    """Stands in for the routing table after close, so the hot path needs no closed check."""

    def __getitem__(self, level: Any) -> tuple:
        raise RuntimeError(CLOSED_MESSAGE)


def rank_included(ranks: str) -> bool:
    """Whether the rank policy ``ranks`` includes this process's rank (the Logger's test, in one place)."""
    if ranks == 'all':
        return True
    if ranks == 'local_zero':
        return dist.get_local_rank() == 0
    return dist.get_global_rank() == 0


def takes_files(destination: LoggerDestination) -> bool:
    """Composer's Logger hands files to every destination; the ones that did not override
    ``upload_file`` would ignore them, so only the others are called."""
    return type(destination).upload_file is not LoggerDestination.upload_file or bool(destination.can_upload_files())


class Router:
    """The destinations of one Logger, with the rank policy applied for this rank.

    Args:
        destinations: every destination of the Logger (already checked to be destinations).

    Attributes:
        destinations: every destination given, on every rank.
        active: the destinations this rank calls (their policy includes this rank).
        is_global_zero: whether this is global rank zero.
        hparam_destinations: the destinations hyperparameters go to (``active`` on global rank zero).
        routes: per log level (indexed by its int value), the active destinations taking data of that level.
        uploaders: the active destinations that take files.
        has_uploader_anywhere: whether any destination takes files (on any rank's policy).
        failures: ``id(destination) -> (destination, first exception)``.
    """

    def __init__(self, destinations: Sequence[LoggerDestination]):
        self.destinations = tuple(destinations)
        self.active = tuple(d for d in self.destinations if rank_included(d.ranks))
        self.is_global_zero = dist.get_global_rank() == 0
        self.hparam_destinations = self.active if self.is_global_zero else ()
        self.routes: Any = [()] + [
            tuple(d for d in self.active if level <= LogLevel.parse(d.log_level)) for level in LogLevel
        ]
        self.uploaders = tuple(d for d in self.active if takes_files(d))
        self.has_uploader_anywhere = any(takes_files(d) for d in self.destinations)
        self._takes_copy = {id(d): 'copy' in inspect.signature(d.upload_file).parameters for d in self.uploaders}
        # Composer's post_close() takes no arguments, ours may take (state, logger): read each form once.
        self._post_close: dict[int, Callable[[Any, Any], None]] = {
            id(d): post_close_caller(d) for d in self.destinations
        }
        self.failures: dict[int, tuple[LoggerDestination, BaseException]] = {}

    def takes_copy(self, destination: LoggerDestination) -> bool:
        """Whether the uploader ``destination``'s ``upload_file`` takes ``copy=``."""
        return self._takes_copy[id(destination)]

    def add_listener(self, destination: LoggerDestination, owner: str) -> bool:
        """Add ``destination`` to the active ones for lifecycle events; False when it was not added.

        Raises:
            ValueError: an unknown rank policy (``owner`` names the call).
        """
        validate_ranks(getattr(destination, 'ranks', 'zero'), owner)
        if destination in self.active or not rank_included(destination.ranks):
            return False
        self._post_close[id(destination)] = post_close_caller(destination)
        self.active = self.active + (destination,)
        return True

    def dispatch(self, destinations: Sequence[LoggerDestination], hook: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook`` on each of ``destinations``; an exception is recorded, not raised."""
        for destination in destinations:
            try:
                getattr(destination, hook)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - one destination must not take the others down
                self.record_failure(destination, hook, exc)

    def record_failure(self, destination: LoggerDestination, hook: str, exc: BaseException) -> None:
        """Keep the first exception of ``destination`` and report it once (a log record and a warning)."""
        if id(destination) in self.failures:
            return  # reported once, not once per call
        self.failures[id(destination)] = (destination, exc)
        note = 'ignored (optional destination)' if destination.optional else 're-raised at close()'
        message = f'{type(destination).__name__}.{hook} raised {type(exc).__name__}: {exc}; {note}'
        log.error(message, exc_info=exc)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def close_hook(self, destination: LoggerDestination, event: Event, state: Any, logger: Any) -> None:
        """Call ``close`` or ``post_close`` directly, as Composer's engine does (not through ``run_event``)."""
        if event is Event.CLOSE:
            destination.close(state, logger)
        else:
            self._post_close[id(destination)](state, logger)

    def close_all(self, state: Any, logger: Any) -> list[BaseException]:
        """Close, then post-close, every active destination; the non-optional ones' exceptions, in order.

        Destinations upload their last files (final log lines, event files) from their own
        ``close()``, so the uploaders are closed last.
        """
        errors: list[BaseException] = []
        ordered = [d for d in self.active if d not in self.uploaders] + list(self.uploaders)
        for event in (Event.CLOSE, Event.POST_CLOSE):
            for destination in ordered:
                try:
                    self.close_hook(destination, event, state, logger)
                except Exception as exc:  # noqa: BLE001 - every destination gets closed
                    log.error('%s.%s raised %s', type(destination).__name__, event.value, exc, exc_info=exc)
                    if not destination.optional:
                        errors.append(exc)
        return errors
