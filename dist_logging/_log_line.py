"""The line format of the per-rank files that ``setup_logging`` writes, shared by the writer and the reader.

One record is one header line, then one line per further line of its message (a traceback,
a multi-line warning), each starting with a TAB::

    2026-11-23T11:08:50.123456Z rank 3 ERROR train.data: could not read shard 17
    \tTraceback (most recent call last):
    \t  File "train.py", line 12, in <module>

A header starts with a digit and a continuation with a TAB, so no message text can be taken
for a header, whatever it contains. Level and logger names have their whitespace replaced by
``_`` so that the first ``': '`` after the name ends it. This module imports nothing heavy:
``dist-logging logs`` reads files without importing torch.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import Optional

__all__ = ['CONTINUATION', 'HEADER_RE', 'format_record', 'utc_iso', 'parse_utc_iso', 'level_number']

CONTINUATION = '\t'

# time, rank, level, logger, first line of the message
HEADER_RE = re.compile(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z rank (\d+) (\S+) (\S+): (.*)\Z')

_WHITESPACE = re.compile(r'\s')


_SECOND_TEXT: dict[int, str] = {}  # recent whole seconds -> their text: records come many per second


def utc_iso(created: float) -> str:
    """``1763895530.5`` -> ``'2025-11-23T10:58:50.500000'`` (UTC, microseconds, no zone letter)."""
    seconds = int(created)
    micros = int(round((created - seconds) * 1_000_000))
    if micros >= 1_000_000:  # rounding up to the next second
        seconds, micros = seconds + 1, micros - 1_000_000
    text = _SECOND_TEXT.get(seconds)
    if text is None:
        if len(_SECOND_TEXT) > 64:
            _SECOND_TEXT.clear()
        text = _SECOND_TEXT[seconds] = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))
    return f'{text}.{micros:06d}'


_SECOND_VALUE: dict[str, int] = {}  # recent 'YYYY-MM-DDTHH:MM:SS' -> seconds since the epoch


def parse_utc_iso(text: str) -> float:
    """The inverse of :func:`utc_iso` (``'YYYY-MM-DDTHH:MM:SS.ffffff'``, UTC) as seconds since the epoch.

    Raises:
        ValueError: ``text`` is not in that form.
    """
    whole = text[:19]
    base = _SECOND_VALUE.get(whole)
    if base is None:
        if len(_SECOND_VALUE) > 64:
            _SECOND_VALUE.clear()
        base = _SECOND_VALUE[whole] = calendar.timegm(time.strptime(whole, '%Y-%m-%dT%H:%M:%S'))
    return base + int(text[20:26]) / 1e6


def _token(name: str) -> str:
    if not name:
        return '-'
    return _WHITESPACE.sub('_', name) if _WHITESPACE.search(name) else name


def format_record(created: float, rank: int, level: str, logger: str, message: str) -> str:
    """One record as it is written to the file, without the final newline."""
    header = f'{utc_iso(created)}Z rank {rank} {_token(level)} {_token(logger)}: '
    if '\n' not in message:
        return header + message
    first, *rest = message.split('\n')
    return header + first + ''.join('\n' + CONTINUATION + line for line in rest)


_LEVELS = {'CRITICAL': 50, 'FATAL': 50, 'ERROR': 40, 'WARNING': 30, 'WARN': 30, 'INFO': 20, 'DEBUG': 10, 'NOTSET': 0}


def level_number(name: str) -> Optional[int]:
    """The number of a level name (``'WARNING'`` -> 30, ``'Level_5'`` -> 5, ``'25'`` -> 25); None if unknown."""
    number = _LEVELS.get(name.upper())
    if number is not None:
        return number
    if name.isdigit():
        return int(name)
    if name.startswith(('Level_', 'Level ')) and name[6:].isdigit():
        return int(name[6:])
    return None
