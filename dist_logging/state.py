"""Training progress (:class:`Timestamp`) and the run :class:`State` the Logger owns."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

__all__ = ['Timestamp', 'State', 'ResumeInfo', 'COUNTER_FIELDS']


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
            self, epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0, epoch_wct=0.0
        )


COUNTER_FIELDS = ('epoch', 'batch', 'batch_in_epoch', 'sample', 'sample_in_epoch', 'token', 'token_in_epoch')
"""The :class:`Timestamp` fields a checkpoint carries (the wall-clock fields differ by rank and start again)."""


@dataclasses.dataclass(frozen=True)
class ResumeInfo:
    """What a destination's ``on_resume`` hook is told: training resumed at ``step`` (see ``docs/destinations.md``).

    Every step at or after ``superseded_from`` that was logged before the resume is superseded by
    what the resumed run logs: each step is to be shown once, the newest attempt's value winning.

    Attributes:
        step: the batch count restored (the checkpoint's ``timestamp.batch``).
        superseded_from: the first superseded step: ``step + 1``, or ``step`` when the resumed run
            logs ``step`` again (Composer's convention: a batch's metrics carry the count before it ends).
        resume: how many resumes this run went through, this one included (1 for the first); it
            tells resumes apart where the attempt number does not (a manual relaunch reports the
            same attempt again).
        attempt: this process's attempt (:func:`dist_logging.dist.get_attempt`).
        saved_attempt: the attempt that saved the state, or None (``Logger.resume_at``).
        run_name: the run's name.
        time: when the resume took effect (seconds since the epoch): what was logged before is superseded.
    """

    step: int
    superseded_from: int
    resume: int
    attempt: str
    saved_attempt: Optional[str]
    run_name: str
    time: float

    def describe(self) -> str:
        """One line for a log: ``resumed at step 20 (resume 1, attempt 0, saved by attempt 0)``."""
        saved = f', saved by attempt {self.saved_attempt}' if self.saved_attempt is not None else ''
        return f'resumed at step {self.step} (resume {self.resume}, attempt {self.attempt}{saved})'


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
