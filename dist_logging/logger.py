"""The :class:`Logger`: the API users call, routing, and the rank policy (in one place).

The Logger never opens a file or a socket itself. It validates each call,
decides which destinations take it on this rank (computed once, at
construction, so a call that no destination takes on this rank costs next to
nothing), and hands the data over. Metrics logged with ``reduce=`` are buffered
and combined across ranks by :meth:`Logger.flush`.
"""

from __future__ import annotations

import pathlib
import re
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from dist_logging import dist
from dist_logging._logger.gather import REDUCTIONS, FlushSchedule, MetricGatherer
from dist_logging._logger.handover import file_names, folder_names, hand_file, hand_folder
from dist_logging._logger.postmortem_link import check_hang_timeout, check_reason, make_recorder, stop_recorder
from dist_logging._logger.resume import PendingResume
from dist_logging._logger.resume_api import ResumeMethods
from dist_logging._logger.routing import CLOSED_MESSAGE, ClosedRoutes, Router
from dist_logging._logger.run_name import resolve_run_name
from dist_logging._logger.summaries import DEFAULT_GATHER_SUMMARY_ABOVE, check_summary_above, per_rank_groups
from dist_logging._values import check_metric_key, check_table, metric_scalar
from dist_logging.destination import Event, LoggerDestination, LogLevel, validate_ranks
from dist_logging.stragglers.api import RankReportMethods
from dist_logging.stragglers.reporter import RankReportOptions, make_reporter
from dist_logging.redaction import RedactOption, build_redactor
from dist_logging.state import State
from dist_logging.telemetry.hub import Telemetry, TelemetryOptions

__all__ = ['Logger']

Data = Union[Mapping[str, Any], Callable[[], Mapping[str, Any]]]


class Logger(RankReportMethods, ResumeMethods):
    """Routes logging calls to destinations, applying each destination's rank policy.

    Build one on every rank. Each destination's ``ranks`` policy (``'zero'``,
    ``'local_zero'``, ``'all'``) decides on which ranks it is called; hyperparameters
    reach destinations on global rank zero only.

    The Logger is ``Stateful`` (torch's protocol): put it in the ``dcp.save`` / ``dcp.load`` state dict
    (``{'model': ..., 'optim': ..., 'logger': logger}``) and a resumed job continues its count, each
    destination showing every step once, the resumed run's values winning (see :meth:`load_state_dict`,
    :meth:`resume_at` and the "Resume" section of docs/destinations.md).

    Args:
        destinations: a destination or a sequence of them.
        run_name: the run's name, identical on every rank. Default: the environment
            variable ``DIST_LOGGING_RUN_NAME``, else derived from the launcher's job id
            (torchrun's run id, else ``slurm-<job>-<step>``, else MPI's job id; see
            docs/launchers.md), else generated on rank zero and shared.
        sync_timeout: seconds a collective (:meth:`flush`, consistency checks) waits for
            every rank before raising :class:`~dist_logging.DistributedLoggingError`.
        log_run_info: when True, log world size, torch version and host names as
            hyperparameters at construction (a collective).
        redact: secret redaction for hyperparameters, traces and table cells: True (the
            default key-name and value rules, see README "Secrets"), False (off), or extra
            regex pattern(s) searched in every key on top of the default rules.
        auto_flush: whether :meth:`batch_end` and :meth:`epoch_end` flush automatically.
        flush_every: :meth:`batch_end` flushes when the batch count is divisible by this
            (``flush_every=10``: at batches 10, 20, ...); batches in between issue no
            collective. Automatic flushes are asynchronous (completed at the next flush or
            at :meth:`close`); when one finds nothing buffered on any rank, the gap doubles
            (up to 1,024 batches) until a flush finds data. See docs/gather.md.
        rank_report_every: every this many batches, compare the ranks' busy time (see
            :meth:`section`) and report the spread and the stragglers on rank zero (a collective;
            none in between). None (default): off. See docs/stragglers.md.
        rank_report_options: a :class:`~dist_logging.stragglers.RankReportOptions` or a mapping of its fields.
        system_metrics_every: seconds between samples of each node's CPU, memory, disk, network (and GPUs,
            with NVML), taken off the training thread by each node's local-zero rank; rank zero's destinations
            get them as ``system/{host}/{metric}`` at its next ``batch_end``. None (default): off. Needs
            ``pip install "dist-logging[system]"``. See docs/telemetry.md.
        metrics_port: rank zero serves Prometheus metrics (every rank's progress and pending uploads, every
            node's system metrics) at ``http://<host>:<port>/metrics`` from a thread of its own (0: any
            free port, see :attr:`metrics_url`). None (default): off. Needs ``pip install
            "dist-logging[prometheus]"``. Read-only and unauthenticated: see docs/telemetry.md.
        metrics_host: the address the endpoint binds (default ``'0.0.0.0'``, every interface;
            ``'127.0.0.1'``: this host only).
        gather_summary_above: above this many ranks, keys logged with ``reduce='gather'`` reach trackers as
            summaries (min, median, p90, max, argmin and argmax rank) and their per-rank values go only to
            destinations keeping per-rank series (files) and to the endpoint; None: never. See docs/gather.md.
        hang_timeout: seconds the training thread may stay away from the Logger (between :meth:`batch_end`
            / :meth:`epoch_end` calls) before this rank captures its postmortem (stacks, torch's
            flight-recorder dump, header) and uploads it under ``{run_name}/postmortem/``. Setting it also
            turns on the other triggers (see ``postmortem``). None (default): no hang watchdog. Choose it
            longer than your slowest step, evaluation or checkpoint; see docs/postmortem.md.
        postmortem: capture a postmortem on an uncaught exception, SIGTERM, or a failed Logger
            collective. None (default): on when ``hang_timeout`` is set. Needs a destination that takes
            files; ``dist-logging diagnose`` reads the result.

    Raises:
        TypeError: a destination that is not a :class:`LoggerDestination`.
        ValueError: a bad run name, rank policy, timeout or telemetry setting.
        OSError: (rank zero) ``metrics_port`` is in use.
        ImportError: psutil or prometheus_client is missing for the telemetry asked for.
    """

    def __init__(
        self,
        destinations: Union[LoggerDestination, Sequence[LoggerDestination], None] = None,
        run_name: Optional[str] = None,
        *,
        sync_timeout: float = 300.0,
        log_run_info: bool = False,
        redact: RedactOption = True,
        auto_flush: bool = True,
        flush_every: int = 1,
        rank_report_every: Optional[int] = None,
        rank_report_options: Union[RankReportOptions, Mapping[str, Any], None] = None,
        system_metrics_every: Optional[float] = None,
        metrics_port: Optional[int] = None,
        metrics_host: str = '0.0.0.0',
        gather_summary_above: Optional[int] = DEFAULT_GATHER_SUMMARY_ABOVE,
        hang_timeout: Optional[float] = None,
        postmortem: Optional[bool] = None,
    ):
        if destinations is None:
            destinations = ()
        elif isinstance(destinations, LoggerDestination):
            destinations = (destinations,)
        self.destinations: tuple[LoggerDestination, ...] = tuple(destinations)
        for index, destination in enumerate(self.destinations):
            if not isinstance(destination, LoggerDestination):
                raise TypeError(f'destinations[{index}] is a {type(destination).__name__}, not a LoggerDestination')
            validate_ranks(
                getattr(destination, 'ranks', 'zero'), f'destinations[{index}] ({type(destination).__name__})'
            )
            LogLevel.parse(destination.log_level)
        telemetry_options = TelemetryOptions(system_metrics_every, metrics_port, metrics_host)
        summarize_above = check_summary_above(gather_summary_above)
        check_hang_timeout(hang_timeout)  # before anything starts
        self._group = dist.LoggingGroup(sync_timeout)
        self._redact = build_redactor(redact)
        self.auto_flush = bool(auto_flush)
        self._schedule = FlushSchedule(flush_every)  # raises ValueError naming a bad flush_every
        self._in_flight_batch = 0  # the batch count at which the asynchronous flush in flight was issued
        self.state = State(resolve_run_name(run_name, self._group))
        self._ranks = make_reporter(rank_report_every, rank_report_options, self._group, self.run_name)
        self._closed = False
        self._closing = False
        self._warned_no_upload = False

        # Rank policy, applied once (see _logger.routing). The hot path reads the routing table from
        # attributes of the Logger itself: per log level, the destinations taking that level.
        self._router = Router(self.destinations)
        self._is_global_zero = self._router.is_global_zero
        self._hparam_destinations = self._router.hparam_destinations
        self._routes: Any = self._router.routes
        self._batch_routes: Optional[tuple[LoggerDestination, ...]] = self._routes[LogLevel.BATCH]
        self._dispatch = self._router.dispatch
        self._record_failure = self._router.record_failure
        self._gatherer = MetricGatherer(self._group)
        self._gatherer.summarize_above = summarize_above
        self._checkpoint_commit: Optional[tuple[int, float]] = None
        self._telemetry: Optional[Telemetry] = None
        if telemetry_options.enabled:
            try:
                self._telemetry = self._start_telemetry(telemetry_options)
            except BaseException:  # e.g. the port is in use: nothing of this Logger stays behind
                self._group.destroy()
                raise
        self._resumes = 0  # resumes this run went through (carried in the state dict)
        self._pending_resume: Optional[PendingResume] = None

        self.run_event(Event.INIT)
        # The black box (docs/postmortem.md): after INIT, so the uploaders it delivers through are started.
        self._postmortem = make_recorder(
            self._router,
            self.state,
            self._group,
            self._gatherer,
            hang_timeout,
            bool(postmortem) if postmortem is not None else hang_timeout is not None,
        )
        if log_run_info:
            self._log_run_info()

    # ------------------------------------------------------------------ helpers
    @property
    def run_name(self) -> str:
        """The run's name (identical on every rank)."""
        return self.state.run_name

    @property
    def active_destinations(self) -> tuple[LoggerDestination, ...]:
        """The destinations this rank calls (its policy includes this rank)."""
        return self._router.active

    @property
    def metrics_url(self) -> Optional[str]:
        """Where the Prometheus endpoint answers (rank zero, with ``metrics_port``), else None."""
        return self._telemetry.url if self._telemetry is not None else None

    def _start_telemetry(self, options: TelemetryOptions) -> Telemetry:
        def uploaders() -> list:
            found = (getattr(destination, 'uploader', None) for destination in self._router.active)
            return [uploader for uploader in found if hasattr(uploader, 'pending_stats')]

        def stragglers() -> Optional[dict[int, int]]:
            report = self._ranks.last if self._ranks is not None else None
            if report is None or not report.complete:
                return None if self._ranks is None else {}
            return {entry.rank: 1 for entry in report.chronic}

        return Telemetry(
            options,
            self._group.store_line(),
            dist.get_global_rank(),
            dist.get_world_size(),
            dist.get_local_rank(),
            dist.get_node_rank(),
            dist.get_num_nodes(),
            uploaders,
            lambda: self._checkpoint_commit,
            stragglers,
        )

    def note_checkpoint_committed(self, checkpoint_id: str, step: Optional[int] = None) -> None:
        """Record a committed checkpoint for the endpoint (``CheckpointWriter`` calls it; any thread).

        Args:
            checkpoint_id: the checkpoint's id (its step is read from ``step<digits>`` in it when ``step`` is None).
            step: the checkpoint's step (default: from the id, else this Logger's batch count).
        """
        if step is None:
            found = re.findall(r'step(\d+)', str(checkpoint_id))
            step = int(found[-1]) if found else self.state.timestamp.batch
        self._checkpoint_commit = (int(step), time.time())

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(CLOSED_MESSAGE)

    @staticmethod
    def _resolve(data: Data, what: str) -> Mapping[str, Any]:
        if callable(data):
            data = data()
        if not isinstance(data, Mapping):
            raise TypeError(f'{what} must be a mapping (or a callable returning one), got {type(data).__name__}')
        return data

    # ------------------------------------------------------------------ logging API
    def log_hyperparameters(self, hparams: Data, *, check_consistency: bool = False) -> None:
        """Log settings of the run. Emitted once, by global rank zero, to every destination active there.

        Secret-looking keys are redacted (see ``redact``). Values that are not JSON
        serializable are left to destinations, which store them as strings.

        Args:
            hparams: name -> value, or a zero-argument callable returning that.
            check_consistency: when True, every rank must call this (a collective): rank
                zero compares a digest of each rank's hyperparameters and, where ranks
                disagree, warns and logs a trace naming the keys and ranks that differ.

        Raises:
            TypeError: ``hparams`` is not a mapping or has non-string keys.
            RuntimeError: the Logger is closed.
            DistributedLoggingError: with ``check_consistency``, a rank did not take part in time.
        """
        self._check_open()
        if not check_consistency and not self._hparam_destinations:
            return
        hparams = self._resolve(hparams, 'hyperparameters')
        for key in hparams:
            if not isinstance(key, str):
                raise TypeError(f'hyperparameter names must be str, got {type(key).__name__} {key!r}')
        redacted = self._redact(hparams)
        if check_consistency:
            from dist_logging._logger.consistency import check_hyperparameters

            differences = check_hyperparameters(redacted, self._group)
            if differences and self._is_global_zero:
                warnings.warn(f'hyperparameters differ across ranks: {differences}', RuntimeWarning, stacklevel=2)
                self.log_traces({'hyperparameter_mismatch': differences})
        self._dispatch(self._hparam_destinations, 'log_hyperparameters', redacted)

    def log_metrics(
        self,
        metrics: Data,
        step: Optional[int] = None,
        *,
        reduce: Optional[str] = None,
        level: Union[LogLevel, int, str, None] = None,
    ) -> None:
        """Log scalar metrics.

        With ``reduce=None`` the call goes to the destinations active on this rank. With
        ``reduce`` in ``'mean'``, ``'sum'``, ``'min'``, ``'max'``, ``'gather'`` the values are
        only buffered here (no collective); the next :meth:`flush` combines them across
        ranks and rank zero emits the result (``'gather'`` emits ``key/rank{r}`` per rank).
        NaN and inf pass through unchanged (also through reductions).

        Args:
            metrics: name -> number, numpy scalar, or 0-d/1-element tensor; or a
                zero-argument callable returning that, called only if some destination
                on this rank takes the call (or ``reduce`` is set).
            step: the step the values belong to (default: ``state.timestamp.batch``, as in Composer).
            reduce: how to combine values across ranks, or None to only filter.
            level: the :class:`LogLevel` of this data (default ``BATCH``); destinations whose
                threshold is lower skip it.

        Raises:
            TypeError: a non-string name or a non-numeric value (names them).
            ValueError: a multi-element tensor/array, an unknown ``reduce`` or ``level``.
            RuntimeError: the Logger is closed.
        """
        if reduce is None:
            # The hot path: on a rank where no destination takes the call this is two lookups.
            destinations = self._batch_routes if level is None else self._routes[LogLevel.parse(level)]
            if not destinations:
                if destinations is None:
                    self._check_open()
                    if self._pending_resume is not None:  # the first step after a resume: settle it, then log
                        self._settle_resume(self.state.timestamp.batch if step is None else step)
                        self.log_metrics(metrics, step, level=level)
                return
            data = metrics() if callable(metrics) else metrics
            if not isinstance(data, Mapping):
                raise TypeError(f'metrics must be a mapping (or a callable returning one), got {type(data).__name__}')
            clean = {}
            for key, value in data.items():
                if type(key) is not str or not key:
                    check_metric_key(key)
                kind = type(value)
                clean[key] = value if kind is float or kind is int else metric_scalar(key, value)
            if step is None:  # as Composer's Logger: destinations get the batch count
                step = self.state.timestamp.batch
            for destination in destinations:
                try:
                    destination.log_metrics(clean, step)
                except Exception as exc:  # noqa: BLE001 - one destination must not take the others down
                    self._record_failure(destination, 'log_metrics', exc)
            return
        self._check_open()
        if reduce not in REDUCTIONS:
            raise ValueError(f'unknown reduce {reduce!r}; expected one of {list(REDUCTIONS)} or None')
        data = self._resolve(metrics, 'metrics')
        if step is None:  # the batch of the call, as for unreduced values (not the batch of the flush)
            step = self.state.timestamp.batch
        self._gatherer.add(data, step, reduce, int(LogLevel.BATCH if level is None else LogLevel.parse(level)))

    def log_traces(self, traces: Data, *, level: Union[LogLevel, int, str] = LogLevel.VERBOSE) -> None:
        """Log debug data (any values) to the destinations active on this rank; secrets are redacted.

        Raises:
            TypeError: ``traces`` is not a mapping or has non-string keys.
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        # Traces carry no step: they neither settle a waiting resume nor are held back by it.
        routes = self._routes if self._pending_resume is None else self._router.routes
        destinations = routes[LogLevel.parse(level)]
        if not destinations:
            return
        data = self._resolve(traces, 'traces')
        for key in data:
            check_metric_key(key)
        self._dispatch(destinations, 'log_traces', self._redact(data))

    def log_table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        name: str = 'Table',
        step: Optional[int] = None,
        *,
        level: Union[LogLevel, int, str] = LogLevel.BATCH,
    ) -> None:
        """Log a table to the destinations active on this rank; secrets in cells are redacted.

        Raises:
            TypeError: columns that are not strings, or a name that is not a string.
            ValueError: a row whose length differs from the number of columns (names the row).
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        if self._pending_resume is not None:
            self._settle_resume(self.state.timestamp.batch if step is None else step)
        destinations = self._routes[LogLevel.parse(level)]
        columns, rows = check_table(columns, rows, name)
        if destinations:
            if step is None:
                step = self.state.timestamp.batch
            self._dispatch(destinations, 'log_table', columns, self._redact.table(columns, rows), name, step)

    def log_images(
        self,
        images: Any,
        name: str = 'Images',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks: Optional[dict[str, Any]] = None,
        mask_class_labels: Optional[dict[int, str]] = None,
        use_table: bool = True,
        *,
        level: Union[LogLevel, int, str] = LogLevel.BATCH,
    ) -> None:
        """Log images (arrays or tensors, CHW/HWC or a batch) to the destinations active on this rank.

        Raises:
            ValueError: images whose shape or dtype is not an image (says what was expected).
            RuntimeError: the Logger is closed.
        """
        from dist_logging._images import to_image_batch, validate_masks

        self._check_open()
        if self._pending_resume is not None:
            self._settle_resume(self.state.timestamp.batch if step is None else step)
        destinations = self._routes[LogLevel.parse(level)]
        batch = to_image_batch(images, channels_last)  # validate on every rank, at the call
        validate_masks(masks, batch)
        if destinations:
            if step is None:
                step = self.state.timestamp.batch
            self._dispatch(
                destinations, 'log_images', images, name, channels_last, step, masks, mask_class_labels, use_table
            )

    # ------------------------------------------------------------------ files
    def has_file_upload_destination(self) -> bool:
        """Whether any destination (on any rank's policy) takes files: it says ``can_upload_files()``
        or overrides ``upload_file`` (the destinations :meth:`upload_file` calls)."""
        return self._router.has_uploader_anywhere

    def upload_file(
        self, remote_file_name: str, file_path: Union[str, pathlib.Path], *, overwrite: bool = False, copy: bool = True
    ) -> None:
        """Hand a file to every destination that takes files and whose policy includes this rank.

        As in Composer, a destination takes files when it overrides ``upload_file``, whether or
        not it overrides ``can_upload_files()``.

        Both names are templates filled by :func:`format_name_with_dist_and_time`
        (``{run_name}``, ``{rank}``, ``{epoch}``, ...). The call returns once each
        destination has taken the file; uploads happen in the background.

        Args:
            remote_file_name: template for the object name (relative; no ``..``).
            file_path: template for the local file.
            overwrite: whether an existing object of that name may be replaced.
            copy: True (default) snapshots the file so the caller may change it right
                away; False hands the file over (the caller promises not to modify or
                delete it), which is O(1).

        Raises:
            FileNotFoundError: ``file_path`` does not exist.
            IsADirectoryError: ``file_path`` is a directory.
            ValueError: a bad template or an absolute/escaping remote name.
            FileExistsError: ``overwrite=False`` and the name is already queued or stored.
            UploadError: an earlier upload failed (surfaced at the next call).
            RuntimeError: the Logger is closed.
        """
        if not self._closing:
            self._check_open()
        remote, local = file_names(remote_file_name, file_path, self.state)
        if not self._router.has_uploader_anywhere:
            self._warn_no_uploader(f'upload_file({remote!r})')
        hand_file(self._router, self.state, remote, local, overwrite, copy)

    def _warn_no_uploader(self, call: str) -> None:
        if not self._warned_no_upload:  # once per Logger
            self._warned_no_upload = True
            warnings.warn(
                f'{call}: the Logger has no upload-capable destination; files are not uploaded',
                RuntimeWarning,
                stacklevel=3,
            )

    def upload_folder(
        self, remote_prefix: str, local_dir: Union[str, pathlib.Path], *, commit: bool = True, copy: bool = True
    ) -> None:
        """Hand a folder to every destination that takes files and whose policy includes this rank, committed
        as one object: visible (to ``dist_logging.checkpoint.latest_checkpoint``) only once every file landed.

        For checkpoints that are folders but not DCP checkpoints: an HF ``save_pretrained``
        folder, a Lightning checkpoint directory. Both names are templates, as in
        :meth:`upload_file`. A destination with an ``upload_folder`` method (``RemoteUploaderDownloader``)
        commits the folder (see its docstring and ``docs/checkpoints.md``); another destination
        that takes files gets one ``upload_file`` per file, uncommitted, with a warning.

        Args:
            remote_prefix: template for the folder's name in the bucket (relative; no ``..``).
            local_dir: template for the local folder.
            commit: commit the folder (un-committing a committed folder of that name first).
            copy: as in :meth:`upload_file`.

        Raises:
            NotADirectoryError: ``local_dir`` is not a folder.
            ValueError: a bad template, an empty folder or an escaping name.
            UploadError: an earlier upload failed (surfaced at the next call).
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        remote, local = folder_names(remote_prefix, local_dir, self.state)
        if not self._router.has_uploader_anywhere:
            self._warn_no_uploader(f'upload_folder({remote!r})')
        hand_folder(self._router, self.state, remote, local, commit, copy)

    def capture_postmortem(self, reason: str = 'manual', *, wait: Optional[float] = None) -> Optional[str]:
        """Capture this rank's postmortem now (stacks, flight-recorder dump, header, last events) and upload it.

        Not a collective: call it on the ranks you want evidence from. Once per rank per attempt: after
        a capture (this one or an automatic one) it returns None. See docs/postmortem.md.

        Args:
            reason: a short word saying why (lands in the header).
            wait: seconds to wait for the set to land in the bucket (default: return once handed over).

        Returns:
            The set's object prefix (``{run_name}/postmortem/attempt-{A}/rank-{N}/``), or None when this
            rank captured already or has no destination that takes files.

        Raises:
            ValueError: a reason that is not a short word.
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        check_reason(reason)
        if self._postmortem is None:
            self._warn_no_uploader('capture_postmortem()')
            return None
        return self._postmortem.capture(reason, wait=wait)

    # ------------------------------------------------------------------ gathering
    def flush(self) -> None:
        """Combine the metrics buffered with ``reduce=`` across ranks and emit them on rank zero.

        A collective: every rank must call it at the same point (``epoch_end`` does, and
        ``batch_end`` every ``flush_every`` batches, unless ``auto_flush=False``). It
        completes an automatic flush still in flight, then reduces what is buffered and
        emits before returning. At most two all_reduces and a gather to rank zero in the
        steady state, however many keys (see docs/gather.md).

        Raises:
            DistributedLoggingError: some rank did not reach the flush within ``sync_timeout``,
                or flushed at another point (names the ranks).
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        gatherer = self._gatherer
        if gatherer.in_flight:
            self._emit_gathered(gatherer.complete(), self._in_flight_batch)
            self._schedule.record(gatherer.last_had_data, automatic=True)
        batch = self.state.timestamp.batch
        self._emit_gathered(gatherer.flush(batch), batch)
        self._schedule.record(gatherer.last_had_data, automatic=False)

    def _scheduled_flush(self, batch: int) -> None:
        """``batch_end``'s flush: complete the previous automatic flush, issue the next one if due."""
        gatherer = self._gatherer
        if gatherer.in_flight:
            self._emit_gathered(gatherer.complete(), self._in_flight_batch)
            self._schedule.record(gatherer.last_had_data, automatic=True)
        if not self._group.active:  # a world of one: a flush costs no collective, never back off
            self._emit_gathered(gatherer.flush(batch), batch)
        elif self._schedule.due(batch):
            self._schedule.issued(batch)
            self._in_flight_batch = batch
            self._emit_gathered(gatherer.start(batch), batch)

    def _emit_gathered(self, results: list, batch: int) -> None:
        """Emit on rank zero. :meth:`log_metrics` gives every value a step (the batch of its call);
        ``batch`` (of the flush, not of the later call that completed it) is the fallback."""
        if self._is_global_zero:
            if self._pending_resume is not None and results:
                first = results[0][1]
                self._settle_resume(batch if first is None else first)
            for metrics, step, level in results:
                self._dispatch(self._routes[level], 'log_metrics', metrics, batch if step is None else step)
            if self._gatherer.per_rank:  # summarized for trackers: the per-rank values to files and the endpoint
                self._emit_per_rank(batch)

    def _emit_per_rank(self, batch: int) -> None:
        taken, self._gatherer.per_rank = self._gatherer.per_rank, {}
        for metrics, step, level in per_rank_groups(taken):
            destinations = [d for d in self._routes[level] if getattr(d, 'per_rank_series', False)]
            if destinations:
                self._dispatch(destinations, 'log_metrics', metrics, batch if step is None else step)
        if self._telemetry is not None:
            self._telemetry.note_gathered(
                {key: {rank: entry[0] for rank, entry in values.items()} for key, values in taken.items()}
            )

    # ------------------------------------------------------------------ lifecycle
    def run_event(self, event: Union[Event, str]) -> None:
        """Send a lifecycle event to the destinations active on this rank.

        Raises:
            ValueError: an unknown event.
        """
        event = Event(event)
        if event is Event.CLOSE or event is Event.POST_CLOSE:
            # As Composer's engine does: close() and post_close() are called directly, not via
            # run_event (a destination overriding run_event for its events still gets closed).
            for destination in self._router.active:
                try:
                    self._router.close_hook(destination, event, self.state, self)
                except Exception as exc:  # noqa: BLE001 - one destination must not take the others down
                    self._record_failure(destination, event.value, exc)
            return
        self._check_open()
        self._dispatch(self._router.active, 'run_event', event, self.state, self)

    def add_listener(self, destination: LoggerDestination) -> None:
        """Attach ``destination`` to a Logger that already exists, for lifecycle events only.

        For code configured after the Logger (e.g. :func:`~dist_logging.setup_logging`, which
        uploads each rank's Python log with the Logger's other files). On the ranks its
        ``ranks`` policy names, the destination's ``init`` runs now and it then gets every later
        event (``batch_end``, ``epoch_end``, ``fit_end``, ``close``, ``post_close``) like the
        Logger's own destinations, and is closed before the uploading ones, so the files it
        uploads at close are taken. Data calls never reach it: routes are fixed at construction.
        Adding the same destination twice adds it once.

        Raises:
            TypeError: ``destination`` is not a :class:`LoggerDestination`.
            ValueError: an unknown rank policy.
            RuntimeError: the Logger is closed.
        """
        self._check_open()
        if not isinstance(destination, LoggerDestination):
            raise TypeError(f'add_listener: {type(destination).__name__} is not a LoggerDestination')
        if self._router.add_listener(destination, f'add_listener({type(destination).__name__})'):
            self._dispatch((destination,), 'run_event', Event.INIT, self.state, self)

    def fit_start(self) -> None:
        """Training starts."""
        self.run_event(Event.FIT_START)

    def epoch_start(self) -> None:
        """An epoch starts."""
        self.run_event(Event.EPOCH_START)

    def batch_start(self) -> None:
        """A batch starts."""
        self.run_event(Event.BATCH_START)

    def batch_end(self, samples: int = 0, tokens: int = 0) -> None:
        """A batch of ``samples`` samples and ``tokens`` tokens ended: advance the timestamp,
        flush gathered metrics when the schedule says so (see ``flush_every``) and notify destinations."""
        self._check_open()
        if self._pending_resume is not None:  # a batch ended with nothing logged since the resume
            self._settle_resume(None)
        self.state.advance_batch(samples, tokens)
        if self.auto_flush:
            batch = self.state.timestamp.batch
            if batch % self._schedule.flush_every == 0:
                self._timed_flush(self._scheduled_flush, batch)
        if self._ranks is not None:  # every rank_report_every batches, a collective (see docs/stragglers.md)
            self._ranks.batch_end(self)
        self.run_event(Event.BATCH_END)
        if self._telemetry is not None:  # progress for the heartbeats; on rank zero, node samples to emit
            nodes = self._telemetry.batch_end(self.state.timestamp.batch)
            if nodes and self._batch_routes:
                self._dispatch(self._batch_routes, 'log_metrics', nodes, self.state.timestamp.batch)

    def epoch_end(self) -> None:
        """An epoch ended: flush (unless ``auto_flush=False``), advance the epoch, notify destinations.

        As in Composer, destinations see a timestamp that already counts the epoch (``epoch``
        is the number of finished epochs, the per-epoch counters are back at zero).
        """
        self._check_open()
        if self.auto_flush:
            self.flush()
        if self._pending_resume is not None:
            self._settle_resume(None)
        self.state.advance_epoch()
        self.run_event(Event.EPOCH_END)

    def fit_end(self) -> None:
        """Training ended."""
        self.run_event(Event.FIT_END)

    def close(self) -> None:
        """Close every destination (waiting for their uploads); idempotent.

        Completes an automatic flush still in flight and emits its values (waiting at most
        until ``sync_timeout`` after it was issued; only when it brought new keys is agreeing
        on them a collective), but starts no flush of its own: values buffered since the
        last flush are reported in a warning.

        Raises:
            DistributedLoggingError: the flush in flight could not complete (names the ranks),
                raised after every destination was closed.
            The first exception a non-optional destination raised during the run or
            while closing (e.g. :class:`~dist_logging.UploadError`), with the others
            listed in its notes.
        """
        if self._closed:
            return
        if self._pending_resume is not None:  # closed before logging anything after a resume: still recorded
            self._settle_resume(None)
        stop_recorder(self._postmortem, self._group)  # a capture in progress is handed over first
        gather_error: Optional[BaseException] = None
        if self._gatherer.in_flight:
            try:
                self._emit_gathered(self._gatherer.complete(), self._in_flight_batch)
            except Exception as exc:  # noqa: BLE001 - destinations still get closed, then it is raised
                gather_error = exc
        pending = self._gatherer.pending_keys()
        if pending:
            warnings.warn(
                f'Logger.close(): metrics buffered with reduce= were never flushed: {sorted(pending)}; '
                'call flush() on every rank before close()',
                RuntimeWarning,
                stacklevel=2,
            )
        if self._ranks is not None:  # rank zero: upload the rank history, log its heatmap (no collective)
            try:
                self._ranks.close(self)
            except Exception as exc:  # noqa: BLE001 - destinations still get closed, then it is raised
                gather_error = gather_error or exc
        if self._telemetry is not None:
            self._telemetry.close()
        self._closed = True
        self._routes = ClosedRoutes()  # type: ignore[assignment]
        self._batch_routes = None
        errors = [exc for destination, exc in self._router.failures.values() if not destination.optional]
        if gather_error is not None:
            errors.insert(0, gather_error)
        # Destinations upload their last files (final log lines, event files) from their own
        # close(): accept those uploads until every close ran.
        self._closing = True
        errors += self._router.close_all(self.state, self)
        self._closing = False
        self._group.destroy()
        if errors:
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f'also failed: {type(other).__name__}: {other}')
            raise first

    def __enter__(self) -> 'Logger':
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def _log_run_info(self) -> None:
        import socket

        import torch

        hosts = self._group.all_gather_object(socket.gethostname(), 'gathering host names')
        self.log_hyperparameters(
            {
                'world_size': dist.get_world_size(),
                'num_nodes': dist.get_num_nodes(),
                'torch_version': torch.__version__,
                'hosts': sorted(set(hosts)),
            }
        )

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> 'Logger':
        """Build a Logger from a YAML file or a mapping (see :mod:`dist_logging.config`); call it on every rank.

        Every key is checked before anything is built, so a typo fails here with its key
        path (``destinations[2].rankz: unknown key; did you mean 'ranks'?``).

        Args:
            config: a path to a YAML file, or the config as a mapping.
            **overrides: Logger keyword arguments (e.g. ``run_name=``) that win over the config.

        Raises:
            FileNotFoundError: the config file does not exist.
            ValueError: an unknown key or destination type, a bad value, an unset environment variable.
            TypeError: an override the Logger does not take, or a value of the wrong type.
            ImportError: a destination's optional package is missing (names the extra to install).
        """
        from dist_logging._logger.config_load import build_logger  # at call time: the core does not load it at import

        return build_logger(cls, config, overrides)

    def __repr__(self) -> str:
        return f'Logger(run_name={self.run_name!r}, destinations={list(self.destinations)!r})'
