"""Per-rank section timing on the training thread: :class:`Section` and :class:`SectionTimer`.

The timer only adds numbers on the training thread: entering a section reads the clock and
pushes a frame, leaving it adds the elapsed time to the section's total (no lock, no allocation
in the steady state, no collective). The totals of a window are read at a report.

Busy time, the quantity ranks are compared by, is the time in top-level *work* sections,
minus any *wait* section nested inside one (a rank waiting for its peers inside ``forward``
is not working). With no work section marked in a window, busy time is the window's wall
time minus the wait sections and the Logger's own collectives (see :meth:`SectionTimer.take`).

On CUDA (``device='cuda'``, or ``'auto'`` once CUDA is initialized) a section records two
CUDA events on the current stream; their elapsed time is read at a later report, once the
events completed (``Event.query()``), never by synchronizing the training thread. Sections
whose events are still pending at a report count in the next window.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Optional

from dist_logging.stragglers._core import ACCELERATED, SectionCore, TimerCore
from dist_logging.stragglers._core import clock as core_clock

__all__ = ['Section', 'SectionTimer', 'WindowTotals', 'check_section_name', 'RESERVED_NAMES']

# Names the report uses for its own series; a section may not take them.
RESERVED_NAMES = frozenset({'busy', 'step', 'memory', 'stragglers'})
_NAME = re.compile(r'[A-Za-z0-9_.\-]{1,64}')

# Contribution of a finished section to busy time: +1 top-level work, -1 a wait nested in
# work (taken back out of it), 0 otherwise (nested work, a wait inside a wait, a top-level wait).
_ADD, _SUBTRACT, _NONE = 1, -1, 0


def check_section_name(name: Any) -> str:
    """Return ``name`` if it can name a section (it becomes part of metric keys ``ranks/<name>/...``).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: empty, longer than 64 characters, a character outside ``[A-Za-z0-9_.-]``,
            or a reserved name (``busy``, ``step``, ``memory``, ``stragglers``).
    """
    if not isinstance(name, str):
        raise TypeError(f'section name must be a str, got {type(name).__name__} {name!r}')
    if not _NAME.fullmatch(name):
        raise ValueError(f'section name {name!r}: use 1 to 64 characters of letters, digits, "_", "." and "-"')
    if name in RESERVED_NAMES:
        raise ValueError(f'section name {name!r} is reserved for the report (reserved: {sorted(RESERVED_NAMES)})')
    return name


class WindowTotals:
    """What one rank measured in one window (a report interval).

    Attributes:
        steps: batches ended in the window.
        wall_s: wall-clock seconds of the window.
        busy_s: busy seconds (see the module docstring), summed over the window.
        wait_s: seconds in top-level wait sections.
        collective_s: seconds in the Logger's own collectives.
        sections: section name -> seconds summed over the window (nested sections included).
        memory_bytes: peak CUDA memory allocated in the window, else the resident set size at
            the report; None when memory is not measured.
        per_step_s: each step's busy seconds (wall clock only; None on CUDA, where only the sum is known).
    """

    __slots__ = (
        'steps',
        'wall_s',
        'busy_s',
        'wait_s',
        'collective_s',
        'sections',
        'memory_bytes',
        'per_step_s',
        '_jitter',
    )

    def __init__(
        self,
        steps: int,
        wall_s: float,
        busy_s: float,
        wait_s: float,
        collective_s: float,
        sections: dict[str, float],
        memory_bytes: Optional[float],
        per_step_s: Optional[list[float]] = None,
    ):
        self.steps = steps
        self.wall_s = wall_s
        self.busy_s = busy_s
        self.wait_s = wait_s
        self.collective_s = collective_s
        self.sections = sections
        self.memory_bytes = memory_bytes
        self.per_step_s = per_step_s
        self._jitter: Optional[tuple[Optional[float], Optional[float]]] = None

    # The median and its deviation are computed where they are read (the report thread), not when the
    # training thread ends the window.
    @property
    def busy_median_s(self) -> Optional[float]:
        """The median step's busy seconds (None when the steps' times are not known, e.g. on CUDA)."""
        return self._median_and_mad()[0]

    @property
    def busy_mad_s(self) -> Optional[float]:
        """The median absolute deviation of the steps' busy seconds from their median: the rank's own
        step-to-step jitter in the window (None when the median is None)."""
        return self._median_and_mad()[1]

    def _median_and_mad(self) -> tuple[Optional[float], Optional[float]]:
        if self._jitter is None:
            if self.per_step_s:
                median = _median(self.per_step_s)
                self._jitter = (median, _median([abs(value - median) for value in self.per_step_s]))
            else:
                self._jitter = (None, None)
        return self._jitter

    def __repr__(self) -> str:
        return (
            f'WindowTotals(steps={self.steps}, wall_s={self.wall_s:.6f}, busy_s={self.busy_s:.6f}, '
            f'sections={self.sections})'
        )


class Section(SectionCore):
    """A named block timed on this rank: a context manager, a decorator, or ``start()``/``stop()``.

    Get one from :meth:`dist_logging.Logger.section`; the same object may be entered again
    while it is open (recursion) and on every step. Sections nest; time in a nested section
    counts for its own name and, unless it is a wait section, as part of its parent's work.

    Args:
        timer: the :class:`SectionTimer` that accumulates it.
        name: the section's name (see :func:`check_section_name`).
        wait: True for a block where this rank waits for others (a collective, a barrier):
            counted as waiting, not as busy time.
    """

    # The with-statement (__enter__/__exit__) comes from the core (_core.py): compiled when built. The
    # window's seconds are kept on the section itself: the hot path touches as few objects as it can.
    __slots__ = ('name', '_opened')

    def __init__(self, timer: 'SectionTimer', name: str, wait: bool = False):
        self._timer = timer
        self.name = check_section_name(name)
        self.wait = bool(wait)
        self._opened = 0  # start() calls not yet stopped, for start()/stop() users (framework hooks)
        # For the outermost section on the wall clock (the common case), __enter__ pushes the frame
        # itself (the timer's frame list is never replaced).
        self._stack, self._clock = timer._stack, timer._clock
        self._top = _NONE if self.wait else _ADD
        self._seconds = 0.0  # on the wall clock, in the current window (read and reset by SectionTimer.take)
        self._entered = False  # closed at least once in the current window
        self._wall = timer._inline()  # the core may time it inline (set again by the timer once it knows)

    def __call__(self, fn: Callable) -> Callable:
        """Use the section as a decorator: every call of ``fn`` is timed."""
        timer, section = self._timer, self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            timer.enter(section)
            try:
                return fn(*args, **kwargs)
            finally:
                timer.exit(section)

        return timed

    def start(self) -> None:
        """Open the section (for hook-based code that cannot use ``with``); close it with :meth:`stop`."""
        self._timer.enter(self)
        self._opened += 1

    def stop(self) -> None:
        """Close the section opened by :meth:`start`; does nothing when it is not open (a hook that
        fires without its partner, e.g. after an exception, must not break the next step)."""
        if self._opened:
            self._opened -= 1
            self._timer.exit(self)

    @property
    def is_open(self) -> bool:
        """Whether :meth:`start` was called more often than :meth:`stop`."""
        return self._opened > 0

    def __repr__(self) -> str:
        return f'Section({self.name!r}, wait={self.wait})'


class SectionTimer(TimerCore):
    """Accumulates this rank's section times, the window's wall time and the Logger's collective time.

    Call everything from one thread (the training thread). Nothing here communicates.

    Args:
        device: ``'cpu'`` (wall clock), ``'cuda'`` (CUDA events, read later), or ``'auto'``:
            CUDA events when CUDA is initialized when the first section opens, else wall clock.
        memory: whether :meth:`take` measures memory (peak CUDA allocated, else RSS).
        clock: the wall clock (seconds); None for the core's (:func:`dist_logging.stragglers._core.clock`,
            the monotonic clock ``time.perf_counter`` reads). Tests pass their own; sections of a timer
            with its own clock always run the Python path.

    Attributes:
        work_marked: whether a work section closed in the current window (busy time then comes
            from sections alone).

    Raises:
        ValueError: an unknown ``device``.
    """

    # _busy, _wait and work_marked are the core's (TimerCore), where the compiled sections add to them.
    __slots__ = (
        '_device',
        '_memory',
        '_clock',
        '_sections',
        '_late',
        '_stack',
        '_collective',
        '_steps',
        '_window_start',
        '_per_step',
        '_mark',
        '_mark_busy',
        '_cuda',
        '_events',
        '_resident',
    )

    def __init__(self, device: str = 'auto', memory: bool = True, clock: Optional[Callable[[], float]] = None):
        if device not in ('auto', 'cpu', 'cuda'):
            raise ValueError(f"section timing device must be 'auto', 'cpu' or 'cuda', got {device!r}")
        self._device = device
        self._memory = bool(memory)
        self._clock = clock = core_clock if clock is None else clock
        self._sections: dict[tuple[str, bool], Section] = {}
        self._late: dict[str, float] = {}  # section name -> seconds read from CUDA events in this window
        self._stack: list[tuple[Section, float, int, bool, Any]] = []  # the open frames, outermost first
        self._busy = 0.0
        self._wait = 0.0
        # Whether a work section closed in this window (busy time then comes from sections alone); an
        # attribute, not a property: the Logger reads it at every batch_end.
        self.work_marked = False
        self._collective = 0.0
        self._steps = 0
        self._window_start = clock()
        # Busy seconds of each step of the window (wall clock only): the report compares ranks by their
        # median step, as NVRx does, so a rank descheduled for a few steps is not a straggler.
        self._per_step: list[float] = []
        self._mark = (self._window_start, 0.0, 0.0, 0.0)  # at the last step: time, busy, wait, collective
        self._mark_busy = 0.0  # busy at the last step (the sections' path keeps only this)
        self._cuda: Optional[bool] = None if device == 'auto' else device == 'cuda'
        self._events: Any = None  # the CUDA event bookkeeping, made on first use
        self._resident = _ResidentSet()

    # ------------------------------------------------------------------ hot path
    def section(self, name: str, wait: bool = False) -> Section:
        """The :class:`Section` for ``name`` (one object per name and kind, reused).

        Raises:
            TypeError, ValueError: a bad name (see :func:`check_section_name`).
        """
        key = (name, wait)
        found = self._sections.get(key)
        if found is None:
            found = self._sections[key] = Section(self, name, bool(wait))
        return found

    def _inline(self) -> bool:
        """Whether sections may time themselves inline (the core's outermost frame on the wall clock): not
        on CUDA, and (compiled core) the timer reads the core's clock."""
        return self._cuda is False and (not ACCELERATED or self._clock is core_clock)

    def enter(self, section: Section) -> None:
        """Open a frame for ``section`` (called by :class:`Section`)."""
        # Frames are (section, start, contribution, inside_wait, start_event).
        wait = section.wait
        stack = self._stack
        if stack:
            inside_wait = stack[-1][3]
            contribution = _SUBTRACT if wait and not inside_wait and stack[0][2] == _ADD else _NONE
            inside_wait = inside_wait or wait
        else:
            contribution = _NONE if wait else _ADD
            inside_wait = wait
        if self._cuda is False:
            stack.append((section, self._clock(), contribution, inside_wait, None))
            return
        if self._cuda is None:
            self._cuda = _cuda_ready()
            if not self._cuda:
                for known in self._sections.values():
                    known._wall = self._inline()
        event = self._device_events().record() if self._cuda else None
        stack.append((section, self._clock(), contribution, inside_wait, event))

    def exit(self, section: Section) -> None:
        """Close the innermost frame, which must be ``section``'s.

        Raises:
            RuntimeError: ``section`` is not the innermost open section (sections must nest).
        """
        end = self._clock()
        stack = self._stack
        if not stack or stack[-1][0] is not section:
            open_names = [frame[0].name for frame in stack]
            raise RuntimeError(
                f'section {section.name!r} closed while {open_names or "no section"} is open; '
                'sections must nest (close the innermost first)'
            )
        _, start, contribution, inside_wait, event = stack.pop()
        if event is not None:
            self._device_events().finish(event, section.name, contribution, inside_wait and not stack)
            return
        seconds = end - start
        section._seconds += seconds
        section._entered = True
        if contribution == _ADD:
            self._busy += seconds
            self.work_marked = True
        elif contribution == _SUBTRACT:
            self._busy -= seconds
        elif inside_wait and not stack:
            self._wait += seconds

    def _add(self, name: str, seconds: float, contribution: int, wait_top: bool) -> None:
        """Count a section's time read later (CUDA events)."""
        late = self._late
        late[name] = late.get(name, 0.0) + seconds
        if contribution == _ADD:
            self._busy += seconds
            self.work_marked = True
        elif contribution == _SUBTRACT:
            self._busy -= seconds
        elif wait_top:
            self._wait += seconds

    def add_collective(self, seconds: float) -> None:
        """Count ``seconds`` spent in the Logger's own collectives (not busy time)."""
        self._collective += seconds

    def step(self) -> None:
        """One batch ended."""
        self._steps += 1
        if self.work_marked:  # the common case: work sections marked; no clock read needed
            busy = self._busy
            self._per_step.append(busy - self._mark_busy)
            self._mark_busy = busy
            return
        now = self._clock()
        then, _, wait, collective = self._mark
        self._per_step.append(max((now - then) - (self._wait - wait) - (self._collective - collective), 0.0))
        self._mark = (now, self._busy, self._wait, self._collective)
        self._mark_busy = self._busy

    # ------------------------------------------------------------------ window
    @property
    def steps(self) -> int:
        """Batches ended in the current window."""
        return self._steps

    @property
    def open_sections(self) -> list[str]:
        """Names of the sections open now, outermost first."""
        return [frame[0].name for frame in self._stack]

    def take(self) -> WindowTotals:
        """End the window: return its totals and start the next one (at a report, on every rank).

        Sections still open count in the window in which they close; on CUDA, sections whose
        events have not completed count in the window in which they are read.
        """
        now = self._clock()
        if self._events is not None:
            for name, seconds, contribution, wait_top in self._events.completed():
                self._add(name, seconds, contribution, wait_top)
        wall = now - self._window_start
        busy = self._busy if self.work_marked else max(wall - self._wait - self._collective, 0.0)
        # The median step on the wall clock (computed by the reader); on CUDA the steps' device times
        # arrive late, so the mean.
        per_step = self._per_step if self._events is None else None
        seconds = self._late  # CUDA times read now, then what the sections timed on the wall clock
        for section in self._sections.values():
            if section._entered:
                seconds[section.name] = seconds.get(section.name, 0.0) + section._seconds
                section._seconds, section._entered = 0.0, False
        totals = WindowTotals(
            self._steps,
            wall,
            busy,
            self._wait,
            self._collective,
            seconds,
            self._read_memory() if self._memory else None,
            per_step,
        )
        self._late = {}
        self._busy = self._wait = self._collective = 0.0
        self.work_marked = False
        self._steps = 0
        self._window_start = now
        self._per_step = []
        self._mark = (now, 0.0, 0.0, 0.0)
        self._mark_busy = 0.0
        return totals

    def _read_memory(self) -> Optional[float]:
        if self._cuda:
            import torch

            peak = float(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()  # the next window's peak is its own
            return peak
        return self._resident.read()

    def close(self) -> None:
        """Release the file descriptor memory is read through (the timer keeps working; it reopens it)."""
        self._resident.close()

    def _device_events(self) -> '_DeviceEvents':
        if self._events is None:
            self._events = _DeviceEvents()
        return self._events


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _cuda_ready() -> bool:
    """CUDA timing only when the program already initialized CUDA (never initialize it for the user)."""
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken CUDA install means wall-clock timing
        return False


class _ResidentSet:
    """The resident set size of this process, read at each report from ``/proc/<pid>/statm`` through one file
    descriptor kept open (one ``pread``: the report runs on the training thread); after a fork the child
    opens its own. Where there is no ``/proc``, the peak from ``getrusage``."""

    __slots__ = ('_fd', '_pid', '_page')

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._pid = -1
        self._page = 0

    def read(self) -> Optional[float]:
        try:
            if self._pid != os.getpid():
                self.close()
                self._fd = os.open(f'/proc/{os.getpid()}/statm', os.O_RDONLY | getattr(os, 'O_CLOEXEC', 0))
                self._pid, self._page = os.getpid(), os.sysconf('SC_PAGE_SIZE')
            return float(int(os.pread(self._fd, 128, 0).split()[1]) * self._page)  # type: ignore[arg-type]
        except (OSError, ValueError, IndexError, AttributeError):
            try:
                import resource

                return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            except Exception:  # noqa: BLE001 - memory is optional
                return None

    def close(self) -> None:
        """Close the descriptor (a later :meth:`read` opens it again)."""
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self._pid = None, -1


class _DeviceEvents:
    """CUDA event pairs recorded on the current stream and read once they completed.

    ``record`` takes an event from a pool (creating CUDA events on every step would cost
    more than timing); ``completed`` returns the finished pairs' times (``Event.query()`` is
    True, so ``elapsed_time`` does not block) and puts their events back in the pool.
    """

    def __init__(self, event_factory: Optional[Callable[[], Any]] = None):
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

        self._factory = event_factory
        self._pool: list[Any] = []
        self._pending: list[tuple[Any, Any, str, int, bool]] = []

    def record(self) -> Any:
        event = self._pool.pop() if self._pool else self._factory()
        event.record()
        return event

    def finish(self, start: Any, name: str, contribution: int, wait_top: bool) -> None:
        end = self.record()
        self._pending.append((start, end, name, contribution, wait_top))

    def completed(self) -> list[tuple[str, float, int, bool]]:
        done, still = [], []
        for pair in self._pending:
            start, end = pair[0], pair[1]
            if end.query():  # the end completed, so the start did too (same stream, earlier)
                done.append((pair[2], start.elapsed_time(end) / 1000.0, pair[3], pair[4]))
                self._pool.extend((start, end))
            else:
                still.append(pair)
        self._pending = still
        return done
