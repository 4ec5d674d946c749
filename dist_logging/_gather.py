"""Buffering of metrics logged with ``reduce=`` and their combination across ranks at flush."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from dist_logging import dist
from dist_logging._values import check_metric_key, metric_scalar

__all__ = ['REDUCTIONS', 'MetricGatherer']

REDUCTIONS = ('mean', 'sum', 'min', 'max', 'gather')


class MetricGatherer:
    """Buffers reduced metrics between flushes (world-size-one version; replaced by the gather issue)."""

    def __init__(self, group: dist.LoggingGroup):
        self._group = group
        self._buffer: dict[str, tuple[str, Any, Optional[int]]] = {}

    def add(self, metrics: Mapping[str, Any], step: Optional[int], reduce: str) -> None:
        for key, value in metrics.items():
            check_metric_key(key)
            self._buffer[key] = (reduce, metric_scalar(key, value), step)

    def pending_keys(self) -> list[str]:
        return list(self._buffer)

    def flush(self) -> list[tuple[dict[str, float], Optional[int]]]:
        buffered, self._buffer = self._buffer, {}
        out: dict[Optional[int], dict[str, float]] = {}
        for key, (reduce, value, step) in buffered.items():
            name = f'{key}/rank0' if reduce == 'gather' else key
            out.setdefault(step, {})[name] = value
        return [(metrics, step) for step, metrics in out.items()]
