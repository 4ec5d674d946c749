"""When a rank captures its postmortem: the hang watchdog, the Logger's errors, uncaught exceptions, SIGTERM.

A :class:`Recorder` belongs to one Logger. Its triggers:

- **hang**: a check run by the process's watch thread (the store line that beats for the Logger's
  group; no thread of its own) sees that the training thread has not come back to the Logger
  (``batch_end`` / ``epoch_end``) for ``hang_timeout`` seconds; the capture runs on a thread started then.
- **logging_error**: a collective of the Logger's group failed (:class:`~dist_logging.DistributedLoggingError`).
- **exception**: an exception nobody caught on the training thread (``sys.excepthook``, or
  ``threading.excepthook`` when the Logger was made on another thread); the hook captures, waits for
  the upload (bounded) and then calls the hook that was there before: nothing is swallowed.
- **sigterm**: a Python handler cannot run while the main thread is inside a gloo collective, so
  the signal also wakes a thread of ours through ``signal.set_wakeup_fd`` (a byte written by
  CPython's C-level handler); a capture thread then captures and waits for the upload (bounded), and
  the process ends as it would have: the capture thread signals the main thread again, whose handler
  calls the handler that was there before (or restores the default and raises SIGTERM again); if the
  main thread is stuck in native code, the capture thread ends the process with ``os._exit(143)``
  (128 + SIGTERM). The main thread's handler itself never waits: it may have interrupted the main
  thread inside a capture (our excepthook handing a set over: after a crash, the survivors' collectives
  fail the moment torchrun's SIGTERM arrives) or holding a lock the capture needs; waiting there
  deadlocked until the bound and lost the set. A SIGTERM that arrives while the main thread is in our
  excepthook is acted on when the hook returns (after the previous hook printed the traceback).
- **manual**: :meth:`Recorder.capture`.

Once per rank per attempt: the first capture wins; later triggers only wait for its delivery.
Nothing runs, is written or is uploaded while nothing is wrong (the watchdog's check is two reads
and a comparison per beat).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Optional

from dist_logging import dist
from dist_logging.errors import UploadError
from dist_logging.postmortem.capture import object_names, rank_prefix, write_set

__all__ = ['Recorder', 'DELIVERY_SECONDS', 'SCRATCH_PREFIX', 'sweep_scratch']

#: The longest a process-ending trigger (an uncaught exception, SIGTERM) waits for its set to land.
#: torchrun SIGKILLs 30 s after its SIGTERM (its default); capturing takes well under a second.
DELIVERY_SECONDS = 20.0
_SIGTERM_EXIT = 128 + signal.SIGTERM
#: After a SIGTERM's capture: how long the main thread may take to return from our excepthook (the previous
#: hook prints the traceback), then to act on the SIGTERM, before the capture thread ends the process itself.
_HOOK_GRACE = 5.0
_MAIN_GRACE = 1.0
#: A capture writes its set into ``<temp dir>/<SCRATCH_PREFIX><rank>-pid<pid>-<random>`` before handing the files
#: over, and removes it after; a process killed meanwhile leaves it: :func:`sweep_scratch` removes those.
SCRATCH_PREFIX = 'dist_logging-postmortem-rank'


def sweep_scratch(root: Optional[str] = None) -> list[str]:
    """Remove the capture scratch folders in ``root`` (the temp dir by default) whose process has ended.

    A recorder sweeps when it starts, so a job that follows a killed one leaves the machine clean. Folders of live
    processes, of processes this user may not signal, and anything not named like a scratch folder stay.

    Returns:
        The folders removed.
    """
    root = root or tempfile.gettempdir()
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not entry.startswith(SCRATCH_PREFIX) or '-pid' not in entry:
            continue
        pid_text = entry.split('-pid', 1)[1].split('-', 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue  # not ours to judge
        folder = os.path.join(root, entry)
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            removed.append(folder)
    return removed


class Recorder:
    """One Logger's postmortem: triggers, capture, delivery (see the module docstring).

    Args:
        run_name: the run's name (object names start with it).
        rank, world_size, attempt: this process's global rank, the world size and torchrun's attempt.
        deliver: ``deliver(object_name, local_path)`` hands a file to the Logger's upload path
            (journaled: a file handed over survives the process; see ``dist-logging drain``).
        wait_delivered: ``wait_delivered(timeout) -> bool``: wait until what was handed over landed.
        events: returns the Logger's last events (called at capture time, on the capturing thread).
        progress: returns something that changes whenever the training thread comes back to the
            Logger (the watchdog compares it between beats).
        hang_timeout: seconds without progress before a ``'hang'`` capture; None: no watchdog.
        roster: returns global rank -> ``(host, pid)`` (who ran where, from the store).
        logging_group: the name of the Logger's own process group, for the header.

    Raises:
        ValueError: ``hang_timeout`` is not a positive number.
    """

    def __init__(
        self,
        *,
        run_name: str,
        rank: int,
        world_size: int,
        attempt: Any,
        deliver: Callable[[str, str], None],
        wait_delivered: Callable[[float], bool],
        events: Callable[[], Mapping[str, Any]],
        progress: Callable[[], Any],
        hang_timeout: Optional[float] = None,
        roster: Callable[[], Mapping[int, Any]] = dict,
        logging_group: Optional[str] = None,
    ):
        if hang_timeout is not None and (isinstance(hang_timeout, bool) or not hang_timeout > 0):
            raise ValueError(f'hang_timeout must be a positive number of seconds or None, got {hang_timeout!r}')
        self.run_name, self.rank, self.world_size, self.attempt = run_name, rank, world_size, attempt
        self.hang_timeout = None if hang_timeout is None else float(hang_timeout)
        self._deliver, self._wait_delivered, self._events, self._progress = deliver, wait_delivered, events, progress
        self._roster, self._logging_group = roster, logging_group
        self.training_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._captured = threading.Event()  # set once the set was handed over (or failed to be)
        self._claimed = False
        self._thread: Optional[threading.Thread] = None
        self._last_progress: Any = None
        self._last_change = time.monotonic()
        self.progress_log: 'collections.deque[tuple[float, Any]]' = collections.deque(maxlen=16)
        self.prefix: Optional[str] = None  # the rank's object prefix, once captured
        self.error: Optional[BaseException] = None  # what went wrong while capturing, if anything
        self._closed = False

    # ------------------------------------------------------------------ triggers
    def tick(self) -> None:
        """The hang watchdog's check (called by the watch thread between beats; returns at once)."""
        if self.hang_timeout is None or self._claimed or self._closed:
            return
        now = time.monotonic()
        current = self._progress()
        if current != self._last_progress:
            self._last_progress, self._last_change = current, now
            self.progress_log.append((round(time.time(), 3), current))
            return
        if now - self._last_change >= self.hang_timeout:
            self.capture_in_background('hang')

    def on_logging_error(self, error: BaseException) -> None:
        """A collective of the Logger's group failed: capture on a thread (the error is raised to the caller)."""
        self.capture_in_background('logging_error', error)

    def capture_in_background(self, reason: str, exception: Optional[BaseException] = None) -> bool:
        """Start the capture on a thread of its own (``dist_logging-postmortem``); False if one was made already."""
        if not self._claim():
            return False
        self._thread = threading.Thread(
            target=self._capture, args=(reason, exception, None), name='dist_logging-postmortem', daemon=True
        )
        self._thread.start()
        return True

    def capture(
        self, reason: str, exception: Optional[BaseException] = None, wait: Optional[float] = None
    ) -> Optional[str]:
        """Capture this rank's set now, on the calling thread, and hand it to the upload path.

        Args:
            reason: a short word saying why (it lands in the header).
            exception: an exception to include, if any.
            wait: seconds to wait for the set to land in the bucket (None: do not wait).

        Returns:
            The object prefix of the rank's set, or None when this rank captured one already in this
            attempt (that capture's delivery is then awaited, within ``wait``).
        """
        if not self._claim():
            if wait:
                self.wait(wait)
            return None
        self._capture(reason, exception, wait)
        return self.prefix

    def wait(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a capture in progress to be handed over and to land; False on timeout."""
        deadline = time.monotonic() + timeout
        if not self._captured.wait(timeout):
            return False
        try:
            return bool(self._wait_delivered(max(0.0, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001 - the files stay in staging for `dist-logging drain`
            return False

    @property
    def captured(self) -> bool:
        """Whether this rank's set was captured (in this attempt)."""
        return self._claimed

    def _claim(self) -> bool:
        with self._lock:
            if self._claimed or self._closed:
                return False
            self._claimed = True
            return True

    @staticmethod
    def _ours() -> bool:
        """Whether the calling thread is one of the postmortem's own (its stack says nothing about the job)."""
        return threading.current_thread().name.startswith('dist_logging-postmortem')

    def _capture(self, reason: str, exception: Optional[BaseException], wait: Optional[float]) -> None:
        folder = tempfile.mkdtemp(prefix=f'{SCRATCH_PREFIX}{self.rank}-pid{os.getpid()}-')
        try:
            try:
                events = dict(self._events())
                events['progress_seen_by_watchdog'] = list(self.progress_log)  # (wall time, (batch, epoch))
                events['seconds_without_progress'] = round(time.monotonic() - self._last_change, 3)
            except Exception as exc:  # noqa: BLE001 - the rest of the set matters more
                events = {'error': f'{type(exc).__name__}: {exc}'}
            try:
                roster = dict(self._roster())
            except Exception:  # noqa: BLE001 - the header says what it knows
                roster = {}
            files = write_set(
                folder,
                reason=reason,
                rank=self.rank,
                world_size=self.world_size,
                attempt=self.attempt,
                run_name=self.run_name,
                roster=roster,
                logging_group=self._logging_group,
                exception=exception,
                events=events,
                training_thread=self.training_thread,
                skip_thread=threading.get_ident() if self._ours() else None,
            )
            names = object_names(self.run_name, self.attempt, self.rank)
            order = ['fr'] + [name for name in names if name != 'fr']  # the header last
            for name in order:
                if name in files:
                    try:
                        self._deliver(names[name], files[name])
                    except UploadError as exc:
                        # An earlier upload's failure (this set's first file, when the bucket is down), raised at
                        # this hand-over; the file of this call was queued all the same: hand over the rest.
                        if self.error is None:
                            self.error = exc
            self.prefix = rank_prefix(self.run_name, self.attempt, self.rank)
        except Exception as exc:  # noqa: BLE001 - recorded; a capture must never take the process down
            self.error = exc
        finally:
            self._captured.set()
            shutil.rmtree(folder, ignore_errors=True)
        if wait:
            self.wait(wait)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Install the process-wide hooks (uncaught exceptions, SIGTERM) for this recorder; remove the scratch
        folders that killed captures left on this machine (:func:`sweep_scratch`)."""
        sweep_scratch()
        _hooks.add(self)

    def close(self) -> None:
        """Stop triggering (the Logger closes); a capture in progress is waited for (bounded)."""
        self._closed = True
        _hooks.remove(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(DELIVERY_SECONDS)


class _ProcessHooks:
    """The process-wide hooks shared by every live :class:`Recorder`: exceptions and SIGTERM."""

    def __init__(self) -> None:
        self._recorders: 'weakref.WeakSet[Recorder]' = weakref.WeakSet()
        self._lock = threading.Lock()
        self._installed = False
        self._previous_excepthook: Any = None
        self._previous_thread_hook: Any = None
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._wakeup: Optional[tuple[int, int]] = None
        self._signal_thread: Optional[threading.Thread] = None
        self._sigterm_started = threading.Event()
        self._sigterm_done = threading.Event()
        self._main_took_over = threading.Event()
        self._signal_lock = threading.RLock()  # taken in the main thread's handler too (which may nest)
        self._in_hook = threading.Event()  # the main thread is in our excepthook (capturing, then printing)
        self._hook_returned = threading.Event()

    def add(self, recorder: Recorder) -> None:
        with self._lock:
            self._recorders.add(recorder)
            if self._installed:
                return
            self._installed = True
            self._previous_excepthook, sys.excepthook = sys.excepthook, self._excepthook
            self._previous_thread_hook, threading.excepthook = threading.excepthook, self._thread_hook
            if threading.current_thread() is threading.main_thread():
                self._install_sigterm()

    def remove(self, recorder: Recorder) -> None:
        with self._lock:
            self._recorders.discard(recorder)
            if self._recorders or not self._installed:
                return
            self._installed = False
            if sys.excepthook == self._excepthook:
                sys.excepthook = self._previous_excepthook
            if threading.excepthook == self._thread_hook:
                threading.excepthook = self._previous_thread_hook
            if threading.current_thread() is threading.main_thread():
                self._uninstall_sigterm()

    # ------------------------------------------------------------------ exceptions
    def _capture_all(self, reason: str, exception: Optional[BaseException], thread: Optional[int]) -> None:
        recorders = [r for r in list(self._recorders) if thread is None or r.training_thread == thread]
        for recorder in recorders:
            recorder.capture(reason, exception)
        deadline = time.monotonic() + DELIVERY_SECONDS
        for recorder in recorders:
            recorder.wait(max(0.0, deadline - time.monotonic()))

    def wait_captures(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s in all) until every live recorder's capture, if it made one, landed.

        Registered with :func:`dist_logging.dist.on_fatal_exit_wait`: the exit after a fatal error (which
        ends with ``os._exit``) waits for a set being uploaded, e.g. the ``logging_error`` capture of a rank
        whose script caught the :class:`~dist_logging.DistributedLoggingError` and returned.
        """
        deadline = time.monotonic() + timeout
        for recorder in list(self._recorders):
            if recorder.captured:
                recorder.wait(max(0.0, deadline - time.monotonic()))

    def _excepthook(self, kind: Any, value: Any, tb: Any) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main:
            self._in_hook.set()
        try:
            try:
                if not issubclass(kind, KeyboardInterrupt):
                    self._capture_all('exception', value, threading.get_ident())
            finally:
                previous = self._previous_excepthook or sys.__excepthook__
                previous(kind, value, tb)
        finally:
            if main:
                self._hook_returned.set()
                if self._sigterm_started.is_set():  # a SIGTERM came while we captured: act on it now
                    self._sigterm_done.wait(DELIVERY_SECONDS + _HOOK_GRACE)
                    self._act_on_sigterm(signal.SIGTERM, None)

    def _thread_hook(self, args: Any) -> None:
        try:
            if args.thread is not None and args.exc_type is not SystemExit:
                self._capture_all('exception', args.exc_value, args.thread.ident)
        finally:
            previous = self._previous_thread_hook or threading.__excepthook__
            previous(args)

    # ------------------------------------------------------------------ SIGTERM
    def _install_sigterm(self) -> None:
        try:
            previous = signal.getsignal(signal.SIGTERM)
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            try:
                old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            except (ValueError, OSError):
                old = None
            if old is not None and old != -1:  # someone else's wakeup fd (an asyncio loop): keep it
                signal.set_wakeup_fd(old)
                os.close(read_fd)
                os.close(write_fd)
            else:
                self._wakeup = (read_fd, write_fd)
                self._signal_thread = threading.Thread(
                    target=self._signal_loop, args=(read_fd,), name='dist_logging-postmortem-signal', daemon=True
                )
                self._signal_thread.start()
            signal.signal(signal.SIGTERM, self._sigterm_handler)
        except (ValueError, OSError):  # no signals here (an embedded interpreter)
            return
        self._previous_sigterm, self._sigterm_installed = previous, True

    def _uninstall_sigterm(self) -> None:
        if not self._sigterm_installed:
            return
        self._sigterm_installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._sigterm_handler:
                previous = self._previous_sigterm
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        if self._wakeup is not None:
            read_fd, write_fd = self._wakeup
            self._wakeup = None
            try:
                current = signal.set_wakeup_fd(-1)
                if current != write_fd:  # not ours any more: put it back
                    signal.set_wakeup_fd(current)
            except (ValueError, OSError):
                pass
            os.write(write_fd, b'\0')  # ends the signal thread
            thread = self._signal_thread
            if thread is not None:
                thread.join(1.0)
            os.close(write_fd)
            os.close(read_fd)

    def _signal_loop(self, read_fd: int) -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data or b'\0' in data:
                return
            if signal.SIGTERM in data:
                self._on_sigterm()

    def _on_sigterm(self) -> None:
        """A SIGTERM arrived: start this SIGTERM's capture (once). Never blocks: the capture, the wait for its
        delivery and the end of the process belong to the capture thread (:meth:`_sigterm_capture`)."""
        with self._signal_lock:
            if self._sigterm_started.is_set():
                return
            self._sigterm_started.set()
        threading.Thread(target=self._sigterm_capture, name='dist_logging-postmortem-sigterm', daemon=True).start()

    def _sigterm_capture(self) -> None:
        """Capture (once per rank), wait for delivery (bounded), then end the process as SIGTERM would have."""
        try:
            self._capture_all('sigterm', None, None)
        finally:
            self._sigterm_done.set()
        if self._previous_sigterm == signal.SIG_IGN:
            return
        # The main thread in our excepthook acts on the SIGTERM when the hook returns (the previous hook prints).
        if not self._in_hook.is_set() or self._hook_returned.wait(_HOOK_GRACE):
            if not self._main_took_over.is_set():
                try:  # the main thread's handler does what the previous handler would have, if it gets to run
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
                except (OSError, ValueError):
                    pass
            if self._main_took_over.wait(_MAIN_GRACE):
                return
        # The main thread is stuck in native code (a collective that will not complete): end here.
        sys.stderr.write(f'dist_logging: SIGTERM: postmortem captured; ending the process (exit {_SIGTERM_EXIT})\n')
        sys.stderr.flush()
        os._exit(_SIGTERM_EXIT)

    def _sigterm_handler(self, signum: int, frame: Any) -> None:
        """(main thread) Never waits here: the main thread may be interrupted inside the capture (our excepthook)
        or holding a lock the capture needs. Until the capture is done, note the signal and return; the capture
        thread signals the main thread again when its set landed (or its bound passed)."""
        self._on_sigterm()
        if not self._sigterm_done.is_set():
            return
        if self._in_hook.is_set() and not self._hook_returned.is_set():
            return  # the main thread is in our excepthook: it acts on the SIGTERM when the hook returns
        self._act_on_sigterm(signum, frame)

    def _act_on_sigterm(self, signum: int, frame: Any) -> None:
        """Do what the previous handler would have done (the capture is over); once."""
        with self._signal_lock:
            if self._main_took_over.is_set():
                return
            self._main_took_over.set()
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


_hooks = _ProcessHooks()
dist.on_fatal_exit_wait(_hooks.wait_captures)
