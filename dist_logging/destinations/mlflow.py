"""MLFlowLogger: params, metrics (batched), tables and images in an MLflow tracking store."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import tempfile
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from dist_logging._artifacts import flatten, jsonable, safe_artifact_name
from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination
from dist_logging.destinations._periodic import PeriodicFlushMixin, check_interval
from dist_logging.naming import DIST_PLACEHOLDERS, format_name_with_dist, validate_template

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['MLFlowLogger']

INSTALL_HINT = 'MLFlowLogger needs the mlflow package: pip install dist-logging[mlflow]'

# MLflow's server-side limits (mlflow/utils/validation.py); a larger batch or value is refused.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000
MAX_KEY_LENGTH = 250
RUN_NAME_TAG = 'dist_logging.run_name'
_BAD_KEY_CHARS = re.compile(r'[^A-Za-z0-9_\-. :/]')


def _check_installed() -> None:
    if importlib.util.find_spec('mlflow') is None:
        raise ImportError(INSTALL_HINT)


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

    The run: ``run_id`` (or the ``MLFLOW_RUN_ID`` environment variable) resumes that run.
    Otherwise, with ``resume=True``, a run of the experiment tagged with this Logger's run
    name (``dist_logging.run_name``; the same on every restart of a torchrun job) is
    resumed, else a new one is created. Params already in a resumed run are not sent
    again; a changed value (which MLflow refuses) is skipped with a warning.

    Args:
        tracking_uri: the tracking store (``sqlite:///...``, ``http://...``, ``databricks``);
            ``None`` uses MLflow's default (``MLFLOW_TRACKING_URI`` or a local store).
        experiment_name: the experiment, created if missing.
        run_name: template for the MLflow run's name (default: the Logger's run name).
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

    Raises:
        ImportError: mlflow is not installed (with the extra to install).
        ValueError: an empty experiment name, a bad template or interval.
        TypeError: ``tags`` is not a mapping.
    """

    def __init__(self, tracking_uri: Optional[str] = None, experiment_name: str = 'dist_logging',
                 run_name: Optional[str] = None, run_id: Optional[str] = None, resume: bool = True,
                 tags: Optional[Mapping[str, Any]] = None, artifact_location: Optional[str] = None,
                 flush_interval: int = 10, param_separator: str = '/', log_traces: bool = False,
                 synchronous: bool = False, ranks: str = 'zero', log_level: Any = None,
                 optional: Optional[bool] = None):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        _check_installed()
        if not isinstance(experiment_name, str) or not experiment_name.strip():
            raise ValueError(f'MLFlowLogger: experiment_name must be a non-empty string, got {experiment_name!r}')
        if tracking_uri is not None and (not isinstance(tracking_uri, str) or not tracking_uri):
            raise ValueError(f'MLFlowLogger: tracking_uri must be a non-empty string or None, got {tracking_uri!r}')
        if run_name is not None:
            validate_template(run_name, DIST_PLACEHOLDERS)
        if param_separator not in ('/', '.'):
            raise ValueError(f"MLFlowLogger: param_separator must be '/' or '.', got {param_separator!r}")
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError(f'MLFlowLogger: tags must be a mapping, got {type(tags).__name__}')
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name_template = run_name
        self.run_id = run_id or os.environ.get('MLFLOW_RUN_ID') or None
        self.resume = bool(resume)
        self.tags = {str(k): format_log_data_value(v) for k, v in (tags or {}).items()}
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
        self._queue: 'queue.Queue[Optional[Callable[[], None]]]' = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._tmpdir: Optional[tempfile.TemporaryDirectory] = None

    # ------------------------------------------------------------------ lifecycle
    def init(self, state: 'State', logger: 'Logger') -> None:
        from mlflow.tracking import MlflowClient

        self._state = state
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        run = self._open_run(state)
        self.run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        self._existing_params = dict(run.data.params)
        self._tmpdir = tempfile.TemporaryDirectory(prefix='dist_logging_mlflow_')
        if not self.synchronous:
            self._thread = threading.Thread(target=self._work, name='dist_logging-mlflow', daemon=True)
            self._thread.start()

    def _open_run(self, state: 'State') -> Any:
        from mlflow.exceptions import MlflowException

        client = self.client
        if self.run_id:
            try:
                run = client.get_run(self.run_id)
            except MlflowException as exc:
                raise ValueError(f'MLFlowLogger: run_id {self.run_id!r} not found in {client.tracking_uri!r}: {exc}') from exc
            if run.info.status != 'RUNNING':
                client.update_run(run.info.run_id, status='RUNNING')
            return run
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(self.experiment_name, artifact_location=self.artifact_location)
            except MlflowException:  # created meanwhile by another job
                experiment_id = client.get_experiment_by_name(self.experiment_name).experiment_id
        else:
            experiment_id = experiment.experiment_id
        if self.resume:
            found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{state.run_name}'",
                                       max_results=1, order_by=['attributes.start_time DESC'])
            if found:
                run = found[0]
                if run.info.status != 'RUNNING':
                    client.update_run(run.info.run_id, status='RUNNING')
                return run
        name = format_name_with_dist(self.run_name_template, state.run_name) if self.run_name_template else state.run_name
        return client.create_run(experiment_id, run_name=name, tags={RUN_NAME_TAG: state.run_name, **self.tags})

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self.client is None:
            return
        try:
            self._send_metrics()
            self._submit(lambda: self.client.set_terminated(self.run_id, status='FINISHED'))
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None
        finally:
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
                self._tmpdir = None
            self.client = None
        self._raise_errors()

    def flush(self) -> None:
        """Hand buffered metrics to the background thread, in ``log_batch`` calls of at most 1000.

        Raises:
            RuntimeError: an earlier MLflow call failed (its error is the cause).
        """
        self._raise_errors()
        self._send_metrics()

    def _send_metrics(self) -> None:
        while self._metrics:
            chunk, self._metrics = self._metrics[:MAX_METRICS_PER_BATCH], self._metrics[MAX_METRICS_PER_BATCH:]
            self._submit(lambda chunk=chunk: self.client.log_batch(self.run_id, metrics=chunk))

    # ------------------------------------------------------------------ background work
    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - surfaced like a background failure
                self._errors.append(exc)
        else:
            self._queue.put(job)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - recorded, raised at the next call or close
                with self._lock:
                    self._errors.append(exc)

    def _raise_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            error = RuntimeError(f'MLFlowLogger: {len(errors)} MLflow call(s) failed; first: '
                                 f'{type(errors[0]).__name__}: {errors[0]}')
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
            self._warn_once('key', f'MLFlowLogger: names must be at most {MAX_KEY_LENGTH} characters of letters, '
                                   f"digits and '_-. :/'; {name!r} is logged as {clean!r} (warned once)")
        return clean

    def _step(self, step: Optional[int]) -> int:
        if step is not None:
            return step
        return self._state.timestamp.batch if self._state is not None else 0

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._check_open()
        params: dict[str, str] = {}
        truncated = []
        for name, value in flatten(hyperparameters, self.param_separator).items():
            text = format_log_data_value(value)
            if len(text) > MAX_PARAM_VALUE_LENGTH:
                truncated.append(name)
                text = text[:MAX_PARAM_VALUE_LENGTH]
            params[self._key(name)] = text
        if truncated:
            self._warn_once('truncated', f'MLFlowLogger: values of {truncated} are longer than MLflow\'s '
                                         f'{MAX_PARAM_VALUE_LENGTH} characters and were truncated')
        changed = [k for k, v in params.items() if k in self._existing_params and self._existing_params[k] != v]
        if changed:
            warnings.warn(f'MLFlowLogger: run {self.run_id} already has params {changed} with other values; MLflow '
                          'does not allow changing a param, so the new values are not logged', RuntimeWarning,
                          stacklevel=3)
        todo = [Param(k, v) for k, v in params.items() if k not in self._existing_params]
        self._existing_params.update({p.key: p.value for p in todo})
        for start in range(0, len(todo), MAX_PARAMS_PER_BATCH):
            chunk = todo[start:start + MAX_PARAMS_PER_BATCH]
            self._submit(lambda chunk=chunk: self.client.log_batch(self.run_id, params=chunk))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        from mlflow.entities import Metric

        self._check_open()
        step = self._step(step)
        now = int(time.time() * 1000)
        self._metrics.extend(Metric(self._key(name), float(value), now, step) for name, value in metrics.items())
        if len(self._metrics) >= MAX_METRICS_PER_BATCH:
            self.flush()

    def log_traces(self, traces: dict[str, Any]) -> None:
        if not self.should_log_traces:
            return
        self._check_open()
        for name, value in traces.items():
            text = format_log_data_value(value)
            path = f'traces/{safe_artifact_name(name)}.txt'
            self._submit(lambda text=text, path=path: self.client.log_text(self.run_id, text, path))

    def log_table(self, columns: list[str], rows: list[list[Any]], name: str = 'Table',
                  step: Optional[int] = None) -> None:
        self._check_open()
        text = json.dumps({'columns': list(columns), 'data': jsonable(rows)}, default=format_log_data_value)
        path = f'tables/{safe_artifact_name(name)}/step{self._step(step):06d}.json'
        self._submit(lambda: self.client.log_text(self.run_id, text, path))

    def log_images(self, images: Any, name: str = 'Images', channels_last: bool = False,
                   step: Optional[int] = None, masks: Optional[dict[str, Any]] = None,
                   mask_class_labels: Optional[dict[int, str]] = None, use_table: bool = True) -> None:
        from dist_logging._images import encode_png, overlay_masks, to_image_batch, to_uint8, validate_masks

        self._check_open()
        batch = to_uint8(to_image_batch(images, channels_last))
        mask_batches = validate_masks(masks, batch)
        folder = f'images/{safe_artifact_name(name)}'
        stem = f'step{self._step(step):06d}'
        # Encoded now (a copy the caller cannot change); written and uploaded in the background.
        files: list[tuple[str, bytes]] = []
        for index in range(batch.shape[0]):
            files.append((f'{stem}-{index}.png', encode_png(batch[index])))
            for mask_name, mask in mask_batches.items():
                overlaid = overlay_masks(batch[index:index + 1], mask[index:index + 1])[0]
                files.append((f'{stem}-{index}.{safe_artifact_name(mask_name).replace("/", "_")}.png',
                              encode_png(overlaid)))
        if mask_class_labels and mask_batches:
            files.append((f'{stem}.mask_class_labels.json',
                          json.dumps({str(k): v for k, v in mask_class_labels.items()}).encode()))
        self._submit(lambda: self._upload_files(folder, files))

    def _upload_files(self, folder: str, files: list[tuple[str, bytes]]) -> None:
        with tempfile.TemporaryDirectory(dir=self._tmpdir.name if self._tmpdir else None) as directory:
            for file_name, data in files:
                with open(os.path.join(directory, file_name), 'wb') as f:
                    f.write(data)
            self.client.log_artifacts(self.run_id, directory, artifact_path=folder)
