"""The statistics of a rank report: spread across ranks, scores, and the slow / chronic verdicts.

Pure functions and one small state holder over numpy arrays indexed by rank; nothing here
communicates. Values are seconds per step (lower is better); NaN marks a rank that has no
value for a series (it never entered that section in the window) and is left out.

Scores are the ones NVIDIA's ``nvidia-resiliency-ext`` straggler detector defines, from 0
(worst) to 1 (best):

* **relative score**: the fastest rank's time ÷ this rank's time (0.5: twice as slow as the
  fastest rank);
* **individual score**: this rank's best window so far ÷ this window (0.5: twice as slow as
  its own best).

The *verdict* does not use the fastest rank as its reference, because at thousands of ranks
one unusually fast rank (one that skipped work) would make every other rank look slow. A
rank is **slow** in a report when its time is at least ``slow_ratio`` × the lower quartile of
all ranks' times and at least ``min_gap_s`` above it. At 2 to 4 ranks the lower quartile
(taken as the lower neighbour) *is* the fastest rank; at scale it takes a quarter of the job
being fast to move it. And, so that a rank whose steps scatter widely in a window (a rank starved
of CPU by its neighbours, a descheduled data loader) is not called slow on a noisy median, its
time must exceed the reference by more than ``jitter_k`` × its own jitter in the window (the
median absolute deviation of its steps' busy times). With the benchmark's ±5 % uniform jitter
that margin is 3 × 2.5 % = 7.5 %, below the 10 % of ``slow_ratio``, so a steady 1.2x rank is
still slow; a rank at 1.13x whose steps scatter by ±10 % or more is not. A rank is **chronic**
when it was slow in at least ``m`` of the last ``n`` reports; slow now but not chronic is **one-off**.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

__all__ = [
    'Verdicts',
    'SeriesStats',
    'series_stats',
    'series_table',
    'relative_scores',
    'individual_scores',
    'reference',
    'slow_mask',
    'VerdictTracker',
    'CHRONIC',
    'ONE_OFF',
    'OK',
]

CHRONIC, ONE_OFF, OK = 'chronic', 'one-off', 'ok'
_VERDICTS = np.array([OK, ONE_OFF, CHRONIC])  # indexed by 0 ok, 1 slow now, 2 chronic


@dataclasses.dataclass(frozen=True)
class Verdicts:
    """The thresholds of the verdicts (see the module docstring).

    Args:
        slow_ratio: a rank is slow at ``time >= slow_ratio * lower quartile`` (> 1).
        min_gap_s: ... and ``time - lower quartile >= min_gap_s`` seconds per step (>= 0), so
            that microsecond differences in tiny steps are never a report.
        chronic_reports: ``m``: slow in at least this many of ...
        chronic_window: ``n``: ... the last this many reports (``1 <= m <= n``).
        jitter_k: ... and ``time - lower quartile > jitter_k *`` the rank's own jitter (the
            median absolute deviation of its steps' busy seconds in the window; >= 0, 0: off).

    Raises:
        ValueError: a threshold out of range (names it).
    """

    slow_ratio: float = 1.1
    min_gap_s: float = 1e-4
    chronic_reports: int = 2
    chronic_window: int = 5
    jitter_k: float = 3.0

    def __post_init__(self) -> None:
        if isinstance(self.jitter_k, bool) or not (isinstance(self.jitter_k, (int, float)) and self.jitter_k >= 0):
            raise ValueError(f'jitter_k must be a number >= 0, got {self.jitter_k!r}')
        if not (isinstance(self.slow_ratio, (int, float)) and self.slow_ratio > 1):
            raise ValueError(f'slow_ratio must be a number > 1, got {self.slow_ratio!r}')
        if not (isinstance(self.min_gap_s, (int, float)) and self.min_gap_s >= 0):
            raise ValueError(f'min_gap_s must be a number >= 0, got {self.min_gap_s!r}')
        for field in ('chronic_reports', 'chronic_window'):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'{field} must be an int >= 1, got {value!r}')
        if self.chronic_reports > self.chronic_window:
            raise ValueError(
                f'chronic_reports ({self.chronic_reports}) must be <= chronic_window '
                f'({self.chronic_window}): slow in m of the last n reports'
            )


@dataclasses.dataclass(frozen=True)
class SeriesStats:
    """One series (busy time, wall-clock step, a section, memory) across ranks.

    ``median_s``, ``p90_s`` and the ranks are None on ranks other than zero, which only learn
    the minimum and maximum (one all-reduce, see docs/stragglers.md).

    Attributes:
        name: ``'busy'``, ``'step'``, ``'memory'`` or a section name.
        min_s, median_s, p90_s, max_s: across the ranks that have a value (seconds per step;
            bytes for ``memory``).
        slowest_rank: the rank with the largest value.
        fastest_rank: the rank with the smallest value.
        spread: ``max_s / median_s`` (1.0: no rank slower than the median).
        ranks: how many ranks have a value.
    """

    name: str
    min_s: Optional[float]
    median_s: Optional[float]
    p90_s: Optional[float]
    max_s: Optional[float]
    slowest_rank: Optional[int] = None
    fastest_rank: Optional[int] = None
    spread: Optional[float] = None
    ranks: Optional[int] = None


def series_stats(name: str, values: np.ndarray) -> SeriesStats:
    """Min / median / p90 / max of ``values`` (one per rank, NaN = no value), with the extreme ranks.

    Median and p90 interpolate linearly between neighbours (numpy's default percentile).
    """
    return series_table([name], np.asarray(values, dtype=np.float64)[:, None])[name]


def series_table(names: Sequence[str], matrix: np.ndarray) -> dict[str, SeriesStats]:
    """:func:`series_stats` of every column of ``matrix`` (ranks x series) at once.

    One sort of the whole table serves every series' four statistics and extreme ranks (rank
    zero's CPU per report: a handful of numpy calls whatever the number of series).

    Raises:
        ValueError: ``names`` and the columns differ in number.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[1] != len(names):
        raise ValueError(f'series_table: {len(names)} names for a table of shape {matrix.shape}')
    missing = np.isnan(matrix)
    counts = matrix.shape[0] - missing.sum(axis=0)
    filled = matrix.copy()
    filled[missing] = np.inf  # no value: sorted last
    order = filled.argsort(axis=0, kind='stable')
    columns = np.arange(matrix.shape[1])
    ordered = filled[order, columns]
    ordered[np.arange(matrix.shape[0])[:, None] >= counts] = 0.0  # the no-value tail: read only where count is 0
    last = np.maximum(counts - 1, 0)
    quantiles = []
    for q in (0.5, 0.9):
        position = q * last
        low = position.astype(np.int64)
        high = np.minimum(low + 1, last)
        below, above = ordered[low, columns], ordered[high, columns]
        quantiles.append(below + (above - below) * (position - low))
    rows = zip(
        names,
        counts.tolist(),
        ordered[0, columns].tolist(),
        quantiles[0].tolist(),
        quantiles[1].tolist(),
        ordered[last, columns].tolist(),
        order[last, columns].tolist(),
        order[0, columns].tolist(),
    )
    out = {}
    for name, count, low_s, median, p90, high_s, slowest, fastest in rows:
        if count == 0:
            out[name] = SeriesStats(name, None, None, None, None, ranks=0)
        else:
            out[name] = SeriesStats(
                name, low_s, median, p90, high_s, slowest, fastest, high_s / median if median > 0 else None, count
            )
    return out


def relative_scores(values: np.ndarray) -> np.ndarray:
    """The fastest rank's value ÷ each rank's value, in [0, 1] (NaN stays NaN; a 0 value scores 1)."""
    values = np.asarray(values, dtype=np.float64)
    if np.all(np.isnan(values)):
        return values.copy()
    best = np.nanmin(values)
    with np.errstate(divide='ignore', invalid='ignore'):
        scores = np.where(values > 0, best / values, 1.0)
    return np.where(np.isnan(values), np.nan, np.clip(scores, 0.0, 1.0))


def individual_scores(best: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each rank's best window so far ÷ this window, in [0, 1] (``best`` already includes this window)."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(divide='ignore', invalid='ignore'):
        scores = np.where(values > 0, best / values, 1.0)
    return np.where(np.isnan(values), np.nan, np.clip(scores, 0.0, 1.0))


def reference(values: np.ndarray) -> Optional[float]:
    """The verdict's reference: the lower quartile, taken as the lower neighbour (the fastest rank at 2-4 ranks)."""
    values = np.asarray(values, dtype=np.float64)
    seen = np.sort(values[~np.isnan(values)])
    if seen.size == 0:
        return None
    return float(seen[int(0.25 * (seen.size - 1))])


def slow_mask(values: np.ndarray, verdicts: Verdicts, jitter: Optional[np.ndarray] = None) -> np.ndarray:
    """Which ranks are slow in this report (bool per rank; NaN is never slow).

    Args:
        values: busy seconds per step, one per rank.
        verdicts: the thresholds.
        jitter: each rank's jitter in the window (median absolute deviation of its steps, seconds;
            NaN or None: unknown, no margin), see :attr:`Verdicts.jitter_k`.
    """
    values = np.asarray(values, dtype=np.float64)
    ref = reference(values)
    if ref is None:
        return np.zeros(values.shape, dtype=bool)
    gap = values - ref  # comparisons with NaN are False, without a warning
    slow = (values >= ref * verdicts.slow_ratio) & (gap >= verdicts.min_gap_s)
    if jitter is not None and verdicts.jitter_k > 0:
        jitter = np.asarray(jitter, dtype=np.float64)
        slow &= gap > verdicts.jitter_k * np.where(np.isnan(jitter), 0.0, jitter)
    return slow


class VerdictTracker:
    """Remembers which ranks were slow in the last ``n`` reports, the best window per rank, and since when.

    One instance on rank zero over every rank (``world_size`` rows); one on every rank over
    itself (``world_size=1``) for its own verdict.

    Args:
        world_size: how many ranks it tracks.
        verdicts: the thresholds.
    """

    def __init__(self, world_size: int, verdicts: Verdicts):
        if world_size < 1:
            raise ValueError(f'world_size must be >= 1, got {world_size!r}')
        self.verdicts = verdicts
        self._slow = np.zeros((verdicts.chronic_window, world_size), dtype=bool)
        self._reports = 0
        self._since = np.full(world_size, -1, dtype=np.int64)  # batch of the first slow report of the streak
        self._best: dict[str, np.ndarray] = {}

    @property
    def reports(self) -> int:
        """How many reports were recorded."""
        return self._reports

    def best(self, series: str, values: np.ndarray) -> np.ndarray:
        """Fold this window into the per-rank best of ``series`` and return the best so far."""
        values = np.asarray(values, dtype=np.float64)
        best = self._best.get(series)
        best = values.copy() if best is None else np.fmin(best, values)
        self._best[series] = best
        return best

    def record(self, slow: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add one report's slow mask.

        Returns:
            ``(verdict, slow_count, since)`` per rank: ``verdict`` is :data:`CHRONIC`,
            :data:`ONE_OFF` or :data:`OK`; ``slow_count`` the slow reports among the last
            ``n``; ``since`` the batch at which the current slow streak began (-1: not slow).
            A rank is chronic even in a report where it is not slow, while ``m`` of the last
            ``n`` were.
        """
        slow = np.asarray(slow, dtype=bool)
        self._slow[self._reports % self.verdicts.chronic_window] = slow
        self._reports += 1
        count = self._slow.sum(axis=0)
        chronic = count >= self.verdicts.chronic_reports
        self._since = np.where(slow, np.where(self._since < 0, batch, self._since), np.where(chronic, self._since, -1))
        verdict = _VERDICTS[np.where(chronic, 2, slow.astype(np.int64))]
        return verdict, count, self._since.copy()
