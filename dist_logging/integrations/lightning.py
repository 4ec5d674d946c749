"""``DistLoggingLogger``: dist_logging as a PyTorch Lightning logger, with checkpoint uploads.

::

    from dist_logging.integrations.lightning import DistLoggingLogger

    trainer = Trainer(strategy='ddp', devices=2, logger=DistLoggingLogger(config='configs/per_rank.yaml'),
                      callbacks=[ModelCheckpoint(every_n_train_steps=500, save_last=True)])

Where Lightning calls it (2.x):

* on every rank: ``experiment`` (touched in setup, once the process group exists: the
  Logger is built there), ``log_hyperparams``, ``log_metrics``/``save`` (at each logging
  step), ``finalize`` (teardown, also after an exception);
* on global rank zero only: ``after_save_checkpoint``, right after ``trainer.save_checkpoint``
  wrote the file (and after the barrier that follows it). It only snapshots files and hands
  them to the upload workers: no collective, no waiting for the store.

Uses ``lightning.pytorch``, or ``pytorch_lightning`` when that is the one installed.
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from dist_logging.integrations._common import advance_to, CheckpointNamer, import_framework, LoggerHandle
from dist_logging.integrations._sections import StepSections

if TYPE_CHECKING:
    from dist_logging.logger import Logger

_pl = import_framework(('lightning.pytorch', 'pytorch_lightning'), 'lightning', 'dist_logging.integrations.lightning')

__all__ = ['DistLoggingLogger', 'RankSections', 'LoggerState']

# The framework's base classes, named for type checkers (a base must be a name: the module is imported at run time).
_LightningLogger: Any = _pl.loggers.Logger
_Callback: Any = _pl.Callback

log = logging.getLogger(__name__)

#: Lightning's own checkpoint folder layout is ``<root>/<name>/<version>/checkpoints``.
EXPERIMENT_NAME = 'dist_logging'


class DistLoggingLogger(_LightningLogger):
    """A Lightning ``Logger`` that routes everything through a :class:`~dist_logging.Logger`.

    Mapping: ``log_hyperparams`` -> ``log_hyperparameters`` (a dict or ``Namespace``; emitted by
    global rank zero, redacted); ``log_metrics(metrics, step)`` -> ``log_metrics(metrics,
    step=step)``; ``after_save_checkpoint`` -> each checkpoint file written since the last call
    (top-k, ``last.ckpt``, best) snapshotted and handed to ``upload_file``; ``finalize`` -> close
    (waits for the uploads). The Logger is built on first use, on every rank, once Lightning
    has created the process group. Its batch count follows Lightning's logging steps (see
    :func:`~dist_logging.integrations._common.advance_to`), so destinations that act every N
    batches (file flushes, console prints) keep their rhythm.

    Checkpoints are uploaded with ``overwrite=True``: the bucket mirrors what Lightning wrote,
    and Lightning rewrites a name (``last.ckpt`` at every save) when it means the newer file.
    An upload that fails is reported as a warning at the next save and raised by ``finalize``;
    it never raises on rank zero alone mid-training (the other ranks would wait for it at the
    next collective). A job killed with uploads pending leaves them in the upload staging
    folder for ``dist-logging drain``.

    Checkpoints go (unless ``ModelCheckpoint(dirpath=...)``) to
    ``<default_root_dir>/dist_logging/<run_name>/checkpoints``: ``name`` is ``'dist_logging'``
    and ``version`` the run name.

    One object, one run (as Lightning's loggers keep one ``version``): the first Logger built fixes
    the run name, and each later stage builds its Logger with that name (reading ``version``
    between stages builds nothing). Threads: none until the Logger's destinations start theirs
    (upload workers at the first upload, trackers when they open their run); all end at
    ``finalize`` (the end of every stage), :meth:`close`, garbage collection of this object,
    or interpreter exit (uploads drained as ``close()`` does). A pickled copy carries no Logger
    and no thread; it builds its own Logger, with the same run name once one was fixed.

    Args:
        logger: a :class:`~dist_logging.Logger`, or a zero-argument callable returning one (called
            on every rank when Lightning sets up). A Logger you pass is closed by the first ``finalize``
            and cannot log again; a factory or config builds a new one at each stage (``validate``,
            ``test``, ``predict`` after ``fit``) with the same run name (the factory must build new
            destinations at each call and leave ``run_name`` unset or fixed), so the stages append to
            the same per-rank files and MLflow run; with a config, each new destination also loads
            the previous one's ``state_dict()``, so W&B, Comet and Neptune runs continue too.
        config: with ``logger=None``, a YAML path or a mapping for :meth:`Logger.from_config`; with
            neither, the path in the environment variable ``DIST_LOGGING_CONFIG``.
        upload_checkpoints: whether ``after_save_checkpoint`` uploads checkpoint files.
        checkpoint_name: object-name template of a checkpoint; ``{name}`` is the file's name, with
            ``{run_name}``, ``{rank}`` and the other placeholders of
            :func:`~dist_logging.format_name_with_dist_and_time`.
        reduce: None (default): values pass through as Lightning gives them (Lightning already reduced
            what was logged with ``sync_dist=True``; other values are each rank's own, which per-rank
            destinations keep apart). Or ``'mean'``, ``'sum'``, ``'min'``, ``'max'``, ``'gather'``: every
            metric is combined across ranks by the Logger's flush at each logging step, one collective
            for all keys. ``log_metrics`` then is a collective: Lightning calls it on every rank; do not
            call it yourself from code that runs on one rank.

    Raises:
        ValueError: an unknown ``reduce``, a bad ``checkpoint_name`` (it must contain ``{name}``), both
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
        checkpoint_name: str = '{run_name}/checkpoints/{name}',
        reduce: Optional[str] = None,
    ):
        from dist_logging._logger.gather import REDUCTIONS

        super().__init__()
        if reduce is not None and reduce not in REDUCTIONS:
            raise ValueError(
                f'DistLoggingLogger: unknown reduce {reduce!r}; expected one of {list(REDUCTIONS)} or None'
            )
        if not isinstance(upload_checkpoints, bool):
            raise TypeError(f'DistLoggingLogger: upload_checkpoints must be a bool, got {upload_checkpoints!r}')
        self._namer = CheckpointNamer(checkpoint_name, ('name',), 'DistLoggingLogger')
        self._handle = LoggerHandle(logger, config, 'DistLoggingLogger')
        self.reduce = reduce
        self.upload_checkpoints = upload_checkpoints
        # path -> (mtime_ns, ctime_ns, size, inode) of what was handed over last; rank zero only.
        self._handed_over: dict[str, tuple[int, int, int, int]] = {}
        self._checkpoint_callbacks: list[Any] = []
        self._upload_errors: list[BaseException] = []
        self._finalizer = _close_when_collected(self)

    # ------------------------------------------------------------------ identity
    @property
    def experiment(self) -> 'Logger':
        """The :class:`~dist_logging.Logger`, on every rank.

        Lightning's own loggers return a dummy on ranks other than zero; ours returns the real
        Logger everywhere because the Logger applies each destination's rank policy itself
        (per-rank files, ``reduce=`` collectives and uploads need every rank).
        """
        return self._handle.get()

    @property
    def name(self) -> str:
        """``'dist_logging'``: checkpoints go to ``<root>/dist_logging/<run_name>/checkpoints``."""
        return EXPERIMENT_NAME

    @property
    def version(self) -> str:
        """The run name (identical on every rank), the same for the life of this object.

        Read before anything was logged, it builds the Logger (on every rank, once the process group
        exists, as Lightning reads it in setup); read between stages, it builds nothing.
        """
        run_name = self._handle.run_name
        return run_name if run_name is not None else self._handle.get().run_name

    @property
    def save_dir(self) -> Optional[str]:
        """None: Lightning puts checkpoints under the Trainer's ``default_root_dir``; the Logger's
        destinations choose their own paths."""
        return None

    @property
    def log_dir(self) -> Optional[str]:
        """None, as :attr:`save_dir` (the destinations' paths come from their templates)."""
        return None

    # ------------------------------------------------------------------ logging
    def log_hyperparams(self, params: Union[Mapping[str, Any], argparse.Namespace], *args: Any, **kwargs: Any) -> None:
        """Log hyperparameters (a dict or ``Namespace``); emitted once, by global rank zero.

        Raises:
            TypeError: ``params`` is neither a mapping nor a Namespace.
        """
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        elif params is None:
            params = {}
        if not isinstance(params, Mapping):
            raise TypeError(
                f'DistLoggingLogger.log_hyperparams: expected a dict or argparse.Namespace, got {type(params).__name__}'
            )
        self._handle.get().log_hyperparameters(dict(params))

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        """Log ``metrics`` at Lightning's ``step``; with ``reduce`` set, combine them across ranks (a collective)."""
        logger = self._handle.get()
        if self.reduce is None:
            logger.log_metrics(metrics, step=step)
        else:
            logger.log_metrics(metrics, step=step, reduce=self.reduce)
            logger.flush()
        advance_to(logger, step)  # periodic destinations (file flush, console) act on Lightning's clock

    # ------------------------------------------------------------------ checkpoints
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Hand every checkpoint file written since the last call to ``upload_file`` (rank zero; no collective).

        A failed upload surfaces here as a warning (raising on one rank would leave the others
        waiting) and is raised by :meth:`finalize`.
        """
        if not self.upload_checkpoints:
            return
        if not any(_same_callback(checkpoint_callback, known) for known in self._checkpoint_callbacks):
            self._checkpoint_callbacks.append(checkpoint_callback)
        just_saved = getattr(checkpoint_callback, '_last_checkpoint_saved', None)
        self._upload_new_files(checkpoint_callback, just_saved=just_saved)

    def _upload_new_files(self, callback: Any, just_saved: Optional[str] = None) -> None:
        try:
            paths = _checkpoint_paths(callback)
        except ReferenceError:  # Lightning passes a weak proxy; the callback is gone
            return
        logger = self._handle.get()
        for path in paths:
            try:
                info = os.stat(path)  # follows save_last='link' symlinks to the checkpoint they name
            except OSError:
                continue
            signature = (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino)
            if self._handed_over.get(path) == signature and path != just_saved:
                continue
            try:
                self._namer.upload(logger, os.path.realpath(path), overwrite=True, name=os.path.basename(path))
            except Exception as exc:  # noqa: BLE001 - see after_save_checkpoint: never raise on rank zero alone
                self._upload_errors.append(exc)
                warnings.warn(
                    f'DistLoggingLogger: checkpoint upload problem ({type(exc).__name__}: {exc}); '
                    'raised again by finalize()',
                    RuntimeWarning,
                    stacklevel=3,
                )
            self._handed_over[path] = signature

    def finalize(self, status: str) -> None:
        """Upload checkpoint files not yet handed over (e.g. a ``last.ckpt`` link), then close the Logger.

        Closing waits for every upload and issues no collective. Called on every rank.

        Raises:
            UploadError: (or the first error of a checkpoint upload) naming what did not land, unless
                ``status`` is not ``'success'``: then Lightning is already raising the training error,
                and upload errors are logged instead of replacing it.
        """
        errors: list[BaseException] = []
        if self.upload_checkpoints and self._handle.is_built:
            for callback in self._checkpoint_callbacks:
                self._upload_new_files(callback)
        errors, self._upload_errors = self._upload_errors, []
        self._checkpoint_callbacks = []
        try:
            self._handle.close()
        except Exception as exc:  # noqa: BLE001 - combined with the errors recorded during training
            errors.append(exc)
        if not errors:
            return
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f'also: {type(other).__name__}: {other}')
        if status != 'success':
            log.error('DistLoggingLogger.finalize(%r): %s: %s', status, type(first).__name__, first)
            return
        raise first

    def close(self) -> None:
        """Close the Logger now (waits for its uploads; no collective), as :meth:`finalize` does; idempotent.

        For a logger used outside a ``Trainer``. Unneeded otherwise: ``finalize`` closes it at the end
        of each stage, and garbage collection or interpreter exit closes one left open.

        Raises:
            UploadError: as :meth:`finalize` with ``status='success'``.
        """
        self.finalize('success')

    def __getstate__(self) -> dict[str, Any]:
        # Spawn-based launchers pickle the Trainer: each process builds its own Logger (the handle
        # leaves a Logger it built behind) and a copy gets its own collector hook.
        state = self.__dict__.copy()
        state['_checkpoint_callbacks'] = []
        state.pop('_finalizer', None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._finalizer = _close_when_collected(self)


class RankSections(_Callback):
    """Marks the rank report's sections from Lightning's batch hooks (a Lightning ``Logger`` gets none).

    ::

        dl = DistLoggingLogger(config='configs/per_rank.yaml')   # with rank_report_every: 100
        trainer = Trainer(strategy='ddp', logger=dl, callbacks=[RankSections(dl)])

    On every rank: ``data`` (``on_train_batch_end`` to the next ``on_train_batch_start``), ``forward``
    (to ``on_before_backward``), ``backward`` as a wait section (it holds DDP's gradient sync, where
    the fast ranks wait for the slow one), ``optimizer`` (``on_before_optimizer_step`` to
    ``on_train_batch_end``); one report step per training batch (docs/stragglers.md). Nothing
    happens when the Logger's reports are off.

    Args:
        adapter: the :class:`DistLoggingLogger` whose Logger reports.

    Raises:
        TypeError: ``adapter`` is not a :class:`DistLoggingLogger`.
    """

    def __init__(self, adapter: DistLoggingLogger):
        if not isinstance(adapter, DistLoggingLogger):
            raise TypeError(f'RankSections: expected a DistLoggingLogger, got {type(adapter).__name__}')
        self._adapter = adapter
        self._sections = StepSections('RankSections')

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._sections.switch(self._adapter.experiment, 'forward')

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._sections.switch(self._adapter.experiment, 'backward', wait=True)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._sections.switch(self._adapter.experiment, None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._sections.switch(self._adapter.experiment, 'optimizer')

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._sections.step_end(self._adapter.experiment, trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._sections.switch(self._adapter.experiment, None)


class LoggerState(_Callback):
    """Keeps the Logger's state in Lightning's checkpoints, so a resumed fit continues its step count and rewinds
    no history (a Lightning ``Logger`` takes no part in checkpoints; a callback does).

    ::

        dl = DistLoggingLogger(config='configs/per_rank.yaml')
        trainer = Trainer(logger=dl, callbacks=[LoggerState(dl)])
        trainer.fit(model, ckpt_path='last')     # the Logger resumes at the checkpoint's step

    ``state_dict`` is :meth:`Logger.state_dict`, stored by Lightning under ``checkpoint['callbacks']``;
    ``load_state_dict`` hands it back to :meth:`Logger.load_state_dict` when Lightning restores the
    checkpoint, on every rank: its destinations then show each step once, the resumed run's values
    winning (the "Resume" section of docs/destinations.md).

    Args:
        adapter: the :class:`DistLoggingLogger` whose Logger is saved and restored.

    Raises:
        TypeError: ``adapter`` is not a :class:`DistLoggingLogger`.
    """

    def __init__(self, adapter: DistLoggingLogger):
        if not isinstance(adapter, DistLoggingLogger):
            raise TypeError(f'LoggerState: expected a DistLoggingLogger, got {type(adapter).__name__}')
        self._adapter = adapter

    def state_dict(self) -> dict[str, Any]:
        """The Logger's state (:meth:`Logger.state_dict`)."""
        return self._adapter.experiment.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the Logger (:meth:`Logger.load_state_dict`); an empty state (none saved) is ignored.

        Raises:
            TypeError, ValueError: as :meth:`Logger.load_state_dict`.
        """
        if state_dict:
            self._adapter.experiment.load_state_dict(state_dict)


def _close_when_collected(adapter: DistLoggingLogger) -> weakref.finalize:
    """Close the adapter's Logger when the adapter is garbage-collected, or at interpreter exit (draining
    its uploads as ``close()`` does), if no ``finalize`` did. The hook holds the handle, never the adapter."""
    return weakref.finalize(adapter, _close_handle, adapter._handle)


def _close_handle(handle: LoggerHandle) -> None:
    try:
        handle.close()
    except Exception as exc:  # noqa: BLE001 - a collector or exit hook has nobody to raise to
        log.error(
            'DistLoggingLogger: closing the Logger of an adapter that was not finalized: %s: %s',
            type(exc).__name__,
            exc,
            exc_info=exc,
        )


def _same_callback(a: Any, b: Any) -> bool:
    try:
        return a == b or a is b
    except ReferenceError:
        return False


def _checkpoint_paths(callback: Any) -> list[str]:
    """The files a checkpoint callback knows of: top-k, best, last and the one it saved last (deduplicated)."""
    paths: list[str] = []
    best_k = getattr(callback, 'best_k_models', None) or {}
    candidates = [
        *best_k,
        getattr(callback, 'best_model_path', ''),
        getattr(callback, 'last_model_path', ''),
        getattr(callback, '_last_checkpoint_saved', ''),
    ]
    for path in candidates:
        if isinstance(path, (str, os.PathLike)) and os.fspath(path) and os.fspath(path) not in paths:
            paths.append(os.fspath(path))
    return paths
