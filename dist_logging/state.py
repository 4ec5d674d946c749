"""Training progress (:class:`Timestamp`) and the run :class:`State` the Logger owns."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

__all__ = ['Timestamp', 'State']


@dataclasses.dataclass(frozen=True)
class Timestamp:
    """Where training is: counters since the start of the run and of the current epoch.

    Every field defaults to zero, so ``Timestamp(epoch=2, batch=7)`` works. Wall-clock
    fields are seconds (floats): ``total_wct`` since the run started, ``epoch_wct``
    since the epoch started, ``batch_wct`` the duration of the last batch.

    Raises:
        ValueError: a negative counter.
    """

    epoch: int = 0
    batch: int = 0
    batch_in_epoch: int = 0
    sample: int = 0
    sample_in_epoch: int = 0
    token: int = 0
    token_in_epoch: int = 0
    total_wct: float = 0.0
    epoch_wct: float = 0.0
    batch_wct: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f'Timestamp.{field.name} must be a number, got {value!r}')
            if value < 0:
                raise ValueError(f'Timestamp.{field.name} must be >= 0, got {value!r}')

    def to_next_batch(self, samples: int = 0, tokens: int = 0, duration: float = 0.0) -> 'Timestamp':
        """The timestamp after one more batch of ``samples`` samples and ``tokens`` tokens, lasting ``duration`` s.

        Raises:
            ValueError: ``samples`` or ``tokens`` not a non-negative int, or ``duration`` not a
                non-negative number.
        """
        for name, value in (('samples', samples), ('tokens', tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f'{name} must be a non-negative int, got {value!r}')
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
            raise ValueError(f'duration must be a non-negative number of seconds, got {duration!r}')
        # Called at every batch_end: the fields are built here from this (valid) timestamp and the checked
        # increments, so they need not be checked again (dataclasses.replace would, field by field).
        following = object.__new__(Timestamp)
        following.__dict__.update(
            epoch=self.epoch,
            batch=self.batch + 1,
            batch_in_epoch=self.batch_in_epoch + 1,
            sample=self.sample + samples,
            sample_in_epoch=self.sample_in_epoch + samples,
            token=self.token + tokens,
            token_in_epoch=self.token_in_epoch + tokens,
            total_wct=self.total_wct + duration,
            epoch_wct=self.epoch_wct + duration,
            batch_wct=duration,
        )
        return following

    def to_next_epoch(self) -> 'Timestamp':
        """The timestamp at the start of the next epoch (per-epoch counters reset)."""
        return dataclasses.replace(
            self, epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0, epoch_wct=0.0,
        )


class State:
    """The run as the Logger sees it: its name and where training is.

    Attributes:
        run_name: Identical on every rank of the run.
        timestamp: Advanced by :meth:`Logger.batch_end` / :meth:`Logger.epoch_end`.
    """

    def __init__(self, run_name: str, timestamp: Optional[Timestamp] = None):
        self.run_name = run_name
        self.timestamp = timestamp if timestamp is not None else Timestamp()
        self._last_mark = time.monotonic()

    def advance_batch(self, samples: int = 0, tokens: int = 0) -> None:
        """Count one finished batch; its duration is the time since the previous mark.

        Raises:
            ValueError: ``samples`` or ``tokens`` not a non-negative int.
        """
        now = time.monotonic()
        self.timestamp = self.timestamp.to_next_batch(samples, tokens, now - self._last_mark)
        self._last_mark = now

    def advance_epoch(self) -> None:
        """Count one finished epoch."""
        self.timestamp = self.timestamp.to_next_epoch()

    def __repr__(self) -> str:
        return f'State(run_name={self.run_name!r}, timestamp={self.timestamp!r})'
