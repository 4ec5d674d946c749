"""The per-rank history of a run (ranks x windows): a small JSON-lines file rank zero writes.

Line 1 is a header; each later line is one report::

    {"format": "dist_logging.rank_history", "version": 1, "run_name": ..., "world_size": 4,
     "hosts": ["a", "a", "b", "b"], "slow_ratio": 1.1, "chronic_reports": 2, "chronic_window": 5}
    {"window": 0, "batch": 100, "time": 1764273600.0, "steps": 99, "reference_ms": 10.01,
     "ms": {"busy": [10.0, ...], "step": [...], "forward": [...]}, "memory": [...],
     "verdicts": {"3": "chronic"}}

Values are milliseconds per step rounded to the microsecond (``null``: no value). Each line
is appended and flushed at its report, so a run that dies keeps every report but the last
line at worst (the reader skips a torn last line). A file a rank-zero restart continues
holds a new header line; the reader starts a new segment there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from dist_logging.stragglers.report import RankReport, per_step

__all__ = ['HISTORY_NAME', 'FORMAT', 'HistoryWriter', 'History', 'read_history', 'summary_text', 'private_history_path']

HISTORY_NAME = 'rank_history.jsonl'
FORMAT = 'dist_logging.rank_history'


def _ms(values: np.ndarray) -> list[Optional[float]]:
    return [None if math.isnan(v) else round(v * 1e3, 3) for v in values.tolist()]


class HistoryWriter:
    """Appends one line per report to ``path`` (rank zero only).

    Args:
        path: the file (created, or appended to with a new header).
        header: the header's fields (run name, world size, hosts, thresholds).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str, header: dict[str, Any]):
        from dist_logging._private_dirs import open_private_file

        self.path = path
        # Not following a symlink planted in its place (the default folder is under the system temp dir).
        fd = open_private_file(path, os.O_WRONLY | os.O_APPEND, create=True)
        self._file = os.fdopen(fd, 'a', encoding='utf-8')
        self._write({'format': FORMAT, 'version': 1, **header})

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(',', ':')) + '\n')
        self._file.flush()

    def append(self, report: RankReport, table: np.ndarray, layout: Sequence[str], when: float) -> None:
        """Write one report: every rank's per-step values of each series."""
        values = per_step(table, layout)
        memory = values.pop('memory')
        line: dict[str, Any] = {
            'window': report.window,
            'batch': report.batch,
            'time': round(when, 3),
            'steps': report.steps,
            'reference_ms': None if report.reference_s is None else round(report.reference_s * 1e3, 3),
            'ms': {name: _ms(column) for name, column in values.items()},
            'verdicts': {str(e.rank): e.verdict for e in report.stragglers},
        }
        if not np.all(np.isnan(memory)):
            line['memory'] = [None if math.isnan(v) else int(v) for v in memory.tolist()]
        self._write(line)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if not self._file.closed:
            self._file.close()


@dataclasses.dataclass
class History:
    """A history file read back.

    Attributes:
        header: the last header's fields.
        batches: the batch of each window.
        series: name -> array of shape (ranks, windows), seconds per step (NaN: no value).
        verdicts: per window, rank -> verdict for the ranks that were not ``'ok'``.
        hosts: host name per rank.
    """

    header: dict[str, Any]
    batches: list[int]
    series: dict[str, np.ndarray]
    verdicts: list[dict[int, str]]

    @property
    def hosts(self) -> list[str]:
        """Host name per rank ('' when unknown)."""
        return list(self.header.get('hosts') or [])

    @property
    def world_size(self) -> int:
        """Ranks in the run."""
        return int(self.header.get('world_size') or 0)


def read_history(path: str) -> History:
    """Read a history file; with several segments (a restarted rank zero), the last one.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a rank history file, or no header (names the file and line).
    """
    header: Optional[dict[str, Any]] = None
    windows: list[dict[str, Any]] = []
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            if number >= len(lines) - 1:  # a torn last line: the run died while writing it
                break
            raise ValueError(f'{path}:{number}: not JSON') from None
        if line.get('format') == FORMAT:
            header, windows = line, []
        elif header is None:
            raise ValueError(f'{path}:{number}: not a rank history file (no {FORMAT} header first)')
        else:
            windows.append(line)
    if header is None:
        raise ValueError(f'{path}: not a rank history file (empty or no header)')
    world = int(header.get('world_size') or 0)
    names: list[str] = []
    for line in windows:
        for name in line.get('ms', {}):
            if name not in names:
                names.append(name)
    series = {name: np.full((world, len(windows)), np.nan) for name in names}
    for column, line in enumerate(windows):
        for name, values in line.get('ms', {}).items():
            array = np.array([np.nan if v is None else v / 1e3 for v in values], dtype=np.float64)
            series[name][: len(array), column] = array[:world]
    verdicts = [{int(rank): verdict for rank, verdict in line.get('verdicts', {}).items()} for line in windows]
    return History(
        header=header, batches=[int(line.get('batch', 0)) for line in windows], series=series, verdicts=verdicts
    )


def summary_text(history: History, top: int = 5) -> str:
    """A human summary: the run, the busy time's spread, and each rank ever flagged (chronic first)."""
    lines = [
        f"run {history.header.get('run_name', '?')}: {history.world_size} ranks, {len(history.batches)} "
        f'reports' + (f' (batches {history.batches[0]}-{history.batches[-1]})' if history.batches else '')
    ]
    busy = history.series.get('busy')
    if busy is None or busy.size == 0:
        lines.append('no reports yet')
        return '\n'.join(lines)
    last = busy[:, -1]
    if not np.all(np.isnan(last)):
        lines.append(
            f'last report: busy per step min {np.nanmin(last) * 1e3:.2f} ms, median '
            f'{np.nanmedian(last) * 1e3:.2f} ms, max {np.nanmax(last) * 1e3:.2f} ms '
            f'(rank {int(np.nanargmax(last))})'
        )
    flagged: dict[int, dict[str, int]] = {}
    for window in history.verdicts:
        for rank, verdict in window.items():
            counts = flagged.setdefault(rank, {})
            counts[verdict] = counts.get(verdict, 0) + 1
    if not flagged:
        lines.append('no rank was ever slow')
        return '\n'.join(lines)
    hosts = history.hosts
    with np.errstate(invalid='ignore', divide='ignore'):
        medians = np.nanmedian(busy, axis=0)
    order = sorted(flagged, key=lambda r: (-flagged[r].get('chronic', 0), -flagged[r].get('one-off', 0), r))
    lines.append(f'ranks ever slow: {len(flagged)} (chronic first)')
    for rank in order[:top]:
        counts = flagged[rank]
        first = next(i for i, w in enumerate(history.verdicts) if rank in w)
        with np.errstate(invalid='ignore', divide='ignore'):
            ratio = np.nanmedian(busy[rank] / medians) if rank < busy.shape[0] else float('nan')
        host = f' on {hosts[rank]}' if rank < len(hosts) and hosts[rank] else ''
        lines.append(
            f'  rank {rank}{host}: chronic in {counts.get("chronic", 0)}, one-off in '
            f'{counts.get("one-off", 0)} of {len(history.batches)} reports, first at batch '
            f'{history.batches[first]}; busy {ratio:.2f}x the median (median over reports)'
        )
    if len(order) > top:
        lines.append(f'  ... and {len(order) - top} more')
    return '\n'.join(lines)


def private_history_path(run_name: str) -> str:
    """Where rank zero keeps the history while the run goes on: the per-user private folder of the run."""
    from dist_logging._private_dirs import private_dir

    return os.path.join(private_dir(run_name, 'ranks'), HISTORY_NAME)
