"""Copying what a process writes to ``sys.stdout``/``sys.stderr`` into a log, line by line.

Used by ``FileLogger(capture_stdout=True, capture_stderr=True)``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional, TextIO

__all__ = ['StreamTee', 'install_tee', 'remove_tee']

_MAX_PARTIAL = 1 << 16  # a line longer than this (a progress bar without newlines) is cut into pieces


class StreamTee:
    """Stands in for a text stream: everything written goes to the stream first, then, line by line, to ``sink``.

    Every other attribute (``encoding``, ``fileno``, ``isatty``, ``buffer``...) is the stream's own,
    so libraries that inspect ``sys.stdout`` see the real terminal. ``sink`` gets each complete line
    without its newline; an error it raises is kept in :attr:`error` (never raised into ``print``).

    Args:
        stream: the stream to stand in for (e.g. ``sys.stdout``).
        sink: called with each complete line.
    """

    def __init__(self, stream: TextIO, sink: Callable[[str], None]):
        self._stream = stream
        self._sink: Optional[Callable[[str], None]] = sink
        self._partial = ''
        self._lock = threading.Lock()
        self.error: Optional[BaseException] = None

    @property
    def stream(self) -> TextIO:
        """The stream this tee writes to."""
        return self._stream

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if self._sink is not None and text:
            with self._lock:
                data = self._partial + text
                if '\n' in data:
                    *lines, self._partial = data.split('\n')
                    for line in lines:
                        self._emit(line)
                else:
                    self._partial = data
                while len(self._partial) > _MAX_PARTIAL:
                    piece, self._partial = self._partial[:_MAX_PARTIAL], self._partial[_MAX_PARTIAL:]
                    self._emit(piece)
        return len(text) if written is None else written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def _emit(self, line: str) -> None:
        sink = self._sink
        if sink is None:
            return
        try:
            sink(line)
        except Exception as exc:  # noqa: BLE001 - a print must never fail because the log copy did
            if self.error is None:
                self.error = exc

    def detach(self) -> None:
        """Write out an unfinished last line and stop copying (writes still reach the stream)."""
        with self._lock:
            partial, self._partial = self._partial, ''
            if partial:
                self._emit(partial)
            self._sink = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __repr__(self) -> str:
        return f'<StreamTee of {self._stream!r}>'


def install_tee(name: str, sink: Callable[[str], None]) -> StreamTee:
    """Replace ``sys.<name>`` (``'stdout'`` or ``'stderr'``) by a tee copying its lines to ``sink``."""
    tee = StreamTee(getattr(sys, name), sink)
    setattr(sys, name, tee)
    return tee


def remove_tee(name: str, tee: StreamTee) -> None:
    """Stop ``tee``; put its stream back as ``sys.<name>`` when nobody replaced the tee since.

    When someone wrapped the tee in turn, it stays in their chain, passing writes through.
    """
    tee.detach()
    if getattr(sys, name) is tee:
        setattr(sys, name, tee.stream)
