"""The Logger's rank reporter: every ``N`` batches, compare the ranks' busy time and report on rank zero.

Cost (see docs/stragglers.md for the model):

* between reports nothing communicates: sections and ``batch_end`` only add numbers;
* at a report the training thread only ends the window (:meth:`SectionTimer.take`) and hands it to
  the report thread, lending it the Logger's logging group; that thread runs the report's
  collectives, gives the group back and builds the report, and the training thread emits it (rank
  zero) at the first step after it is ready. The training thread's next collective on the group
  (a flush) waits until the group is given back, so the report's collectives come between the same
  two of the training thread's on every rank;
* the collectives: one all-reduce (MAX) of ``2 * (series) + 1`` float64 per rank (series = busy,
  step, each section, memory): every rank learns each series' min and max, and whether some
  rank has a section name the others do not know yet; plus one gather to rank zero of this
  rank's fixed-size record (``6 + sections`` float64);
* only when a rank used a new section name (normally once, at the first report): an all-gather
  of the new names, a second all-reduce and gather; at the first report, one gather of
  64-byte host names (started with the others).

Every collective goes through the Logger's :class:`~dist_logging.dist.LoggingGroup`, so none waits
longer than ``sync_timeout`` and a missing rank is named in the error, which reaches the training
thread at its next step.
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
from dist_logging.stragglers._core import NullSectionCore
from dist_logging.stragglers._report_thread import ReportThread
from dist_logging.stragglers.history import HISTORY_NAME, HistoryWriter, private_history_path, read_history
from dist_logging.stragglers.report import (
    TABLE_COLUMNS,
    RankReport,
    build_partial,
    build_report,
    own_series,
    record_of,
    report_metrics,
    straggler_line,
    table_rows,
)
from dist_logging.stragglers.stats import VerdictTracker, Verdicts
from dist_logging.stragglers.timer import Section, SectionTimer, WindowTotals, check_section_name

# The Logger, seen through its public methods only (log_metrics, log_table, log_images, upload_file,
# has_file_upload_destination); not imported, so the Logger can import this module.
LoggerLike = Any

__all__ = [
    'RankReportOptions',
    'RankReporter',
    'check_report_every',
    'check_report_options',
    'make_reporter',
    'NullSection',
    'MAX_SECTIONS',
    'HOST_BYTES',
]

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
            :class:`~dist_logging.stragglers.stats.Verdicts` (defaults: 1.1, 0.1 ms, 2 of 5, 3 x the rank's jitter).
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


class NullSection(NullSectionCore):
    """What :meth:`Logger.section` returns when rank reports are off: checks the name, times nothing.

    Its with-statement is the core's (compiled when built, like the timed sections': see ``_core.py``).
    """

    __slots__ = ('name', 'wait')

    def __init__(self, name: str, wait: bool = False):
        self.name = check_section_name(name)
        self.wait = bool(wait)

    def __call__(self, fn: Any) -> Any:
        """As a decorator: ``fn`` itself (nothing to time)."""
        return fn

    def start(self) -> None:
        """Nothing to open."""

    def stop(self) -> None:
        """Nothing to close."""

    is_open = False


class _Output(NamedTuple):
    """What rank zero emits for one report (built on the report thread, emitted on the training thread)."""

    batch: int
    metrics: dict[str, float]
    rows: list[list[Any]]
    line: Optional[str]  # the console line naming a rank that turned chronic
    recovered: list[int]  # ranks no longer chronic
    upload_history: bool


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
        group: the Logger's logging group (lent to the report thread for each report's collectives).
        run_name: the run's name (the history file's folder and uploaded name).

    Raises:
        ValueError: a bad ``every`` or option.
    """

    __slots__ = (
        'every',
        'options',
        'timer',
        '_group',
        '_run_name',
        '_rank',
        '_world',
        '_verdicts',
        '_tracker',
        '_layout',
        '_hosts',
        '_previous_ratio',
        '_last',
        '_window',
        '_calls',
        '_started',
        '_named',
        '_history',
        '_history_failed',
        '_warned_sections',
        '_jobs',
        '_history_lock',
    )

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
        # Reports are exchanged and built off the training thread, in order, by one report thread (started at
        # the first report, ended by close()); the training thread emits each once built (docs/stragglers.md).
        self._jobs = ReportThread(self._report, 'dist_logging-rank-report')
        self._history_lock = threading.Lock()

    # ------------------------------------------------------------------ training thread
    def section(self, name: str, wait: bool = False) -> Section:
        """The :class:`~dist_logging.stragglers.timer.Section` ``name`` (see :meth:`Logger.section`)."""
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
        the window ends and goes to the report thread, which exchanges it with the other ranks
        and builds the report; it is emitted at the first step after it is built (see
        docs/stragglers.md, "Cost"). Nothing here waits for another rank.

        Args:
            logger: the Logger (rank zero emits through its public methods).
            batch: the batch count to label the report with (default: the Logger's, read at a report step).

        Raises:
            DistributedLoggingError: an earlier report failed: a rank did not take part within ``sync_timeout``
                (raised at the first step after the report thread gave up).
            Exception: what building an earlier report raised (raised when it would have been emitted).
        """
        calls = self._calls = self._calls + 1
        if self._started:
            self.timer.step()
        else:  # the first step (compilation, caches, start-up skew between ranks) is not compared
            self._started = True
            self.timer.take()
        if calls % self.every and not self._jobs.outstanding:  # type: ignore[operator]
            return  # most steps: nothing more (every rank has the same counts: all skip together)
        if self._jobs.ready():
            self.emit_built(logger)
        if calls % self.every or self.timer.steps == 0:  # type: ignore[operator]
            return
        self._submit(self.timer.take(), logger.state.timestamp.batch if batch is None else batch)

    def _submit(self, totals: WindowTotals, batch: int) -> None:
        """Hand a window to the report thread (made at the first report)."""
        window, self._window = self._window, self._window + 1
        group = self._group
        if group.active:
            # Creating the group (if no flush did yet) is a collective that must come in the same order on every
            # rank as every other group's creation: on the training thread, not the report thread.
            group.group()
            # The report's collectives come, on every rank, right after this step's: the training thread's
            # next collective on the group waits until the report thread gives the group back.
            group.lend(self._jobs.start())
        self._jobs.submit(totals, batch, window)

    # ------------------------------------------------------------------ the report thread
    def _report(self, totals: WindowTotals, batch: int, window: int) -> tuple[RankReport, Optional['_Output']]:
        """Exchange one window with the other ranks and build its report (in order: one report thread).

        Everything here is the report thread's alone (the layout, host names, trackers, the trend, the
        chronic set, the history file); the training thread hands in the window and emits the output.
        """
        group = self._group
        try:
            record = record_of(totals, self._layout)
            reduced, rows = self._exchange(record, bool(set(totals.sections) - set(self._layout)), window == 0)
            if reduced.tolist()[-1] > 0:  # some rank has section names the layout lacks (the first report, mostly)
                self._agree_on(sorted(set(totals.sections) - set(self._layout)))
                record = record_of(totals, self._layout)
                reduced, rows = self._exchange(record, False, False)
        finally:
            if group.active:
                group.give_back()  # the training thread's collectives may go on
        return self._build(record, rows, reduced, batch, window)

    def _exchange(
        self, record: np.ndarray, new: bool, hosts: bool
    ) -> tuple[torch.Tensor, Union[np.ndarray, list[torch.Tensor]]]:
        """The report's all-reduce and gather (and, with ``hosts``, the host names' gather), started
        together and completed together: ``(reduced, gathered rows or this rank's record)``; with one
        process, the same without communicating."""
        group = self._group
        reduced = self._reduce_input(record, new)
        if not group.active:
            if hosts:
                self._hosts = [_HOST]
            return reduced, record[None, :]
        gloo = group.group()
        group.arrive()
        works = [group.start_all_reduce(reduced, torch.distributed.ReduceOp.MAX, gloo, 'reducing the rank report')]
        host_rows: list[torch.Tensor] = []
        if hosts:
            work, host_rows = group.start_gather(_host_tensor(), gloo, 'gathering host names for the rank report')
            works.append(work)
        work, rows = group.start_gather(torch.from_numpy(record), gloo, 'gathering the rank report records')
        works.append(work)
        group.wait_all(works, 'completing the rank report')
        if host_rows:
            self._hosts = [bytes(row.numpy().tobytes()).rstrip(b'\0').decode(errors='replace') for row in host_rows]
        return reduced, (rows or record[None, :])

    def _build(
        self,
        record: np.ndarray,
        rows: Union[np.ndarray, list[torch.Tensor]],
        reduced: torch.Tensor,
        batch: int,
        window: int,
    ) -> tuple[RankReport, Optional[_Output]]:
        """Build one report and, on rank zero, what it emits and the history line (``rows``: the gathered
        records, or a table already)."""
        layout, hosts = self._layout, self._hosts
        minima, maxima, _ = self._reduce_output(reduced)
        table = rows if isinstance(rows, np.ndarray) else torch.stack(rows).numpy()
        if self._rank != 0:
            report = build_partial(
                record, layout, minima, maxima, self._tracker, _HOST, self._rank, self._world, batch, window
            )
            self._last = report
            return report, None
        report, self._previous_ratio = build_report(
            table, layout, hosts, self._tracker, self._previous_ratio, batch, window, self.options.top_k
        )
        chronic = frozenset(entry.rank for entry in report.chronic)
        # A console line when a rank turns chronic, not at every report; another when one recovers.
        line = straggler_line(report, self._verdicts) if chronic - self._named else None
        recovered = sorted(self._named - chronic)
        self._named = chronic
        output = _Output(
            batch,
            report_metrics(report),
            table_rows(report),
            line,
            recovered,
            self._write_history(report, table, layout, hosts),
        )
        self._last = report
        return report, output

    def _write_history(
        self, report: RankReport, table: np.ndarray, layout: Sequence[str], hosts: Sequence[str]
    ) -> bool:
        """Append the report to the history file; whether it is due for an upload."""
        if not self.options.history or self._history_failed:
            return False
        try:
            with self._history_lock:
                if self._history is None:
                    self._history = HistoryWriter(
                        private_history_path(self._run_name),
                        {
                            'run_name': self._run_name,
                            'world_size': self._world,
                            'hosts': list(hosts),
                            'slow_ratio': self._verdicts.slow_ratio,
                            'chronic_reports': self._verdicts.chronic_reports,
                            'chronic_window': self._verdicts.chronic_window,
                        },
                    )
                self._history.append(report, table, layout, time.time())
        except OSError as exc:  # the report itself goes out; the file is a convenience
            self._history_failed = True
            log.warning('rank report: cannot write the history file: %s', exc)
            return False
        return report.window % _UPLOAD_EVERY_REPORTS == _UPLOAD_EVERY_REPORTS - 1

    # ------------------------------------------------------------------ back on the training thread
    def emit_built(self, logger: LoggerLike, wait: bool = False) -> None:
        """Emit the reports the report thread finished (all of them, waiting, with ``wait``), in order.

        Raises:
            DistributedLoggingError: a report's collectives failed (a rank did not take part in time).
            Exception: what building a report raised.
        """
        jobs = self._jobs
        while jobs.outstanding and (wait or jobs.ready()):
            _, output = jobs.result()  # each report's collectives end by their deadline: no timeout needed
            if output is not None:
                self._emit(logger, output)

    def _reduce_input(self, record: np.ndarray, has_new: bool) -> torch.Tensor:
        """``[v, -v, new-names flag]`` for one MAX all-reduce: every series' max and min on every rank."""
        column = own_series(record, self._layout)
        inf = math.inf  # a rank without a value (NaN) must not win the MAX
        both = (
            [-inf if v != v else v for v in column]
            + [-inf if v != v else -v for v in column]
            + [1.0 if has_new else 0.0]
        )
        return torch.from_numpy(np.array(both, dtype=np.float64))  # a third of torch.tensor(list)'s time

    @staticmethod
    def _reduce_output(tensor: torch.Tensor) -> tuple[np.ndarray, np.ndarray, bool]:
        out = tensor.numpy()
        count = (len(out) - 1) // 2
        maxima = np.where(np.isinf(out[:count]), np.nan, out[:count])
        minima = np.where(np.isinf(out[count : 2 * count]), np.nan, -out[count : 2 * count])
        return minima, maxima, bool(out[-1] > 0)

    def _agree_on(self, unknown: list[str]) -> None:
        """Some rank has section names the layout lacks: every rank adds the union, in one order."""
        gathered = self._group.all_gather_object(unknown, 'agreeing on section names for the rank report')
        new = sorted(set().union(*map(set, gathered)) - set(self._layout))
        room = MAX_SECTIONS - len(self._layout)
        if len(new) > room and not self._warned_sections:
            self._warned_sections = True
            log.warning('rank report: more than %d section names; ignoring %s', MAX_SECTIONS, new[room:])
        self._layout.extend(new[:room])

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
            with self._history_lock:  # a whole file: the report thread appends under the same lock
                logger.upload_file(f'{self._run_name}/{HISTORY_NAME}', self._history.path, overwrite=True)

    def close(self, logger: LoggerLike) -> None:
        """At the Logger's close, before its destinations close (rank zero does the work): wait for the reports
        handed to the report thread (every rank closes, so their collectives complete; each waits at most
        ``sync_timeout``) and emit them, stop the thread, upload the history and log the heatmap as an image.
        Never raises for the image (it is a convenience).

        Raises:
            DistributedLoggingError: a report could not complete (a rank did not take part).
        """
        try:
            self.emit_built(logger, wait=True)
        finally:
            self._jobs.close()  # the reports after a failed one: each ends by its deadline
            self.timer.close()
        if self._history is None:
            return
        self._history.close()
        self._upload_history(logger)
        if self.options.heatmap:
            try:
                from dist_logging.stragglers.heatmap import heatmap_image

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
