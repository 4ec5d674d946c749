"""InMemoryLogger: keeps everything it is given, for tests and notebooks."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from dist_logging.destination import LoggerDestination
from dist_logging.state import Timestamp

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['InMemoryLogger']


class InMemoryLogger(LoggerDestination):
    """Stores logged data in memory.

    Attributes:
        hyperparameters: every hyperparameter logged (later calls update earlier keys).
        data: metric name -> list of ``(step, value)``; a ``None`` step is replaced by
            the batch count at the time of the call. Gathered metrics appear as one
            series per rank (``'loss/rank0'``, ``'loss/rank1'``, ...).
        most_recent_values: metric name -> latest value.
        most_recent_timestamps: metric name -> the :class:`~dist_logging.Timestamp` of its latest
            call (``None`` when the destination was used without a Logger).
        state: the run :class:`~dist_logging.State` (set when the Logger opens it; ``None`` before).
        traces: trace name -> list of values, in call order.
        tables: table name -> list of ``(step, columns, rows)``.
        images: image name -> list of ``(step, images, masks)``.
        resumes: one :class:`~dist_logging.state.ResumeInfo` per resume, in order (the markers); at
            each, the entries of ``data``, ``tables`` and ``images`` at superseded steps were dropped.

    Args:
        ranks: rank policy (default ``'zero'``).
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
    """

    # Keeps per-rank series: above gather_summary_above ranks it still gets every key/rank{r} (docs/gather.md).
    per_rank_series = True

    def __init__(self, ranks: str = 'zero', log_level: Any = None, optional: Optional[bool] = None):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        self.hyperparameters: dict[str, Any] = {}
        self.data: dict[str, list[tuple[Optional[int], Any]]] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_timestamps: dict[str, Optional[Timestamp]] = {}
        self.state: Optional['State'] = None
        self._timestamps: dict[str, list[Optional[Timestamp]]] = {}
        self.traces: dict[str, list[Any]] = {}
        self.tables: dict[str, list[tuple[Optional[int], list[str], list[list[Any]]]]] = {}
        self.images: dict[str, list[tuple[Optional[int], Any, Any]]] = {}
        self.resumes: list['ResumeInfo'] = []

    def init(self, state: 'State', logger: 'Logger') -> None:
        self.state = state

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Drop every entry at a step >= ``info.superseded_from`` (the resumed run logs them again) and
        record the resume in :attr:`resumes`. Entries without a step (direct calls) are kept."""
        first = info.superseded_from

        def kept(step: Optional[int]) -> bool:
            return step is None or step < first

        for name in list(self.data):
            points, stamps = self.data[name], self._timestamps[name]
            keep = [i for i, (step, _) in enumerate(points) if kept(step)]
            if len(keep) == len(points):
                continue
            if not keep:
                del self.data[name], self._timestamps[name], self.most_recent_values[name]
                del self.most_recent_timestamps[name]
                continue
            self.data[name] = [points[i] for i in keep]
            self._timestamps[name] = [stamps[i] for i in keep]
            self.most_recent_values[name] = self.data[name][-1][1]
            self.most_recent_timestamps[name] = self._timestamps[name][-1]
        for series in (self.tables, self.images):
            for name in list(series):
                series[name] = [entry for entry in series[name] if kept(entry[0])]
                if not series[name]:
                    del series[name]
        self.resumes.append(info)

    def _step(self, step: Optional[int]) -> Optional[int]:
        if step is None and self.state is not None:
            return self.state.timestamp.batch
        return step

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self.hyperparameters.update(copy.deepcopy(hyperparameters))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        step = self._step(step)
        timestamp = self.state.timestamp if self.state is not None else None  # immutable: safe to keep
        for name, value in metrics.items():
            if type(value) is not float and type(value) is not int:  # called directly with e.g. a tensor: keep a copy
                value = copy.deepcopy(value)
            self.data.setdefault(name, []).append((step, value))
            self._timestamps.setdefault(name, []).append(timestamp)
            self.most_recent_values[name] = value
            self.most_recent_timestamps[name] = timestamp

    def get_timeseries(self, metric: str) -> dict[str, np.ndarray]:
        """One metric over time, as arrays of equal length (for plotting).

        Returns:
            ``{metric: values, 'step': steps, 'epoch': ..., 'batch': ..., 'batch_in_epoch': ...,
            'sample': ..., 'sample_in_epoch': ..., 'token': ..., 'token_in_epoch': ...,
            'total_wct': ..., 'epoch_wct': ..., 'batch_wct': ...}``: the values, the step of
            each, and every :class:`~dist_logging.Timestamp` field at the time of each call
            (NaN where the call had no run state).

        Raises:
            ValueError: ``metric`` was never logged (names it and the logged ones).
        """
        if metric not in self.data:
            raise ValueError(f'get_timeseries: metric {metric!r} was never logged; logged metrics: {sorted(self.data)}')
        points = self.data[metric]
        series: dict[str, np.ndarray] = {metric: np.array([value for _, value in points])}
        series['step'] = np.array([np.nan if step is None else step for step, _ in points])
        timestamps = self._timestamps[metric]
        for field in dataclasses.fields(Timestamp):
            series[field.name] = np.array([np.nan if t is None else getattr(t, field.name) for t in timestamps])
        return series

    def log_traces(self, traces: dict[str, Any]) -> None:
        for name, value in traces.items():
            self.traces.setdefault(name, []).append(value)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self.tables.setdefault(name, []).append((self._step(step), list(columns), [list(r) for r in rows]))

    def log_images(
        self,
        images: Any,
        name: str = 'Images',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks: Optional[dict[str, Any]] = None,
        mask_class_labels: Optional[dict[int, str]] = None,
        use_table: bool = True,
    ) -> None:
        from dist_logging._images import to_image_batch

        batch = to_image_batch(images, channels_last).copy()
        self.images.setdefault(name, []).append((self._step(step), batch, copy.deepcopy(masks)))
