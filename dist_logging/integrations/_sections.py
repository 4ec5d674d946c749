"""The sections a framework adapter marks from its framework's hooks (see docs/stragglers.md).

Hooks cannot use ``with``: the adapter switches from one section to the next as the hooks fire
(``data`` until the step starts, then ``forward`` ...), with at most one of its own sections open.
A hook order the adapter did not expect (a user's section left open across hooks, a framework
version that calls hooks differently) turns the marks off with one warning; training goes on.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

__all__ = ['StepSections']


class StepSections:
    """Switches the adapter's open section as hooks fire."""

    def __init__(self, owner: str):
        self._owner = owner
        self._open: Any = None
        self._broken = False

    def switch(self, logger: Any, name: Optional[str], wait: bool = False) -> None:
        """Close the open section, then open ``name`` (None: open none)."""
        if self._broken:
            return
        try:
            if self._open is not None:
                self._open, section = None, self._open
                section.stop()
            if name is not None:
                section = logger.section(name, wait)
                section.start()
                self._open = section
        except RuntimeError as exc:  # sections out of nesting order
            self._broken = True
            warnings.warn(f'{self._owner}: section marks turned off ({exc})', RuntimeWarning, stacklevel=3)

    def step_end(self, logger: Any, batch: Optional[int] = None, then: Optional[str] = 'data') -> None:
        """One step ended: close the open section, count the step for the rank report, open ``then``."""
        self.switch(logger, None)
        logger.rank_report_step(batch)
        self.switch(logger, then)
