"""NeptuneLogger: a neptune.ai run per job (or per rank): parameters, metrics, traces, tables, images, files."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import threading
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from dist_logging import _private_dirs, dist
from dist_logging._artifacts import jsonable, table_json
from dist_logging._values import format_log_data_value, metric_scalar
from dist_logging.destination import check_state
from dist_logging.destinations._optional import import_installed, require_installed
from dist_logging.destinations._tracker import TrackerDestination

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['NeptuneLogger', 'NEPTUNE_MODES']

INSTALL_HINT = 'NeptuneLogger needs the neptune package (1.x): pip install dist-logging[neptune]'

NEPTUNE_MODES = ('async', 'sync', 'offline', 'read-only', 'debug')
"""The connection modes ``neptune.init_run`` accepts (``mode=``, or ``NEPTUNE_MODE``)."""


def _plain(value: Any) -> Any:
    """A value Neptune stores as a field: numbers, bools and strings as they are, the rest as text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return format_log_data_value(value) if value is not None else 'None'


class NeptuneLogger(TrackerDestination):
    """Logs to a `neptune.ai <https://neptune.ai>`_ run (Composer's ``NeptuneLogger`` API, neptune 1.x).

    The run is created when the Logger opens this destination (``neptune.init_run``) and
    stopped at ``close()``. By default one run per job, on global rank zero; with every
    rank logging (``rank_zero_only=False`` or ``ranks='all'``) each rank has its own run,
    named after the Logger's run as in Composer, with ``<base>/rank`` its global rank.
    Everything goes under ``base_namespace``:

    * hyperparameters -> ``<base>/hyperparameters/...`` (already redacted by the Logger;
      values Neptune cannot store as fields, e.g. lists, as their text);
    * metrics -> float series ``<base>/metrics/<key>`` at their step (``step``, else the
      Logger's batch count). Neptune series only take increasing steps, so a point waits
      until a later step of its key arrives, its batch ends (``batch_end``/``epoch_end``), or
      close: a key logged twice at one step keeps the later value, as W&B does. A point for a step below one
      already written is dropped with a warning naming the key (once per key) instead of failing at sync;
    * traces -> ``<base>/traces/<name>`` (the latest value, as Composer's);
    * tables -> ``<base>/tables/<name>``: a JSON file ``{"columns": [...], "data": [...]}``
      (the latest table of that name);
    * images -> the image series ``<base>/<name>`` (each image named ``<name>_<index>``,
      described with its training step; Neptune numbers the series itself); with masks
      also ``<base>/<name> + <mask> mask overlaid``;
    * with ``upload_checkpoints=True``, files handed to ``Logger.upload_file`` ->
      ``<base>/<remote_file_name>`` (Composer skips ``.symlink`` files: so does this).

    Nothing here waits for Neptune on the training loop: every neptune call runs in order
    on one background thread (Neptune then sends from its own). ``upload_file`` snapshots
    the file at the call (a reflink or in-kernel copy) so the caller may change it at once;
    the worker hands the snapshot to Neptune as a stream (Neptune keeps its own copy until
    it is sent) and removes it. Failures of background calls are raised (as
    ``RuntimeError`` with the cause) at the next call or at close.

    Args:
        project: ``workspace/project`` (default: ``NEPTUNE_PROJECT``).
        api_token: the API token (default: ``NEPTUNE_API_TOKEN``; never logged).
        rank_zero_only: log on global rank zero only (Composer's switch; ``ranks=`` wins).
        upload_checkpoints: store files handed to ``upload_file`` in the run.
        base_namespace: the namespace everything is logged under.
        mode: Neptune's connection mode (``'async'``, ``'sync'``, ``'offline'``, ``'read-only'``,
            ``'debug'``; default: ``NEPTUNE_MODE``, else async). Offline runs are written under
            ``.neptune/offline`` in the working directory and sent later with ``neptune sync``.
        ranks: rank policy (``'zero'``, ``'local_zero'``, ``'all'``); overrides ``rank_zero_only``.
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.
        **neptune_kwargs: more ``neptune.init_run`` keyword arguments.

    Raises:
        ImportError: neptune is not installed (with the extra to install).
        TypeError: an argument of the wrong type (names it).
        ValueError: an empty ``base_namespace``, an unknown ``mode``, or
            ``rank_zero_only=False`` with a rank-zero ``ranks`` policy.
    """

    tracker_owner = 'NeptuneLogger'
    metric_namespace = 'metrics'
    hyperparam_namespace = 'hyperparameters'
    trace_namespace = 'traces'
    table_namespace = 'tables'
    integration_version_key = 'source_code/integrations/dist_logging'
    opens_on_first_use = True  # as Composer's, whose run is created when first used

    def __init__(
        self,
        *,
        project: Optional[str] = None,
        api_token: Optional[str] = None,
        rank_zero_only: bool = True,
        upload_checkpoints: bool = False,
        base_namespace: str = 'training',
        mode: Optional[str] = None,
        ranks: Optional[str] = None,
        log_level: Any = None,
        optional: Optional[bool] = None,
        **neptune_kwargs: Any,
    ):
        owner = type(self).__name__
        ranks = self._ranks_from_rank_zero_only(ranks, rank_zero_only, owner)
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        require_installed('neptune', INSTALL_HINT)
        for arg, value in (('project', project), ('api_token', api_token), ('mode', mode)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f'{owner}: {arg} must be a str or None, got {type(value).__name__}')
        for arg, flag in (('upload_checkpoints', upload_checkpoints),):
            if not isinstance(flag, bool):
                raise TypeError(f'{owner}: {arg} must be a bool, got {flag!r}')
        if not isinstance(base_namespace, str):
            raise TypeError(f'{owner}: base_namespace must be a str, got {base_namespace!r}')
        if not base_namespace.strip('/'):
            raise ValueError(f'{owner}: base_namespace cannot be empty, got {base_namespace!r}')
        if mode is not None and mode not in NEPTUNE_MODES:
            raise ValueError(f'{owner}: unknown mode {mode!r}; expected one of {list(NEPTUNE_MODES)}')
        for key in ('project', 'api_token', 'mode'):
            if key in neptune_kwargs:
                raise TypeError(f'{owner}: give {key} as its own argument')
        self.project = project
        self._api_token = api_token
        self.mode = mode
        self.upload_checkpoints = upload_checkpoints
        self.base_namespace = base_namespace.strip('/')
        self.neptune_kwargs = dict(neptune_kwargs)
        self.rank_zero_only = self.ranks == 'zero'
        self._neptune_run: Any = None
        self._file_type: Any = None
        self._pending: dict[str, tuple[int, Any]] = {}  # metric key -> (step, value) not yet written
        self._last_step: dict[str, int] = {}  # metric key -> last step written
        self._warned: set[str] = set()
        self._queued_files: set[str] = set()
        self._snapshot_dir: Optional[str] = None
        if upload_checkpoints:
            self.upload_file = self._upload_file  # type: ignore[method-assign]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The Neptune run's id (``run_id``, e.g. ``'PROJ-12'``): loaded into a new NeptuneLogger, it continues that
        run. None before the run opens, and for an offline or debug run (Neptune resumes only runs it stores)."""
        run_id = self.neptune_kwargs.get('with_id')
        if self._neptune_run is not None:
            run_id = getattr(self._neptune_run, '_sys_id', None)
            if str(run_id).startswith('OFFLINE') or self._effective_mode() in ('offline', 'debug'):
                run_id = None
        return {'run_id': run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved run when the Logger opens this destination (``neptune.init_run(with_id=...)``).

        Raises:
            TypeError, ValueError: as :meth:`LoggerDestination.load_state_dict`; also a saved run id that
                contradicts ``with_id=``.
        """
        run_id = check_state(self, state, ('run_id',)).get('run_id')
        current = getattr(self._neptune_run, '_sys_id', None) if self._neptune_run is not None else None
        if not self._restore_run(run_id, current, 'run'):
            return
        given = self.neptune_kwargs.get('with_id')
        if given is not None and given != run_id:
            raise ValueError(f'NeptuneLogger.load_state_dict: the saved run {run_id!r} contradicts with_id={given!r}')
        self.neptune_kwargs['with_id'] = run_id

    def _effective_mode(self) -> Optional[str]:
        return self.mode or os.environ.get('NEPTUNE_MODE')

    # ------------------------------------------------------------------ lifecycle
    @property
    def neptune_run(self) -> Any:
        """The ``neptune.Run``, for logging more metadata. Used before any Logger opened this destination (as
        code written for Composer's does), it opens the run as a first log call does (see ``_open_if_alone``).

        This destination's own writes happen later, on its background thread, so what is
        written here directly is not ordered with them.

        Raises:
            RuntimeError: the destination is closed, or not open on a rank its ``ranks`` policy excludes.
        """
        if self._neptune_run is None:
            self._open_if_alone()
        if self._neptune_run is None:
            raise RuntimeError(
                'NeptuneLogger is not open: it is opened by the Logger (init), or by a first call '
                'on a rank its ranks policy includes'
            )
        return self._neptune_run

    @property
    def _base_namespace(self) -> str:
        """``base_namespace`` under the private name Composer's logger keeps it (code written against it reads it)."""
        return self.base_namespace

    @property
    def base_handler(self) -> Any:
        """The run's handler for ``base_namespace`` (Composer's ``base_handler``)."""
        return self.neptune_run[self.base_namespace]

    def init(self, state: 'State', logger: 'Logger') -> None:
        if self._neptune_run is not None and not self._ended:
            return  # already open
        neptune = import_installed('neptune', INSTALL_HINT)
        self._file_type = import_installed('neptune.types', INSTALL_HINT).File
        kwargs = dict(self.neptune_kwargs)
        kwargs.setdefault('name', state.run_name)  # on every rank, as Composer's: `<base>/rank` tells them apart
        run = neptune.init_run(project=self.project, api_token=self._api_token, mode=self.mode, **kwargs)
        from dist_logging import __version__

        run[f'{self.base_namespace}/rank'] = dist.get_global_rank()
        run[self.integration_version_key] = __version__
        self._neptune_run = run
        self._pending, self._last_step, self._queued_files = {}, {}, set()
        self._start_worker(state)

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        self._write_before(state.timestamp.batch)

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        self._write_before(state.timestamp.batch)

    def _write_before(self, step: int) -> None:
        """Write the waiting points of steps before ``step`` (batches that ended): one that
        logs once an epoch shows up now, not when its key is next logged."""
        if not self._pending or self._worker is None or self._ended:
            return
        ready = {key: point for key, point in self._pending.items() if point[0] < step}
        if ready:
            for key, point in ready.items():
                del self._pending[key]
                self._last_step[key] = point[0]
            self._submit_on_run(lambda run: self._write_points(run, ready))

    def _final_jobs(self, failed: bool) -> list[Callable[[], None]]:
        """Write the waiting metric points, mark a failed run ``sys/failed``, and stop the run
        (an offline run is then complete)."""
        run = self._neptune_run
        jobs: list[Callable[[], None]] = []
        pending, self._pending = self._pending, {}
        if pending:
            jobs.append(lambda: self._write_points(run, pending))
        if failed:
            jobs.append(lambda: run.__setitem__('sys/failed', True))
        jobs.append(run.stop)
        return jobs

    def _worker_stopped(self) -> None:
        """Remove the folder of ``upload_file`` snapshots (the worker removed each one it handed over)."""
        if self._snapshot_dir is not None:
            shutil.rmtree(self._snapshot_dir, ignore_errors=True)
            self._snapshot_dir = None

    # ------------------------------------------------------------------ helpers

    def _path(self, *parts: str) -> str:
        return '/'.join((self.base_namespace,) + parts)

    def _submit_on_run(self, job: Callable[[Any], None]) -> None:
        """Queue ``job(run)`` on the worker, for the run open at the call (a first call made without a Logger
        opens it; a later re-init does not redirect a job already queued).

        Raises:
            RuntimeError: as :meth:`_check_open`.
        """
        self._check_open()
        run = self._neptune_run
        self._worker.submit(lambda: job(run))  # type: ignore[union-attr]

    def _drain(self) -> None:
        """Wait until every call queued so far ran; raise what failed."""
        self._check_open()
        done = threading.Event()
        self._worker.submit(done.set)  # type: ignore[union-attr]
        done.wait()
        self._check_open()

    def _write_points(self, run: Any, points: dict[str, tuple[int, Any]]) -> None:
        for key, (step, value) in points.items():
            run[self._path(self.metric_namespace, key)].append(value, step=step)

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        values = _plain(jsonable(dict(hyperparameters)))  # a copy the caller cannot change
        path = self._path(self.hyperparam_namespace)
        self._submit_on_run(lambda run: run[path].assign(values) if values else None)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self._check_open()
        at = self._training_step(step)
        ready: dict[str, tuple[int, Any]] = {}
        for key, value in metrics.items():
            key = str(key)
            value = float(metric_scalar(key, value))  # a tensor or numpy scalar too; NaN stays a float
            waiting = self._pending.get(key)
            last = waiting[0] if waiting is not None else self._last_step.get(key)
            if last is not None and at < last:
                if key not in self._warned:
                    self._warned.add(key)
                    warnings.warn(
                        f'NeptuneLogger: metric {key!r} at step {at} is before step {last} already logged; '
                        'Neptune series only take increasing steps, so it is dropped (warned once per key)',
                        RuntimeWarning,
                        stacklevel=3,
                    )
                continue
            if waiting is not None and waiting[0] < at:
                ready[key] = waiting
                self._last_step[key] = waiting[0]
            self._pending[key] = (at, value)
        if ready:
            self._submit_on_run(lambda run: self._write_points(run, ready))

    def log_traces(self, traces: dict[str, Any]) -> None:
        values = _plain(jsonable(dict(traces)))
        path = self._path(self.trace_namespace)
        self._submit_on_run(lambda run: run[path].assign(values) if values else None)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        del step  # a Neptune file field holds the latest table
        text = table_json([str(c) for c in columns], [list(r) for r in rows], ascii=False)
        path = self._path(self.table_namespace, name)
        self._submit_on_run(lambda run: run.__setitem__(path, self._file_type.from_content(text, extension='json')))

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
        from dist_logging._images import overlay_masks, snapshot_images, to_rgb

        del use_table, mask_class_labels  # W&B-only options, as in Composer
        batch, mask_batches = snapshot_images(images, channels_last, masks)
        at = self._training_step(step)
        series = self._path(name)

        def log(run: Any) -> None:  # one extend per batch: the batch's images in order, named and described alike
            file_type = self._file_type
            rgb = to_rgb(batch) if batch.shape[-1] == 1 else batch
            run[series].extend([file_type.as_image(image) for image in rgb], name=name, description=f'step {at}')
            for mask_name, mask in mask_batches.items():
                overlaid = overlay_masks(batch, mask, alpha=0.6)
                run[f'{series} + {mask_name} mask overlaid'].extend(
                    [file_type.as_image(image) for image in overlaid], name=name, description=f'step {at}'
                )

        self._submit_on_run(log)

    # ------------------------------------------------------------------ files
    def can_upload_files(self) -> bool:
        """True with ``upload_checkpoints=True``: files handed to the Logger are stored in the run."""
        return self.upload_checkpoints

    def _upload_file(
        self,
        state: Optional['State'],
        remote_file_name: str,
        file_path: Union[str, pathlib.Path],
        *,
        overwrite: bool = False,
        copy: bool = True,
    ) -> None:
        """``upload_file`` with ``upload_checkpoints=True``: snapshot the file, store it at ``<base>/<name>``.

        Returns at once; ``.symlink`` files (Composer's checkpoint pointers) and symlinks are skipped.

        Raises:
            FileNotFoundError: the file does not exist.
            FileExistsError: ``overwrite=False`` and the run already has (or this destination
                already queued) a field of that name.
            RuntimeError: this destination is not open, or an earlier neptune call failed.
        """
        from dist_logging._files import copy_file

        self._check_open()
        path = pathlib.Path(file_path)
        if path.is_symlink() or path.suffix.lower() == '.symlink':
            return
        remote = os.fspath(remote_file_name).strip('/')
        field = self._path(remote)
        run = self._neptune_run
        if not overwrite and (remote in self._queued_files or run.exists(field)):
            raise FileExistsError(f'NeptuneLogger.upload_file: {field!r} already exists in the run (overwrite=False)')
        if self._snapshot_dir is None:
            self._snapshot_dir = tempfile.mkdtemp(prefix='neptune-', dir=_private_dirs.private_dir('scratch'))
        snapshot = os.path.join(self._snapshot_dir, uuid.uuid4().hex)
        try:
            if copy:
                copy_file(os.fspath(path), snapshot, mode=0o400)
            else:
                os.link(os.fspath(path), snapshot)
        except FileNotFoundError:
            raise FileNotFoundError(f'NeptuneLogger.upload_file: {os.fspath(path)!r} does not exist') from None
        except OSError:  # a hard link across filesystems: copy instead
            copy_file(os.fspath(path), snapshot, mode=0o400)
        file_type, extension = self._file_type, path.suffix.lstrip('.') or None

        def upload() -> None:
            try:
                with open(snapshot, 'rb') as stream:  # Neptune copies a stream into its own upload folder
                    run[field] = file_type.from_stream(stream, extension=extension)
            finally:
                os.unlink(snapshot)

        try:
            self._submit(upload)
        except BaseException:
            os.unlink(snapshot)
            raise
        self._queued_files.add(remote)

    def download_file(
        self, remote_file_name: str, destination: str, overwrite: bool = False, progress_bar: bool = True
    ) -> None:
        """Download the file field ``<base>/<remote_file_name>`` to ``destination`` (needs Neptune's server).

        Waits until this destination's queued calls ran (so a file just handed to
        ``upload_file`` can be read back).

        Raises:
            FileExistsError: ``destination`` exists and ``overwrite`` is False.
            FileNotFoundError: no such field in the run.
            RuntimeError: the destination is not open.
        """
        del progress_bar
        if not overwrite and os.path.lexists(destination):
            raise FileExistsError(f'NeptuneLogger.download_file: {destination!r} exists (overwrite=False)')
        run = self.neptune_run
        field = self._path(os.fspath(remote_file_name).strip('/'))
        self._drain()
        if not run.exists(field):
            raise FileNotFoundError(f'NeptuneLogger.download_file: no file {field!r} in the run')
        folder = os.path.dirname(os.path.abspath(destination))
        with tempfile.TemporaryDirectory(dir=folder, prefix='.dist_logging-neptune-') as tmp:
            target = os.path.join(tmp, 'file')
            run[field].download(destination=target)
            os.replace(target, destination)

    def __repr__(self) -> str:
        return (
            f'NeptuneLogger(project={self.project!r}, mode={self.mode!r}, ranks={self.ranks!r}, '
            f'upload_checkpoints={self.upload_checkpoints})'
        )
