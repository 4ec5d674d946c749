"""``DistLoggingCallback``: dist_logging as a Hugging Face ``Trainer`` callback, with checkpoint uploads.

::

    from dist_logging.integrations.transformers import DistLoggingCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[DistLoggingCallback(config='logger.yaml')])

or, after ``import dist_logging.integrations.transformers`` (which registers the name),
``TrainingArguments(report_to=['dist_logging'])`` with the config in the environment variable
``DIST_LOGGING_CONFIG``.

The Trainer calls callbacks on every rank. It gives every rank the same, already averaged
``logs`` in ``on_log``: the Logger's rank policy makes rank-zero destinations emit them once,
and per-rank destinations keep each rank's copy. When it saves, global rank zero writes the
model, optimizer, scheduler and trainer state into ``checkpoint-N`` and every rank writes its
own ``rng_state_{rank}.pth``, with no barrier before ``on_save``: so in ``on_save`` each rank
uploads only files it wrote itself (they are complete when its ``on_save`` runs) and never
reads a file another rank may still be writing.
"""

from __future__ import annotations

import numbers
import os
import re
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Optional

from dist_logging.integrations._common import advance_to, CheckpointNamer, import_framework, LoggerHandle
from dist_logging.integrations._sections import StepSections

if TYPE_CHECKING:
    from dist_logging.logger import Logger

_transformers = import_framework(('transformers',), 'transformers', 'dist_logging.integrations.transformers')
_integration_utils = import_framework(
    ('transformers.integrations.integration_utils',), 'transformers', 'dist_logging.integrations.transformers'
)

__all__ = ['DistLoggingCallback']

# The framework's base classes, named for type checkers (a base must be a name: the module is imported at run time).
_TrainerCallback: Any = _transformers.TrainerCallback

_RNG_STATE = re.compile(r'rng_state(?:_(\d+))?\.pth')
_CHECKPOINT_PREFIX = 'checkpoint'  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR


class DistLoggingCallback(_TrainerCallback):
    """A ``TrainerCallback`` that logs through a :class:`~dist_logging.Logger` and uploads checkpoints.

    Mapping: ``on_train_begin`` -> ``log_hyperparameters`` (``TrainingArguments.to_dict()`` plus the
    model config under ``model_config/``; secrets such as ``hub_token`` are redacted);
    ``on_log`` -> ``log_metrics(numbers, step=state.global_step)`` and ``log_traces`` for other
    values; ``on_save`` -> the new ``checkpoint-N`` folder handed to ``upload_file`` file by file
    (snapshots: training goes on while they upload): global rank zero uploads the files it wrote,
    every rank its own ``rng_state_{rank}.pth``; ``on_train_end`` -> close the Logger when this
    callback built it (waits for the uploads).

    Resume: a ``trainer.train(resume_from_checkpoint=...)`` restores the ``TrainerState`` before
    ``on_train_begin``, which then finds ``state.global_step > 0`` and calls
    :meth:`Logger.resume_at` with it (and the epoch): the Logger continues at the checkpoint's step
    and its destinations show each step once, the resumed run's values winning (the "Resume" section
    of docs/destinations.md).

    With ``rank_report_every=N`` in the Logger, the hooks mark the rank report's sections on every
    rank (``data`` between steps, ``forward_backward`` as a wait section since it holds the gradient
    sync, ``optimizer``) and count one report step per optimizer step (docs/stragglers.md).

    Checkpoints are uploaded with ``overwrite=True`` (the bucket mirrors the output folder). An
    upload problem is reported as a warning when it surfaces and raised by ``on_train_end``;
    it never raises mid-training on one rank (the others would wait for it in the next
    collective). A job killed with uploads pending leaves them in the upload staging folder
    for ``dist-logging drain``.

    Args:
        logger: a :class:`~dist_logging.Logger`, or a zero-argument callable returning one (called
            on every rank at the first hook, once the process group exists). A given Logger is
            not closed here: close it after ``trainer.train()`` to wait for its uploads.
        config: with ``logger=None``, a YAML path or a mapping for :meth:`Logger.from_config`;
            with neither, the path in the environment variable ``DIST_LOGGING_CONFIG``.
        upload_checkpoints: whether ``on_save`` uploads the checkpoint folder.
        checkpoint_name: object-name template of a checkpoint file: ``{checkpoint}`` is the folder's
            name (``checkpoint-500``), ``{name}`` the file's path inside it, with ``{run_name}``,
            ``{rank}`` and the other placeholders of :func:`~dist_logging.format_name_with_dist_and_time`.

    Raises:
        ValueError: a bad ``checkpoint_name`` (it must contain ``{checkpoint}`` and ``{name}``), both
            or neither of ``logger``/``config`` (without ``DIST_LOGGING_CONFIG``), a bad config key.
        TypeError: a ``logger`` that is neither a Logger nor callable, a non-bool ``upload_checkpoints``.
        FileNotFoundError: the config file does not exist.
    """

    def __init__(
        self,
        logger: Any = None,
        *,
        config: Any = None,
        upload_checkpoints: bool = True,
        checkpoint_name: str = '{run_name}/checkpoints/{checkpoint}/{name}',
    ):
        if not isinstance(upload_checkpoints, bool):
            raise TypeError(f'DistLoggingCallback: upload_checkpoints must be a bool, got {upload_checkpoints!r}')
        self._namer = CheckpointNamer(checkpoint_name, ('checkpoint', 'name'), 'DistLoggingCallback')
        self._handle = LoggerHandle(logger, config, 'DistLoggingCallback')
        self.upload_checkpoints = upload_checkpoints
        self._upload_errors: list[BaseException] = []
        self._sections = StepSections('DistLoggingCallback')

    @property
    def logger(self) -> 'Logger':
        """The :class:`~dist_logging.Logger` (built on first access)."""
        return self._handle.get()

    # ------------------------------------------------------------------ hooks (every rank)
    # The Logger's clock follows state.global_step: each optimizer step ends one batch for the
    # destinations (see advance_to), after that step's logs and saves, so periodic destinations
    # (file flushes, console prints) see them. None of these hooks issues a collective.
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        hparams = dict(args.to_dict())
        model_config = getattr(model, 'config', None)
        if model_config is not None and hasattr(model_config, 'to_dict'):
            hparams.update({f'model_config/{key}': value for key, value in model_config.to_dict().items()})
        logger = self._handle.get()
        if int(state.global_step or 0) > 0 and logger.state.timestamp.batch != int(state.global_step):
            # Resumed from a checkpoint: the TrainerState is restored before this hook.
            logger.resume_at(int(state.global_step), epoch=int(state.epoch or 0))
        logger.log_hyperparameters(hparams)
        logger.fit_start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            logger = self._handle.get()
            advance_to(logger, state.global_step)
            # Forward and backward hold DDP's gradient sync, where fast ranks wait: a wait section.
            self._sections.switch(logger, 'forward_backward', wait=True)

    # Rank report sections (Logger(rank_report_every=N); docs/stragglers.md): data (between steps),
    # forward_backward (a wait: it holds the gradient sync), optimizer. One report step per optimizer step.
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            self._sections.switch(self._handle.get(), 'optimizer')

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            self._sections.switch(self._handle.get(), None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            self._sections.step_end(self._handle.get(), state.global_step)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            self._handle.get().epoch_start()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle.is_built:
            from dist_logging.destination import Event

            logger = self._handle.get()
            advance_to(logger, state.global_step)
            logger.run_event(Event.EPOCH_END)  # not Logger.epoch_end(): that flushes gathered metrics (a collective)
            logger.state.advance_epoch()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: Optional[Mapping[str, Any]] = None, **kwargs: Any
    ) -> None:
        if not logs:
            return
        logger = self._handle.get()
        metrics: dict[str, Any] = {}
        traces: dict[str, Any] = {}
        for key, value in logs.items():
            is_number = isinstance(value, numbers.Number) and not isinstance(value, bool)
            (metrics if is_number else traces)[key] = value
        if metrics:
            logger.log_metrics(metrics, step=state.global_step)
        if traces:
            logger.log_traces(traces)
        advance_to(logger, state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.upload_checkpoints:
            return
        checkpoint = f'{_CHECKPOINT_PREFIX}-{state.global_step}'
        folder = os.path.join(args.output_dir, checkpoint)
        if not os.path.isdir(folder):
            # E.g. hyperparameter search trials, which save under a per-trial folder.
            warnings.warn(
                f'DistLoggingCallback.on_save: {folder} does not exist; nothing uploaded', RuntimeWarning, stacklevel=2
            )
            return
        logger = self._handle.get()
        advance_to(logger, state.global_step)
        for relative in _own_files(folder, args.process_index, args.process_index == 0 and args.should_save):
            try:
                self._namer.upload(
                    logger, os.path.join(folder, relative), overwrite=True, checkpoint=checkpoint, name=relative
                )
            except Exception as exc:  # noqa: BLE001 - never raise on one rank mid-training (see the class doc)
                self._upload_errors.append(exc)
                warnings.warn(
                    f'DistLoggingCallback: checkpoint upload problem ({type(exc).__name__}: {exc}); '
                    'raised again by on_train_end',
                    RuntimeWarning,
                    stacklevel=2,
                )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the Logger if this callback built it (waits for uploads), then raise what failed.

        Raises:
            UploadError: (or the first checkpoint upload error) naming what did not land.
        """
        errors, self._upload_errors = self._upload_errors, []
        if self._handle.is_built:
            self._sections.switch(self._handle.get(), None)
            advance_to(self._handle.get(), state.global_step)
        try:
            if self._handle.built_here:
                self._handle.close()  # ends the fit, waits for uploads
            elif self._handle.is_built:
                self._handle.get().fit_end()
        except Exception as exc:  # noqa: BLE001 - combined with the errors recorded during training
            errors.append(exc)
        if errors:
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f'also: {type(other).__name__}: {other}')
            raise first


def _own_files(folder: str, rank: int, writes_shared_files: bool) -> list[str]:
    """Files of ``folder`` (relative POSIX paths, sorted) that process ``rank`` wrote itself.

    ``rng_state_{r}.pth`` belongs to rank ``r`` (``rng_state.pth`` to a world of one); every other file
    was written by the process that saves shared files (global rank zero) and, in sharded set-ups,
    completed by the saving collective before ``on_save``.
    """
    owned = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for file_name in sorted(files):
            match = _RNG_STATE.fullmatch(file_name)
            if match is not None and root == folder:
                mine = (
                    match.group(1) is None and rank == 0 or match.group(1) is not None and int(match.group(1)) == rank
                )
            else:
                mine = writes_shared_files
            if mine:
                owned.append(os.path.relpath(os.path.join(root, file_name), folder).replace(os.sep, '/'))
    return owned


# report_to=['dist_logging']: the Trainer looks names up in this table and builds the class with no
# arguments (the config then comes from DIST_LOGGING_CONFIG). Transformers has no public registry
# for it; the table has been stable across 4.x and 5.x.
if isinstance(getattr(_integration_utils, 'INTEGRATION_TO_CALLBACK', None), dict):
    _integration_utils.INTEGRATION_TO_CALLBACK['dist_logging'] = DistLoggingCallback
