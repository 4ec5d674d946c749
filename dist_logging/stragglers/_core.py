"""The hot path of section timing: the compiled core when it is built, else the same classes in Python.

:class:`~dist_logging.stragglers.timer.Section`, :class:`~dist_logging.stragglers.timer.SectionTimer` and
:class:`~dist_logging.stragglers.reporter.NullSection` derive from the classes here. The compiled module
(``_csections.c``, built on POSIX at install) implements the with-statement of the outermost
section on the wall clock, which runs at every step with cold caches; everything else (nesting,
CUDA events, decorators, ``start()``/``stop()``, the report) is Python either way, and sees the
same frames (docs/stragglers.md, "Cost").

Set ``DIST_LOGGING_NO_EXTENSIONS=1`` before import to use the Python classes (what a platform
without a compiler gets). :data:`ACCELERATED` says which core is in use.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

__all__ = ['ACCELERATED', 'NullSectionCore', 'SectionCore', 'TimerCore', 'clock']


class _PyTimerCore:
    """The window's busy and wait seconds (Python core)."""

    __slots__ = ('_busy', '_wait', 'work_marked')

    _busy: float
    _wait: float
    work_marked: bool


class _Timer(Protocol):
    """What a section's core needs of its timer (SectionTimer, in timer.py)."""

    _busy: float
    _wait: float
    work_marked: bool

    def enter(self, section: Any) -> None: ...

    def exit(self, section: Any) -> None: ...


class _PySectionCore:
    """A section's with-statement (Python core): the outermost frame on the wall clock inline, else the timer's."""

    # The with-statement is the hot path, and after a step's device wait it runs with cold caches, so it
    # touches as few objects as it can.
    __slots__ = ('_timer', '_stack', '_clock', '_top', '_seconds', '_entered', '_wall', 'wait')

    # Set by Section.__init__ (timer.py).
    _timer: _Timer
    _stack: list[tuple[Any, float, int, bool, Any]]  # the timer's open frames: (section, start, contribution, ...)
    _clock: Callable[[], float]
    _top: int  # the contribution of an outermost frame: timer._ADD or timer._NONE
    _seconds: float
    _entered: bool
    _wall: bool
    wait: bool

    def __enter__(self) -> Any:
        stack = self._stack
        if stack or not self._wall:
            self._timer.enter(self)
        else:  # what SectionTimer.enter does for an outermost frame on the wall clock
            stack.append((self, self._clock(), self._top, self.wait, None))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        stack = self._stack
        if len(stack) == 1 and self._wall:  # the outermost frame on the wall clock: SectionTimer.exit's work, inline
            frame = stack[0]
            if frame[0] is self and frame[4] is None:
                seconds = self._clock() - frame[1]
                stack.pop()
                self._seconds += seconds
                self._entered = True
                if frame[2] == 1:  # top-level work (timer._ADD)
                    timer = self._timer
                    timer._busy += seconds
                    timer.work_marked = True
                elif frame[3]:  # a top-level wait
                    self._timer._wait += seconds
                return
        self._timer.exit(self)


class _PyNullSectionCore:
    """A with-statement that does nothing (Python core)."""

    __slots__ = ()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _load() -> tuple[bool, Any, Any, Any, Any]:
    python = (False, _PyTimerCore, _PySectionCore, _PyNullSectionCore, time.perf_counter)
    if os.environ.get('DIST_LOGGING_NO_EXTENSIONS', '').strip() not in ('', '0'):
        return python
    try:
        from dist_logging.stragglers._csections import NullSectionCore, SectionCore, TimerCore
        from dist_logging.stragglers._csections import clock as compiled_clock
    except ImportError:  # not built (no compiler at install, or not POSIX)
        return python
    return True, TimerCore, SectionCore, NullSectionCore, compiled_clock


#: Whether the compiled core is in use.
ACCELERATED: bool
if TYPE_CHECKING:
    # Type checkers see the Python core: the compiled one implements the same slots and methods.
    ACCELERATED = False
    TimerCore = _PyTimerCore
    SectionCore = _PySectionCore
    NullSectionCore = _PyNullSectionCore
    clock = time.perf_counter
else:
    ACCELERATED, TimerCore, SectionCore, NullSectionCore, clock = _load()
