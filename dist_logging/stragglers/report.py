"""The rank report: :class:`RankReport` and :class:`RankEntry`, built from the per-rank records of a window.

A *record* is one rank's window as a fixed-size float64 row (:data:`FIXED` columns, then one
column per agreed section): the only thing that crosses the wire to rank zero. Rank zero
builds the full report from the table of every rank's record; the other ranks build a
partial one (their own entry, each series' minimum and maximum) from the all-reduce.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from dist_logging.stragglers.stats import (
    CHRONIC,
    OK,
    ONE_OFF,
    SeriesStats,
    VerdictTracker,
    Verdicts,
    individual_scores,
    reference,
    relative_scores,
    series_table,
    slow_mask,
)
from dist_logging.stragglers.timer import WindowTotals

__all__ = [
    'RankEntry',
    'RankReport',
    'STEPS',
    'WALL',
    'BUSY',
    'COLLECTIVE',
    'MEMORY',
    'JITTER',
    'FIXED',
    'record_of',
    'per_step',
    'build_report',
    'build_partial',
    'report_metrics',
    'TABLE_COLUMNS',
    'table_rows',
    'straggler_line',
]

# Columns of a record: totals over the window, except BUSY (seconds per step, the median step) and
# JITTER (the median absolute deviation of the window's steps' busy seconds, NaN when not known).
STEPS, WALL, BUSY, COLLECTIVE, MEMORY, JITTER = range(6)
FIXED = 6


@dataclasses.dataclass(frozen=True)
class RankEntry:
    """One rank in one report.

    Attributes:
        rank: the global rank.
        host: its host name ('' when unknown).
        busy_s: busy seconds per step, the window's median step (the mean on CUDA); what ranks
            are compared by.
        step_s: wall-clock seconds per step.
        ratio: ``busy_s`` ÷ the lower quartile of every rank's busy time (None off rank zero).
        relative_score: the fastest rank's busy time ÷ this rank's (NVRx's relative score).
        individual_score: this rank's best window ÷ this window (NVRx's individual score).
        verdict: ``'chronic'``, ``'one-off'`` or ``'ok'`` (None off rank zero).
        slow_reports: in how many of the last ``chronic_window`` reports it was slow.
        since_batch: the batch of the first report of its current slow streak (None: not slow).
        trend: ``ratio`` now ÷ ``ratio`` in the previous report (> 1: getting worse).
        slowest_section: its section furthest above that section's median (None without sections).
        sections: section -> seconds per step.
        memory_bytes: peak CUDA memory allocated in the window, else RSS (None when not measured).
    """

    rank: int
    host: str
    busy_s: Optional[float]
    step_s: Optional[float]
    ratio: Optional[float]
    relative_score: Optional[float]
    individual_score: Optional[float]
    verdict: Optional[str]
    slow_reports: int = 0
    since_batch: Optional[int] = None
    trend: Optional[float] = None
    slowest_section: Optional[str] = None
    sections: Mapping[str, float] = dataclasses.field(default_factory=dict)
    memory_bytes: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class RankReport:
    """A rank report (see docs/stragglers.md); :meth:`dist_logging.Logger.rank_report` returns the last one.

    Attributes:
        batch: the batch count at the report.
        window: the report's index (0 for the first).
        steps: batches in the window.
        world_size: ranks in the job.
        series: ``'busy'``, ``'step'``, each section and ``'memory'`` -> :class:`SeriesStats`.
        reference_s: the verdict's reference busy time (lower quartile; None off rank zero).
        slowest: the ``top_k`` ranks with the largest busy time, slowest first (rank zero only).
        stragglers: every rank whose verdict is not ``'ok'``, chronic first (rank zero only).
        own: this rank's entry.
        complete: True on rank zero (everything above); False elsewhere (series hold only min
            and max, ``slowest`` and ``stragglers`` are empty, ``own`` has no verdict).
    """

    batch: int
    window: int
    steps: int
    world_size: int
    series: Mapping[str, SeriesStats]
    reference_s: Optional[float]
    slowest: Sequence[RankEntry]
    stragglers: Sequence[RankEntry]
    own: RankEntry
    complete: bool

    @property
    def chronic(self) -> list[RankEntry]:
        """The chronic stragglers (rank zero only), worst first."""
        return [entry for entry in self.stragglers if entry.verdict == CHRONIC]

    @property
    def chronic_hosts(self) -> list[str]:
        """Hosts of the chronic stragglers, each once, worst first (e.g. to exclude them on restart)."""
        return list(dict.fromkeys(entry.host for entry in self.chronic if entry.host))


def record_of(totals: WindowTotals, layout: Sequence[str]) -> np.ndarray:
    """This rank's window as a record (NaN for a section it did not enter, or memory not measured)."""
    nan = math.nan
    # Busy time per step: the window's median step when known (robust to a few descheduled steps).
    busy = totals.busy_s / max(totals.steps, 1) if totals.busy_median_s is None else totals.busy_median_s
    memory = nan if totals.memory_bytes is None else totals.memory_bytes
    jitter = nan if totals.busy_mad_s is None else totals.busy_mad_s
    sections = totals.sections
    # One list, one array: a report runs on the training thread, where each small numpy call costs.
    return np.array(
        [totals.steps, totals.wall_s, busy, totals.collective_s, memory, jitter]
        + [sections.get(name, nan) for name in layout],
        dtype=np.float64,
    )


def own_series(record: np.ndarray, layout: Sequence[str]) -> list[float]:
    """One rank's record as its :func:`per_step` values, in :func:`per_step`'s order (busy, step, each section,
    memory), in plain Python: what the report's all-reduce carries, without a numpy call per value."""
    values = record.tolist()
    steps = values[STEPS]
    if not steps > 0:  # no step in the window (or NaN): nothing per step
        return [math.nan] * (2 + len(layout)) + [values[MEMORY]]
    return (
        [values[BUSY], values[WALL] / steps]
        + [values[FIXED + index] / steps for index in range(len(layout))]
        + [values[MEMORY]]
    )


def per_step(table: np.ndarray, layout: Sequence[str]) -> dict[str, np.ndarray]:
    """Series name -> one value per rank (seconds per step; bytes for memory) from a table of records."""
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    steps = np.where(table[:, STEPS] > 0, table[:, STEPS], np.nan)
    values = {'busy': np.where(np.isnan(steps), np.nan, table[:, BUSY]), 'step': table[:, WALL] / steps}
    for index, name in enumerate(layout):
        values[name] = table[:, FIXED + index] / steps
    values['memory'] = table[:, MEMORY]
    return values


def _float(value: Any) -> Optional[float]:
    value = float(value)
    return None if np.isnan(value) else value


def _entry(
    rank: int,
    host: str,
    values: Mapping[str, np.ndarray],
    layout: Sequence[str],
    fields: dict[str, Any],
    medians: Mapping[str, Optional[float]],
) -> RankEntry:
    sections = {name: float(values[name][rank]) for name in layout if not np.isnan(values[name][rank])}
    slowest_section, worst = None, 1.0  # only a section above its median
    for name, seconds in sections.items():
        median = medians.get(name)
        if median and seconds / median > worst:
            slowest_section, worst = name, seconds / median
    return RankEntry(
        rank=rank,
        host=host,
        busy_s=_float(values['busy'][rank]),
        step_s=_float(values['step'][rank]),
        sections=sections,
        memory_bytes=_float(values['memory'][rank]),
        slowest_section=slowest_section,
        **fields,
    )


def build_report(
    table: np.ndarray,
    layout: Sequence[str],
    hosts: Sequence[str],
    tracker: VerdictTracker,
    previous_ratio: Optional[np.ndarray],
    batch: int,
    window: int,
    top_k: int,
    own_rank: int = 0,
) -> tuple[RankReport, np.ndarray]:
    """Rank zero's full report from every rank's record (row = rank).

    Args:
        table: ``world_size`` x ``FIXED + len(layout)`` records.
        layout: the agreed section names (record columns after :data:`FIXED`).
        hosts: host name per rank.
        tracker: rank zero's :class:`VerdictTracker` (updated here).
        previous_ratio: each rank's busy ratio in the previous report (for the trend), or None.
        batch, window: the batch count and index of this report.
        top_k: how many of the slowest ranks to list.
        own_rank: the rank building it (for ``own``).

    Returns:
        ``(report, ratio)``: the report and every rank's busy ratio (keep it for the next trend).
    """
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    world = table.shape[0]
    values = per_step(table, layout)
    series = series_table(list(values), np.array(list(values.values())).T)
    busy = values['busy']
    ref = reference(busy)
    with np.errstate(divide='ignore', invalid='ignore'):
        ratio = busy / ref if ref else np.full(world, np.nan)
    relative = relative_scores(busy)
    individual = individual_scores(tracker.best('busy', busy), busy)
    jitter = np.where(np.isnan(busy), np.nan, table[:, JITTER])
    verdict, count, since = tracker.record(slow_mask(busy, tracker.verdicts, jitter), batch)
    medians = {name: stats.median_s for name, stats in series.items()}

    def fields(rank: int) -> dict[str, Any]:
        trend = None
        if previous_ratio is not None and previous_ratio.shape == ratio.shape:
            before, now = previous_ratio[rank], ratio[rank]
            trend = _float(now / before) if before and not np.isnan(before) else None
        return {
            'ratio': _float(ratio[rank]),
            'relative_score': _float(relative[rank]),
            'individual_score': _float(individual[rank]),
            'verdict': str(verdict[rank]),
            'slow_reports': int(count[rank]),
            'since_batch': int(since[rank]) if since[rank] >= 0 else None,
            'trend': trend,
        }

    def entry(rank: int) -> RankEntry:
        return _entry(rank, hosts[rank] if rank < len(hosts) else '', values, layout, fields(rank), medians)

    # Python objects only for the ranks worth naming (top k and the flagged), not for every rank.
    order = np.argsort(np.where(np.isnan(busy), -np.inf, busy))[::-1]
    slowest = [entry(int(rank)) for rank in order[:top_k] if not np.isnan(busy[rank])]
    flagged_ranks = np.flatnonzero(verdict != OK)
    flagged = sorted(flagged_ranks, key=lambda r: (verdict[r] != CHRONIC, -(ratio[r] if not np.isnan(ratio[r]) else 0)))
    stragglers = [entry(int(rank)) for rank in flagged]
    report = RankReport(
        batch=batch,
        window=window,
        steps=int(np.nanmax(table[:, STEPS])),
        world_size=world,
        series=series,
        reference_s=ref,
        slowest=slowest,
        stragglers=stragglers,
        own=entry(own_rank),
        complete=True,
    )
    return report, ratio


def build_partial(
    record: np.ndarray,
    layout: Sequence[str],
    minima: np.ndarray,
    maxima: np.ndarray,
    tracker: VerdictTracker,
    host: str,
    rank: int,
    world_size: int,
    batch: int,
    window: int,
) -> RankReport:
    """A report for a rank other than zero: its own entry and each series' min and max.

    Args:
        record: this rank's record.
        minima, maxima: per series in :func:`per_step` order, from the all-reduce (NaN: no rank has it).
        tracker: this rank's own tracker (``world_size=1``), for its individual score.
    """
    values = per_step(record[None, :], layout)
    names = list(values)
    series = {name: SeriesStats(name, _float(minima[i]), None, None, _float(maxima[i])) for i, name in enumerate(names)}
    busy = values['busy']
    best = tracker.best('busy', busy)
    low = minima[0]
    relative = None
    if not np.isnan(busy[0]) and not np.isnan(low):
        relative = min(low / busy[0], 1.0) if busy[0] > 0 else 1.0
    fields = {
        'ratio': None,
        'relative_score': relative,
        'individual_score': _float(individual_scores(best, busy)[0]),
        'verdict': None,
    }
    own = _entry(0, host, values, layout, fields, {})
    own = dataclasses.replace(own, rank=rank)
    return RankReport(
        batch=batch,
        window=window,
        steps=int(record[STEPS]),
        world_size=world_size,
        series=series,
        reference_s=None,
        slowest=(),
        stragglers=(),
        own=own,
        complete=False,
    )


def report_metrics(report: RankReport) -> dict[str, float]:
    """The report as scalar metrics (``ranks/busy/median_s`` ...; see docs/stragglers.md)."""
    metrics: dict[str, float] = {}
    for name, stats in report.series.items():
        if stats.max_s is None:
            continue
        prefix = f'ranks/{name}/'
        if name == 'memory':
            metrics[prefix + 'max_bytes'] = stats.max_s
            if stats.median_s is not None:
                metrics[prefix + 'median_bytes'] = stats.median_s
            if stats.slowest_rank is not None:
                metrics[prefix + 'largest_rank'] = stats.slowest_rank
            continue
        for field in ('min_s', 'median_s', 'p90_s', 'max_s'):
            value = getattr(stats, field)
            if value is not None:
                metrics[prefix + field] = value
        if stats.slowest_rank is not None:
            metrics[prefix + 'slowest_rank'] = stats.slowest_rank
        if stats.spread is not None and name != 'step':
            metrics[prefix + 'spread'] = stats.spread
    if report.complete:
        metrics['ranks/stragglers/chronic'] = sum(1 for e in report.stragglers if e.verdict == CHRONIC)
        metrics['ranks/stragglers/one_off'] = sum(1 for e in report.stragglers if e.verdict == ONE_OFF)
    return metrics


TABLE_COLUMNS = (
    'rank',
    'host',
    'busy_s',
    'ratio',
    'relative_score',
    'individual_score',
    'verdict',
    'slow_reports',
    'since_batch',
    'slowest_section',
)


def table_rows(report: RankReport) -> list[list[Any]]:
    """Rows of the slowest-ranks table: the stragglers, then the slowest ranks not already listed."""
    seen: set[int] = set()
    rows = []
    for entry in list(report.stragglers) + list(report.slowest):
        if entry.rank in seen:
            continue
        seen.add(entry.rank)
        rows.append(
            [
                entry.rank,
                entry.host,
                _round(entry.busy_s),
                _round(entry.ratio, 3),
                _round(entry.relative_score, 3),
                _round(entry.individual_score, 3),
                entry.verdict,
                entry.slow_reports,
                entry.since_batch,
                entry.slowest_section,
            ]
        )
    return rows


def _round(value: Optional[float], digits: int = 6) -> Optional[float]:
    return None if value is None else round(float(value), digits)  # float: numpy's own round is ten times slower


def straggler_line(report: RankReport, verdicts: Verdicts) -> Optional[str]:
    """One console line naming the worst chronic straggler and its host (None when there is none)."""
    chronic = report.chronic
    if not chronic:
        return None
    worst = chronic[0]
    where = f' on {worst.host}' if worst.host else ''
    # busy_s and ratio are None when a chronic rank (slow in earlier reports) ended no step in this window.
    if worst.busy_s is None or worst.ratio is None or worst.relative_score is None:
        pace = 'ended no step in this window'
    else:
        pace = (
            f'busy {worst.busy_s * 1e3:.2f} ms/step, {worst.ratio:.2f}x the lower quartile '
            f'(relative score {worst.relative_score:.2f})'
        )
    parts = [
        f'rank {worst.rank}{where} is a chronic straggler: {pace}, '
        f'slow in {worst.slow_reports} of the last {verdicts.chronic_window} reports'
    ]
    if worst.since_batch is not None:
        parts.append(f' since batch {worst.since_batch}')
    if worst.trend is not None and abs(worst.trend - 1) >= 0.02:
        parts.append(f', {"worse" if worst.trend > 1 else "better"} than last report ({worst.trend:.2f}x)')
    if worst.slowest_section:
        parts.append(f'; slowest section: {worst.slowest_section}')
    if len(chronic) > 1:
        others = ', '.join(f'{e.rank}' + (f' ({e.host})' if e.host else '') for e in chronic[1:6])
        more = f' and {len(chronic) - 6} more' if len(chronic) > 6 else ''
        parts.append(f'; also chronic: ranks {others}{more}')
    return ''.join(parts)
