"""The destination interface: :class:`LoggerDestination`, :class:`Event` and :class:`LogLevel`.

A destination written for Composer's ``LoggerDestination`` ports by changing its
import: the logging hooks have the same names and signatures, lifecycle
events are methods taking ``(state, logger)``, and ``post_close()`` takes none
(see ``docs/composer.md`` for the few differences).

Destinations are rank-agnostic. The :class:`~dist_logging.Logger` reads each
destination's ``ranks`` policy once and never calls a destination on a rank the
policy excludes, so no destination checks ranks itself.
"""

from __future__ import annotations

import enum
import inspect
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union, cast

if TYPE_CHECKING:
    from dist_logging.state import ResumeInfo, State

__all__ = [
    'LogLevel',
    'Event',
    'RANK_POLICIES',
    'LoggerDestination',
    'validate_ranks',
    'ranks_from_rank_zero_only',
    'post_close_caller',
    'check_state',
]

RANK_POLICIES = ('zero', 'local_zero', 'all')

# What the lifecycle hooks get as ``logger``: the :class:`~dist_logging.Logger` calling them. Spelled as
# ``Any`` because the logger imports this module: the base sits below the Logger in the import graph.
LoggerLike = Any


class LogLevel(enum.IntEnum):
    """How often a piece of data is produced; a destination takes calls up to its threshold.

    Attributes:
        FIT: once per training run.
        EPOCH: once per epoch.
        BATCH: once per batch.
        MICROBATCH: once per microbatch (e.g. a forward pass).
        VERBOSE: for debugging.
    """

    FIT = 1
    EPOCH = 2
    BATCH = 3
    MICROBATCH = 4
    VERBOSE = 5

    @classmethod
    def parse(cls, value: Union[str, int, 'LogLevel']) -> 'LogLevel':
        """``LogLevel.BATCH``, ``'batch'`` or ``3`` -> ``LogLevel.BATCH``.

        Raises:
            ValueError: an unknown level, naming it and the known ones.
        """
        if isinstance(value, LogLevel):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        raise ValueError(f'unknown log level {value!r}; expected one of {[level.name.lower() for level in cls]}')


class Event(enum.Enum):
    """Lifecycle events; each value is the name of the destination method that handles it."""

    INIT = 'init'
    FIT_START = 'fit_start'
    EPOCH_START = 'epoch_start'
    BATCH_START = 'batch_start'
    BATCH_END = 'batch_end'
    EPOCH_END = 'epoch_end'
    FIT_END = 'fit_end'
    CLOSE = 'close'
    POST_CLOSE = 'post_close'


def validate_ranks(ranks: Any, owner: str = 'destination') -> str:
    """Return ``ranks`` if it is a known rank policy.

    Raises:
        ValueError: naming the bad value and the allowed ones.
    """
    if ranks not in RANK_POLICIES:
        raise ValueError(f'{owner}: unknown ranks policy {ranks!r}; expected one of {list(RANK_POLICIES)}')
    return ranks


def ranks_from_rank_zero_only(
    ranks: Optional[str], rank_zero_only: Optional[bool], default: str, owner: str = 'destination'
) -> str:
    """The rank policy from Composer's ``rank_zero_only=`` and/or ``ranks=``.

    ``rank_zero_only=True`` means ``ranks='zero'`` and ``False`` means ``ranks='all'``;
    giving both is fine when they agree. Neither given: ``default``.

    Raises:
        TypeError: ``rank_zero_only`` is not a bool.
        ValueError: an unknown ``ranks``, or ``ranks`` contradicting ``rank_zero_only`` (names both).
    """
    if ranks is not None:
        validate_ranks(ranks, owner)
    if rank_zero_only is None:
        return ranks if ranks is not None else default
    if not isinstance(rank_zero_only, bool):
        raise TypeError(f'{owner}: rank_zero_only must be a bool, got {rank_zero_only!r}')
    implied = 'zero' if rank_zero_only else 'all'
    if ranks is not None and ranks != implied:
        raise ValueError(
            f'{owner}: rank_zero_only={rank_zero_only} means ranks={implied!r}, which contradicts '
            f'ranks={ranks!r}; give only one of them'
        )
    return implied


def post_close_caller(destination: 'LoggerDestination') -> Callable[['State', 'LoggerLike'], None]:
    """A function ``(state, logger)`` that calls ``destination.post_close`` in the form it is written in.

    Composer's ``post_close`` takes no arguments; the ``(state, logger)`` form is accepted too.
    The signature is read once, here.

    Raises:
        TypeError: ``post_close`` takes neither no arguments nor ``(state, logger)``.
    """
    method = destination.post_close
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # builtins and some C callables: call it the Composer way
        return lambda state, logger: method()
    try:
        signature.bind(None, None)
    except TypeError:
        pass
    else:
        # A subclass's post_close(state, logger): the base class declares the no-argument form, the signature
        # just bound two arguments.
        return cast('Callable[[State, LoggerLike], None]', method)
    try:
        signature.bind()
    except TypeError:
        raise TypeError(
            f'{type(destination).__name__}.post_close{signature} must take no arguments (as in '
            'Composer) or (state, logger)'
        ) from None
    return lambda state, logger: method()


class LoggerDestination:
    """Base class for everything the Logger can send data to. Every hook is a no-op by default.

    Class attributes a subclass (or its constructor) may set:

    * ``ranks``: which ranks this destination runs on. ``'zero'`` (global rank 0
      only; the default), ``'local_zero'`` (local rank 0 of every node) or ``'all'``.
      Applied by the Logger; hyperparameters reach a destination only on global rank 0.
    * ``log_level``: the highest :class:`LogLevel` this destination takes (default
      ``VERBOSE``: everything).
    * ``optional``: when True, an exception raised by this destination is reported
      once and never re-raised at ``Logger.close()``.

    Hooks are called on the caller's thread; a destination that does I/O should
    buffer or hand off to its own background worker and return quickly.
    """

    ranks: str = 'zero'
    log_level: LogLevel = LogLevel.VERBOSE
    optional: bool = False

    def __init__(
        self,
        *args: Any,
        ranks: Optional[str] = None,
        log_level: Union[str, int, LogLevel, None] = None,
        optional: Optional[bool] = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        if ranks is not None:
            self.ranks = validate_ranks(ranks, type(self).__name__)
        if log_level is not None:
            self.log_level = LogLevel.parse(log_level)
        if optional is not None:
            self.optional = bool(optional)

    # ----------------------------------------------------------------- data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Log settings that do not vary during the run. Called on global rank 0 only.

        Args:
            hyperparameters: name -> value (any type; nested mappings allowed).
        """

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """Log scalar values that vary during training.

        Args:
            metrics: name -> Python number (the Logger has already converted tensors
                and numpy scalars).
            step: the step (usually the batch) the values belong to; ``None`` lets the
                destination choose (usually a running counter).
        """

    def log_traces(self, traces: dict[str, Any]) -> None:
        """Log debug data such as algorithm traces.

        Args:
            traces: name -> any value.
        """

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        """Log a table.

        Args:
            columns: column names.
            rows: row-oriented values, each row as long as ``columns``.
            name: the table's name.
            step: as in :meth:`log_metrics`.
        """

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
        """Log images given as arrays or tensors.

        Args:
            images: one image (CHW or HWC) or a batch (NCHW or NHWC), as a numpy array,
                a tensor, or a sequence of them.
            name: the name of the image(s).
            channels_last: whether the channel dimension is last (HWC) rather than first.
            step: as in :meth:`log_metrics`.
            masks: mask name (e.g. ``'predictions'``) -> masks matching ``images``.
            mask_class_labels: mask value -> class name.
            use_table: whether to present the images as a table (where the destination can).
        """

    # -------------------------------------------------------------- file hooks
    def can_upload_files(self) -> bool:
        """Whether this destination implements :meth:`upload_file`.

        Defaults to False. As in Composer, :meth:`Logger.upload_file` calls every destination
        that overrides :meth:`upload_file`, whatever this returns; it is read by
        :meth:`Logger.has_file_upload_destination` (with the override).
        """
        return False

    def upload_file(self, state: 'State', remote_file_name: str, file_path: pathlib.Path, *, overwrite: bool) -> None:
        """Store the file at ``file_path`` under ``remote_file_name``.

        After this returns the caller may modify or delete ``file_path``, so a
        destination that works in the background must snapshot the file first.

        Args:
            state: the run state.
            remote_file_name: the already-formatted object name.
            file_path: the local file.
            overwrite: whether an existing object of that name may be replaced.
        """

    def download_file(
        self, remote_file_name: str, destination: str, overwrite: bool = False, progress_bar: bool = True
    ) -> None:
        """Fetch ``remote_file_name`` into the local path ``destination``.

        Raises:
            NotImplementedError: this destination cannot download (the default).
        """
        raise NotImplementedError(f'{type(self).__name__} cannot download files')

    # ---------------------------------------------------------------- lifecycle
    def run_event(self, event: Event, state: 'State', logger: 'LoggerLike') -> None:
        """Dispatch ``event`` to the method of the same name (``post_close`` in the form it is written in)."""
        event = Event(event)
        if event is Event.POST_CLOSE:
            post_close_caller(self)(state, logger)
        else:
            getattr(self, event.value)(state, logger)

    def init(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called once when the Logger is built."""

    def fit_start(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called when training starts."""

    def epoch_start(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called at the start of every epoch."""

    def batch_start(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called at the start of every batch."""

    def batch_end(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called after every batch (the timestamp already counts it)."""

    def epoch_end(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called after every epoch (the timestamp already counts it)."""

    def fit_end(self, state: 'State', logger: 'LoggerLike') -> None:
        """Called when training ends."""

    def close(self, state: 'State', logger: 'LoggerLike') -> None:
        """Flush and release resources; the Logger calls it once, at its close."""

    def post_close(self) -> None:
        """Called after every destination's :meth:`close` (e.g. to wait for uploads other closes queued).

        As in Composer this takes no arguments. A destination may instead define
        ``post_close(self, state, logger)``; the Logger reads which form at construction.
        """

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'LoggerLike') -> None:
        """Training resumed from a checkpoint: steps from ``info.superseded_from`` on, logged before, are superseded.

        Called by the Logger (on the ranks this destination's policy names) after
        ``Logger.load_state_dict`` (``dcp.load``) or ``Logger.resume_at``, just before the first data
        logged after the resume (or at the next ``batch_end`` / ``epoch_end`` / close, when nothing is
        logged first): ``info.superseded_from`` is then known (see
        :class:`~dist_logging.state.ResumeInfo`). ``state.timestamp`` is the restored one. A
        destination shows each step once from here on, the resumed run's values winning, as far as
        its backend can: it drops, purges, or records the superseded range (see the "Resume" section
        of docs/destinations.md). The default does nothing: the destination keeps appending.

        Args:
            info: the resume: the restored step, the first superseded step, the resume's number, the attempts.
            state: the run state (its timestamp already restored).
            logger: the Logger.
        """

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What this destination needs to continue after a restart, as Composer's ``Serializable``.

        Picklable by ``torch.save``. Composer stores each destination's ``state_dict()`` in its
        checkpoints (``state['callbacks'][type(d).__qualname__]``) and hands it back to
        :meth:`load_state_dict`; code that does the same with dist_logging destinations works
        unchanged. The default holds nothing; the tracker destinations hold their run's id
        (W&B, MLflow, Neptune, Comet), so a job restored from a checkpoint continues that run.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (Composer's ``Serializable.load_state_dict``).

        Call it before the Logger opens the destination (before ``Logger(...)``): a tracker
        destination then continues the saved run instead of opening a new one. The default
        takes the empty state Composer's own destinations save.

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: keys this destination does not know (names them).
        """
        check_state(self, state, ())

    def __repr__(self) -> str:
        return f'{type(self).__name__}(ranks={self.ranks!r})'


def check_state(destination: LoggerDestination, state: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``state`` as a dict, checked for :meth:`LoggerDestination.load_state_dict`.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: a key not in ``keys`` (names it and the known ones).
    """
    owner = type(destination).__name__
    if not isinstance(state, Mapping):
        raise TypeError(
            f'{owner}.load_state_dict: expected a mapping (what state_dict() returned), got {type(state).__name__}'
        )
    unknown = sorted(str(k) for k in state if k not in keys)
    if unknown:
        raise ValueError(
            f'{owner}.load_state_dict: unknown key(s) {unknown}; this destination saves {list(keys) or "nothing"}'
        )
    return dict(state)
