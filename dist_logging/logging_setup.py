"""``setup_logging``: the standard library's ``logging``, ``warnings`` and uncaught exceptions, rank-aware.

Under ``torchrun`` every rank runs the same script, so an unconfigured job prints every
``logging.info``, warning and traceback once per rank. :func:`setup_logging` installs two
handlers on the root logger of this process:

* a console handler (``sys.stderr``, looked up at each record so redirections work) whose
  :class:`RankFilter` lets records through on the ranks named by ``console_ranks`` only, and
  records at ``ERROR`` or above on every rank, prefixed ``[rank R]``;
* optionally a file handler writing every record of this rank to its own file (a name
  template such as ``'{run_name}/python-rank{rank}.log'``), in the line format of
  :mod:`dist_logging._log_line` that ``dist-logging logs`` merges.

Nothing here issues a collective or waits for another rank. On a rank whose console is
filtered out and that has no file, the root logger's level is raised to ``ERROR``, so a
``logging.info`` there stops at the standard library's own ``isEnabledFor`` early exit.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from dist_logging import dist
from dist_logging._log_line import format_record
from dist_logging.redaction import redact_text
from dist_logging.destination import LoggerDestination
from dist_logging.naming import (
    DIST_PLACEHOLDERS,
    check_rank_distinct,
    format_name_with_dist,
    template_placeholders,
    validate_object_name,
    validate_template,
)

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['setup_logging', 'teardown_logging', 'RankFilter']

ConsoleRanks = Union[str, Sequence[int]]
CONSOLE_POLICIES = ('zero', 'local_zero', 'all')
CONSOLE_FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'
CONSOLE_DATE_FORMAT = '%Y-%m-%d %H:%M:%S'
DEFAULT_UPLOAD_INTERVAL = 100  # batches, as FileLogger's default flush_interval


class RankFilter(logging.Filter):
    """Passes a record when this rank prints to the console, and every record at ``ERROR`` or above.

    Args:
        on_console: whether this rank is one of the console ranks.
    """

    def __init__(self, on_console: bool):
        super().__init__()
        self.on_console = on_console

    def filter(self, record: logging.LogRecord) -> bool:
        return self.on_console or record.levelno >= logging.ERROR


class _ConsoleFormatter(logging.Formatter):
    """The usual one-line format, secrets redacted, every line prefixed ``[rank R]`` where ranks may interleave."""

    def __init__(self, rank: int, prefix_all: bool, prefix_errors: bool):
        super().__init__(CONSOLE_FORMAT, CONSOLE_DATE_FORMAT)
        self.prefix = f'[rank {rank}] '
        self.prefix_all = prefix_all
        self.prefix_errors = prefix_errors

    def format(self, record: logging.LogRecord) -> str:
        text = redact_text(super().format(record).rstrip('\n'))
        if self.prefix_all or (self.prefix_errors and record.levelno >= logging.ERROR):
            text = self.prefix + text.replace('\n', '\n' + self.prefix)
        return text


class _ConsoleHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when the record arrives (like ``logging.lastResort``)."""

    terminator = '\n'

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            if stream is None:  # pythonw, or a closed interpreter
                return
            stream.write(text + self.terminator)
            stream.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise into the caller
            self.handleError(record)

    def __repr__(self) -> str:
        return f'<{type(self).__name__} stderr ({logging.getLevelName(self.level)})>'


class _FileFormatter(logging.Formatter):
    """One record in the :mod:`~dist_logging._log_line` format: UTC time, rank, level, logger, message."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = message.rstrip('\n') + '\n' + record.exc_text
        if record.stack_info:
            message = message.rstrip('\n') + '\n' + self.formatStack(record.stack_info)
        return format_record(
            record.created, self.rank, record.levelname, record.name, redact_text(message.rstrip('\n'))
        )


class PythonLogUploader(LoggerDestination):
    """Uploads the per-rank Python log with the Logger's other files: every N batches, at epoch and fit end, at close.

    Attached to an existing Logger with :meth:`~dist_logging.Logger.add_listener`; it takes no data.
    """

    ranks = 'all'

    def __init__(self, handler: logging.FileHandler, filename: str, remote_file_name: str, interval: int):
        super().__init__()
        self.handler: Optional[logging.FileHandler] = None
        self.retarget(handler, filename, remote_file_name, interval)

    def retarget(self, handler: logging.FileHandler, filename: str, remote_file_name: str, interval: int) -> None:
        """Upload another handler's file from now on (``setup_logging`` called again with the same Logger)."""
        self.handler = handler
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.interval = interval
        self._uploaded_size = -1

    def upload(self, logger: 'Logger') -> None:
        """Upload the file if it grew since the last upload (a snapshot: the file keeps growing)."""
        handler = self.handler
        if handler is None:
            return
        # Hold the handler's lock so that the snapshot ends on a whole record.
        handler.acquire()
        try:
            if handler.stream is not None:
                handler.stream.flush()
            size = os.path.getsize(self.filename)
            if size == self._uploaded_size:
                return
            logger.upload_file(self.remote_file_name, self.filename, overwrite=True)
            self._uploaded_size = size
        finally:
            handler.release()

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        if state.timestamp.batch % self.interval == 0:
            self.upload(logger)

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        self.upload(logger)

    def fit_end(self, state: 'State', logger: 'Logger') -> None:
        self.upload(logger)

    def close(self, state: 'State', logger: 'Logger') -> None:
        self.upload(logger)
        self.handler = None


class _Installed:
    """What one :func:`setup_logging` call put in place, so the next call can replace exactly that."""

    def __init__(self) -> None:
        self.handlers: list[logging.Handler] = []
        self.console: Optional[logging.Handler] = None
        self.uploader: Optional[PythonLogUploader] = None
        self.uploader_logger: Optional['Logger'] = None
        self.captured_warnings = False


_lock = threading.RLock()
_installed: Optional[_Installed] = None
# The hooks ours was installed over, oldest first (ours may be installed again over a wrapper of itself).
_excepthook_chain: list[Any] = []
_threading_excepthook_chain: list[Any] = []
_hook_state = threading.local()


# ---------------------------------------------------------------------------- argument checks
def _parse_level(level: Any) -> int:
    if isinstance(level, bool):
        raise TypeError(f'setup_logging: level must be an int or a level name, got {level!r}')
    if isinstance(level, int):
        return level
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if isinstance(number, int):
            return number
        raise ValueError(
            f'setup_logging: unknown level {level!r}; expected one of DEBUG, INFO, WARNING, ERROR, '
            'CRITICAL, or a number'
        )
    raise TypeError(f'setup_logging: level must be an int or a level name, got {type(level).__name__} {level!r}')


def _console_policy(console_ranks: Any, rank: int, world_size: int) -> tuple[bool, bool]:
    """``(this rank prints, several ranks may print)`` for a ``console_ranks`` value.

    Raises:
        ValueError: an unknown policy name, or a rank outside the world.
        TypeError: neither a policy name nor a list of ints.
    """
    if isinstance(console_ranks, str):
        if console_ranks == 'zero':
            return rank == 0, False
        if console_ranks == 'local_zero':
            return dist.get_local_rank() == 0, dist.get_num_nodes() > 1
        if console_ranks == 'all':
            return True, world_size > 1
        raise ValueError(
            f'setup_logging: unknown console_ranks {console_ranks!r}; expected one of '
            f'{list(CONSOLE_POLICIES)} or a list of global ranks'
        )
    try:
        ranks = list(console_ranks)
    except TypeError:
        raise TypeError(
            f'setup_logging: console_ranks must be one of {list(CONSOLE_POLICIES)} or a list of global '
            f'ranks, got {type(console_ranks).__name__} {console_ranks!r}'
        ) from None
    for item in ranks:
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f'setup_logging: console_ranks must hold ints (global ranks), got {item!r}')
        if not 0 <= item < world_size:
            raise ValueError(
                f'setup_logging: console_ranks names rank {item}, outside this world of {world_size} '
                f'rank(s) (0..{world_size - 1})'
            )
    return rank in ranks, len(set(ranks)) > 1


class _NoCollective:
    """Stands in for the Logger's group when deriving a run name: setup_logging never issues a collective."""

    def broadcast_object(self, obj: Any, what: str) -> Any:
        raise ValueError(
            'setup_logging: the file name uses {run_name} but this job shares no run id '
            '(DIST_LOGGING_RUN_NAME, torchrun\'s TORCHELASTIC_RUN_ID, a SLURM job, an MPI job id or '
            'MASTER_ADDR/MASTER_PORT) to '
            'derive one from without a collective; pass run_name= or logger='
        )


def _run_name(run_name: Optional[str], logger: Optional['Logger'], template: str) -> str:
    if run_name is None and logger is not None:
        return logger.run_name
    if run_name is None and 'run_name' not in template_placeholders(template):
        return '<unused>'
    from dist_logging._logger.run_name import resolve_run_name

    # The Logger's own derivation (argument, environment, torchrun's run id), so both name the same folder.
    return resolve_run_name(run_name, _NoCollective())


def _remote_name(template: str, run_name: str) -> str:
    # As FileLogger: a relative local path is also the object name; an absolute one keeps its file name.
    remote_template = template if not os.path.isabs(template) else '{run_name}/' + os.path.basename(template)
    return validate_object_name(format_name_with_dist(remote_template, run_name))


def _upload_interval(logger: 'Logger') -> int:
    """Upload as often as the Logger's FileLogger flushes, when it has one."""
    from dist_logging.destinations.file import FileLogger

    for destination in logger.destinations:
        if isinstance(destination, FileLogger):
            return destination.flush_interval
    return DEFAULT_UPLOAD_INTERVAL


# ---------------------------------------------------------------------------- the public call
def setup_logging(
    level: Union[int, str] = logging.INFO,
    *,
    console_ranks: ConsoleRanks = 'zero',
    file: Optional[Union[str, os.PathLike]] = None,
    run_name: Optional[str] = None,
    capture_warnings: bool = True,
    logger: Optional['Logger'] = None,
) -> Optional[str]:
    """Configure this process's root logger for a distributed job: one console, one file per rank.

    Call it on every rank, before or after ``init_process_group`` (rank facts come from
    torchrun's environment until a process group exists). Calling it again replaces the
    handlers and hooks it installed (never duplicates them) and leaves other handlers alone.

    * Console (``sys.stderr``): records at ``level`` or above are printed on the ranks named
      by ``console_ranks`` only. When more than one rank may print, each line starts with
      ``[rank R]``. Records at ``ERROR`` or above are printed by every rank, prefixed
      ``[rank R]`` in a world of more than one. An uncaught exception (main thread or any
      thread) is logged at ``CRITICAL`` with its traceback before the process dies.
    * ``file``: every rank writes all its records at ``level`` or above to its own file,
      one line per record (UTC time, global rank, level, logger name, message; continuation
      lines of tracebacks start with a TAB). ``dist-logging logs`` merges these files. After a
      torchrun restart or a SLURM requeue the file is appended to, starting with a WARNING
      record ``===== attempt N (...) starts =====``; ``{attempt}`` in ``file`` gives each attempt
      its own file.
    * Secrets in messages (URL passwords, known token formats) are redacted on both.
    * With no file, on a rank that does not print to the console, the root logger's level is
      raised to ``ERROR`` (unless the root logger has other handlers), so a filtered-out call
      costs what a disabled level costs in the standard library.

    Args:
        level: the root logger's level (a number or a name such as ``'INFO'``).
        console_ranks: ``'zero'`` (global rank 0), ``'local_zero'`` (local rank 0 of each
            node), ``'all'``, or a list of global ranks.
        file: a name template (``{run_name}``, ``{rank}``, ``{local_rank}``, ``{node_rank}``,
            ``{world_size}``, ``{local_world_size}``, ``{attempt}``) that must tell ranks apart, e.g.
            ``'{run_name}/python-rank{rank}.log'``; ``None`` for no file.
        run_name: fills ``{run_name}``; default: ``logger.run_name``, else derived as the
            Logger derives it (``DIST_LOGGING_RUN_NAME``, torchrun's run id).
        capture_warnings: route ``warnings`` through the ``py.warnings`` logger (printed once
            on the console ranks, recorded in every rank's file).
        logger: a :class:`~dist_logging.Logger`; when it can upload files, this rank's file
            is uploaded with its other logs (every ``flush_interval`` batches of its
            ``FileLogger``, default 100, at epoch and fit end, and at close), under the
            file's relative path (``{run_name}/<file name>`` for an absolute path).

    Returns:
        The path of this rank's log file, or ``None`` without ``file``.

    Raises:
        ValueError: an unknown level or ``console_ranks``, a rank outside the world, a ``file``
            template with an unknown placeholder or one that cannot tell ranks apart, or a
            ``{run_name}`` that cannot be derived without a collective.
        TypeError: arguments of the wrong type.
        RuntimeError: ``logger`` is closed.
        OSError: the file cannot be opened.
    """
    global _installed
    level_number = _parse_level(level)
    rank, world_size = dist.get_global_rank(), dist.get_world_size()
    on_console, several_print = _console_policy(console_ranks, rank, world_size)
    if logger is not None:
        from dist_logging.logger import Logger

        if not isinstance(logger, Logger):
            raise TypeError(f'setup_logging: logger must be a dist_logging.Logger, got {type(logger).__name__}')
        if logger._closed:
            raise RuntimeError('setup_logging: the Logger is closed; pass an open one (or none)')
    path: Optional[str] = None
    remote: Optional[str] = None
    if file is not None:
        template = os.fspath(file)
        if not isinstance(template, str) or not template:
            raise ValueError(f'setup_logging: file must be a non-empty name template, got {file!r}')
        validate_template(template, DIST_PLACEHOLDERS)
        check_rank_distinct(template, 'all', 'setup_logging file')
        name = _run_name(run_name, logger, template)
        path = format_name_with_dist(template, name)
        if logger is not None and logger.has_file_upload_destination():
            remote = _remote_name(template, logger.run_name if run_name is None else run_name)

    console = _ConsoleHandler()
    console.setFormatter(_ConsoleFormatter(rank, prefix_all=several_print, prefix_errors=world_size > 1))
    console.addFilter(RankFilter(on_console))
    handlers: list[logging.Handler] = [console]
    file_handler: Optional[logging.FileHandler] = None
    if path is not None:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        file_handler = logging.FileHandler(path, mode='a', encoding='utf-8')
        file_handler.setFormatter(_FileFormatter(rank))
        handlers.append(file_handler)
        _mark_attempt(file_handler, path)

    with _lock:
        root = logging.getLogger()
        previous = _installed
        installed = _Installed()
        installed.handlers = handlers
        installed.console = console
        if previous is not None:
            for handler in previous.handlers:
                root.removeHandler(handler)
                handler.close()
            if previous.uploader is not None:
                previous.uploader.handler = None  # the Logger keeps it as a listener; it no longer uploads
                if previous.uploader_logger is logger:
                    installed.uploader, installed.uploader_logger = previous.uploader, logger
        foreign = [h for h in root.handlers if h not in handlers]
        for handler in handlers:
            root.addHandler(handler)
        if not on_console and file_handler is None and not foreign:
            root.setLevel(max(level_number, logging.ERROR))  # the filtered-out call stops at isEnabledFor
        else:
            root.setLevel(level_number)
        was_captured = previous is not None and previous.captured_warnings
        if capture_warnings:
            if not was_captured and not _warnings_captured():
                logging.captureWarnings(True)
                installed.captured_warnings = True
            else:
                installed.captured_warnings = was_captured
        elif was_captured:
            logging.captureWarnings(False)
        _install_hooks()
        _installed = installed
    if remote is not None and file_handler is not None and logger is not None:
        if installed.uploader is not None:  # the same Logger again: retarget its listener, never add a second
            installed.uploader.retarget(file_handler, file_handler.baseFilename, remote, _upload_interval(logger))
        else:
            uploader = PythonLogUploader(file_handler, file_handler.baseFilename, remote, _upload_interval(logger))
            logger.add_listener(uploader)
            installed.uploader, installed.uploader_logger = uploader, logger
    else:
        installed.uploader = installed.uploader_logger = None
    return path


_marked_paths: set[str] = set()


def _mark_attempt(handler: logging.FileHandler, path: str) -> None:
    """After a torchrun restart or a SLURM requeue, start this attempt's lines in the (appended)
    file with a visible record; once per process and file, however often setup_logging runs."""
    facts = dist.launch_facts()
    key = os.path.abspath(path)
    if facts.attempt == '0' or key in _marked_paths:
        return
    _marked_paths.add(key)
    record = logging.LogRecord(
        'dist_logging',
        logging.WARNING,
        __file__,
        0,
        '===== attempt %s (%s) starts =====',
        (facts.attempt, facts.attempt_cause),
        None,
    )
    handler.handle(record)


def _warnings_captured() -> bool:
    # logging keeps the original showwarning while it captures.
    return getattr(logging, '_warnings_showwarning', None) is not None


def teardown_logging() -> None:
    """Undo :func:`setup_logging`: remove and close its handlers, restore the exception hooks and warnings.

    Other handlers and the root logger's level are left as they are. Safe to call when
    :func:`setup_logging` was never called.
    """
    global _installed
    with _lock:
        installed, _installed = _installed, None
        if installed is None:
            return
        root = logging.getLogger()
        for handler in installed.handlers:
            root.removeHandler(handler)
            handler.close()
        if installed.uploader is not None:
            installed.uploader.handler = None
        if installed.captured_warnings:
            logging.captureWarnings(False)
        # A hook someone installed over ours stays; ours then only passes exceptions on.
        if sys.excepthook is _excepthook and _excepthook_chain:
            sys.excepthook = _excepthook_chain.pop()
        if threading.excepthook is _threading_excepthook and _threading_excepthook_chain:
            threading.excepthook = _threading_excepthook_chain.pop()


# ---------------------------------------------------------------------------- uncaught exceptions
def _install_hooks() -> None:
    """Put our hooks in front of the current ones, unless they are in front already.

    ``torch.distributed.init_process_group`` wraps ``sys.excepthook`` (it prefixes what the hook it
    wrapped prints with ``[rankN]: ``). Calling ``setup_logging`` after it puts ours in front again,
    over that wrapper, which still calls ours: the inner call passes the exception on (see
    :func:`_excepthook`), so it is logged once.
    """
    if sys.excepthook is not _excepthook:
        _excepthook_chain.append(sys.excepthook)
        sys.excepthook = _excepthook
    if threading.excepthook is not _threading_excepthook:
        _threading_excepthook_chain.append(threading.excepthook)
        threading.excepthook = _threading_excepthook


def _log_uncaught(message: str, exc_info: tuple) -> bool:
    """Log an uncaught exception with its traceback; whether our console printed it."""
    if _installed is None:
        return False
    root = logging.getLogger()
    printed = root.isEnabledFor(logging.CRITICAL)
    root.critical(message, exc_info=exc_info)
    return printed


def _chained_call(chain: list[Any], default: Any, depth: int, log: Any, call_previous: Any) -> None:
    """Run one level of our hook: the outermost logs; each level calls the hook it was installed over.

    Ours may sit in the chain more than once (installed again over a wrapper that calls it): the
    ``depth``-th nested call of ours in this thread calls the ``depth``-th hook from the end of
    ``chain``, so the chain is walked once, never in a loop. The default hook is skipped when our
    console already printed the traceback (it would print it again, without the rank prefix).
    """
    if depth == 0:
        try:
            _hook_state.printed = log()
        except Exception:  # noqa: BLE001 - the previous hook still reports it
            _hook_state.printed = False
    index = len(chain) - 1 - depth
    previous = chain[index] if index >= 0 else default
    if getattr(_hook_state, 'printed', False) and previous is default:
        return
    call_previous(previous)


def _stream_saved_by_torch() -> Any:
    """The real stderr when our hook is called by the wrapper ``torch.distributed.init_process_group`` installs.

    That wrapper points ``sys.stderr`` at a buffer while the hook it wrapped runs, then prints the
    buffer with ``[rankN]: `` before each line; our record names its rank already, so it goes to the
    stream the wrapper saved (its local ``old_stderr``). None in any other case.
    """
    try:
        frame = sys._getframe(2)  # 0: here, 1: _excepthook, 2: its caller
    except ValueError:
        return None
    if frame.f_code.co_name != '_distributed_excepthook' or not str(frame.f_globals.get('__name__', '')).startswith(
        'torch.distributed'
    ):
        return None
    stream = frame.f_locals.get('old_stderr')
    return stream if hasattr(stream, 'write') else None


def _excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
    depth = getattr(_hook_state, 'depth', 0)
    _hook_state.depth = depth + 1
    real_stderr = _stream_saved_by_torch() if depth == 0 else None
    buffer = sys.stderr
    if real_stderr is not None:
        sys.stderr = real_stderr
    try:
        # Ctrl-C reaches every rank: no N copies of it.
        log = (
            (lambda: False)
            if issubclass(exc_type, KeyboardInterrupt)
            else (lambda: _log_uncaught(f'Uncaught exception: {exc_type.__name__}: {exc}', (exc_type, exc, tb)))
        )
        _chained_call(_excepthook_chain, sys.__excepthook__, depth, log, lambda previous: previous(exc_type, exc, tb))
    finally:
        _hook_state.depth = depth
        if real_stderr is not None:
            sys.stderr = buffer


def _threading_excepthook(args: Any) -> None:
    depth = getattr(_hook_state, 'thread_depth', 0)
    _hook_state.thread_depth = depth + 1
    try:

        def log() -> bool:
            if args.exc_type is None or issubclass(args.exc_type, SystemExit):
                return False
            name = args.thread.name if args.thread is not None else '?'
            return _log_uncaught(
                f'Uncaught exception in thread {name}: {args.exc_type.__name__}: {args.exc_value}',
                (args.exc_type, args.exc_value, args.exc_traceback),
            )

        _chained_call(
            _threading_excepthook_chain, threading.__excepthook__, depth, log, lambda previous: previous(args)
        )
    finally:
        _hook_state.thread_depth = depth
