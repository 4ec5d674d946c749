"""The package's own exceptions; builtin exceptions are used wherever they fit."""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional

__all__ = ['UploadError', 'DistributedLoggingError']


class UploadError(RuntimeError):
    """One or more uploads did not land in the object store.

    Attributes:
        failures: Remote object name -> the exception that made its upload fail.
    """

    def __init__(self, failures: Mapping[str, BaseException], message: Optional[str] = None):
        self.failures = dict(failures)
        if message is None:
            lines = [f'{len(self.failures)} upload(s) failed:']
            lines += [f'  {name}: {type(exc).__name__}: {exc}' for name, exc in sorted(self.failures.items())]
            message = '\n'.join(lines)
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.failures, str(self)))


class DistributedLoggingError(RuntimeError):
    """A logging collective could not complete on every rank (a rank is missing or failed).

    Attributes:
        missing_ranks: The ranks that did not reach the collective, when known (the union of
            the three kinds below, plus ranks torch itself named); empty when unknown.
        left_ranks: The ranks known to have left the job (their process ended).
        unreachable_ranks: The ranks that went silent (their host cut off or frozen, or the
            process frozen or ended without a trace).
        late_ranks: The ranks that are alive but did not call (stuck in the user's code, or in
            an earlier logging call).
        hosts: Rank -> host name, as each rank announced itself at start, for the ranks named.
    """

    def __init__(
        self,
        message: str,
        missing_ranks: Iterable[int] = (),
        left_ranks: Iterable[int] = (),
        unreachable_ranks: Iterable[int] = (),
        late_ranks: Iterable[int] = (),
        hosts: Optional[Mapping[int, str]] = None,
    ):
        self.left_ranks = tuple(sorted(set(left_ranks)))
        self.unreachable_ranks = tuple(sorted(set(unreachable_ranks)))
        self.late_ranks = tuple(sorted(set(late_ranks)))
        self.missing_ranks = tuple(
            sorted(set(missing_ranks) | set(self.left_ranks) | set(self.unreachable_ranks) | set(self.late_ranks))
        )
        self.hosts = dict(hosts or {})
        super().__init__(message)

    def __reduce__(self):
        return (
            type(self),
            (str(self), self.missing_ranks, self.left_ranks, self.unreachable_ranks, self.late_ranks, self.hosts),
        )

    @classmethod
    def from_runtime_error(cls, what: str, exc: BaseException, timeout: float) -> 'DistributedLoggingError':
        """Build the error from torch's message, extracting the ranks it names."""
        text = str(exc)
        missing: list[int] = []
        # monitored_barrier: "Ranks 1, 3 failed to pass monitoredBarrier" / "Rank 1 failed to pass ..."
        match = re.search(r'Ranks? ([\d, ]+) failed to pass', text)
        if match:
            missing = [int(r) for r in re.findall(r'\d+', match.group(1))]
        where = f'; missing ranks: {missing}' if missing else ''
        cause = text.splitlines()[0] if text else type(exc).__name__
        return cls(f'{what}: not every rank arrived within {timeout:g} s{where} ({cause})', missing)
