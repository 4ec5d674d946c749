"""Finding ranks' log files and reading them record by record, for ``dist-logging logs``."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from typing import Callable, Iterable, Iterator, Optional, Sequence

from dist_logging._log_line import CONTINUATION, HEADER_RE, parse_utc_iso

__all__ = ['Record', 'LogSource', 'parse_ranks', 'format_ranks', 'find_log_files', 'read_records', 'resume_markers']

_SNIFF_BYTES = 1 << 16
_RANK_IN_NAME = re.compile(r'(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])', re.IGNORECASE)
_TEXT_LINE = re.compile(r'\[([A-Za-z_][A-Za-z0-9_]*)\]')
_TEXT_STEP = re.compile(r'\[metric\]\[batch=(\d+)\]')
# FileLogger's resume marker (text), and the first superseded step it names.
_TEXT_RESUME = re.compile(r'\[resume\]: .*: steps >= (\d+) written above are superseded')
_SKIP_EXTENSIONS = frozenset(
    {
        '.png',
        '.jpg',
        '.jpeg',
        '.csv',
        '.pt',
        '.pth',
        '.bin',
        '.safetensors',
        '.npy',
        '.npz',
        '.gz',
        '.zip',
        '.tar',
        '.pkl',
        '.db',
        '.json',
        '.yaml',
        '.yml',
        '.lock',
    }
)


def parse_ranks(text: str) -> frozenset[int]:
    """``'0,3-5'`` -> ``{0, 3, 4, 5}``.

    Raises:
        ValueError: an empty list, a part that is not ``N`` or ``N-M`` with ``N <= M``, a negative rank.
    """
    ranks: set[int] = set()
    for part in str(text).split(','):
        part = part.strip()
        match = re.fullmatch(r'(\d+)(?:\s*-\s*(\d+))?', part)
        if not match:
            raise ValueError(f'bad rank list {text!r}: {part!r} is not a rank (N) or a range (N-M)')
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f'bad rank list {text!r}: range {part!r} ends before it starts')
        if high - low > 1_000_000:
            raise ValueError(f'bad rank list {text!r}: range {part!r} is too large')
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def format_ranks(ranks: Iterable[int]) -> str:
    """``{0, 2, 3, 4, 5, 7}`` -> ``'0,2-5,7'``."""
    ordered = sorted(set(ranks))
    parts = []
    for _, run in itertools.groupby(enumerate(ordered), key=lambda item: item[1] - item[0]):
        values = [value for _, value in run]
        parts.append(str(values[0]) if len(values) == 1 else f'{values[0]}-{values[-1]}')
    return ','.join(parts)


def rank_from_path(path: str) -> Optional[int]:
    """The rank a file name (or, failing that, its folder's name) names, if any."""
    head, name = os.path.split(path)
    for part in (name, os.path.basename(head)):
        matches = _RANK_IN_NAME.findall(part)
        if matches:
            return int(matches[-1])
    return None


# ---------------------------------------------------------------------------- records
class Record:
    """One log record read from a file.

    Attributes:
        time: seconds since the epoch (UTC), or None for formats without times.
        rank: the global rank that wrote it.
        level: the level name (``'INFO'``) or, for FileLogger records, the kind (``'METRIC'``, ``'STDOUT'``).
        logger: the Python logger's name, or None for FileLogger records.
        message: the message, possibly several lines (a traceback).
        step: the training step of a FileLogger record that has one (metrics; tables and images in JSON
            Lines), else None.
        line: the number (from 0) of the record's first line in its file.
    """

    __slots__ = ('time', 'rank', 'level', 'logger', 'message', 'step', 'line')

    def __init__(
        self,
        time: Optional[float],
        rank: int,
        level: str,
        logger: Optional[str],
        message: str,
        step: Optional[int] = None,
        line: int = 0,
    ):
        self.time = time
        self.rank = rank
        self.level = level
        self.logger = logger
        self.message = message
        self.step = step
        self.line = line

    def __repr__(self) -> str:
        return f'Record({self.time!r}, rank={self.rank}, {self.level}, {self.logger!r}, {self.message!r})'


class LogSource:
    """One per-rank log file: its path, the rank its name gives, its format once known."""

    def __init__(self, path: str, index: int, rank: Optional[int] = None, kind: Optional[str] = None):
        self.path = path
        self.index = index
        self.rank = rank
        self.kind = kind  # 'python', 'jsonl', 'text', or None until a first line is read

    def __repr__(self) -> str:
        return f'LogSource({self.path!r}, rank={self.rank}, kind={self.kind})'


def sniff_line(line: str) -> Optional[str]:
    """The format a first line belongs to: ``'python'``, ``'jsonl'``, ``'text'``, or None."""
    if HEADER_RE.match(line.rstrip('\n')):
        return 'python'
    stripped = line.strip()
    if stripped.startswith('{'):
        try:
            obj = json.loads(stripped)
        except ValueError:
            return None
        return 'jsonl' if isinstance(obj, dict) and 'kind' in obj and 'time' in obj else None
    if _TEXT_LINE.match(stripped):
        return 'text'
    return None


def _first_line(path: str) -> Optional[str]:
    """The first line of a file (at most 64 KiB of it); None for an empty file."""
    with open(path, 'r', encoding='utf-8', errors='replace', newline='\n') as handle:
        line = handle.readline(_SNIFF_BYTES)
    return line or None


class LineParser:
    """Turns the lines of one file into records: ``feed`` returns the record a line completes."""

    def __init__(self, source: LogSource):
        self.source = source
        self.pending: Optional[Record] = None
        self.lines: list[str] = []
        self.line_no = -1  # of the line being fed

    def _complete(self) -> Optional[Record]:
        record = self.pending
        if record is not None and self.lines:
            record.message = record.message + '\n' + '\n'.join(self.lines)
        self.pending, self.lines = None, []
        return record

    def _start(self, record: Record) -> Optional[Record]:
        done = self._complete()
        record.line = self.line_no
        self.pending = record
        return done

    def _orphan(self, text: str) -> Optional[Record]:
        # Text before a file's first record (or after a finished one in --follow): its own record, kept.
        rank = self.source.rank if self.source.rank is not None else 0
        return self._start(Record(None, rank, '-', None, text))

    def feed(self, line: str) -> Optional[Record]:
        self.line_no += 1
        line = line[:-1] if line.endswith('\n') else line
        kind = self.source.kind
        if kind is None:
            kind = self.source.kind = sniff_line(line) or 'text'
        if kind == 'python':
            match = HEADER_RE.match(line)
            if match is not None:
                stamp, rank, level, logger, message = match.groups()
                return self._start(Record(parse_utc_iso(stamp), int(rank), level, logger, message))
            if self.pending is None:
                return self._orphan(line)
            self.lines.append(line[1:] if line.startswith(CONTINUATION) else line)
            return None
        if kind == 'jsonl':
            return self._start(self._json_record(line)) if line.strip() else None
        match = _TEXT_LINE.match(line)
        if match is not None:
            rank = self.source.rank if self.source.rank is not None else 0
            step = _TEXT_STEP.match(line)
            return self._start(
                Record(
                    None,
                    rank,
                    match.group(1).upper(),
                    None,
                    line[match.end() :].lstrip(': '),
                    int(step.group(1)) if step else None,
                )
            )
        if self.pending is None:
            return self._orphan(line)
        self.lines.append(line)
        return None

    def _json_record(self, line: str) -> Record:
        rank = self.source.rank if self.source.rank is not None else 0
        try:
            obj = json.loads(line)
        except ValueError:
            return Record(None, rank, '-', None, line)  # a torn or foreign line: shown as it is, never dropped
        if not isinstance(obj, dict):
            return Record(None, rank, '-', None, line)
        stamp = obj.get('time')
        stamp = float(stamp) if isinstance(stamp, (int, float)) and math.isfinite(stamp) else None
        if isinstance(obj.get('rank'), int):
            rank = obj['rank']
        data = obj.get('data')
        if isinstance(data, dict):
            message = ', '.join(f'{key}: {value}' for key, value in data.items())
        elif isinstance(data, str):
            message = data.rstrip('\n')
        else:
            message = json.dumps(data)
        step = obj.get('step')
        if 'step' in obj:
            message = f'[step={step}] {message}'
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        return Record(stamp, rank, str(obj.get('kind', '-')).upper(), None, message, step)

    def finish(self) -> Optional[Record]:
        return self._complete()


# ---------------------------------------------------------------------------- finding files
def find_log_files(paths: Sequence[str], *, allow_empty: bool = False, known: Iterable[str] = ()) -> list[LogSource]:
    """The per-rank log files named by ``paths`` (files, or folders searched recursively).

    In a folder, a file is taken when its first line is a record of a known format (tables,
    images and other files next to the logs are skipped); an empty file is taken when its
    name has a rank and a log extension. A file named on the command line is always taken.
    ``known`` paths (already read by ``--follow``) are taken without being opened again.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a named file whose first line is no known log format, several files whose
            rank cannot be told (no rank in the name or content), or no log file at all (unless
            ``allow_empty``).
    """
    found: list[str] = []
    seen: set[str] = set()
    known = set(known)
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f'{path!r} does not exist')
        if os.path.isdir(path):
            for folder, subfolders, files in os.walk(path):
                subfolders.sort()
                for name in sorted(files):
                    candidate = os.path.join(folder, name)
                    if (candidate in known or _looks_like_log(candidate)) and os.path.realpath(candidate) not in seen:
                        seen.add(os.path.realpath(candidate))
                        found.append(candidate)
        else:
            first = _first_line(path)
            if first is not None and sniff_line(first) is None:
                raise ValueError(
                    f'{path!r} is not a log written by setup_logging or FileLogger (its first line '
                    f'is {first[:80].rstrip()!r})'
                )
            if os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                found.append(path)
    if not found and not allow_empty:
        raise ValueError(f'no log files found in {", ".join(map(repr, paths))}')
    sources = []
    nameless = []
    for index, path in enumerate(found):
        source = LogSource(path, index, rank_from_path(path))
        first = None if path in known else _first_line(path)
        if first is not None:
            source.kind = sniff_line(first)
        if source.rank is None and source.kind != 'python' and path not in known:
            nameless.append(path)
        sources.append(source)
    if len(nameless) > 1:
        raise ValueError(
            f'cannot tell which rank wrote {nameless[0]!r} and {nameless[1]!r}: name per-rank logs '
            'with {rank} (e.g. logs-rank{rank}.txt)'
        )
    return sources


def _looks_like_log(path: str) -> bool:
    if os.path.splitext(path)[1].lower() in _SKIP_EXTENSIONS:
        return False
    try:
        first = _first_line(path)
    except OSError:
        return False
    if first is None:
        return rank_from_path(path) is not None and os.path.splitext(path)[1].lower() in ('.log', '.txt', '.jsonl')
    return sniff_line(first) is not None


def ensure_open_file_limit(count: int) -> None:
    """Raise this process's soft limit on open files so that ``count`` logs can be open at once.

    A merge keeps every file open (thousands of ranks, thousands of files); the soft limit is
    often 1024 while the hard limit allows far more.

    Raises:
        ValueError: the hard limit is too low (names it, and the way around it).
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = count + 64  # stdio, the interpreter's own files
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    allowed = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if allowed > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
    if allowed < needed:
        raise ValueError(
            f'{count} log files must be open at once but this process may open at most {hard} files '
            '(ulimit -Hn); raise that limit, or merge fewer ranks at a time with --ranks'
        )


# ---------------------------------------------------------------------------- reading and merging
def resume_markers(path: str) -> list[tuple[int, int]]:
    """``(line number, first superseded step)`` of every FileLogger resume marker in the file, in file order.

    One pass, one line in memory at a time (the markers are few: one per resume).
    """
    markers = []
    with open(path, 'r', encoding='utf-8', errors='replace', newline='\n', buffering=1 << 16) as handle:
        for number, line in enumerate(handle):
            if 'resume' not in line:
                continue
            if line.startswith('[resume]'):
                match = _TEXT_RESUME.match(line)
                if match is not None:
                    markers.append((number, int(match.group(1))))
            elif line.startswith('{"kind": "resume"'):
                try:
                    first = json.loads(line)['data']['superseded_from']
                except (ValueError, KeyError, TypeError):
                    continue
                if isinstance(first, int):
                    markers.append((number, first))
    return markers


def _superseded_filter(markers: list[tuple[int, int]]) -> Callable[[Record], bool]:
    """Whether a record is superseded: it has a step at or after the first superseded step of some marker
    below it (the resumed run logged that step again). Records are asked in file order."""
    # below[i]: the lowest first-superseded step of markers i.. (a later resume to an earlier step wins).
    below = [first for _, first in markers]
    for i in range(len(below) - 2, -1, -1):
        below[i] = min(below[i], below[i + 1])
    position = 0

    def superseded(record: Record) -> bool:
        nonlocal position
        while position < len(markers) and markers[position][0] <= record.line:
            position += 1
        return position < len(markers) and record.step is not None and record.step >= below[position]

    return superseded


def read_records(source: LogSource, *, all_attempts: bool = True) -> Iterator[Record]:
    """Every record of one file, in file order, reading one line at a time.

    With ``all_attempts=False``, records superseded by a later FileLogger resume marker are left out:
    a first pass finds the markers (see :func:`resume_markers`), the second reads the records.
    """
    markers = [] if all_attempts or source.kind == 'python' else resume_markers(source.path)
    superseded = _superseded_filter(markers) if markers else None
    parser = LineParser(source)
    with open(source.path, 'r', encoding='utf-8', errors='replace', newline='\n', buffering=1 << 16) as handle:
        for line in handle:
            record = parser.feed(line)
            if record is not None and (superseded is None or not superseded(record)):
                yield record
    record = parser.finish()
    if record is not None and (superseded is None or not superseded(record)):
        yield record
