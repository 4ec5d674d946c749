"""Shared by destinations that buffer: flush every N batches, at every epoch end and at fit end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['PeriodicFlushMixin', 'check_interval']


def check_interval(owner: str, name: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 1.

    Raises:
        ValueError: naming the owner, the argument and the bad value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{owner}: {name} must be an int >= 1, got {value!r}')
    return value


class PeriodicFlushMixin:
    """Calls ``self.flush()`` every ``self.flush_interval`` batches, at each epoch end and at fit end.

    Put it before :class:`~dist_logging.LoggerDestination` in the bases; the class sets
    ``flush_interval`` (checked with :func:`check_interval`) and defines ``flush()``.
    """

    flush_interval: int

    def flush(self) -> None:
        raise NotImplementedError

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        if state.timestamp.batch % self.flush_interval == 0:
            self.flush()

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        self.flush()

    def fit_end(self, state: 'State', logger: 'Logger') -> None:
        self.flush()
