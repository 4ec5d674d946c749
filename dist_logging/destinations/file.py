"""FileLogger: each rank's log as a text or JSON Lines file, uploaded when an uploader exists."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination
from dist_logging.naming import (DIST_PLACEHOLDERS, check_rank_distinct, format_name_with_dist,
                                 validate_object_name, validate_template)

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['FileLogger']

FORMATS = ('text', 'jsonl')


class FileLogger(LoggerDestination):
    """Writes everything logged to a file per rank (by default), buffered, flushed periodically.

    Lines are written to an open, buffered file; they reach the disk every
    ``flush_interval`` batches, at every epoch end and at close. When the Logger
    has an upload-capable destination, the file is uploaded (``overwrite=True``) under
    ``remote_file_name`` after every flush, so the object always holds the newest log.

    Args:
        filename: template for the local path (``{run_name}``, ``{rank}``, ...).
        remote_file_name: template for the uploaded name (default: the same as ``filename``);
            ``None``-like empty string disables uploading.
        format: ``'text'`` (human-readable lines) or ``'jsonl'`` (one JSON object a line).
        flush_interval: flush every this many batches (>= 1).
        log_traces: also write traces (default True).
        ranks: rank policy (default ``'all'``: every rank writes its own file).

    Raises:
        ValueError: a bad template, an unknown format, a bad interval, or a template that
            cannot tell ranks apart under ``ranks='all'``/``'local_zero'`` (names it).
    """

    def __init__(self, filename: str = '{run_name}/logs-rank{rank}.txt', remote_file_name: Optional[str] = None,
                 format: str = 'text', flush_interval: int = 100, log_traces: bool = True, ranks: str = 'all',
                 log_level: Any = None, optional: Optional[bool] = None):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        if format not in FORMATS:
            raise ValueError(f'FileLogger: unknown format {format!r}; expected one of {list(FORMATS)}')
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, int) or flush_interval < 1:
            raise ValueError(f'FileLogger: flush_interval must be an int >= 1, got {flush_interval!r}')
        validate_template(filename, DIST_PLACEHOLDERS)
        check_rank_distinct(filename, self.ranks, 'FileLogger filename')
        if remote_file_name is None:
            remote_file_name = filename
        if remote_file_name:
            validate_template(remote_file_name, DIST_PLACEHOLDERS)
            check_rank_distinct(remote_file_name, self.ranks, 'FileLogger remote_file_name')
        self.filename_template = filename
        self.remote_file_name_template = remote_file_name
        self.format = format
        self.flush_interval = flush_interval
        self.should_log_traces = log_traces
        self.filename: Optional[str] = None
        self.remote_file_name: Optional[str] = None
        self._file: Optional[TextIO] = None
        self._state: Optional['State'] = None
        self._logger: Optional['Logger'] = None
        self._dirty = False

    # ------------------------------------------------------------------ lifecycle
    def init(self, state: 'State', logger: 'Logger') -> None:
        self._state, self._logger = state, logger
        self.filename = format_name_with_dist(self.filename_template, state.run_name)
        if self.remote_file_name_template:
            self.remote_file_name = validate_object_name(
                format_name_with_dist(self.remote_file_name_template, state.run_name))
        directory = os.path.dirname(self.filename)
        if directory:
            os.makedirs(directory, exist_ok=True)
        # Append: a restarted run with the same name keeps what the first attempt wrote.
        self._file = open(self.filename, 'a', encoding='utf-8', buffering=1 << 16)

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        if state.timestamp.batch % self.flush_interval == 0:
            self.flush()

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        self.flush()

    def fit_end(self, state: 'State', logger: 'Logger') -> None:
        self.flush()

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self._file is None:
            return
        self.flush()
        self._file.close()
        self._file = None

    def flush(self) -> None:
        """Write buffered lines to disk and, if the Logger can upload, upload the file."""
        if self._file is None or not self._dirty:
            return
        self._file.flush()
        self._dirty = False
        logger = self._logger
        if self.remote_file_name and logger is not None and logger.has_file_upload_destination():
            logger.upload_file(self.remote_file_name, self.filename, overwrite=True)

    # ------------------------------------------------------------------ writing
    def _write(self, kind: str, data: Any, step: Optional[int] = None, **extra: Any) -> None:
        if self._file is None:
            raise RuntimeError(f'FileLogger({self.filename_template!r}) is not open: it is opened by the Logger')
        timestamp = self._state.timestamp if self._state is not None else None
        if self.format == 'jsonl':
            record: dict[str, Any] = {'kind': kind, 'time': round(time.time(), 6)}
            if timestamp is not None:
                record['epoch'], record['batch'] = timestamp.epoch, timestamp.batch
            if step is not None:
                record['step'] = step
            record.update(extra)
            record['data'] = data
            self._file.write(json.dumps(record, default=format_log_data_value, allow_nan=True) + '\n')
        else:
            where = f'[epoch={timestamp.epoch}][batch={timestamp.batch if step is None else step}]' if timestamp else ''
            if isinstance(data, dict):
                for name, value in data.items():
                    self._file.write(f'[{kind}]{where}: {name}: {format_log_data_value(value)}\n')
            else:
                self._file.write(f'[{kind}]{where}: {format_log_data_value(data)}\n')
        self._dirty = True

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self._write('hparams', hyperparameters)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self._write('metric', metrics, step)

    def log_traces(self, traces: dict[str, Any]) -> None:
        if self.should_log_traces:
            self._write('trace', traces)

    def log_table(self, columns: list[str], rows: list[list[Any]], name: str = 'Table',
                  step: Optional[int] = None) -> None:
        self._write('table', {'columns': columns, 'rows': rows}, step, name=name)
