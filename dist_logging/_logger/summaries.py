"""Summaries of per-rank series (``reduce='gather'``) for trackers, above a number of ranks.

``reduce='gather'`` emits ``key/rank{r}`` per rank: 1,024 ranks x 10 keys is 10,240 series,
beyond what trackers accept (W&B: fewer than 10,000 metrics per project). Above
``gather_summary_above`` ranks, each gathered key becomes six series for the trackers:
``key/min``, ``key/median``, ``key/p90``, ``key/max``, ``key/argmin_rank``, ``key/argmax_rank``
(NaN values are left out of them); the full per-rank values go to the destinations that keep
per-rank series (file-like ones, ``per_rank_series = True``) and to the Prometheus endpoint.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

import numpy as np

__all__ = [
    'DEFAULT_GATHER_SUMMARY_ABOVE',
    'SUMMARY_SUFFIXES',
    'check_summary_above',
    'summarize_gathered',
    'per_rank_groups',
]

#: Above this many ranks, gathered keys are summarized for trackers.
DEFAULT_GATHER_SUMMARY_ABOVE = 64
SUMMARY_SUFFIXES = ('min', 'median', 'p90', 'max', 'argmin_rank', 'argmax_rank')


def check_summary_above(value: Any) -> Optional[int]:
    """Validate ``gather_summary_above``: a non-negative int, or None (never summarize).

    Raises:
        ValueError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'gather_summary_above must be a non-negative int (a number of ranks) or None, got {value!r}')
    return value


def summarize_gathered(
    values: dict[str, tuple[float, float, float]], gather_keys: Iterable[str], world_size: int
) -> dict[str, dict[int, tuple[float, float, float]]]:
    """Replace, in ``values`` (``{name: (value, step, level)}``), each gathered key's ``key/rank{r}`` by its summary.

    Args:
        values: the flush's values on rank zero; changed in place.
        gather_keys: the keys reduced with ``'gather'``.
        world_size: the number of ranks.

    Returns:
        ``{key: {rank: (value, step, level)}}``: the per-rank values taken out.
    """
    taken: dict[str, dict[int, tuple[float, float, float]]] = {}
    for key in gather_keys:
        per_rank = {}
        for rank in range(world_size):
            entry = values.pop(f'{key}/rank{rank}', None)
            if entry is not None:
                per_rank[rank] = entry
        if not per_rank:
            continue
        taken[key] = per_rank
        ranks = np.fromiter(per_rank, dtype=np.int64, count=len(per_rank))
        numbers = np.array([entry[0] for entry in per_rank.values()], dtype=np.float64)
        step, level = max(entry[1] for entry in per_rank.values()), next(iter(per_rank.values()))[2]
        keep = ~np.isnan(numbers)
        if keep.any():
            ranks, numbers = ranks[keep], numbers[keep]
            summary = (
                float(numbers.min()),
                float(np.median(numbers)),
                float(np.percentile(numbers, 90)),
                float(numbers.max()),
                float(ranks[int(numbers.argmin())]),
                float(ranks[int(numbers.argmax())]),
            )
        else:
            summary = (math.nan,) * 6
        for suffix, value in zip(SUMMARY_SUFFIXES, summary):
            values[f'{key}/{suffix}'] = (value, step, level)
    return taken


def per_rank_groups(taken: Mapping[str, Mapping[int, tuple[float, float, float]]]) -> list:
    """``summarize_gathered``'s output as ``(metrics, step, level)`` groups of ``key/rank{r}`` values."""
    groups: dict[tuple[float, int], dict[str, float]] = {}
    for key, per_rank in taken.items():
        for rank, (value, step, level) in per_rank.items():
            groups.setdefault((step, int(level)), {})[f'{key}/rank{rank}'] = float(value)
    return [(groups[sl], None if sl[0] == -math.inf else int(sl[0]), sl[1]) for sl in sorted(groups)]
