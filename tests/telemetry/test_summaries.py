"""Per-rank series summarized for trackers above gather_summary_above ranks (dist_logging._logger.summaries)."""

from __future__ import annotations

import math

from dist_logging._logger.summaries import per_rank_groups, summarize_gathered


def test_gathered_keys_become_six_summaries_and_the_rest_stays():
    world = 100
    values = {f'loss/rank{r}': (float(r), 7.0, 3.0) for r in range(world)}
    values['lr'] = (0.1, 7.0, 3.0)
    values['loss/rank13'] = (math.nan, 7.0, 3.0)  # left out of the summaries
    taken = summarize_gathered(values, ['loss'], world)
    assert set(values) == {
        'lr',
        'loss/min',
        'loss/median',
        'loss/p90',
        'loss/max',
        'loss/argmin_rank',
        'loss/argmax_rank',
    }
    assert values['loss/min'][0] == 0.0 and values['loss/max'][0] == 99.0
    assert values['loss/argmin_rank'][0] == 0.0 and values['loss/argmax_rank'][0] == 99.0
    assert values['loss/median'][0] == 50.0  # 99 values 0..99 without 13
    assert 89.0 < values['loss/p90'][0] < 91.0
    assert values['loss/p90'][1:] == (7.0, 3.0)
    assert len(taken['loss']) == world and math.isnan(taken['loss'][13][0])
    ((metrics, step, level),) = per_rank_groups(taken)
    assert (step, level) == (7, 3) and len(metrics) == world and metrics['loss/rank99'] == 99.0


def test_all_nan_gives_nan_summaries():
    values = {'x/rank0': (math.nan, 1.0, 3.0), 'x/rank1': (math.nan, 1.0, 3.0)}
    summarize_gathered(values, ['x'], 2)
    assert all(math.isnan(values[f'x/{s}'][0]) for s in ('min', 'max', 'argmin_rank'))
