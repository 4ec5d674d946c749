"""WandBLogger: a Weights & Biases run per job (or per rank): config, metrics, tables, images, traces, artifacts."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import tempfile
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from dist_logging import dist
from dist_logging._artifacts import jsonable
from dist_logging._values import format_log_data_value
from dist_logging.destination import check_state
from dist_logging.destinations._optional import import_installed, require_installed
from dist_logging.destinations._tracker import TrackerDestination
from dist_logging.naming import DIST_PLACEHOLDERS, format_name_with_dist, validate_template

if TYPE_CHECKING:
    import pathlib

    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['WandBLogger', 'STEP_METRIC']

INSTALL_HINT = 'WandBLogger needs the wandb package: pip install dist-logging[wandb]'

STEP_METRIC = 'trainer/global_step'
"""Every row this destination logs carries the training step under this key, and the run's
charts use it as their x-axis (``define_metric``), so a step that goes backwards is still
plotted where it belongs (see :class:`WandBLogger`)."""

ARTIFACT_NAME_MAX = 128  # W&B's limit on artifact names
_ARTIFACT_NAME_BAD = re.compile(r'[^A-Za-z0-9\-_.]')
_MAX_MASK_CLASS = 255  # W&B stores masks as 8-bit PNGs


def _optional_str(owner: str, name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'{owner}: {name} must be a non-empty string or None, got {value!r}')
    return value


class WandBLogger(TrackerDestination):
    """Logs to a `Weights & Biases <https://wandb.ai>`_ run (Composer's ``WandBLogger`` API).

    The run is created when the Logger opens this destination (``wandb.init``) and finished
    at ``close()``. By default one run per job, on global rank zero. With every rank
    logging (``rank_zero_only=False`` or ``ranks='all'``) each rank has its own run named
    ``{name}-rank{rank}``, all in one group (``group``, default: the run name) so the
    ranks of a job show together; ``ranks='local_zero'`` gives one such run per node.

    * hyperparameters -> the run config (``config.update``; already redacted by the Logger;
      a later value for the same key replaces the earlier one);
    * metrics -> history rows at their step (``step``, else the Logger's batch count);
    * tables -> ``wandb.Table`` under the table's name;
    * images -> ``wandb.Image`` (masks as W&B segmentation masks with ``mask_class_labels``);
      with ``use_table`` one ``wandb.Table`` of them under ``'<name> Table'``, else a list
      under ``<name>``;
    * traces -> history values ``traces/<name>`` at the current batch;
    * with ``log_artifacts=True``, files handed to ``Logger.upload_file`` -> one W&B artifact
      each, named after the remote name (characters other than letters, digits, ``-_.``
      become ``.``), typed by its extension (``.pt`` -> ``model``), with aliases ``latest``
      and ``ep<epoch>-ba<batch>`` and the timestamp as metadata. ``overwrite`` does not
      apply: logging a name again adds a version. Without ``log_artifacts`` this
      destination takes no files (``upload_file`` is the base class's no-op, and the Logger
      does not count it as an uploader).

    Nothing here waits for W&B on the training loop: every wandb call (``log``,
    ``config.update``, building images, hashing artifact files, ``log_artifact``) runs in
    order on one background thread, and wandb's own service process does the uploads. A
    log call only validates and copies its data; ``upload_file`` snapshots the file into
    wandb's artifact staging folder (a reflink or an in-kernel copy; a hard link with
    ``copy=False``) so the caller may change it at once, and wandb removes the snapshot
    once uploaded. Failures of background calls are raised (as ``RuntimeError`` with the
    cause) at the next call or at close.

    Steps: W&B keeps one monotonic row counter (``_step``). A row is logged at wandb step =
    the training step while steps do not go back, so ``_step`` is the training step, as in
    Composer. Every row also carries the training step as ``trainer/global_step``, the
    charts' x-axis. When a step goes backwards (a job resumed from an earlier checkpoint
    into the same W&B run, or data for an earlier step logged late), wandb would drop the
    data; here it goes into a new row after the last one instead (one warning), so
    nothing is lost and it is still plotted at its own step. Data for the same step joins
    one row; a key logged twice at the same ``step`` keeps the later value, as in wandb
    (the Logger passes the batch count as the step when the caller gives none). Called
    without a step (traces, or direct calls), a key already in the row starts a new row at
    the same step instead, as ``wandb.log`` would, so such repeated values are all kept.

    Args:
        project: the W&B project.
        group: the run group (a template: ``{run_name}``, ...).
        name: the run name (a template; default: the Logger's run name).
        entity: the W&B entity (user or team).
        tags: tags for the run.
        log_artifacts: upload files handed to ``upload_file`` as W&B artifacts.
        rank_zero_only: log on global rank zero only (Composer's switch; ``ranks=`` wins).
        init_kwargs: more ``wandb.init`` keyword arguments (``config``, ``mode``, ``dir``,
            ``resume``, ``id``, ``settings``, ``reinit``, ...). If a run is already active
            in the process, wandb's default returns it (and this destination finishes it at
            close); pass ``{'reinit': 'create_new'}`` for a separate run.
        ranks: rank policy (``'zero'``, ``'local_zero'``, ``'all'``); overrides ``rank_zero_only``.
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.

    Raises:
        ImportError: wandb is not installed (with the extra to install).
        ValueError: an empty project/entity, a bad name or group template, an ``init_kwargs``
            value that contradicts an argument, or ``rank_zero_only=False`` with a rank-zero
            ``ranks`` policy.
        TypeError: ``tags`` not a sequence of strings, ``init_kwargs`` not a mapping.
    """

    tracker_owner = 'WandBLogger'

    def __init__(
        self,
        project: Optional[str] = None,
        group: Optional[str] = None,
        name: Optional[str] = None,
        entity: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        log_artifacts: bool = False,
        rank_zero_only: bool = True,
        init_kwargs: Optional[Mapping[str, Any]] = None,
        *,
        ranks: Optional[str] = None,
        log_level: Any = None,
        optional: Optional[bool] = None,
    ):
        owner = type(self).__name__
        ranks = self._ranks_from_rank_zero_only(ranks, rank_zero_only, owner)
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        require_installed('wandb', INSTALL_HINT)
        project = _optional_str(owner, 'project', project)
        entity = _optional_str(owner, 'entity', entity)
        group = _optional_str(owner, 'group', group)
        name = _optional_str(owner, 'name', name)
        if init_kwargs is None:
            init_kwargs = {}
        if not isinstance(init_kwargs, Mapping) or not all(isinstance(k, str) for k in init_kwargs):
            raise TypeError(
                f'{owner}: init_kwargs must be a mapping of wandb.init keyword arguments, got {init_kwargs!r}'
            )
        if tags is not None:
            if (
                isinstance(tags, (str, bytes))
                or not isinstance(tags, Sequence)
                or not all(isinstance(t, str) and t for t in tags)
            ):
                raise TypeError(f'{owner}: tags must be a list of non-empty strings, got {tags!r}')
            tags = list(tags)
        kwargs = dict(init_kwargs)
        for key, value in (('project', project), ('group', group), ('name', name), ('entity', entity), ('tags', tags)):
            if value is None:
                continue
            if kwargs.get(key) is not None and kwargs[key] != value:
                raise ValueError(f'{owner}: {key}={value!r} contradicts init_kwargs[{key!r}]={kwargs[key]!r}')
            kwargs[key] = value
        self._name_uses_rank = False
        for key in ('name', 'group'):
            if kwargs.get(key) is not None:
                if not isinstance(kwargs[key], str):
                    raise TypeError(f'{owner}: {key} must be a string, got {kwargs[key]!r}')
                used = validate_template(kwargs[key], DIST_PLACEHOLDERS)
                if key == 'name':
                    self._name_uses_rank = 'rank' in used
        if log_artifacts and self.ranks == 'zero' and dist.get_world_size() > 1:
            warnings.warn(
                f'{owner}(log_artifacts=True) logs on rank zero only: files that other ranks upload '
                "(e.g. their checkpoint shards) are not stored; pass ranks='all' (rank_zero_only=False) "
                'to give every rank its own run and artifacts',
                UserWarning,
                stacklevel=2,
            )
        self.log_artifacts = bool(log_artifacts)
        if self.log_artifacts:
            # Only then does this destination take files: the Logger hands files to destinations
            # whose class overrides upload_file, so without log_artifacts the base class's no-op
            # stays, and the Logger (and other destinations) see no uploader here.
            self.upload_file = self._upload_artifact  # type: ignore[method-assign]
        self.rank_zero_only = self.ranks == 'zero'
        self.init_kwargs = kwargs
        # Set here so download_file works on ranks that never open a run; replaced by the run's own.
        self.entity: Optional[str] = kwargs.get('entity')
        self.project: Optional[str] = kwargs.get('project')
        self.run: Any = None
        self.run_dir: Optional[str] = None
        self.run_url: Optional[str] = None
        self._wandb: Any = None
        self._staging_dir: Optional[str] = None
        self._last_wandb_step = -1
        self._row_step: Optional[int] = None  # training step of the row at _last_wandb_step
        self._row_keys: set[str] = set()  # keys logged to that row
        self._warned: set[str] = set()
        self._disabled = False

    # ------------------------------------------------------------------ lifecycle
    def run_name_and_group(self, run_name: str) -> tuple[str, Optional[str]]:
        """The W&B run name and group this rank uses for the Logger run ``run_name``.

        Raises:
            ValueError: a template that cannot be filled.
        """
        name = format_name_with_dist(self.init_kwargs.get('name') or '{run_name}', run_name)
        group = self.init_kwargs.get('group')
        group = format_name_with_dist(group, run_name) if group else None
        if self.ranks != 'zero':
            if group is None:
                group = name
            if not self._name_uses_rank:
                name = f'{name}-rank{dist.get_global_rank()}'
        return name, group

    def init(self, state: 'State', logger: 'Logger') -> None:
        if self.run is not None and not self._ended:
            return  # already open
        wandb = import_installed('wandb', INSTALL_HINT)
        from wandb.sdk.artifacts.staging import get_staging_dir

        kwargs = dict(self.init_kwargs)
        kwargs['name'], group = self.run_name_and_group(state.run_name)
        if group is not None:
            kwargs['group'] = group
        run = wandb.init(**kwargs)
        self._wandb, self.run = wandb, run
        self.run_dir = getattr(run, 'dir', None)
        self.entity = getattr(run, 'entity', None) or self.entity
        self.project = getattr(run, 'project', None) or self.project
        # WANDB_MODE=disabled gives a run that stores nothing: files are then not snapshotted either.
        self._disabled = bool(getattr(run, 'disabled', False))
        if not self._disabled and not getattr(run, 'offline', False):
            self.run_url = getattr(run, 'url', None)
        # A resumed run continues at its next step: earlier steps would be refused by wandb.
        self._last_wandb_step = int(getattr(run, 'step', 0) or 0) - 1
        self._row_step, self._row_keys = None, set()
        run.define_metric(STEP_METRIC)
        run.define_metric('*', step_metric=STEP_METRIC, step_sync=True)
        if self.log_artifacts and not self._disabled:
            self._staging_dir = get_staging_dir()
        self._start_worker(state)

    def _final_jobs(self, failed: bool) -> list[Callable[[], None]]:
        """Finish the run, with exit code 1 while an exception propagates."""
        run, exit_code = self.run, 1 if failed else 0

        def finish() -> None:
            run.finish(exit_code=exit_code)

        return [finish]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The W&B run (``run_id``, ``entity``, ``project``): loaded into a new WandBLogger, it continues that run."""
        run_id = getattr(self.run, 'id', None) if self.run is not None else self.init_kwargs.get('id')
        return {'run_id': run_id, 'entity': self.entity, 'project': self.project}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved run when the Logger opens this destination (``wandb.init(id=..., resume='allow')``).

        Raises:
            TypeError, ValueError: as :meth:`LoggerDestination.load_state_dict`; also a saved run id
                that contradicts ``init_kwargs['id']``.
        """
        state = check_state(self, state, ('run_id', 'entity', 'project'))
        run_id = state.get('run_id')
        if not self._restore_run(run_id, getattr(self.run, 'id', None), 'run'):
            return
        given = self.init_kwargs.get('id')
        if given is not None and given != run_id:
            raise ValueError(
                f'WandBLogger.load_state_dict: the saved run {run_id!r} contradicts init_kwargs[\'id\']={given!r}'
            )
        self.init_kwargs['id'] = run_id
        self.init_kwargs.setdefault('resume', 'allow')
        for key in ('entity', 'project'):  # a run id is only unique within its entity and project
            if state.get(key) and self.init_kwargs.get(key) is None:
                self.init_kwargs[key] = state[key]
                setattr(self, key, state[key])

    # ------------------------------------------------------------------ resumes
    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Record the superseded range on the run and say so in a warning: an open W&B run cannot drop rows.

        The run's summary gets ``dist_logging/resume/wandb_step_<W>`` = ``{"step": S, "superseded_from": P,
        "before_wandb_step": W, "resume": n, "attempt": a}``: the rows before wandb step ``W`` whose
        ``trainer/global_step`` is ``>= P`` were superseded by the resumed run (the charts, whose x-axis is
        ``trainer/global_step``, show both until filtered; see the "Resume" section of docs/destinations.md).
        Rewinding the run on the W&B server (``wandb.init(resume_from=f'{run_id}?_step={P}')``) is not done here.
        """
        self._check_open()
        before = self._last_wandb_step + 1
        record = {
            'step': info.step,
            'superseded_from': info.superseded_from,
            'before_wandb_step': before,
            'resume': info.resume,
            'attempt': info.attempt,
            'time': info.time,
        }
        key = f'dist_logging/resume/wandb_step_{before}'
        run = self.run
        self._submit(lambda: run.summary.update({key: record}))
        self._warn_once(
            'resume',
            f'WandBLogger: resumed at step {info.step}: the rows of steps >= '
            f'{info.superseded_from} logged before wandb step {before} are superseded but stay '
            f'in the run (W&B cannot delete rows of an open run); recorded in the run summary '
            f'as {key!r}',
        )
        self._row_step, self._row_keys = None, set()

    # ------------------------------------------------------------------ helpers
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _wandb_step(self, step: int, keys: Any, explicit: bool) -> int:
        """The wandb row for data with ``keys`` at training step ``step`` (see the class docstring).

        Data for the open row's step joins that row, except that without an explicit step a
        key already in it starts a new row (as ``wandb.log`` without a step would): nothing
        is overwritten that the caller did not address to the same step.
        """
        if step > self._last_wandb_step:
            wandb_step = step
        elif step == self._row_step and (explicit or self._row_keys.isdisjoint(keys)):
            self._row_keys.update(keys)
            return self._last_wandb_step
        else:
            wandb_step = self._last_wandb_step + 1
            if self._row_step is not None and step < self._row_step:
                self._warn_once(
                    'backwards',
                    f'WandBLogger: step {step} is before the last step logged to W&B '
                    f'({self._row_step}); W&B steps only go forward, so this data is logged '
                    f'in a new row (wandb step {wandb_step}) and plotted at its own step by '
                    f'{STEP_METRIC!r} (warned once)',
                )
            elif step == self._row_step:
                self._warn_once(
                    'same-step',
                    f'WandBLogger: {sorted(keys)} logged again at batch {step} without '
                    'step=; kept in a new row at the same step. Call logger.batch_end() '
                    'after each batch or pass step= (warned once)',
                )
        self._last_wandb_step, self._row_step, self._row_keys = wandb_step, step, set(keys)
        return wandb_step

    def _log_row(self, row: dict[str, Any], step: Optional[int]) -> None:
        training_step = self._training_step(step)
        wandb_step = self._wandb_step(training_step, row.keys(), step is not None)
        row[STEP_METRIC] = training_step
        run = self.run
        self._submit(lambda: run.log(row, step=wandb_step))

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self._check_open()
        config = jsonable(hyperparameters)  # a JSON-friendly copy the caller cannot change
        run = self.run
        self._submit(lambda: run.config.update(config, allow_val_change=True))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self._check_open()
        self._log_row(dict(metrics), step)

    def log_traces(self, traces: dict[str, Any]) -> None:
        self._check_open()
        row = {}
        for name, value in traces.items():
            plain = isinstance(value, (bool, int, float, str)) or value is None
            row[f'traces/{name}'] = value if plain else format_log_data_value(value)
        self._log_row(row, None)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self._check_open()
        columns = [str(c) for c in columns]
        data = jsonable([list(r) for r in rows])
        wandb, run = self._wandb, self.run
        training_step = self._training_step(step)
        wandb_step = self._wandb_step(training_step, (name,), step is not None)

        def log() -> None:
            table = wandb.Table(columns=columns, data=data, allow_mixed_types=True)
            run.log({name: table, STEP_METRIC: training_step}, step=wandb_step)

        self._submit(log)

    def log_images(
        self,
        images: Any,
        name: str = 'Images',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks: Optional[dict[str, Any]] = None,
        mask_class_labels: Optional[dict[int, str]] = None,
        use_table: bool = False,
    ) -> None:
        """Log images as ``wandb.Image`` (see the class docstring).

        ``use_table`` defaults to False here, as on Composer's ``WandBLogger.log_images``: the images
        are logged as a list under ``name``. :meth:`Logger.log_images <dist_logging.Logger.log_images>`
        passes its own ``use_table`` (True by default there, as Composer's ``Logger``), which puts
        them in one ``wandb.Table`` under ``'<name> Table'``.

        Raises:
            ValueError: images or masks of a shape or dtype that is no image, a grey image one pixel high or
                wide (a 1-D array: W&B cannot draw it), a class id above 255.
            TypeError: ``mask_class_labels`` not a mapping of int to str.
            RuntimeError: this destination is not open, or an earlier wandb call failed.
        """
        import numpy as np

        from dist_logging._images import snapshot_images

        self._check_open()
        batch, validated_masks = snapshot_images(images, channels_last, masks)
        if batch.shape[-1] == 1 and 1 in batch.shape[1:3]:
            # wandb.Image squeezes size-1 axes and refuses a grey image left with one axis: refused
            # here, at the call, as Composer's WandBLogger does (e.g. for a 1-D array).
            raise ValueError(
                f'WandBLogger: W&B cannot draw a grey image {batch.shape[1]} x {batch.shape[2]} '
                f'pixels (from images of shape {tuple(getattr(images, "shape", ()))}); give it at '
                'least 2 x 2 pixels'
            )
        mask_batches = {}
        for mask_name, mask in validated_masks.items():
            if mask.size and int(mask.max()) > _MAX_MASK_CLASS:
                raise ValueError(
                    f'WandBLogger: mask {mask_name!r} has class id {int(mask.max())}; W&B masks take '
                    f'class ids 0-{_MAX_MASK_CLASS}'
                )
            mask_batches[mask_name] = mask.astype(np.uint8)
        labels = None
        if mask_class_labels is not None:
            if not isinstance(mask_class_labels, Mapping) or not all(
                isinstance(k, int) and not isinstance(k, bool) and isinstance(v, str)
                for k, v in mask_class_labels.items()
            ):
                raise TypeError(
                    f'WandBLogger: mask_class_labels must map int class ids to str labels, got {mask_class_labels!r}'
                )
            labels = dict(mask_class_labels)
        if batch.shape[-1] == 1:
            batch = batch[..., 0]  # wandb takes grey images as HW
        training_step = self._training_step(step)
        key = f'{name} Table' if use_table else name
        wandb_step = self._wandb_step(training_step, (key,), step is not None)
        wandb, run = self._wandb, self.run

        def log() -> None:
            wandb_images = []
            for index in range(batch.shape[0]):
                image_masks = None
                if mask_batches:
                    image_masks = {}
                    for mask_name, mask in mask_batches.items():
                        entry: dict[str, Any] = {'mask_data': mask[index]}
                        if labels is not None:
                            entry['class_labels'] = labels
                        image_masks[mask_name] = entry
                wandb_images.append(wandb.Image(batch[index], masks=image_masks))
            if use_table:
                table = wandb.Table(columns=[name])
                for wandb_image in wandb_images:
                    table.add_data(wandb_image)
                row = {key: table}
            else:
                row = {key: wandb_images}
            row[STEP_METRIC] = training_step
            run.log(row, step=wandb_step)

        self._submit(log)

    # ------------------------------------------------------------------ files
    def can_upload_files(self) -> bool:
        """True with ``log_artifacts=True``: files handed to the Logger become W&B artifacts."""
        return self.log_artifacts

    def _upload_artifact(
        self,
        state: Optional['State'],
        remote_file_name: str,
        file_path: Union[str, 'pathlib.Path'],
        *,
        overwrite: bool = False,
        copy: bool = True,
    ) -> None:
        """``upload_file`` with ``log_artifacts=True``: snapshot the file, log it as a W&B artifact in the background.

        Returns at once.

        Args:
            state: the run state (its timestamp gives the alias ``ep<epoch>-ba<batch>``).
            remote_file_name: the artifact's name (unsupported characters become ``.``; a
                warning says so) and, by its last component, the file's name inside it.
            file_path: the file.
            overwrite: ignored: W&B keeps every version of an artifact.
            copy: True snapshots the file (reflink or in-kernel copy); False hard-links it
                (the caller promises not to modify it; across filesystems the file is used in place).

        Raises:
            ValueError: the artifact name is longer than W&B's 128 characters.
            FileNotFoundError: the file does not exist.
            RuntimeError: this destination is not open, or an earlier wandb call failed.
        """
        del overwrite
        from dist_logging._files import copy_file, link_file

        self._check_open()
        remote = os.fspath(remote_file_name)
        name = _ARTIFACT_NAME_BAD.sub('.', remote)
        if name != remote:
            warnings.warn(
                f'WandBLogger: W&B artifact names take only letters, digits, "-", "_" and "."; '
                f'{remote!r} is stored as {name!r}',
                UserWarning,
                stacklevel=3,
            )
        if len(name) > ARTIFACT_NAME_MAX:
            raise ValueError(
                f'WandBLogger: artifact name {name!r} is {len(name)} characters; W&B allows {ARTIFACT_NAME_MAX}'
            )
        extension = name.rsplit('.', 1)[1] if '.' in name.strip('.') else ''
        artifact_type = 'model' if extension == 'pt' else (extension or 'file')
        if artifact_type.startswith('wandb'):
            artifact_type = 'file'  # W&B reserves types starting with 'wandb-' for itself
        file_name = posixpath.basename(remote.replace('\\', '/')) or name
        current = state or self._state
        timestamp = current.timestamp if current is not None else None
        aliases = ['latest']
        metadata: dict[str, Any] = {}
        if timestamp is not None:
            aliases.append(f'ep{timestamp.epoch}-ba{timestamp.batch}')
            metadata = {f'timestamp/{k}': v for k, v in dataclasses.asdict(timestamp).items()}

        path = os.fspath(file_path)
        if self._disabled:
            if not os.path.isfile(path):
                raise FileNotFoundError(f'WandBLogger.upload_file: {path!r} does not exist')
            return
        snapshot = os.path.join(self._staging_dir or '', f'dist_logging-{uuid.uuid4().hex}')
        owned = True
        try:
            if copy:
                copy_file(path, snapshot, mode=0o400)  # read-only, as wandb's own staged copies
            elif not link_file(path, snapshot):
                snapshot, owned = os.path.abspath(path), False
        except FileNotFoundError:
            raise FileNotFoundError(f'WandBLogger.upload_file: {path!r} does not exist') from None
        wandb, run = self._wandb, self.run

        def log() -> None:
            try:
                artifact = wandb.Artifact(name, type=artifact_type, metadata=metadata)
                # The snapshot is already private; wandb removes files in its staging folder once uploaded.
                artifact.add_file(snapshot, name=file_name, policy='immutable')
                run.log_artifact(artifact, aliases=aliases)
            except BaseException:
                if owned:
                    try:
                        os.unlink(snapshot)
                    except OSError:
                        pass
                raise

        try:
            self._submit(log)
        except BaseException:
            if owned:
                os.unlink(snapshot)
            raise

    def download_file(
        self, remote_file_name: str, destination: str, overwrite: bool = False, progress_bar: bool = True
    ) -> None:
        """Download the (single-file) artifact ``remote_file_name`` (``name`` or ``name:alias``) to ``destination``.

        Uses the W&B API (online), so it works on every rank, also where no run was opened,
        as long as ``entity`` and ``project`` are known (given, or from the run).

        Raises:
            ValueError: entity or project unknown.
            FileNotFoundError: no such artifact.
            FileExistsError: ``destination`` exists and ``overwrite`` is False.
            RuntimeError: the artifact holds more than one file.
        """
        del progress_bar
        wandb = import_installed('wandb', INSTALL_HINT)
        if not self.entity or not self.project:
            raise ValueError(
                'WandBLogger.download_file needs entity and project (give them, or open the run first); '
                f'got entity={self.entity!r}, project={self.project!r}'
            )
        if not overwrite and os.path.lexists(destination):
            raise FileExistsError(f'WandBLogger.download_file: {destination!r} exists (overwrite=False)')
        name = remote_file_name if ':' in remote_file_name else f'{remote_file_name}:latest'
        clean = _ARTIFACT_NAME_BAD.sub('.', name.split(':', 1)[0]) + ':' + name.split(':', 1)[1]
        try:
            artifact = wandb.Api().artifact(f'{self.entity}/{self.project}/{clean}')
        except wandb.errors.CommError as exc:
            raise FileNotFoundError(f'W&B artifact {clean!r} not found in {self.entity}/{self.project}: {exc}') from exc
        folder = os.path.dirname(os.path.abspath(destination))
        with tempfile.TemporaryDirectory(dir=folder, prefix='.dist_logging-wandb-') as tmp:
            artifact.download(root=tmp)
            files = [os.path.join(root, f) for root, _, names in os.walk(tmp) for f in names]
            if len(files) != 1:
                raise RuntimeError(
                    f'W&B artifact {clean!r} holds {len(files)} files; download_file takes '
                    'single-file artifacts (as upload_file makes)'
                )
            if overwrite:
                os.replace(files[0], destination)
            else:
                os.link(files[0], destination)  # atomic, and refuses to replace a file created meanwhile

    def __repr__(self) -> str:
        return f'WandBLogger(project={self.project!r}, ranks={self.ranks!r}, log_artifacts={self.log_artifacts})'
