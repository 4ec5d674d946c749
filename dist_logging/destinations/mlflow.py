"""MLFlowLogger: params, metrics (batched), tables and images in an MLflow tracking store."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from dist_logging import _private_dirs
from dist_logging._artifacts import flatten, jsonable, safe_artifact_name
from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination, check_state, ranks_from_rank_zero_only
from dist_logging.destinations._mlflow_runs import (
    COMPOSER_RUN_NAME_TAG,
    DEFAULT_EXPERIMENT_NAME,
    check_file_store_allowed,
    create_model_version,
    open_run,
    system_metrics_monitor,
)
from dist_logging.destinations._optional import require_installed
from dist_logging.destinations._periodic import PeriodicFlushMixin, check_interval
from dist_logging.naming import DIST_PLACEHOLDERS, check_rank_distinct, format_name_with_dist, validate_template
from dist_logging.worker import BackgroundWorker

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['MLFlowLogger', 'RESUME_TAG_PREFIX', 'superseded_ranges', 'without_superseded']

RESUME_TAG_PREFIX = 'dist_logging.resume.'
"""Each resume of the run sets the tag ``dist_logging.resume.<n>`` (n = 1, 2, ... in the run) to JSON: ``{"step": S,
"superseded_from": P, "before_ms": T, "resume": r, "attempt": a, "saved_attempt": b}``: every point at a step >= P
with a timestamp < T (ms) was superseded by the resumed run (see :func:`without_superseded`)."""

INSTALL_HINT = 'MLFlowLogger needs the mlflow package: pip install dist-logging[mlflow]'

# MLflow's server-side limits (mlflow/utils/validation.py); a larger batch or value is refused.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000
MAX_KEY_LENGTH = 250
_BAD_KEY_CHARS = re.compile(r'[^A-Za-z0-9_\-. :/]')


def _matches_any(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


class MLFlowLogger(PeriodicFlushMixin, LoggerDestination):
    """Logs to an MLflow run through ``mlflow.tracking.MlflowClient`` (no global ``mlflow`` state).

    * hyperparameters -> params: nested mappings flattened (``{'opt': {'lr': 1}}`` ->
      ``opt/lr`` with the default ``param_separator``), values formatted as strings and
      truncated to MLflow's 6000 characters (one warning names the keys);
    * metrics -> metrics with steps (``step`` or else the batch count), buffered and sent in
      ``log_batch`` calls of at most 1000 every ``flush_interval`` batches, at epoch end and
      at close, by a background thread (the training loop does not wait for the server);
    * tables -> JSON artifacts ``tables/<name>/step<step>.json`` (``{"columns", "data"}``, the
      layout ``mlflow.log_table`` uses); images -> PNG artifacts ``images/<name>/step<step>-<i>.png``
      (plus ``...-<i>.<mask>.png`` with each mask overlaid); traces -> text artifacts
      ``traces/<name>.txt`` (latest value), when ``log_traces`` is True.

    After a resume from a checkpoint (``Logger.load_state_dict``), MLflow cannot delete points: the run
    gets a tag ``dist_logging.resume.<n>`` naming the superseded range (see :data:`RESUME_TAG_PREFIX`),
    and :func:`without_superseded` reads a metric history around it.

    The run: ``run_id`` (or the ``MLFLOW_RUN_ID`` environment variable) resumes that run.
    Otherwise, with ``resume=True``, a run of the experiment tagged with this Logger's run
    name (``dist_logging.run_name``, or Composer's ``run_name`` tag; the same on every restart
    of a torchrun job) is resumed, else a new one is created. Params already in a resumed run
    are not sent again; a changed value (which MLflow refuses) is skipped with a warning.
    The run carries the tags ``run_name`` (the Logger's run name, or ``$RUN_NAME``, as Composer
    sets it) and, when given, ``run_group``. With ``ranks='all'`` (Composer's
    ``rank_zero_only=False``) every rank has its own run, named ``{run_name}-rank{rank}``.

    Args:
        tracking_uri: the tracking store (``sqlite:///...``, ``http://...``, ``databricks``, or a
            local folder as a str or ``pathlib.Path``); ``None`` uses MLflow's default
            (``MLFLOW_TRACKING_URI`` or a local store).
        experiment_name: the experiment, created if missing (default: ``$MLFLOW_EXPERIMENT_NAME``,
            else ``'my-mlflow-experiment'``, Composer's default; ``$MLFLOW_EXPERIMENT_ID`` names an existing one
            by id). With neither, a run this job made in ``'dist_logging'`` (the default before) is resumed there.
        run_name: template for the MLflow run's name (default: the Logger's run name). When every
            rank logs, ``-rank{rank}`` is appended unless it has ``{rank}`` (as Composer does).
        run_id: an existing run to resume.
        resume: reuse the experiment's run tagged with this Logger's run name, if any.
        tags: extra tags set on the run.
        artifact_location: where a newly created experiment stores artifacts.
        flush_interval: send buffered metrics every this many batches (>= 1).
        param_separator: joins nested hyperparameter names (``'/'`` or ``'.'``).
        log_traces: also store traces as text artifacts.
        synchronous: do every MLflow call on the caller's thread (for debugging).
        ranks: rank policy (default ``'zero'``).
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.
        rank_zero_only: Composer's spelling of the policy: True means ``ranks='zero'``, False
            ``ranks='all'`` (one run per rank).
        log_system_metrics: also record CPU, memory, disk, network (and GPU) use as
            ``system/...`` metrics, sampled every 5 s and sent every 30 s by MLflow's monitor.
        model_registry_prefix: put before model names in :meth:`register_model`
            (``'{catalog}.{schema}'`` for Unity Catalog).
        model_registry_uri: the model registry (default: the tracking store; ``'databricks-uc'``
            for Unity Catalog).
        run_group: set as the run's ``run_group`` tag.
        logging_buffer_seconds: send buffered metrics at least this often (seconds) while
            metrics keep coming, besides every ``flush_interval`` batches; ``None`` or 0: only by batches.
        rename_metrics: metric name -> the name logged.
        ignore_metrics: glob patterns (``fnmatch``) of metric names not logged.
        ignore_hyperparameters: glob patterns of hyperparameter names (top-level or flattened)
            not logged.
        log_duplicated_metric_every_n_steps: when > 0, a metric whose value equals its last logged
            value is sent again only after this many steps (Composer's default is 100); 0 (the
            default) sends every value.

    Raises:
        ImportError: mlflow (or, with ``log_system_metrics``, psutil) is not installed (with the extra to install).
        ValueError: an empty experiment name, a bad template, interval or buffer time, a
            ``model_registry_prefix`` that is not ``catalog.schema`` for ``'databricks-uc'``, or
            ``rank_zero_only`` contradicting ``ranks``.
        TypeError: ``tags`` or ``rename_metrics`` is not a mapping.
    """

    def __init__(
        self,
        tracking_uri: Union[str, 'os.PathLike[str]', None] = None,
        experiment_name: Optional[str] = None,
        run_name: Optional[str] = None,
        run_id: Optional[str] = None,
        resume: bool = True,
        tags: Optional[Mapping[str, Any]] = None,
        artifact_location: Optional[str] = None,
        flush_interval: int = 10,
        param_separator: str = '/',
        log_traces: bool = False,
        synchronous: bool = False,
        ranks: Optional[str] = None,
        log_level: Any = None,
        optional: Optional[bool] = None,
        *,
        rank_zero_only: Optional[bool] = None,
        log_system_metrics: bool = False,
        model_registry_prefix: str = '',
        model_registry_uri: Optional[str] = None,
        run_group: Optional[str] = None,
        logging_buffer_seconds: Optional[float] = 10,
        rename_metrics: Optional[Mapping[str, str]] = None,
        ignore_metrics: Optional[Sequence[str]] = None,
        ignore_hyperparameters: Optional[Sequence[str]] = None,
        log_duplicated_metric_every_n_steps: int = 0,
    ):
        ranks = ranks_from_rank_zero_only(ranks, rank_zero_only, 'zero', 'MLFlowLogger')
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        require_installed('mlflow', INSTALL_HINT)
        # Given neither way: a run Composer created in its default experiment is resumed too.
        self._default_experiment = experiment_name is None and not os.environ.get('MLFLOW_EXPERIMENT_NAME')
        if experiment_name is None:
            experiment_name = os.environ.get('MLFLOW_EXPERIMENT_NAME') or DEFAULT_EXPERIMENT_NAME
        if not isinstance(experiment_name, str) or not experiment_name.strip():
            raise ValueError(f'MLFlowLogger: experiment_name must be a non-empty string, got {experiment_name!r}')
        if isinstance(tracking_uri, os.PathLike):
            tracking_uri = os.fspath(tracking_uri)
        if tracking_uri is not None and (not isinstance(tracking_uri, str) or not tracking_uri):
            raise ValueError(
                f'MLFlowLogger: tracking_uri must be a non-empty string, a path or None, got {tracking_uri!r}'
            )
        if tracking_uri is not None:
            check_file_store_allowed(tracking_uri)
        # As Composer: when every rank logs, each has its own run, named with a -rank suffix.
        if self.ranks == 'all' and '{rank' not in (run_name or ''):
            run_name = (run_name or '{run_name}') + '-rank{rank}'
        elif self.ranks == 'local_zero' and '{node_rank' not in (run_name or ''):
            run_name = (run_name or '{run_name}') + '-node{node_rank}'
        if run_name is not None:
            validate_template(run_name, DIST_PLACEHOLDERS)
            check_rank_distinct(run_name, self.ranks, 'MLFlowLogger run_name')
        if model_registry_uri == 'databricks-uc' and len(model_registry_prefix.split('.')) != 2:
            raise ValueError(
                f'MLFlowLogger: When registering to Unity Catalog (model_registry_uri=\'databricks-uc\'), '
                f"model_registry_prefix must be '{{catalog}}.{{schema}}', got {model_registry_prefix!r}"
            )
        if logging_buffer_seconds is not None and (
            isinstance(logging_buffer_seconds, bool)
            or not isinstance(logging_buffer_seconds, (int, float))
            or logging_buffer_seconds < 0
        ):
            raise ValueError(
                f'MLFlowLogger: logging_buffer_seconds must be a number >= 0 or None, got {logging_buffer_seconds!r}'
            )
        if rename_metrics is not None and not isinstance(rename_metrics, Mapping):
            raise TypeError(f'MLFlowLogger: rename_metrics must be a mapping, got {type(rename_metrics).__name__}')
        every = log_duplicated_metric_every_n_steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(
                f'MLFlowLogger: log_duplicated_metric_every_n_steps must be an int >= 0, '
                f'got {log_duplicated_metric_every_n_steps!r}'
            )
        if log_system_metrics and importlib.util.find_spec('psutil') is None:
            raise ImportError('MLFlowLogger(log_system_metrics=True) needs psutil: pip install psutil')
        if param_separator not in ('/', '.'):
            raise ValueError(f"MLFlowLogger: param_separator must be '/' or '.', got {param_separator!r}")
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError(f'MLFlowLogger: tags must be a mapping, got {type(tags).__name__}')
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name_template = run_name
        self.run_name: Optional[str] = run_name  # Composer's attribute: the MLflow run's name, formatted at init
        self.run_group = run_group
        self.log_system_metrics = bool(log_system_metrics)
        self.model_registry_prefix = model_registry_prefix
        self.model_registry_uri = model_registry_uri
        self.logging_buffer_seconds = logging_buffer_seconds or None
        self.rename_metrics = dict(rename_metrics or {})
        self.ignore_metrics = list(ignore_metrics or [])
        self.ignore_hyperparameters = list(ignore_hyperparameters or [])
        self.log_duplicated_metric_every_n_steps = log_duplicated_metric_every_n_steps
        self._last_logged: dict[str, tuple[float, int]] = {}  # metric -> (value, step), for duplicate skipping
        self._last_send = time.monotonic()
        self._system_monitor: Any = None
        self.run_id = run_id or os.environ.get('MLFLOW_RUN_ID') or None
        self.resume = bool(resume)
        self.tags = {str(k): format_log_data_value(v) for k, v in (tags or {}).items()}
        if run_group:
            self.tags['run_group'] = str(run_group)
        self.artifact_location = artifact_location
        self.flush_interval = check_interval('MLFlowLogger', 'flush_interval', flush_interval)
        self.param_separator = param_separator
        self.should_log_traces = log_traces
        self.synchronous = bool(synchronous)
        self.client: Any = None
        self.experiment_id: Optional[str] = None
        self._state: Optional['State'] = None
        self._metrics: list[Any] = []
        self._existing_params: dict[str, str] = {}
        self._warned: set[str] = set()
        self._worker: Optional[BackgroundWorker] = None  # None: synchronous (or not open)
        self._errors: list[BaseException] = []  # failures of calls made inline (synchronous)
        self._tmpdir: Optional[tempfile.TemporaryDirectory] = None

    # ------------------------------------------------------------------ lifecycle
    def init(self, state: 'State', logger: 'Logger') -> None:
        from mlflow.entities import RunTag

        if self.client is not None:  # already open: a second INIT must not open a second run
            return

        self._state = state
        client = self._new_client()
        template = self.run_name_template
        self.run_name = format_name_with_dist(template, state.run_name) if template else state.run_name
        # As Composer: the job's run name as a tag (MosaicML's platform sets RUN_NAME).
        self.tags[COMPOSER_RUN_NAME_TAG] = os.environ.get('RUN_NAME', state.run_name)
        # Opened only once the run exists: after a failed init, close() has nothing to end (and no
        # second, misleading error to raise).
        run, created = open_run(
            client,
            run_id=self.run_id,
            experiment_name=self.experiment_name,
            artifact_location=self.artifact_location,
            resume=self.resume,
            key=self._resume_key(state),
            run_name=self.run_name,
            tags=self.tags,
            job_run=self.ranks == 'zero',
            default_experiment=self._default_experiment,
        )
        if not created and self.tags:
            client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in self.tags.items()])
        self.client = client
        self.run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        self._existing_params = dict(run.data.params)
        if self.log_system_metrics:
            self._system_monitor = system_metrics_monitor(self.run_id, client.tracking_uri, resume=not created)
            self._system_monitor.start()
        self._tmpdir = tempfile.TemporaryDirectory(prefix='mlflow-', dir=_private_dirs.private_dir('scratch'))
        if not self.synchronous:
            self._worker = BackgroundWorker('MLFlowLogger', thread_name='dist_logging-mlflow', what='MLflow call(s)')

    def _resume_key(self, state: 'State') -> str:
        # One run per job (rank zero) or one per rank: the key must tell the runs of one job apart.
        return state.run_name if self.ranks == 'zero' else (self.run_name or state.run_name)

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self.client is None:
            return
        try:
            self._send_metrics()
            if self._system_monitor is not None:
                monitor, self._system_monitor = self._system_monitor, None
                self._submit(monitor.finish)  # sends its last samples, before the run ends
            self._submit(lambda: self.client.set_terminated(self.run_id, status='FINISHED'))
            if self._worker is not None:
                self._worker.close()  # runs what is queued (the run's end last), then the thread ends
        finally:
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
                self._tmpdir = None
            self.client = None
        self._raise_errors()

    def post_close(self) -> None:
        """Finish the run if :meth:`close` did not (Composer ends its run here); otherwise nothing.

        Raises:
            RuntimeError: as :meth:`close`.
        """
        if self.client is not None:
            self.close(self._state, None)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Hand buffered metrics to the background thread, in ``log_batch`` calls of at most 1000.

        Raises:
            RuntimeError: an earlier MLflow call failed (its error is the cause).
        """
        self._raise_errors()
        self._send_metrics()

    def _send_metrics(self) -> None:
        self._last_send = time.monotonic()
        while self._metrics:
            chunk, self._metrics = self._metrics[:MAX_METRICS_PER_BATCH], self._metrics[MAX_METRICS_PER_BATCH:]

            # A def, not a lambda with a default: type checkers cannot infer a lambda's default-bound argument.
            def send_metrics(chunk: list[Any] = chunk) -> None:
                self.client.log_batch(self.run_id, metrics=chunk)

            self._submit(send_metrics)

    # ------------------------------------------------------------------ background work
    def _submit(self, job: Callable[[], None]) -> None:
        if self._worker is None or self._worker.closed:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - surfaced like a background failure
                self._errors.append(exc)
        else:
            self._worker.submit(job)

    def _raise_errors(self) -> None:
        if self._worker is not None:
            self._worker.raise_errors()
        errors, self._errors = self._errors, []
        if errors:
            error = RuntimeError(
                f'MLFlowLogger: {len(errors)} MLflow call(s) failed; first: {type(errors[0]).__name__}: {errors[0]}'
            )
            raise error from errors[0]

    def _check_open(self) -> None:
        if self.client is None:
            raise RuntimeError('MLFlowLogger is not open: it is opened by the Logger')
        self._raise_errors()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _key(self, name: str) -> str:
        clean = _BAD_KEY_CHARS.sub('_', name)[:MAX_KEY_LENGTH]
        if clean != name:
            self._warn_once(
                'key',
                f'MLFlowLogger: names must be at most {MAX_KEY_LENGTH} characters of letters, '
                f"digits and '_-. :/'; {name!r} is logged as {clean!r} (warned once)",
            )
        return clean

    def _step(self, step: Optional[int]) -> int:
        if step is not None:
            return step
        return self._state.timestamp.batch if self._state is not None else 0

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Tag the run with the superseded range (``dist_logging.resume.<n>``, the next free n), in the background."""
        self._check_open()
        value = json.dumps(
            {
                'step': info.step,
                'superseded_from': info.superseded_from,
                'before_ms': int(info.time * 1000),
                'resume': info.resume,
                'attempt': info.attempt,
                'saved_attempt': info.saved_attempt,
            }
        )

        def tag() -> None:
            tags = self.client.get_run(self.run_id).data.tags
            number = 1 + max(
                (
                    int(key[len(RESUME_TAG_PREFIX) :])
                    for key in tags
                    if key.startswith(RESUME_TAG_PREFIX) and key[len(RESUME_TAG_PREFIX) :].isdigit()
                ),
                default=0,
            )
            self.client.set_tag(self.run_id, f'{RESUME_TAG_PREFIX}{number}', value)

        self._submit(tag)

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._check_open()
        ignored = self.ignore_hyperparameters
        if ignored:
            hyperparameters = {k: v for k, v in hyperparameters.items() if not _matches_any(k, ignored)}
        params: dict[str, str] = {}
        truncated = []
        for name, value in flatten(hyperparameters, self.param_separator).items():
            if ignored and _matches_any(name, ignored):
                continue
            text = format_log_data_value(value)
            if len(text) > MAX_PARAM_VALUE_LENGTH:
                truncated.append(name)
                text = text[:MAX_PARAM_VALUE_LENGTH]
            params[self._key(name)] = text
        if truncated:
            self._warn_once(
                'truncated',
                f'MLFlowLogger: values of {truncated} are longer than MLflow\'s '
                f'{MAX_PARAM_VALUE_LENGTH} characters and were truncated',
            )
        changed = [k for k, v in params.items() if k in self._existing_params and self._existing_params[k] != v]
        if changed:
            warnings.warn(
                f'MLFlowLogger: run {self.run_id} already has params {changed} with other values; MLflow '
                'does not allow changing a param, so the new values are not logged',
                RuntimeWarning,
                stacklevel=3,
            )
        todo = [Param(k, v) for k, v in params.items() if k not in self._existing_params]
        self._existing_params.update({p.key: p.value for p in todo})
        for start in range(0, len(todo), MAX_PARAMS_PER_BATCH):
            chunk = todo[start : start + MAX_PARAMS_PER_BATCH]

            def send_params(chunk: list[Any] = chunk) -> None:
                self.client.log_batch(self.run_id, params=chunk)

            self._submit(send_params)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        from mlflow.entities import Metric

        self._check_open()
        step = self._step(step)
        now = int(time.time() * 1000)
        if self.ignore_metrics or self.rename_metrics or self.log_duplicated_metric_every_n_steps:
            self._metrics.extend(
                Metric(self._key(self.rename_metrics.get(name, name)), value, now, step)
                for name, value in self._filtered(metrics, step)
            )
        else:
            self._metrics.extend(Metric(self._key(name), float(value), now, step) for name, value in metrics.items())
        if len(self._metrics) >= MAX_METRICS_PER_BATCH or (
            self.logging_buffer_seconds is not None
            and time.monotonic() - self._last_send >= self.logging_buffer_seconds
        ):
            self.flush()

    def _filtered(self, metrics: dict[str, float], step: int) -> list[tuple[str, float]]:
        """Composer's ignore_metrics patterns and duplicate skipping."""
        kept = []
        window = self.log_duplicated_metric_every_n_steps
        for name, value in metrics.items():
            if self.ignore_metrics and _matches_any(name, self.ignore_metrics):
                continue
            value = float(value)
            if window:
                last = self._last_logged.get(name)
                if last is not None and last[0] == value and step < last[1] + window:
                    continue
                self._last_logged[name] = (value, step)
            kept.append((name, value))
        return kept

    def log_traces(self, traces: dict[str, Any]) -> None:
        if not self.should_log_traces:
            return
        self._check_open()
        for name, value in traces.items():
            text = format_log_data_value(value)
            path = f'traces/{safe_artifact_name(name)}.txt'

            def send_trace(text: str = text, path: str = path) -> None:
                self.client.log_text(self.run_id, text, path)

            self._submit(send_trace)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self._check_open()
        text = json.dumps({'columns': list(columns), 'data': jsonable(rows)}, default=format_log_data_value)
        path = f'tables/{safe_artifact_name(name)}/step{self._step(step):06d}.json'
        self._submit(lambda: self.client.log_text(self.run_id, text, path))

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
        from dist_logging._images import encode_png, image_files, prepare_images

        self._check_open()
        batch, mask_batches = prepare_images(images, channels_last, masks)
        folder = f'images/{safe_artifact_name(name)}'
        stem = f'step{self._step(step):06d}'
        # Encoded now (a copy the caller cannot change); written and uploaded in the background.
        files = [(rel, encode_png(image)) for rel, image in image_files(batch, mask_batches, stem)]
        if mask_class_labels and mask_batches:
            files.append(
                (
                    f'{stem}.mask_class_labels.json',
                    json.dumps({str(k): v for k, v in mask_class_labels.items()}).encode(),
                )
            )
        self._submit(lambda: self._upload_files(folder, files))

    # ------------------------------------------------------------------ model registry
    def _enabled_here(self) -> bool:
        from dist_logging import dist

        if self.ranks == 'zero':
            return dist.get_global_rank() == 0
        return self.ranks == 'all' or dist.get_local_rank() == 0

    def _registry_client(self) -> Any:
        return self.client if self.client is not None else self._new_client()

    def _new_client(self) -> Any:
        import mlflow

        # mlflow.MlflowClient looked up at each use, as Composer's logger does: code (and tests) that
        # substitute it reach this destination too.
        return mlflow.MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.model_registry_uri)

    def _model_name(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f'MLFlowLogger: a model name must be a non-empty string, got {name!r}')
        return f'{self.model_registry_prefix}.{name}' if self.model_registry_prefix else name

    def register_model(
        self, model_uri: str, name: str, await_registration_for: int = 300, tags: Optional[dict[str, Any]] = None
    ) -> Any:
        """Register ``model_uri`` as a new version of the model ``<model_registry_prefix>.<name>``, as Composer's does.

        The registered model is created if missing. A ``runs:/<run id>/<path>`` URI is resolved
        to that run's artifacts and the version is linked to the run. Runs on the caller's
        thread, waiting up to ``await_registration_for`` seconds for the version to be ready.
        On a rank this destination's policy excludes it does nothing and returns None.

        Returns:
            The ``mlflow.entities.model_registry.ModelVersion`` (None on an excluded rank).

        Raises:
            ValueError: an empty name.
            mlflow.exceptions.MlflowException: the registry refused it (e.g. an unknown run).
        """
        if not self._enabled_here():
            return None
        full_name = self._model_name(name)
        return create_model_version(
            self._registry_client(),
            full_name,
            model_uri,
            run_id=None,
            tags=tags,
            await_for=await_registration_for,
            resolve_runs_uri=True,
        )

    def register_model_with_run_id(
        self, model_uri: str, name: str, await_creation_for: int = 300, tags: Optional[dict[str, Any]] = None
    ) -> Any:
        """Like :meth:`register_model`, with ``model_uri`` used as given and the version linked to this run.

        Raises:
            RuntimeError: the destination is not open (no run yet).
            ValueError, mlflow.exceptions.MlflowException: as :meth:`register_model`.
        """
        if not self._enabled_here():
            return None
        if not self.run_id or self.client is None:
            raise RuntimeError('MLFlowLogger.register_model_with_run_id: no run yet (the Logger opens it)')
        full_name = self._model_name(name)
        return create_model_version(
            self._registry_client(),
            full_name,
            model_uri,
            run_id=self.run_id,
            tags=tags,
            await_for=await_creation_for,
            resolve_runs_uri=False,
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The MLflow run (``run_id``, ``experiment_id``): loaded into a new MLFlowLogger, it continues that run."""
        return {'run_id': self.run_id, 'experiment_id': self.experiment_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved run when the Logger opens this destination (as ``run_id=`` does).

        Loaded into an open destination logging to another run: a warning, and the open run is kept.

        Raises:
            TypeError, ValueError: as :meth:`LoggerDestination.load_state_dict`.
        """
        run_id = check_state(self, state, ('run_id', 'experiment_id')).get('run_id')
        if run_id is None:
            return
        if self.client is not None:
            if run_id != self.run_id:
                warnings.warn(
                    f'MLFlowLogger.load_state_dict: this destination is logging to run {self.run_id!r} '
                    f'already; the saved run {run_id!r} is not switched to (load the state before '
                    'building the Logger)',
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        self.run_id = run_id

    def _upload_files(self, folder: str, files: list[tuple[str, bytes]]) -> None:
        with tempfile.TemporaryDirectory(
            dir=self._tmpdir.name if self._tmpdir else _private_dirs.private_dir('scratch')
        ) as directory:
            for file_name, data in files:
                with open(os.path.join(directory, file_name), 'wb') as f:
                    f.write(data)
            self.client.log_artifacts(self.run_id, directory, artifact_path=folder)


def superseded_ranges(tags: Mapping[str, str]) -> list[tuple[int, int]]:
    """``(first superseded step, before_ms)`` of every resume recorded in a run's tags (``run.data.tags``).

    Raises:
        ValueError: a ``dist_logging.resume.<n>`` tag that is not the JSON this destination writes.
    """
    ranges = []
    for key, value in tags.items():
        if key.startswith(RESUME_TAG_PREFIX):
            try:
                record = json.loads(value)
                ranges.append((int(record['superseded_from']), int(record['before_ms'])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f'tag {key}={value!r} is not a dist_logging resume record') from exc
    return sorted(ranges)


def without_superseded(history: Sequence[Any], tags: Mapping[str, str]) -> list[Any]:
    """The points of a metric history (``MlflowClient.get_metric_history``) that no resume superseded, by step.

    A point is superseded when some resume's tag says ``superseded_from <= point.step`` and the point was
    logged before the resume (``point.timestamp < before_ms``): the resumed run logged that step again.

    Args:
        history: ``mlflow.entities.Metric`` objects (``step``, ``timestamp`` in ms, ``value``).
        tags: the run's tags (``client.get_run(run_id).data.tags``).

    Returns:
        The points kept, sorted by step (then time).
    """
    ranges = superseded_ranges(tags)
    kept = [
        point
        for point in history
        if not any(point.step >= first and point.timestamp < before for first, before in ranges)
    ]
    return sorted(kept, key=lambda point: (point.step, point.timestamp))
