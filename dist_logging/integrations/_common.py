"""What the framework adapters share: importing a framework with an install hint, the
lazily built Logger, and checkpoint object names.

Nothing here imports a framework or torch.distributed at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

if TYPE_CHECKING:
    from dist_logging.logger import Logger

__all__ = ['CONFIG_ENV', 'import_framework', 'LoggerHandle', 'CheckpointNamer', 'advance_to']

#: The environment variable naming a Logger config (a YAML path) for adapters built with no
#: ``logger`` and no ``config`` (e.g. ``report_to=['dist_logging']`` or ``log_with='dist_logging'``).
CONFIG_ENV = 'DIST_LOGGING_CONFIG'
RUN_NAME_ENV = 'DIST_LOGGING_RUN_NAME'  # read by the Logger when no run_name is given


def import_framework(candidates: tuple[str, ...], extra: str, what: str) -> Any:
    """Import the first importable module of ``candidates``.

    Raises:
        ImportError: none is installed; the message names the extra to install.
    """
    errors = []
    for name in candidates:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            if getattr(exc, 'name', None) not in (None, name, name.split('.')[0]):
                raise  # the framework is installed but broken: show its own error
            errors.append(exc)
    raise ImportError(
        f'{what} needs {" or ".join(candidates)}, which is not installed: pip install "dist-logging[{extra}]"'
    ) from (errors[0] if errors else None)


def _check_config(config: Any, owner: str) -> Any:
    from dist_logging.config import load_config

    if not isinstance(config, (str, os.PathLike, Mapping)):
        raise TypeError(f'{owner}: config must be a path to a YAML file or a mapping, got {type(config).__name__}')
    # Every key is checked now, at construction, not when the first hook runs.
    return load_config(config)


class LoggerHandle:
    """The adapter's :class:`~dist_logging.Logger`: given, built by a factory, or built from a config, on first use.

    Building waits for the first use because the Logger reads its rank from the process
    group, which frameworks create after the adapter (Lightning's own launcher sets no
    ``RANK``).

    Args:
        logger: a Logger, a zero-argument callable returning one, or None.
        config: with ``logger=None``, a YAML path or a mapping for :meth:`Logger.from_config`;
            with neither, the path in the environment variable ``DIST_LOGGING_CONFIG``.
        owner: the adapter's name, for messages.
        run_name: the run name to give a Logger built from a config (None: the config's or default).

    One handle is one run: the run name of the first Logger built (or given) is kept, and every
    Logger built later (after :meth:`close`, e.g. for Lightning's ``test`` after ``fit``) gets the
    same name, so its destinations continue the same files and tracker runs.

    Raises:
        TypeError: ``logger`` is neither a Logger nor callable; ``config`` is not a path or mapping.
        ValueError: both ``logger`` and ``config``; neither and no ``DIST_LOGGING_CONFIG``; a bad config key.
        FileNotFoundError: the config file does not exist.
    """

    def __init__(self, logger: Any, config: Any, owner: str, run_name: Optional[str] = None):
        from dist_logging.logger import Logger

        self.owner = owner
        self._logger: Optional['Logger'] = None
        self._factory: Optional[Callable[[], 'Logger']] = None
        self._config: Any = None
        self._run_name = run_name
        if logger is not None and config is not None:
            raise ValueError(f'{owner}: pass either logger= or config=, not both')
        if isinstance(logger, Logger):
            self._logger = logger
        elif logger is not None:
            if not callable(logger):
                raise TypeError(
                    f'{owner}: logger must be a dist_logging.Logger or a zero-argument callable '
                    f'returning one, got {type(logger).__name__}'
                )
            self._factory = logger
        else:
            if config is None:
                config = os.environ.get(CONFIG_ENV) or None
                if config is None:
                    raise ValueError(
                        f'{owner}: no Logger given: pass logger= (a Logger or a callable returning one), '
                        f'config= (a YAML path or a dict), or set the environment variable {CONFIG_ENV}'
                    )
            self._config = _check_config(config, owner)
        #: Whether this handle built the Logger (and so owns closing it).
        self.built_here = self._logger is None
        # The run name of the first Logger built (or given): every later one gets it.
        self._pinned: Optional[str] = self._logger.run_name if self._logger is not None else None
        # The state_dict() of each destination of the last Logger built from the config, once closed.
        self._destination_states: Optional[list[dict[str, Any]]] = None

    @property
    def run_name(self) -> Optional[str]:
        """The run name of the Logger built (or given) first; None until one exists."""
        return self._pinned

    @property
    def is_built(self) -> bool:
        """Whether the Logger exists (was given, or was built by an earlier :meth:`get`)."""
        return self._logger is not None

    def get(self) -> 'Logger':
        """The Logger, built now if needed (call it where every rank does, after the process group exists).

        Raises:
            TypeError: the factory returned something that is not a Logger.
            RuntimeError: the Logger passed as ``logger=`` was closed (only a factory or a config can
                build another one).
        """
        logger = self._logger
        if logger is None:
            logger = self._build()
            self._logger = logger
            if self._pinned is None:
                self._pinned = logger.run_name
        elif not self.built_here and getattr(logger, '_closed', False):
            raise RuntimeError(
                f'{self.owner}: the Logger passed as logger= was closed (at the end of an earlier '
                'stage, e.g. fit); pass a factory (logger=lambda: Logger(...)) or config= to log '
                'several stages (fit, then test) into one run'
            )
        return logger

    def _build(self) -> 'Logger':
        from dist_logging.config import logger_from_config
        from dist_logging.logger import Logger

        pinned = self._pinned
        if self._factory is not None:
            if pinned is None:
                logger = self._factory()
            else:
                # The factory takes no arguments: the run name reaches a Logger that does not set its own
                # through the environment variable the Logger reads.
                previous = os.environ.get(RUN_NAME_ENV)
                os.environ[RUN_NAME_ENV] = pinned
                try:
                    logger = self._factory()
                finally:
                    if previous is None:
                        os.environ.pop(RUN_NAME_ENV, None)
                    else:
                        os.environ[RUN_NAME_ENV] = previous
            if not isinstance(logger, Logger):
                raise TypeError(
                    f'{self.owner}: the logger factory {self._factory!r} returned a '
                    f'{type(logger).__name__}, not a dist_logging.Logger'
                )
            if pinned is not None and logger.run_name != pinned:
                warnings.warn(
                    f'{self.owner}: the logger factory built a Logger with run_name={logger.run_name!r}, '
                    f'not this adapter\'s run {pinned!r}; let the factory leave run_name unset (or pass '
                    'the same one) so one adapter logs one run',
                    RuntimeWarning,
                    stacklevel=3,
                )
            return logger
        run_name = pinned if pinned is not None else self._run_name
        overrides = {'run_name': run_name} if run_name is not None else {}
        states = self._destination_states
        if states is None:
            return logger_from_config(self._config, **overrides)
        # A later Logger of the run: its destinations take the state of the previous one's before the
        # Logger opens them, so trackers continue their run (W&B, Comet, Neptune by id; MLflow also by tag).
        from dist_logging.config import build_destinations

        destinations = build_destinations(self._config)
        for destination, state in zip(destinations, states):
            destination.load_state_dict(state)
        return Logger(destinations, **{**self._config.logger_kwargs, **overrides})

    def __getstate__(self) -> dict[str, Any]:
        # Spawn-based launchers pickle the adapter into each process: a Logger this handle built
        # stays behind (it owns threads and files); each process builds its own on first use.
        state = self.__dict__.copy()
        if self.built_here:
            state['_logger'] = None
        return state

    def close(self) -> None:
        """End the fit and close the Logger (waits for its uploads; no collective), and forget a Logger
        built here, so a later :meth:`get` builds a new one, with the same run name, from the factory or
        config (a given Logger cannot be reopened). Idempotent.

        Raises:
            UploadError: uploads that did not land (named), as :meth:`Logger.close`.
        """
        logger = self._logger
        if logger is None:
            return
        if self.built_here:
            self._logger = None
        if getattr(logger, '_closed', False):
            return
        try:
            logger.fit_end()  # destinations flush what they buffer (file lines, console metrics)
        finally:
            try:
                logger.close()
            finally:
                if self.built_here and self._config is not None:
                    self._destination_states = _states_of(logger)


def _states_of(logger: 'Logger') -> Optional[list[dict[str, Any]]]:
    """Each destination's ``state_dict()`` (None when one fails: the next Logger then starts afresh)."""
    try:
        return [dict(destination.state_dict()) for destination in logger.destinations]
    except Exception:  # noqa: BLE001 - continuing a tracker run is a convenience, never a reason to fail
        return None


#: At most this many BATCH_END events are replayed by one :func:`advance_to` (a resumed run's first step
#: may be a million batches ahead: the rest is skipped over).
MAX_REPLAYED_BATCHES = 1000


def advance_to(logger: 'Logger', step: Any) -> None:
    """Bring the Logger's batch count up to the framework's ``step``, one ``BATCH_END`` event per batch passed.

    Frameworks call loggers at logging steps, not every batch; destinations that act every N
    batches (a FileLogger's flush, the console's print) need each batch's event to act on time.
    Forward only; a step that is not an int is ignored. Issues no collective (unlike
    :meth:`Logger.batch_end`, which flushes gathered metrics).
    """
    from dist_logging.destination import Event

    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        return
    state = logger.state
    behind = int(step) - state.timestamp.batch
    if behind <= 0:
        return
    if behind > MAX_REPLAYED_BATCHES:
        skipped = behind - MAX_REPLAYED_BATCHES
        state.timestamp = dataclasses.replace(
            state.timestamp,
            batch=state.timestamp.batch + skipped,
            batch_in_epoch=state.timestamp.batch_in_epoch + skipped,
        )
        behind = MAX_REPLAYED_BATCHES
    for _ in range(behind):
        state.advance_batch()
        logger.run_event(Event.BATCH_END)


def _escape(text: str) -> str:
    """Protect braces from the Logger's own template formatting of names it is handed."""
    return text.replace('{', '{{').replace('}', '}}')


class CheckpointNamer:
    """Object names for checkpoint files from a template such as ``'{run_name}/checkpoints/{name}'``.

    Args:
        template: the object-name template: the rank and time placeholders of
            :func:`~dist_logging.format_name_with_dist_and_time` plus ``fields``.
        fields: the adapter's own placeholders (e.g. ``('name',)``); each must appear in the template.
        owner: the adapter's name, for messages.

    Raises:
        TypeError: ``template`` is not a string.
        ValueError: an unknown placeholder, bad braces, or a required field missing from the template.
    """

    def __init__(self, template: Any, fields: tuple[str, ...], owner: str):
        from dist_logging.naming import DIST_PLACEHOLDERS, TIME_PLACEHOLDERS, validate_template

        if not isinstance(template, str):
            raise TypeError(f'{owner}: checkpoint_name must be a str, got {type(template).__name__}')
        used = validate_template(template, DIST_PLACEHOLDERS + TIME_PLACEHOLDERS + fields)
        missing = [field for field in fields if field not in used]
        if missing:
            raise ValueError(
                f'{owner}: checkpoint_name {template!r} must contain '
                f'{", ".join("{" + f + "}" for f in missing)}, or every checkpoint file lands on one name'
            )
        if os.path.isabs(template) or template.startswith('\\'):
            raise ValueError(f'{owner}: checkpoint_name {template!r} is absolute; use a name relative to the bucket')
        self.template = template

    def upload(self, logger: 'Logger', path: Union[str, os.PathLike], *, overwrite: bool, **fields: str) -> str:
        """Hand ``path`` to ``logger.upload_file`` as a snapshot under the name the template makes; returns it.

        Issues no collective. Raises whatever :meth:`Logger.upload_file` raises.
        """
        from dist_logging.naming import format_name_with_dist_and_time, validate_object_name

        name = validate_object_name(
            format_name_with_dist_and_time(self.template, logger.run_name, logger.state.timestamp, **fields)
        )
        logger.upload_file(_escape(name), _escape(os.fspath(path)), overwrite=overwrite, copy=True)
        return name
