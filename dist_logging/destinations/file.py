"""FileLogger: each rank's log as a text or JSON Lines file with its tables and images, uploaded if it can be."""

from __future__ import annotations

import csv
import json
import os
import re
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional, TextIO

from dist_logging import dist
from dist_logging._artifacts import jsonable, safe_artifact_name, table_json
from dist_logging._values import format_log_data_value, json_safe
from dist_logging.destination import LoggerDestination
from dist_logging.destinations._capture import StreamTee, install_tee, remove_tee
from dist_logging.destinations import _sigterm
from dist_logging.destinations._periodic import PeriodicFlushMixin, check_interval
from dist_logging.naming import (
    DIST_PLACEHOLDERS,
    check_rank_distinct,
    format_name_with_dist,
    validate_object_name,
    validate_template,
)

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['FileLogger']

FORMATS = ('text', 'jsonl')
_EARLY_TEXT_LIMIT = 1 << 22  # characters of text (e.g. captured output) held until the Logger opens the file
TABLE_FORMATS = ('jsonl', 'csv')
_RESUME_SCAN_BYTES = 1 << 20  # how much of the log's end a resume reads to name the last step written
# A step-bearing line: Composer's metric line, or a JSON record of a kind that carries a step (its "step" key
# comes before "data", so the first match is the record's own).
_STEP_LINE = re.compile(
    r'^(?:\[metric\]\[batch=(\d+)\]|\{"kind": "(?:metric|table|images)".*?"step": (\d+)[,}])', re.MULTILINE
)


def _captured_line_sink(destination: 'FileLogger', stream: str) -> Any:
    """The tee's sink: each captured line to ``destination``, held weakly so the tee never keeps it alive."""
    ref = weakref.ref(destination)

    def sink(line: str) -> None:
        target = ref()
        if target is not None:
            target._write_captured(stream, line)

    return sink


def _artifact_base(path: str) -> str:
    """``runs/x/logs-rank0.txt`` -> ``runs/x/logs-rank0``: the folder for that log's tables and images."""
    root, ext = os.path.splitext(path)
    return root if ext else path + '.d'


class FileLogger(PeriodicFlushMixin, LoggerDestination):
    """Writes everything logged to a file per rank (by default), buffered, flushed periodically.

    Lines are written to an open, buffered file; they reach the operating system at the end of
    every batch (``batch_end``) and on SIGTERM, so a rank that dies keeps them, and the object
    store every ``flush_interval`` batches, at every epoch end and at close. After a torchrun
    restart or a SLURM requeue the file is appended to, after an ``[attempt]`` line (a record
    of kind ``attempt`` in JSON Lines); ``{attempt}`` in ``filename`` gives each attempt its
    own file instead. When the Logger
    has an upload-capable destination, the file is uploaded (``overwrite=True``) under
    ``remote_file_name`` after every flush, so the object always holds the newest log.

    Tables and images go next to the log, in a folder named after it without its
    extension (``runs/r/logs-rank0.txt`` -> ``runs/r/logs-rank0/``):

    * ``tables/<name>.jsonl`` (one JSON object per row, with the step as ``_step``) or
      ``tables/<name>.csv`` (a header ``_step,<columns>``, then one line per row);
    * ``images/<name>/step<step>-<i>.png`` for image ``i`` of a batch, and
      ``images/<name>/step<step>-<i>.<mask name>.png`` with each mask overlaid.

    They are uploaded like the log (under the same folder next to ``remote_file_name``):
    tables after every flush that changed them, each image once, at the next flush.
    The log itself gets one line per table or image call that names the file.

    Args:
        filename: template for the local path (``{run_name}``, ``{rank}``, ...).
        remote_file_name: template for the uploaded name (default: ``filename`` when it is
            relative, else ``{run_name}/<its file name>``); an empty string disables uploading.
        format: ``'text'`` (Composer's lines: ``[hyperparameter]: lr: 0.1 ``,
            ``[metric][batch=3]: loss: 0.5 ``, ``[trace]: name:value``, ``[table]: name: {json}``)
            or ``'jsonl'`` (one JSON object a line).
        flush_interval: flush every this many batches (>= 1).
        log_traces: also write traces (default True).
        table_format: ``'jsonl'`` (default) or ``'csv'``; a CSV table keeps the columns of its
            first call (a later call with other columns raises ``ValueError``).
        ranks: rank policy (default ``'all'``: every rank writes its own file).
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.
        buffer_size: the file's buffer, as ``open(buffering=)`` takes it: ``1`` writes every
            line at once (Composer's default), ``-1`` the system default, ``n > 1`` a buffer of
            ``n`` bytes (default 64 KiB; lines reach the operating system at each batch end).
        overwrite: truncate an existing log file; by default a restarted run appends to it.
        capture_stdout: also write what this rank prints to ``sys.stdout`` to the log, a line
            each (``[stdout]: <line>`` as Composer, or a JSON record of kind ``stdout`` with its
            time); it still reaches the real stream. From this constructor on (as Composer), so what
            is printed before the Logger exists is written first when it opens the file (up to 4 Mi
            characters; more is counted in a notice line), until close. Not on a rank its policy
            excludes (``ranks='zero'`` on rank 1), where the Logger never opens it.
        capture_stderr: the same for ``sys.stderr`` (``[stderr]: <line>``).

    Raises:
        ValueError: a bad template, an unknown format, a bad interval or ``buffer_size``, or a
            template that cannot tell ranks apart under ``ranks='all'``/``'local_zero'`` (names it).
    """

    # Keeps per-rank series: above gather_summary_above ranks it still gets every key/rank{r} (docs/gather.md).
    per_rank_series = True

    def __init__(
        self,
        filename: str = '{run_name}/logs-rank{rank}.txt',
        remote_file_name: Optional[str] = None,
        format: str = 'text',
        flush_interval: int = 100,
        log_traces: bool = True,
        table_format: str = 'jsonl',
        ranks: str = 'all',
        log_level: Any = None,
        optional: Optional[bool] = None,
        buffer_size: int = 1 << 16,
        overwrite: bool = False,
        capture_stdout: bool = False,
        capture_stderr: bool = False,
    ):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size == 0 or buffer_size < -1:
            raise ValueError(
                f'FileLogger: buffer_size must be 1 (line buffered), -1 (system default) or a '
                f'number of bytes > 1, got {buffer_size!r}'
            )
        if format not in FORMATS:
            raise ValueError(f'FileLogger: unknown format {format!r}; expected one of {list(FORMATS)}')
        if table_format not in TABLE_FORMATS:
            raise ValueError(
                f'FileLogger: unknown table_format {table_format!r}; expected one of {list(TABLE_FORMATS)}'
            )
        validate_template(filename, DIST_PLACEHOLDERS)
        check_rank_distinct(filename, self.ranks, 'FileLogger filename')
        if remote_file_name is None:
            # An absolute local path is no object name: keep its file name, under the run's folder.
            remote_file_name = filename if not os.path.isabs(filename) else '{run_name}/' + os.path.basename(filename)
        if remote_file_name:
            validate_template(remote_file_name, DIST_PLACEHOLDERS)
            if os.path.isabs(remote_file_name) or remote_file_name.startswith('\\'):
                raise ValueError(
                    f'FileLogger: remote_file_name {remote_file_name!r} is absolute; use a name relative to the bucket'
                )
            check_rank_distinct(remote_file_name, self.ranks, 'FileLogger remote_file_name')
        self.filename_template = filename
        self.remote_file_name_template = remote_file_name
        self.format = format
        self.table_format = table_format
        self.flush_interval = check_interval('FileLogger', 'flush_interval', flush_interval)
        self.should_log_traces = log_traces
        self.buffer_size = buffer_size
        self.overwrite = bool(overwrite)
        self.filename: Optional[str] = None
        self.remote_file_name: Optional[str] = None
        self._file: Optional[TextIO] = None
        self._state: Optional['State'] = None
        self._logger: Optional['Logger'] = None
        self._dirty = False
        # table name -> (open file, columns); relative artifact paths to upload at the next flush.
        self._tables: dict[str, tuple[TextIO, Optional[list[str]]]] = {}
        self._dirty_artifacts: dict[str, bool] = {}  # relative path -> overwrite
        self._used_image_names: set[str] = set()
        # write(): text written before the file opens, whether the next text starts a line, and a lock
        # (text may come from several threads, e.g. captured output).
        self._early_text: list[str] = []
        self._at_line_start = True
        self._write_lock = threading.Lock()
        self._closed = False
        self.capture_stdout, self.capture_stderr = bool(capture_stdout), bool(capture_stderr)
        self._early_chars = 0  # held in _early_text; beyond _EARLY_TEXT_LIMIT early text is counted, not kept
        self._early_dropped = 0
        self._tees: list[tuple[str, StreamTee]] = []
        # As Composer: output is copied from here on, so what is printed before the Logger exists is kept
        # too; only where the Logger will open this log (the Logger's own rank-policy test).
        from dist_logging._logger.routing import rank_included

        capture_here = (self.capture_stdout or self.capture_stderr) and rank_included(self.ranks)
        for stream, wanted in (('stdout', self.capture_stdout), ('stderr', self.capture_stderr)):
            if wanted and capture_here:
                tee = install_tee(stream, _captured_line_sink(self, stream))
                self._tees.append((stream, tee))
                # A FileLogger dropped without being closed (e.g. its Logger failed to build) stops copying.
                weakref.finalize(self, remove_tee, stream, tee)

    # ------------------------------------------------------------------ lifecycle
    def init(self, state: 'State', logger: 'Logger') -> None:
        if self._file is not None:  # the Logger opened it already; Composer-style code may send INIT again
            return
        self._state, self._logger = state, logger
        self.filename = format_name_with_dist(self.filename_template, state.run_name)
        if self.remote_file_name_template:
            self.remote_file_name = validate_object_name(
                format_name_with_dist(self.remote_file_name_template, state.run_name)
            )
        directory = os.path.dirname(self.filename)
        if directory:
            os.makedirs(directory, exist_ok=True)
        # Append by default: a restarted run with the same name keeps what the first attempt wrote.
        handle = open(self.filename, 'w' if self.overwrite else 'a', encoding='utf-8', buffering=self.buffer_size)
        with self._write_lock:  # a line printed by another thread meanwhile goes after the early text
            self._file = handle
            self._mark_attempt(state.run_name)
            if self._early_text:
                handle.write(''.join(self._early_text))
                self._early_text, self._early_chars = [], 0
                self._dirty = True
            dropped, self._early_dropped = self._early_dropped, 0
        if dropped:
            notice = (
                f'{dropped} characters written before the Logger opened this log were not kept '
                f'(more than {_EARLY_TEXT_LIMIT} waited)'
            )
            if self.format == 'jsonl':
                self._write('notice', notice)
            else:
                self.write('[notice]: ', notice + '\n')
        with self._write_lock:
            handle.flush()
        _sigterm.register(self)

    @property
    def artifact_dir(self) -> Optional[str]:
        """The local folder of this log's tables and images (``None`` before the Logger opens it)."""
        return _artifact_base(self.filename) if self.filename else None

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self._file is None:
            for stream, tee in reversed(self._tees):
                remove_tee(stream, tee)
            self._tees.clear()
            self._closed = True
            return
        try:
            for stream, tee in reversed(self._tees):
                remove_tee(stream, tee)  # its unfinished last line goes to the log first
            self._tees.clear()
            self.flush()
        finally:
            for handle, _ in self._tables.values():
                handle.close()
            self._tables.clear()
            with self._write_lock:
                self._closed = True
                self._file.close()
                self._file = None
            _sigterm.unregister(self)

    def flush(self) -> None:
        """Write buffered lines and tables to disk and, if the Logger can upload, upload what changed.

        Raises:
            Whatever ``Logger.upload_file`` raises (e.g. an earlier upload's ``UploadError``).
        """
        for _, tee in self._tees:
            if tee.error is not None:  # copying a printed line failed (e.g. disk full): reported once, here
                error, tee.error = tee.error, None
                raise error
        with self._write_lock:
            if self._file is None or not (self._dirty or self._dirty_artifacts):
                return
            self._file.flush()
            dirty, self._dirty = self._dirty, False
        for handle, _ in self._tables.values():
            handle.flush()
        uploads: list[tuple[str, str, bool]] = []
        logger, remote_name = self._logger, self.remote_file_name
        if remote_name and logger is not None and logger.has_file_upload_destination():
            local_base = self._artifact_folder()
            if dirty:
                uploads.append((remote_name, self._open_filename(), True))
            remote_base = _artifact_base(remote_name)
            uploads += [
                (f'{remote_base}/{rel}', os.path.join(local_base, rel), overwrite)
                for rel, overwrite in self._dirty_artifacts.items()
            ]
        self._dirty_artifacts = {}
        for remote, local, overwrite in uploads:
            assert logger is not None  # uploads are only listed when there is a Logger that can upload
            logger.upload_file(remote, local, overwrite=overwrite)

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        # Every batch hands what it wrote to the operating system (one write call when something
        # was logged, none otherwise), so a rank killed right after (os._exit, SIGKILL, SIGTERM)
        # loses none of it; flushing to the bucket stays every flush_interval batches.
        if state.timestamp.batch % self.flush_interval == 0:
            self.flush()
        else:
            self._write_through()

    def _write_through(self, lock_timeout: float = -1) -> None:
        """Hand buffered lines and table rows to the operating system (no upload)."""
        locked = self._write_lock.acquire(timeout=lock_timeout)
        try:
            if self._file is not None:
                self._file.flush()
            for handle, _ in self._tables.values():
                handle.flush()
        finally:
            if locked:
                self._write_lock.release()

    def _flush_on_signal(self) -> None:
        # The signal may interrupt this very thread inside _write_lock: wait a little, then flush anyway.
        self._write_through(lock_timeout=1.0)

    def _mark_attempt(self, run_name: str) -> None:
        """After a torchrun restart or a SLURM requeue, start the attempt with a visible line."""
        facts = dist.launch_facts()
        if facts.attempt == '0':
            return
        assert self._file is not None  # init() opened it just before, under the write lock
        started = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        if self.format == 'jsonl':
            self._file.write(
                json.dumps(
                    {
                        'kind': 'attempt',
                        'time': round(time.time(), 6),
                        'data': {
                            'attempt': facts.attempt,
                            'restarts': facts.restarts,
                            'requeues': facts.requeues,
                            'run_name': run_name,
                            'rank': dist.get_global_rank(),
                        },
                    }
                )
                + '\n'
            )
        else:
            self._file.write(
                f'[attempt]: ===== attempt {facts.attempt} ({facts.attempt_cause}) of run {run_name}, '
                f'rank {dist.get_global_rank()}, started {started} =====\n'
            )
        self._dirty = True

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Write a resume marker: the lines above it at steps >= ``info.superseded_from`` are superseded.

        Nothing written is ever rewritten: ``dist-logging logs`` leaves the superseded lines out
        (unless ``--all-attempts``). The marker names the range it supersedes, found in the last
        MiB of the log: ``[resume]: ===== resumed at step 20 (resume 1, attempt 0, saved by attempt 0)
        of run R, rank 0: steps >= 21 written above are superseded (21..27) =====``, or a record of
        kind ``resume`` in JSON Lines.
        """
        self._check_open()
        self._write_through()
        last = self._last_step_written()
        first = info.superseded_from
        span = f'{first}..{last}' if last is not None and last >= first else 'none found'
        rank = dist.get_global_rank()
        if self.format == 'jsonl':
            record = {
                'kind': 'resume',
                'time': round(info.time, 6),
                'rank': rank,
                'data': {
                    'step': info.step,
                    'superseded_from': first,
                    'superseded_to': last if last is not None and last >= first else None,
                    'resume': info.resume,
                    'attempt': info.attempt,
                    'saved_attempt': info.saved_attempt,
                    'run_name': info.run_name,
                },
            }
            with self._write_lock:
                assert self._file is not None  # checked open above; only close(), on the owner's thread, clears it
                self._file.write(json.dumps(record) + '\n')
                self._dirty = True
        else:
            self.write(
                '[resume]: ',
                f'===== {info.describe()} of run {info.run_name}, rank {rank}: steps >= {first} '
                f'written above are superseded ({span}) =====\n',
            )
        self._write_through()

    def _last_step_written(self) -> Optional[int]:
        """The highest step of a step-bearing line in the last MiB of the log (None: none there)."""
        try:
            with open(self._open_filename(), 'rb') as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(0, size - _RESUME_SCAN_BYTES))
                tail = handle.read().decode('utf-8', errors='replace')
        except OSError:
            return None
        steps = [int(a or b) for a, b in _STEP_LINE.findall(tail)]
        return max(steps) if steps else None

    # ------------------------------------------------------------------ writing
    def _check_open(self) -> None:
        if self._file is None:
            raise RuntimeError(f'FileLogger({self.filename_template!r}) is not open: it is opened by the Logger')

    def _open_filename(self) -> str:
        """The log's path, once init() set it (before it opened the log: callers checked it is open)."""
        assert self.filename is not None
        return self.filename

    def _artifact_folder(self) -> str:
        """The local folder of tables and images, once init() set the log's path (as :attr:`artifact_dir`)."""
        return _artifact_base(self._open_filename())

    def _write(self, kind: str, data: Any, step: Optional[int] = None, **extra: Any) -> None:
        self._check_open()
        timestamp = self._state.timestamp if self._state is not None else None
        if self.format == 'jsonl':
            record: dict[str, Any] = {'kind': kind, 'time': round(time.time(), 6)}
            if timestamp is not None:
                record['epoch'], record['batch'] = timestamp.epoch, timestamp.batch
            if step is not None:
                record['step'] = step
            record.update(extra)
            record['data'] = data
            try:
                line = json.dumps(record, default=format_log_data_value, allow_nan=True)
            except TypeError:  # mapping keys JSON cannot hold (e.g. tuples): store them as text, never crash
                line = json.dumps(json_safe(record), default=format_log_data_value, allow_nan=True)
            with self._write_lock:
                assert self._file is not None  # checked open above; only close(), on the owner's thread, clears it
                self._file.write(line + '\n')
                self._dirty = True
        elif kind == 'metric':  # Composer's text lines, one per name; the trailing space is Composer's too
            batch = step if step is not None else (timestamp.batch if timestamp is not None else 0)
            for name, value in data.items():
                self.write(f'[metric][batch={batch}]: ', f'{name}: {format_log_data_value(value)} \n')
        elif kind == 'hparams':
            for name, value in data.items():
                self.write('[hyperparameter]: ', f'{name}: {format_log_data_value(value)} \n')
        elif kind == 'trace':
            for name, value in data.items():
                self.write(f'[trace]: {name}:', format_log_data_value(value) + '\n')
        else:  # tables and images: '[table]: name: {json}', '[images]: name: where they went'
            self.write(f'[{kind}]: ', f"{extra['name']}: {format_log_data_value(data)}\n")

    def _write_captured(self, stream: str, line: str) -> None:
        if self.format == 'jsonl':
            record = json.dumps({'kind': stream, 'time': round(time.time(), 6), 'data': line})
            with self._write_lock:
                if self._file is not None:
                    self._file.write(record + '\n')
                    self._dirty = True
                elif not self._closed:
                    self._keep_early(record + '\n')
        else:
            self.write(f'[{stream}]: ', line + '\n')

    def write(self, prefix: str, s: str) -> None:
        """Write text to the log, starting each new line with ``prefix`` (as Composer's ``FileLogger.write``).

        A line left unfinished by one call is continued by the next without a prefix; an
        empty line gets none. Text written before the Logger opens the file is kept and
        written first. Thread-safe.

        Raises:
            RuntimeError: the FileLogger is closed.
        """
        with self._write_lock:
            if self._closed:
                raise RuntimeError(f'FileLogger({self.filename_template!r}) is closed')
            pieces = []
            for line in s.splitlines(True):
                pieces.append(prefix + line if self._at_line_start and line != '\n' else line)
                self._at_line_start = line.endswith('\n')
            text = ''.join(pieces)
            if self._file is None:
                self._keep_early(text)
            else:
                self._file.write(text)
                self._dirty = True

    def _keep_early(self, text: str) -> None:
        """Hold text written before the file opens (under ``_write_lock``), up to a bound: a FileLogger that
        is never opened (e.g. on a rank its policy excludes) must not grow without limit."""
        if self._early_chars + len(text) > _EARLY_TEXT_LIMIT:
            self._early_dropped += len(text)
        else:
            self._early_text.append(text)
            self._early_chars += len(text)

    def _step(self, step: Optional[int]) -> int:
        if step is not None:
            return step
        return self._state.timestamp.batch if self._state is not None else 0

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self._write('hparams', hyperparameters)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self._write('metric', metrics, step)

    def log_traces(self, traces: dict[str, Any]) -> None:
        if self.should_log_traces:
            self._write('trace', traces)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self._check_open()
        step_value = self._step(step)
        rel = f'tables/{safe_artifact_name(name)}.{self.table_format}'
        path = os.path.join(self._artifact_folder(), rel)
        entry = self._tables.get(rel)
        if entry is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            existing_header: Optional[list[str]] = None
            if self.table_format == 'csv' and os.path.exists(path) and os.path.getsize(path) > 0:
                with open(path, newline='', encoding='utf-8') as f:  # a restarted run appends to the same table
                    existing_header = next(csv.reader(f), None)
            handle: TextIO = open(path, 'a', encoding='utf-8', newline='', buffering=1 << 16)
            entry = (handle, existing_header[1:] if existing_header else None)
            self._tables[rel] = entry
        handle, header = entry
        if self.table_format == 'csv':
            if header is None:
                csv.writer(handle).writerow(['_step', *columns])
                self._tables[rel] = (handle, list(columns))
            elif header != list(columns):
                raise ValueError(
                    f'FileLogger: table {name!r} was written to {path!r} with columns {header}; '
                    f'got {list(columns)}. A CSV file keeps one header: use another table name '
                    "or table_format='jsonl'"
                )
            writer = csv.writer(handle)
            for row in rows:
                writer.writerow([step_value, *(format_log_data_value(v) for v in row)])
        else:
            for row in rows:
                record = {'_step': step_value}
                record.update({column: jsonable(value) for column, value in zip(columns, row)})
                handle.write(json.dumps(record, allow_nan=False, default=format_log_data_value) + '\n')
        self._dirty_artifacts[rel] = True
        if self.format == 'text':  # Composer's line: the table itself, as JSON
            self.write('[table]: ', f'{name}: {table_json(columns, rows)}\n')
        else:
            self._write('table', f'{len(rows)} row(s) -> {path}', step, name=name, file=path, rows=len(rows))

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
        from dist_logging._images import image_files, prepare_images, write_png

        self._check_open()
        batch, mask_batches = prepare_images(images, channels_last, masks)
        step_value = self._step(step)
        folder = f'images/{safe_artifact_name(name)}'
        stem = f'{folder}/step{step_value:06d}'
        # The same name and step twice (e.g. train and eval at one batch) must not overwrite the first.
        suffix, counter = '', 1
        while stem + suffix in self._used_image_names:
            counter += 1
            suffix = f'_{counter}'
        stem += suffix
        self._used_image_names.add(stem)
        artifact_dir = self._artifact_folder()
        os.makedirs(os.path.join(artifact_dir, folder), exist_ok=True)
        written = []
        for rel, image in image_files(batch, mask_batches, stem):
            write_png(os.path.join(artifact_dir, rel), image)
            self._dirty_artifacts[rel] = True
            written.append(rel)
        self._write(
            'images',
            f'{len(written)} file(s) in {os.path.join(artifact_dir, folder)}',
            step,
            name=name,
            files=[os.path.join(artifact_dir, rel) for rel in written],
        )
