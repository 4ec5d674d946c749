"""The rank report's statistics, scores and verdicts (dist_logging.stragglers.stats and .report), on synthetic
tables."""

import dataclasses
import math

import numpy as np
import pytest

from dist_logging.stragglers.report import (
    BUSY,
    FIXED,
    JITTER,
    MEMORY,
    STEPS,
    WALL,
    build_report,
    report_metrics,
    straggler_line,
    table_rows,
)
from dist_logging.stragglers.stats import (
    CHRONIC,
    OK,
    ONE_OFF,
    VerdictTracker,
    Verdicts,
    individual_scores,
    reference,
    relative_scores,
    series_stats,
    slow_mask,
)


def test_series_stats_ignores_missing_ranks_and_names_the_extremes():
    stats = series_stats('forward', np.array([2.0, np.nan, 1.0, 4.0, 3.0]))
    assert (stats.min_s, stats.median_s, stats.max_s) == (1.0, 2.5, 4.0)
    assert stats.p90_s == pytest.approx(np.percentile([1, 2, 3, 4], 90))
    assert (stats.slowest_rank, stats.fastest_rank, stats.ranks) == (3, 2, 4)
    assert stats.spread == pytest.approx(4.0 / 2.5)
    empty = series_stats('x', np.array([np.nan, np.nan]))
    assert empty.max_s is None and empty.ranks == 0


def test_scores_are_nvrx_relative_and_individual():
    values = np.array([1.0, 2.0, np.nan, 1.25])
    assert relative_scores(values)[[0, 1, 3]].tolist() == [1.0, 0.5, 0.8]
    assert math.isnan(relative_scores(values)[2])
    best = np.array([0.5, 2.0, np.nan, 1.0])
    assert individual_scores(best, values)[[0, 1, 3]].tolist() == [0.5, 1.0, 0.8]


def test_reference_is_the_fastest_at_small_worlds_and_robust_at_scale():
    assert reference(np.array([1.2, 1.0])) == 1.0
    assert reference(np.array([1.3, 1.0, 1.1, 1.2])) == 1.0
    # One rank far faster than the others (it skipped work) must not make everyone slow.
    values = np.full(100, 1.0)
    values[7] = 0.1
    assert reference(values) == 1.0
    assert not slow_mask(values, Verdicts()).any()


def test_slow_needs_both_the_ratio_and_the_gap():
    verdicts = Verdicts(slow_ratio=1.1, min_gap_s=1e-3)
    assert slow_mask(np.array([0.010, 0.012]), verdicts).tolist() == [False, True]
    # 20 % slower but only 20 µs: below the gap, not a report
    assert not slow_mask(np.array([0.0001, 0.00012]), verdicts).any()
    # +5 % jitter is never slow
    assert not slow_mask(np.array([1.0, 1.05, 0.97, 1.02]), Verdicts()).any()


def test_slow_needs_more_than_the_ranks_own_jitter():
    # Rank 1 is 15 % above the reference. With its steps scattering by 1 ms (MAD) around a 10 ms median
    # (a rank starved of CPU now and then), 1.5 ms is within 3 x its jitter: not slow. Steady, it is.
    values = np.array([0.010, 0.0115])
    assert slow_mask(values, Verdicts(), np.array([0.0002, 0.001])).tolist() == [False, False]
    assert slow_mask(values, Verdicts(), np.array([0.0002, 0.0003])).tolist() == [False, True]
    assert slow_mask(values, Verdicts(jitter_k=0), np.array([0.0002, 0.001])).tolist() == [False, True]
    assert slow_mask(values, Verdicts(), np.array([np.nan, np.nan])).tolist() == [False, True]  # unknown: no margin
    # The benchmark's case: 1.2x with +-5 % uniform jitter (MAD 2.5 % of the step) stays slow.
    assert slow_mask(np.array([0.010, 0.012]), Verdicts(), np.array([0.00025, 0.0003])).tolist() == [False, True]


def test_report_uses_the_jitter_column():
    busy = np.array([0.010, 0.0115, 0.0101])
    table = _table(busy)
    table[:, JITTER] = [0.0002, 0.001, 0.0002]
    report, _ = build_report(table, [], ['a', 'b', 'c'], VerdictTracker(3, Verdicts()), None, 100, 0, 3)
    assert report.stragglers == []
    table[1, JITTER] = 0.0003
    report, _ = build_report(table, [], ['a', 'b', 'c'], VerdictTracker(3, Verdicts()), None, 100, 0, 3)
    assert [e.rank for e in report.stragglers] == [1]


@pytest.mark.parametrize(
    'kwargs, match',
    [
        ({'jitter_k': -1}, 'jitter_k'),
        ({'jitter_k': True}, 'jitter_k'),
        ({'slow_ratio': 1.0}, 'slow_ratio'),
        ({'min_gap_s': -1}, 'min_gap_s'),
        ({'chronic_reports': 0}, 'chronic_reports'),
        ({'chronic_reports': 3, 'chronic_window': 2}, 'chronic_reports'),
        ({'chronic_window': True}, 'chronic_window'),
    ],
)
def test_bad_thresholds_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Verdicts(**kwargs)


def test_chronic_is_m_of_the_last_n_reports_and_one_off_otherwise():
    tracker = VerdictTracker(3, Verdicts(chronic_reports=2, chronic_window=4))
    history = [
        [False, True, False],
        [False, False, True],
        [False, True, False],
        [False, False, False],
        [False, False, False],
    ]
    verdicts = []
    for batch, slow in enumerate(history):
        verdict, count, since = tracker.record(np.array(slow), batch * 10)
        verdicts.append(verdict.tolist())
    assert verdicts[0] == [OK, ONE_OFF, OK]
    assert verdicts[1] == [OK, OK, ONE_OFF]  # slow once each: not chronic
    assert verdicts[2] == [OK, CHRONIC, OK]  # rank 1: 2 of the last 4
    assert verdicts[3] == [OK, CHRONIC, OK]  # still 2 of the last 4, although not slow now
    assert verdicts[4] == [OK, OK, OK]  # the window moved past its first slow report
    tracker = VerdictTracker(1, Verdicts())
    _, _, since = tracker.record(np.array([True]), 100)
    _, count, since = tracker.record(np.array([True]), 200)
    assert since.tolist() == [100] and count.tolist() == [2]  # the streak began at batch 100


def _table(busy, steps=10, sections=None):
    busy = np.asarray(busy, dtype=np.float64)
    table = np.full((len(busy), FIXED + (0 if sections is None else sections.shape[1])), np.nan)
    table[:, STEPS] = steps
    table[:, WALL] = busy.max() * steps * 1.1
    table[:, BUSY] = busy  # seconds per step (the median step)
    table[:, MEMORY] = 1e9 + np.arange(len(busy))
    if sections is not None:
        table[:, FIXED:] = sections * steps
    return table


def test_report_names_the_slowed_rank_with_host_scores_and_section():
    rng = np.random.default_rng(3)
    tracker = VerdictTracker(4, Verdicts())
    hosts = ['node-a', 'node-a', 'node-b', 'node-b']
    ratio = None
    for window in range(2):
        busy = 0.010 * rng.uniform(0.995, 1.005, 4)
        busy[2] *= 1.2
        sections = np.stack([busy * 0.3, busy * 0.7], axis=1)
        sections[2, 0] *= 1.5  # its data section is the one far above the median
        report, ratio = build_report(
            _table(busy, sections=sections),
            ['data', 'forward'],
            hosts,
            tracker,
            ratio,
            100 * (window + 1),
            window,
            top_k=2,
        )
    assert [(e.rank, e.host, e.verdict) for e in report.stragglers] == [(2, 'node-b', CHRONIC)]
    worst = report.stragglers[0]
    assert worst.ratio == pytest.approx(1.2, rel=0.02)
    assert worst.relative_score == pytest.approx(1 / 1.2, rel=0.02)
    assert worst.since_batch == 100 and worst.slow_reports == 2 and worst.slowest_section == 'data'
    assert report.chronic_hosts == ['node-b']
    assert [e.rank for e in report.slowest][0] == 2 and len(report.slowest) == 2
    metrics = report_metrics(report)
    assert metrics['ranks/busy/slowest_rank'] == 2 and metrics['ranks/busy/max_s'] == pytest.approx(worst.busy_s)
    assert metrics['ranks/stragglers/chronic'] == 1 and 'ranks/forward/max_s' in metrics
    assert metrics['ranks/step/median_s'] == pytest.approx(0.010 * 1.2 * 1.005 * 1.1, rel=0.01)
    rows = table_rows(report)
    assert rows[0][:2] == [2, 'node-b'] and rows[0][6] == CHRONIC and len(rows) == 2
    line = straggler_line(report, Verdicts())
    assert line.startswith('rank 2 on node-b is a chronic straggler') and 'since batch 100' in line

    # A rank chronic from earlier reports that ended no step in this window has no busy time: the line says so.
    idle = dataclasses.replace(worst, busy_s=None, ratio=None, relative_score=None)
    line = straggler_line(dataclasses.replace(report, stragglers=[idle]), Verdicts())
    assert line.startswith('rank 2 on node-b is a chronic straggler: ended no step in this window, slow in 2 of')


def test_no_false_reports_with_jitter_only():
    rng = np.random.default_rng(0)
    tracker = VerdictTracker(64, Verdicts())
    flagged = 0
    for window in range(100):
        # 100 steps per window, +-5 % uniform jitter per step: the window's median step per rank
        busy = 0.010 * np.median(rng.uniform(0.95, 1.05, (100, 64)), axis=0)
        report, _ = build_report(_table(busy, steps=100), [], [''] * 64, tracker, None, window, window, top_k=3)
        flagged += len(report.stragglers)
    assert flagged == 0
