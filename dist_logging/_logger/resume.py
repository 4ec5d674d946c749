"""The Logger's checkpointed state and its resumes: what ``Logger.state_dict`` saves, checking what is loaded back,
and the resume waiting for the first step the resumed run logs.

The state holds only facts that agree across ranks (``dcp.save`` keeps one copy of each non-tensor value): the
run name, the :class:`~dist_logging.Timestamp` counters (not its wall-clock fields), the attempt that saved it
and how many resumes the run went through. ``dcp.load`` asks ``state_dict()`` for a template first, so the
template has the same keys whatever the Logger's progress.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

from dist_logging.state import COUNTER_FIELDS, ResumeInfo, Timestamp

FORMAT = 1
STATE_KEYS = ('format', 'run_name', 'timestamp', 'attempt', 'resumes')


def logger_state(run_name: str, timestamp: Timestamp, attempt: str, resumes: int) -> dict[str, Any]:
    """The Logger's state dict: plain numbers and strings, the same on every rank of a synchronous job."""
    return {
        'format': FORMAT,
        'run_name': run_name,
        'timestamp': {name: int(getattr(timestamp, name)) for name in COUNTER_FIELDS},
        'attempt': str(attempt),
        'resumes': int(resumes),
    }


def _number(value: Any, what: str) -> int:
    """An int from a loaded value (DCP may hand back a 0-d tensor where a user saved one)."""
    if hasattr(value, 'item') and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'Logger.load_state_dict: {what} must be an int >= 0, got {value!r}')
    return value


def parse_state(saved: Any) -> tuple[Timestamp, str, str, int]:
    """``(timestamp, run_name, attempt, resumes)`` from what :func:`logger_state` returned, checked.

    Raises:
        TypeError: ``saved`` or its ``timestamp`` is not a mapping.
        ValueError: a missing or unknown key, or a bad value (each named).
    """
    if not isinstance(saved, Mapping):
        raise TypeError(
            f'Logger.load_state_dict: expected a mapping (what Logger.state_dict() returned), '
            f'got {type(saved).__name__}'
        )
    unknown = sorted(str(key) for key in saved if key not in STATE_KEYS)
    missing = [key for key in STATE_KEYS if key not in saved]
    if unknown or missing:
        raise ValueError(
            f'Logger.load_state_dict: unknown key(s) {unknown}, missing key(s) {missing}; '
            f'the Logger saves {list(STATE_KEYS)}'
        )
    if _number(saved['format'], 'format') != FORMAT:
        raise ValueError(f'Logger.load_state_dict: state format {saved["format"]!r} is not {FORMAT}')
    counters = saved['timestamp']
    if not isinstance(counters, Mapping):
        raise TypeError(f'Logger.load_state_dict: timestamp must be a mapping, got {type(counters).__name__}')
    odd = sorted(set(map(str, counters)) ^ set(COUNTER_FIELDS))
    if odd:
        raise ValueError(f'Logger.load_state_dict: timestamp keys differ from {list(COUNTER_FIELDS)}: {odd}')
    timestamp = Timestamp(**{name: _number(counters[name], f'timestamp.{name}') for name in COUNTER_FIELDS})
    run_name = saved['run_name']
    if not isinstance(run_name, str) or not run_name:
        raise ValueError(f'Logger.load_state_dict: run_name must be a non-empty str, got {run_name!r}')
    return timestamp, run_name, str(saved['attempt']), _number(saved['resumes'], 'resumes')


class PendingResume:
    """A resume that waits for the first step the resumed run logs, which decides the first superseded step.

    Args:
        step: the batch count restored.
        resume: the resume's number (see :class:`~dist_logging.state.ResumeInfo`).
        attempt: this process's attempt.
        saved_attempt: the attempt that saved the state (None for ``resume_at``).
        run_name: the run's name.
    """

    def __init__(self, step: int, resume: int, attempt: str, saved_attempt: Optional[str], run_name: str):
        self.step = step
        self.resume = resume
        self.attempt = attempt
        self.saved_attempt = saved_attempt
        self.run_name = run_name

    def settle(self, first_step: Optional[int]) -> ResumeInfo:
        """The resume's facts, ``first_step`` being the step of the first data logged after it (None: none yet).

        A first step equal to the restored count means the run logs a batch's data under the count
        before the batch ends (Composer's default): that step was logged by the earlier attempt too
        and is superseded; otherwise the steps after the restored count are.
        """
        superseded_from = self.step if first_step == self.step else self.step + 1
        return ResumeInfo(
            step=self.step,
            superseded_from=superseded_from,
            resume=self.resume,
            attempt=self.attempt,
            saved_attempt=self.saved_attempt,
            run_name=self.run_name,
            time=time.time(),
        )


class PendingRoutes:
    """The Logger's routing table while a resume waits for its first step: no level has a route, so
    ``Logger.log_metrics`` takes its slow branch, which settles the resume (the hot path stays as it is)."""

    def __getitem__(self, level: Any) -> None:
        return None
