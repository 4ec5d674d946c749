"""CometMLLogger: a Comet experiment per job (or per rank): parameters, metrics, tables, images, traces."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from dist_logging import dist
from dist_logging._artifacts import jsonable, table_json
from dist_logging._values import format_log_data_value, metric_scalar
from dist_logging.destination import check_state
from dist_logging.destinations._optional import import_installed, require_installed
from dist_logging.destinations._tracker import TrackerDestination
from dist_logging.naming import DIST_PLACEHOLDERS, format_name_with_dist, validate_template

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['CometMLLogger']

INSTALL_HINT = 'CometMLLogger needs the comet_ml package: pip install dist-logging[comet]'


def _check_logged(result: Any, what: str) -> None:
    # comet_ml reports a refused asset or image on its own log and returns None: make it an error.
    if result is None:
        raise RuntimeError(f'Comet did not accept {what} (see the COMET ERROR line above for why)')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class CometMLLogger(TrackerDestination):
    """Logs to a `Comet <https://www.comet.com>`_ experiment (Composer's ``CometMLLogger`` API).

    The experiment is created when the Logger opens this destination and ended at
    ``close()``. By default one experiment per job, on global rank zero; with every rank
    logging (``rank_zero_only=False`` or ``ranks='all'``) each rank has its own, named
    ``{name}-rank{rank}`` (as in Composer).

    * hyperparameters -> experiment parameters (``log_parameters``; already redacted by the
      Logger; Comet flattens nested keys as ``outer|inner``);
    * metrics -> metrics at their step (``step``, else the Logger's batch count);
    * tables -> a JSON asset ``<name>.json`` at the step, holding
      ``{"columns": [...], "data": [...]}`` (pandas' ``orient='split'``, as Composer's);
    * images -> one image each, ``<name>_<index>`` at the step (a 1-D array is one row of grey
      pixels, as Comet draws what Composer's logger hands it); with masks also
      ``<name>_<index> + <mask> mask overlaid`` and ``<mask>_<index> mask`` (Composer's names);
    * traces -> numbers as metrics ``traces/<name>`` at the current batch, anything else as
      the experiment's "other" value ``traces/<name>`` (the latest wins);
    * files: not taken (as Composer's, which implements no ``upload_file``).

    Offline (``online=False``, or ``exp_kwargs={'offline_directory': ...}``) the experiment is
    a ``comet_ml.OfflineExperiment`` written as a zip archive into the offline directory
    (``COMET_OFFLINE_DIRECTORY``, default ``.cometml-runs``) when it ends; ``comet upload``
    sends it later.

    Nothing here waits for Comet on the training loop: every comet_ml call (including image
    encoding and ``end()``) runs in order on one background thread. A log call only
    validates and copies its data. Failures of background calls are raised (as
    ``RuntimeError`` with the cause) at the next call or at close. Importing comet_ml
    installs its auto-logging hooks process-wide unless ``COMET_DISABLE_AUTO_LOGGING=1``.

    Args:
        workspace: the Comet workspace.
        project_name: the Comet project.
        log_code: log the calling script's code to the experiment.
        log_graph: log the model graph.
        name: the experiment name (a template: ``{run_name}``, ...; default: the Logger's run name).
        rank_zero_only: log on global rank zero only (Composer's switch; ``ranks=`` wins).
        exp_kwargs: more keyword arguments for ``comet_ml.Experiment`` (or ``OfflineExperiment``).
        online: False for an offline experiment; None decides by ``exp_kwargs``.
        ranks: rank policy (``'zero'``, ``'local_zero'``, ``'all'``); overrides ``rank_zero_only``.
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.

    Raises:
        ImportError: comet_ml is not installed (with the extra to install).
        ValueError: an empty workspace/project/name, a bad name template, an ``exp_kwargs``
            value that contradicts an argument, ``online=True`` with ``offline_directory``, or
            ``rank_zero_only=False`` with a rank-zero ``ranks`` policy.
        TypeError: ``exp_kwargs`` not a mapping with str keys, ``online`` not a bool or None.
    """

    tracker_owner = 'CometMLLogger'
    opens_on_first_use = True  # as Composer's, whose experiment exists from its constructor

    def __init__(
        self,
        workspace: Optional[str] = None,
        project_name: Optional[str] = None,
        log_code: bool = False,
        log_graph: bool = False,
        name: Optional[str] = None,
        rank_zero_only: bool = True,
        exp_kwargs: Optional[Mapping[str, Any]] = None,
        *,
        online: Optional[bool] = None,
        ranks: Optional[str] = None,
        log_level: Any = None,
        optional: Optional[bool] = None,
    ):
        owner = type(self).__name__
        ranks = self._ranks_from_rank_zero_only(ranks, rank_zero_only, owner)
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        require_installed('comet_ml', INSTALL_HINT)
        for arg, value in (('workspace', workspace), ('project_name', project_name), ('name', name)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f'{owner}: {arg} must be a non-empty string or None, got {value!r}')
        if name is not None:
            validate_template(name, DIST_PLACEHOLDERS)
        if exp_kwargs is None:
            exp_kwargs = {}
        if not isinstance(exp_kwargs, Mapping) or not all(isinstance(k, str) for k in exp_kwargs):
            raise TypeError(
                f'{owner}: exp_kwargs must be a mapping of comet_ml.Experiment keyword arguments, got {exp_kwargs!r}'
            )
        if online is not None and not isinstance(online, bool):
            raise TypeError(f'{owner}: online must be a bool or None, got {online!r}')
        kwargs = dict(exp_kwargs)
        for key, value in (('workspace', workspace), ('project_name', project_name)):
            if value is not None:
                if kwargs.get(key) is not None and kwargs[key] != value:
                    raise ValueError(f'{owner}: {key}={value!r} contradicts exp_kwargs[{key!r}]={kwargs[key]!r}')
                kwargs[key] = value
        for key, flag in (('log_code', log_code), ('log_graph', log_graph)):
            # The arguments default to False; exp_kwargs may switch them on, never a True argument off.
            if flag and key in kwargs and not kwargs[key]:
                raise ValueError(f'{owner}: {key}=True contradicts exp_kwargs[{key!r}]={kwargs[key]!r}')
            kwargs[key] = bool(flag) or bool(kwargs.get(key, False))
        if online is True and 'offline_directory' in kwargs:
            raise ValueError(
                f'{owner}: online=True contradicts exp_kwargs[\'offline_directory\']={kwargs["offline_directory"]!r}'
            )
        self.online = online if online is not None else 'offline_directory' not in kwargs
        self.name = name  # the experiment's name once open (Composer's attribute), the template until then
        self._name_template = name
        self.rank_zero_only = self.ranks == 'zero'
        self.exp_kwargs = kwargs
        self.experiment: Any = None
        self._saved_key: Optional[str] = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The experiment's key (``experiment_key``): loaded into a new CometMLLogger, it continues that experiment."""
        key = self.experiment.get_key() if self.experiment is not None else self._saved_key
        return {'experiment_key': key}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved experiment when the Logger opens this destination (``comet_ml.ExistingExperiment``,
        or ``ExistingOfflineExperiment`` offline).

        Raises:
            TypeError, ValueError: as :meth:`LoggerDestination.load_state_dict`.
        """
        key = check_state(self, state, ('experiment_key',)).get('experiment_key')
        current = self.experiment.get_key() if self.experiment is not None else None
        if self._restore_run(key, current, 'experiment'):
            self._saved_key = key

    # ------------------------------------------------------------------ lifecycle
    def experiment_name(self, run_name: str) -> str:
        """The Comet experiment name this rank uses for the Logger run ``run_name``.

        Raises:
            ValueError: a template that cannot be filled.
        """
        template = self._name_template
        name = format_name_with_dist(template or '{run_name}', run_name)
        if self.ranks != 'zero' and '{rank}' not in (template or ''):
            name = f'{name}-rank{dist.get_global_rank()}'
        return name

    def init(self, state: 'State', logger: 'Logger') -> None:
        if self.experiment is not None and not self._ended:
            return  # already open
        comet_ml = import_installed('comet_ml', INSTALL_HINT)
        kwargs = dict(self.exp_kwargs)
        if self._saved_key is not None:  # load_state_dict: continue that experiment
            factory = comet_ml.ExistingExperiment if self.online else comet_ml.ExistingOfflineExperiment
            kwargs['experiment_key'] = self._saved_key
        else:
            factory = comet_ml.Experiment if self.online else comet_ml.OfflineExperiment
        experiment = factory(**kwargs)
        self.name = self.experiment_name(state.run_name)
        experiment.set_name(self.name)
        experiment.log_other('Created from', 'dist_logging')
        self.experiment = experiment
        self._start_worker(state)

    def _final_jobs(self, failed: bool) -> list[Callable[[], None]]:
        """End the experiment (an offline one writes its archive); Comet has no failed status to set."""
        return [self.experiment.end]

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        if self._worker is None:
            self._open_if_alone()
        parameters = jsonable(hyperparameters)  # a copy the caller cannot change
        experiment = self.experiment
        self._submit(lambda: experiment.log_parameters(parameters))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        if self._worker is None:
            self._open_if_alone()
        values = {str(k): metric_scalar(str(k), v) for k, v in metrics.items()}  # NaN stays a float NaN
        at = self._training_step(step)
        experiment = self.experiment
        self._submit(lambda: experiment.log_metrics(values, step=at))

    def log_traces(self, traces: dict[str, Any]) -> None:
        if self._worker is None:
            self._open_if_alone()
        numbers, others = {}, {}
        for key, value in jsonable(dict(traces)).items():
            if _is_number(value) or isinstance(value, bool):
                numbers[f'traces/{key}'] = float(value)
            else:
                others[f'traces/{key}'] = value if isinstance(value, str) else format_log_data_value(value)
        at = self._training_step(None)
        experiment = self.experiment

        def log() -> None:
            if numbers:
                experiment.log_metrics(numbers, step=at)
            if others:
                experiment.log_others(others)

        self._submit(log)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        if self._worker is None:
            self._open_if_alone()
        text = table_json([str(c) for c in columns], [list(r) for r in rows], ascii=False)
        at = self._training_step(step)
        experiment = self.experiment

        def log() -> None:
            _check_logged(
                experiment.log_asset_data(text, name=f'{name}.json', step=at, overwrite=True), f'table {name!r}'
            )

        self._submit(log)

    def log_images(
        self,
        images: Any,
        name: str = 'Image',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks: Optional[dict[str, Any]] = None,
        mask_class_labels: Optional[dict[int, str]] = None,
        use_table: bool = True,
    ) -> None:
        import numpy as np

        from dist_logging._images import encode_png, overlay_masks, snapshot_images

        del use_table, mask_class_labels  # W&B-only options, as in Composer
        if self._worker is None:
            self._open_if_alone()
        batch, mask_batches = snapshot_images(images, channels_last, masks)
        at = self._training_step(step)
        experiment = self.experiment

        def log() -> None:
            # Encoded here (PNG, no third-party imaging library) and handed to Comet as files.
            for index in range(batch.shape[0]):
                _check_logged(
                    experiment.log_image(io.BytesIO(encode_png(batch[index])), name=f'{name}_{index}', step=at),
                    f'image {name}_{index}',
                )
            for mask_name, mask in mask_batches.items():
                overlaid = overlay_masks(batch, mask, alpha=0.6)
                alone = overlay_masks(np.zeros_like(batch), mask, alpha=1.0)
                for index in range(batch.shape[0]):
                    for image_name, image in (
                        (f'{name}_{index} + {mask_name} mask overlaid', overlaid[index]),
                        (f'{mask_name}_{index} mask', alone[index]),
                    ):
                        _check_logged(
                            experiment.log_image(io.BytesIO(encode_png(image)), name=image_name, step=at),
                            f'image {image_name}',
                        )

        self._submit(log)

    def __repr__(self) -> str:
        return (
            f'CometMLLogger(project_name={self.exp_kwargs.get("project_name")!r}, ranks={self.ranks!r}, '
            f'online={self.online})'
        )
