"""The Logger's rank reporter: every ``N`` batches, compare the ranks' busy time and report on rank zero.

Cost (see docs/stragglers.md for the model):

* between reports nothing communicates: sections and ``batch_end`` only add numbers;
* at a report, one all-reduce (MAX) of ``2 * (series) + 1`` float64 per rank (series = busy,
  step, each section, memory): every rank learns each series' min and max, and whether some
  rank has a section name the others do not know yet;
* plus one gather to rank zero of this rank's fixed-size record (``6 + sections`` float64);
* both are only *started* at the report step (``async_op``, gloo's own thread carries them) and
  completed at the next step, when every rank has issued them long ago: the training thread
  neither waits for the last rank nor polls (the report comes one step late);
* only when a rank used a new section name (normally once, at the first report): an all-gather
  of the new names, a second all-reduce and gather, at once; at the first report, one gather of
  64-byte host names (started with the others).

Every collective goes through the Logger's :class:`~dist_logging.dist.LoggingGroup`, so each has
its ``sync_timeout`` and a missing rank is named in the error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import threading
import time
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from dist_logging import dist
from dist_logging.ranks._report_thread import ReportThread
from dist_logging.ranks.history import HISTORY_NAME, HistoryWriter, private_history_path, read_history
from dist_logging.ranks.report import (TABLE_COLUMNS, RankReport, build_partial, build_report, own_series, record_of,
                                       report_metrics, straggler_line, table_rows)
from dist_logging.ranks.stats import VerdictTracker, Verdicts
from dist_logging.ranks.timer import Section, SectionTimer, WindowTotals, check_section_name

# The Logger, seen through its public methods only (log_metrics, log_table, log_images, upload_file,
# has_file_upload_destination); not imported, so the Logger can import this module.
LoggerLike = Any

__all__ = ['RankReportOptions', 'RankReporter', 'check_report_every', 'check_report_options', 'make_reporter',
           'NullSection', 'MAX_SECTIONS', 'HOST_BYTES']

log = logging.getLogger('dist_logging.ranks')

MAX_SECTIONS = 64  # bounds the record, and so every report's bytes
_HOST = socket.gethostname()
HOST_BYTES = 64
_UPLOAD_EVERY_REPORTS = 10  # the history is also uploaded every this many reports, not only at close


@dataclasses.dataclass(frozen=True)
class RankReportOptions:
    """How rank reports judge and what they produce (``Logger(rank_report_options=...)``).

    Args:
        slow_ratio, min_gap_s, chronic_reports, chronic_window, jitter_k: the verdict thresholds, see
            :class:`~dist_logging.ranks.stats.Verdicts` (defaults: 1.1, 0.1 ms, 2 of 5, 3 x the rank's jitter).
        top_k: how many of the slowest ranks the table lists (besides every straggler).
        device: ``'auto'`` (CUDA events once CUDA is initialized, else wall clock), ``'cpu'``, ``'cuda'``.
        memory: measure memory per window (peak CUDA allocated, else RSS).
        history: keep the per-rank history file on rank zero and upload it with the run's files.
        heatmap: at close, log the heatmap as an image (TensorBoard / W&B / MLflow draw it).

    Raises:
        ValueError: a value out of range (names the field).
    """

    slow_ratio: float = 1.1
    min_gap_s: float = 1e-4
    chronic_reports: int = 2
    chronic_window: int = 5
    top_k: int = 5
    device: str = 'auto'
    memory: bool = True
    history: bool = True
    heatmap: bool = True
    jitter_k: float = 3.0

    def __post_init__(self) -> None:
        self.verdicts()  # raises on bad thresholds
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f'top_k must be an int >= 1, got {self.top_k!r}')
        if self.device not in ('auto', 'cpu', 'cuda'):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")

    def verdicts(self) -> Verdicts:
        """The verdict thresholds."""
        return Verdicts(self.slow_ratio, self.min_gap_s, self.chronic_reports, self.chronic_window, self.jitter_k)

    @classmethod
    def from_value(cls, value: Union['RankReportOptions', Mapping[str, Any], None]) -> 'RankReportOptions':
        """Options from an instance, a mapping (e.g. a config file's section) or None (defaults).

        Raises:
            TypeError: neither; ValueError: an unknown key (names it) or a bad value.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f'rank_report_options must be a RankReportOptions or a mapping, got {type(value).__name__}')
        known = [field.name for field in dataclasses.fields(cls)]
        for key in value:
            if key not in known:
                raise ValueError(f'rank_report_options.{key}: unknown key; expected one of {known}')
        try:
            return cls(**value)
        except ValueError as exc:
            raise ValueError(f'rank_report_options.{exc}') from None


def check_report_every(every: Any) -> Optional[int]:
    """``rank_report_every``: None (off) or an int >= 1.

    Raises:
        ValueError: anything else (names the value).
    """
    if every is None:
        return None
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f'rank_report_every: must be None (off) or an int >= 1, got {every!r}')
    return every


class NullSection:
    """What :meth:`Logger.section` returns when rank reports are off: checks the name, times nothing."""

    __slots__ = ('name', 'wait')

    def __init__(self, name: str, wait: bool = False):
        self.name = check_section_name(name)
        self.wait = bool(wait)

    def __enter__(self) -> 'NullSection':
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, fn: Any) -> Any:
        """As a decorator: ``fn`` itself (nothing to time)."""
        return fn

    def start(self) -> None:
        """Nothing to open."""

    def stop(self) -> None:
        """Nothing to close."""

    is_open = False


class _Output(NamedTuple):
    """What rank zero emits for one report (built on the builder thread, emitted on the training thread)."""

    batch: int
    metrics: dict[str, float]
    rows: list[list[Any]]
    line: Optional[str]  # the console line naming a rank that turned chronic
    recovered: list[int]  # ranks no longer chronic
    upload_history: bool


class _Pending:
    """A report whose collectives were started at a report step and are completed at the next step."""

    __slots__ = ('totals', 'batch', 'new', 'record', 'reduced', 'rows', 'host_rows', 'works')

    def __init__(self, totals: WindowTotals, batch: int):
        self.totals = totals
        self.batch = batch
        self.new = False
        self.record: Optional[np.ndarray] = None
        self.reduced: Optional[torch.Tensor] = None
        self.rows: list[torch.Tensor] = []
        self.host_rows: list[torch.Tensor] = []
        self.works: list[Any] = []


def _host_tensor() -> torch.Tensor:
    name = _HOST.encode()[:HOST_BYTES]
    padded = torch.zeros(HOST_BYTES, dtype=torch.uint8)
    padded[: len(name)] = torch.frombuffer(bytearray(name), dtype=torch.uint8)
    return padded


class RankReporter:
    """Times sections on this rank and, every ``every`` batches, builds the rank report (a collective).

    Args:
        every: report every this many batches (the first batch, warm-up, is never counted).
        options: :class:`RankReportOptions`.
        group: the Logger's logging group (all collectives go through it).
        run_name: the run's name (the history file's folder and uploaded name).

    Raises:
        ValueError: a bad ``every`` or option.
    """

    __slots__ = ('every', 'options', 'timer', '_group', '_run_name', '_rank', '_world', '_verdicts', '_tracker',
                 '_layout', '_hosts', '_previous_ratio', '_last', '_window', '_calls', '_started', '_named',
                 '_history', '_history_failed', '_warned_sections', '_pending', '_builder', '_history_lock')

    def __init__(self, every: int, options: RankReportOptions, group: dist.LoggingGroup, run_name: str):
        self.every = check_report_every(every)
        self.options = options
        self.timer = SectionTimer(options.device, options.memory)
        self._group = group
        self._run_name = run_name
        self._rank = dist.get_global_rank()
        self._world = dist.get_world_size()
        self._verdicts = options.verdicts()
        self._tracker = VerdictTracker(self._world if self._rank == 0 else 1, self._verdicts)
        self._layout: list[str] = []
        self._hosts: list[str] = []
        self._previous_ratio: Optional[np.ndarray] = None
        self._last: Optional[RankReport] = None
        self._window = 0
        self._calls = 0
        self._started = False
        self._named: frozenset[int] = frozenset()
        self._history: Optional[HistoryWriter] = None
        self._history_failed = False
        self._warned_sections = False
        self._pending: Optional[_Pending] = None  # a report started at the last step, completed at this one
        # Reports are built off the training thread, in order, by one builder thread (started at the first report,
        # ended by close()); the training thread emits each once built (see docs/stragglers.md, "Cost").
        self._builder = ReportThread(self._build, 'dist_logging-rank-report')
        self._history_lock = threading.Lock()

    # ------------------------------------------------------------------ training thread
    def section(self, name: str, wait: bool = False) -> Section:
        """The :class:`~dist_logging.ranks.timer.Section` ``name`` (see :meth:`Logger.section`)."""
        return self.timer.section(name, wait)

    @property
    def last(self) -> Optional[RankReport]:
        """The last report built (None before the first); see :meth:`emit_built` to wait for the one in the making."""
        return self._last

    def add_collective(self, seconds: float) -> None:
        """Count time the Logger spent in its own collectives (a flush): waiting, not busy."""
        self.timer.add_collective(seconds)

    def batch_end(self, logger: LoggerLike, batch: Optional[int] = None) -> None:
        """One training step ended (every rank, in step); report at every ``every``-th call.

        Steps are counted here, not read from ``batch``, so that adapters whose frameworks move
        the batch count in jumps still report at the same step on every rank. At a report step
        the report's collectives are only started; they are completed at the next step (by then
        every rank has long issued them, so nothing waits), and the report is built on the
        builder thread and emitted at the first step after it is built: see docs/stragglers.md, "Cost".

        Args:
            logger: the Logger (rank zero emits through its public methods).
            batch: the batch count to label the report with (default: the Logger's, read at a report step).

        Raises:
            DistributedLoggingError: a rank did not take part in a report within ``sync_timeout``.
            Exception: what building an earlier report raised (raised when it would have been emitted).
        """
        calls = self._calls = self._calls + 1
        if self._started:
            self.timer.step()
        else:  # the first step (compilation, caches, start-up skew between ranks) is not compared
            self._started = True
            self.timer.take()
        if self._pending is None and not self._builder.outstanding and calls % self.every:  # type: ignore[operator]
            return  # most steps: nothing more (every rank has the same counts: all skip together)
        if self._builder.ready():
            self.emit_built(logger)
        if self._pending is not None:  # the previous step was a report step (every rank: same count)
            self._timed(self._harvest, logger)
        if calls % self.every or self.timer.steps == 0:  # type: ignore[operator]
            return
        totals = self.timer.take()
        self._pending = _Pending(totals, logger.state.timestamp.batch if batch is None else batch)
        try:
            self._timed(self._start, logger)
        except BaseException:
            self._pending = None  # nothing half-started is waited for later (the group refuses further use)
            raise

    def _timed(self, call: Any, logger: LoggerLike) -> None:
        started = time.perf_counter()
        try:
            call(logger)
        finally:
            self.timer.add_collective(time.perf_counter() - started)  # in the window, as a wait

    # ------------------------------------------------------------------ the report
    def _start(self, logger: LoggerLike) -> None:
        """At a report step: start the all-reduce and the gather (and, at the first report, the host names);
        with one process (no collective), hand the report to the builder at once."""
        pending = self._pending
        assert pending is not None
        totals = pending.totals
        pending.new = bool(set(totals.sections) - set(self._layout))
        pending.record = record_of(totals, self._layout)
        group = self._group
        if not group.active:  # one process: nothing to wait for, the report now
            self._harvest(logger)
            return
        gloo = group.group()
        group.arrive()
        what = 'reducing the rank report'
        pending.reduced = self._reduce_input(pending.record, pending.new)
        pending.works.append(group.start_all_reduce(pending.reduced, torch.distributed.ReduceOp.MAX, gloo, what))
        if self._window == 0:
            what_hosts = 'gathering host names for the rank report'
            work, pending.host_rows = group.start_gather(_host_tensor(), gloo, what_hosts)
            pending.works.append(work)
        work, pending.rows = group.start_gather(torch.from_numpy(pending.record), gloo,
                                                'gathering the rank report records')
        pending.works.append(work)

    def _harvest(self, logger: LoggerLike) -> None:
        """Complete the started collectives (normally done already) and hand the report to the builder."""
        pending, self._pending = self._pending, None
        assert pending is not None and pending.record is not None
        record = pending.record
        rows: Union[np.ndarray, list[torch.Tensor]]
        if pending.reduced is None:  # one process
            reduced, rows = self._reduce_input(record, pending.new), record[None, :]
            if self._window == 0:
                self._hosts = [_HOST]
        else:
            self._group.wait_all(pending.works, 'completing the rank report')
            reduced, rows = pending.reduced, (pending.rows or record[None, :])
            if pending.host_rows:
                self._hosts = [bytes(row.numpy().tobytes()).rstrip(b'\0').decode(errors='replace')
                               for row in pending.host_rows]
        if reduced.tolist()[-1] > 0:  # some rank has section names the layout lacks (the first report, mostly)
            self._agree_on(sorted(set(pending.totals.sections) - set(self._layout)))
            record = record_of(pending.totals, self._layout)
            reduced = self._reduce(record)  # again, at once
            rows = self._gather(record)
        window, self._window = self._window, self._window + 1
        # The completed collectives' tensors go to the builder as they are: turning them into the report's
        # arrays is its work, not the training thread's.
        self._builder.submit(record, rows, reduced, pending.batch, window, tuple(self._layout), tuple(self._hosts))

    # ------------------------------------------------------------------ the builder thread
    def _build(self, record: np.ndarray, rows: Union[np.ndarray, list[torch.Tensor]], reduced: torch.Tensor,
               batch: int, window: int, layout: Sequence[str],
               hosts: Sequence[str]) -> tuple[RankReport, Optional[_Output]]:
        """Build one report (in order: one builder thread) and, on rank zero, what it emits and the history line.

        Everything here is the builder's alone (the trackers, the trend, the chronic set, the history file);
        the training thread hands in copies (the layout and host names as they were) and the completed
        collectives' tensors (``rows``: the gathered records, or a table already), and emits the output.
        """
        minima, maxima, _ = self._reduce_output(reduced)
        table = rows if isinstance(rows, np.ndarray) else torch.stack(rows).numpy()
        if self._rank != 0:
            report = build_partial(record, layout, minima, maxima, self._tracker, _HOST, self._rank, self._world,
                                   batch, window)
            self._last = report
            return report, None
        report, self._previous_ratio = build_report(table, layout, hosts, self._tracker, self._previous_ratio,
                                                    batch, window, self.options.top_k)
        chronic = frozenset(entry.rank for entry in report.chronic)
        # A console line when a rank turns chronic, not at every report; another when one recovers.
        line = straggler_line(report, self._verdicts) if chronic - self._named else None
        recovered = sorted(self._named - chronic)
        self._named = chronic
        rows = table_rows(report)
        output = _Output(batch, report_metrics(report), rows, line, recovered,
                         self._write_history(report, table, layout, hosts))
        self._last = report
        return report, output

    def _write_history(self, report: RankReport, table: np.ndarray, layout: Sequence[str],
                       hosts: Sequence[str]) -> bool:
        """Append the report to the history file; whether it is due for an upload."""
        if not self.options.history or self._history_failed:
            return False
        try:
            with self._history_lock:
                if self._history is None:
                    self._history = HistoryWriter(private_history_path(self._run_name), {
                        'run_name': self._run_name, 'world_size': self._world, 'hosts': list(hosts),
                        'slow_ratio': self._verdicts.slow_ratio, 'chronic_reports': self._verdicts.chronic_reports,
                        'chronic_window': self._verdicts.chronic_window})
                self._history.append(report, table, layout, time.time())
        except OSError as exc:  # the report itself goes out; the file is a convenience
            self._history_failed = True
            log.warning('rank report: cannot write the history file: %s', exc)
            return False
        return report.window % _UPLOAD_EVERY_REPORTS == _UPLOAD_EVERY_REPORTS - 1

    # ------------------------------------------------------------------ back on the training thread
    def emit_built(self, logger: LoggerLike, wait: bool = False) -> None:
        """Emit the reports the builder finished (all of them, waiting, with ``wait``), in order.

        Raises:
            Exception: what building a report raised.
        """
        builder = self._builder
        while builder.outstanding and (wait or builder.ready()):
            _, output = builder.result()  # building never waits for another rank: no timeout needed
            if output is not None:
                self._emit(logger, output)

    def _reduce_input(self, record: np.ndarray, has_new: bool) -> torch.Tensor:
        """``[v, -v, new-names flag]`` for one MAX all-reduce: every series' max and min on every rank."""
        column = own_series(record, self._layout)
        inf = math.inf  # a rank without a value (NaN) must not win the MAX
        both = ([-inf if v != v else v for v in column] + [-inf if v != v else -v for v in column]
                + [1.0 if has_new else 0.0])
        return torch.from_numpy(np.array(both, dtype=np.float64))  # a third of torch.tensor(list)'s time

    @staticmethod
    def _reduce_output(tensor: torch.Tensor) -> tuple[np.ndarray, np.ndarray, bool]:
        out = tensor.numpy()
        count = (len(out) - 1) // 2
        maxima = np.where(np.isinf(out[:count]), np.nan, out[:count])
        minima = np.where(np.isinf(out[count:2 * count]), np.nan, -out[count:2 * count])
        return minima, maxima, bool(out[-1] > 0)

    def _reduce(self, record: np.ndarray) -> torch.Tensor:
        """The all-reduce at once (after the section names changed): its result, for :meth:`_reduce_output`."""
        tensor = self._reduce_input(record, False)
        self._group.all_reduce(tensor, torch.distributed.ReduceOp.MAX, 'reducing the rank report')
        return tensor

    def _agree_on(self, unknown: list[str]) -> None:
        """Some rank has section names the layout lacks: every rank adds the union, in one order."""
        gathered = self._group.all_gather_object(unknown, 'agreeing on section names for the rank report')
        new = sorted(set().union(*map(set, gathered)) - set(self._layout))
        room = MAX_SECTIONS - len(self._layout)
        if len(new) > room and not self._warned_sections:
            self._warned_sections = True
            log.warning('rank report: more than %d section names; ignoring %s', MAX_SECTIONS, new[room:])
        self._layout.extend(new[:room])

    def _gather(self, record: np.ndarray) -> np.ndarray:
        group = self._group
        if not group.active:
            return record[None, :]
        what = 'gathering the rank report records'
        group.arrive()
        work, rows = group.start_gather(torch.from_numpy(record), group.group(), what)
        group.wait_all([work], what)
        return torch.stack(rows).numpy() if self._rank == 0 else record[None, :]

    # ------------------------------------------------------------------ rank zero's output
    def _emit(self, logger: LoggerLike, output: '_Output') -> None:
        batch = output.batch
        logger.log_metrics(output.metrics, step=batch)
        if output.rows:
            logger.log_table(list(TABLE_COLUMNS), output.rows, name='rank_report', step=batch)
        if output.line:
            log.warning('%s', output.line)
        if output.recovered:
            log.warning('rank report: rank(s) %s no longer chronic stragglers (batch %d)', output.recovered, batch)
        if output.upload_history:
            self._upload_history(logger)

    def _upload_history(self, logger: LoggerLike) -> None:
        if self._history is not None and logger.has_file_upload_destination():
            with self._history_lock:  # a whole file: the builder appends under the same lock
                logger.upload_file(f'{self._run_name}/{HISTORY_NAME}', self._history.path, overwrite=True)

    def close(self, logger: LoggerLike) -> None:
        """At the Logger's close, before its destinations close (rank zero does the work): upload the
        history and log the heatmap as an image. Never raises for the image (it is a convenience).

        A report started at the last step is completed first (every rank closes, so the started
        collectives complete; only if section names changed in that window does it issue more).

        Raises:
            DistributedLoggingError: completing that report failed (a rank did not take part).
        """
        if self._pending is not None:
            self._harvest(logger)
        try:
            self.emit_built(logger, wait=True)
        finally:
            self._builder.close()
            self.timer.close()
        if self._history is None:
            return
        self._history.close()
        self._upload_history(logger)
        if self.options.heatmap:
            try:
                from dist_logging.ranks.heatmap import heatmap_image

                image = heatmap_image(read_history(self._history.path))
                logger.log_images(image, name='ranks/heatmap', channels_last=True, use_table=False)
            except (OSError, ValueError, KeyError) as exc:
                log.warning('rank report: no heatmap image: %s', exc)



def check_report_options(every: Any, options: Any) -> tuple[Optional[int], RankReportOptions]:
    """``rank_report_every`` and ``rank_report_options`` checked (a config file checks them at load).

    Raises:
        ValueError, TypeError: a bad value; the message starts with the key.
    """
    return check_report_every(every), RankReportOptions.from_value(options)


def make_reporter(every: Any, options: Any, group: dist.LoggingGroup, run_name: str) -> Optional[RankReporter]:
    """The Logger's reporter, or None when ``every`` is None (off); options are checked either way.

    Raises:
        ValueError, TypeError: a bad ``rank_report_every`` or ``rank_report_options`` (names it).
    """
    every, options = check_report_options(every, options)
    return None if every is None else RankReporter(every, options, group, run_name)
