"""``dist-logging logs``: many ranks' log files as one time-ordered stream, identical records collapsed.

Reads the files :func:`~dist_logging.setup_logging` writes (:mod:`dist_logging._log_line`)
and :class:`~dist_logging.destinations.FileLogger`'s (JSON Lines with a ``time`` field, or
Composer-style text lines ``[kind]...: ...``, which carry no time and keep their place in their
file). Each file is read line by line by a generator; ``heapq.merge`` interleaves them, so memory
per file is one record, whatever the file's size. Collapsing holds only the records of the last
``window`` seconds (at most ``MAX_PENDING`` groups).

A record's rank comes from its content (``setup_logging`` lines name it) or from the file name
(``rank3``, ``rank-3``, ``rank_3``; or a folder ``rank3/``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
import os
import re
import time
from typing import IO, Callable, Iterable, Iterator, Optional, Sequence

from dist_logging._log_line import CONTINUATION, HEADER_RE, level_number, parse_utc_iso, utc_iso

__all__ = ['Record', 'Group', 'LogSource', 'parse_ranks', 'format_ranks', 'find_log_files', 'read_records',
           'merge_records', 'Collapser', 'format_group', 'merge_logs', 'follow_logs', 'DEFAULT_WINDOW']

DEFAULT_WINDOW = 5.0  # seconds: identical records from several ranks this close together become one line
MAX_PENDING = 10_000  # groups held for collapsing at most; beyond, the oldest are written out early
DEFAULT_LEVEL = 20  # records without a standard level (FileLogger's kinds) count as INFO for --level
_SNIFF_BYTES = 1 << 16
_READ_CHUNK = 1 << 20  # --follow reads at most this much of a file per poll

_RANK_IN_NAME = re.compile(r'(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])', re.IGNORECASE)
_TEXT_LINE = re.compile(r'\[([A-Za-z_][A-Za-z0-9_]*)\]')
_SKIP_EXTENSIONS = frozenset({'.png', '.jpg', '.jpeg', '.csv', '.pt', '.pth', '.bin', '.safetensors', '.npy',
                              '.npz', '.gz', '.zip', '.tar', '.pkl', '.db', '.json', '.yaml', '.yml', '.lock'})


# ---------------------------------------------------------------------------- ranks
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
    """

    __slots__ = ('time', 'rank', 'level', 'logger', 'message')

    def __init__(self, time: Optional[float], rank: int, level: str, logger: Optional[str], message: str):
        self.time = time
        self.rank = rank
        self.level = level
        self.logger = logger
        self.message = message

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


class _Parser:
    """Turns the lines of one file into records: ``feed`` returns the record a line completes."""

    def __init__(self, source: LogSource):
        self.source = source
        self.pending: Optional[Record] = None
        self.lines: list[str] = []

    def _complete(self) -> Optional[Record]:
        record = self.pending
        if record is not None and self.lines:
            record.message = record.message + '\n' + '\n'.join(self.lines)
        self.pending, self.lines = None, []
        return record

    def _start(self, record: Record) -> Optional[Record]:
        done = self._complete()
        self.pending = record
        return done

    def _orphan(self, text: str) -> Optional[Record]:
        # Text before a file's first record (or after a finished one in --follow): its own record, kept.
        rank = self.source.rank if self.source.rank is not None else 0
        return self._start(Record(None, rank, '-', None, text))

    def feed(self, line: str) -> Optional[Record]:
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
            return self._start(Record(None, rank, match.group(1).upper(), None, line[match.end():].lstrip(': ')))
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
        if 'step' in obj:
            message = f'[step={obj["step"]}] {message}'
        return Record(stamp, rank, str(obj.get('kind', '-')).upper(), None, message)

    def finish(self) -> Optional[Record]:
        return self._complete()


# ---------------------------------------------------------------------------- finding files
def find_log_files(paths: Sequence[str], *, allow_empty: bool = False,
                   known: Iterable[str] = ()) -> list[LogSource]:
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
                raise ValueError(f'{path!r} is not a log written by setup_logging or FileLogger (its first line '
                                 f'is {first[:80].rstrip()!r})')
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
        raise ValueError(f'cannot tell which rank wrote {nameless[0]!r} and {nameless[1]!r}: name per-rank logs '
                         'with {rank} (e.g. logs-rank{rank}.txt)')
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
        raise ValueError(f'{count} log files must be open at once but this process may open at most {hard} files '
                         '(ulimit -Hn); raise that limit, or merge fewer ranks at a time with --ranks')


# ---------------------------------------------------------------------------- reading and merging
def read_records(source: LogSource) -> Iterator[Record]:
    """Every record of one file, in file order, reading one line at a time."""
    parser = _Parser(source)
    with open(source.path, 'r', encoding='utf-8', errors='replace', newline='\n', buffering=1 << 16) as handle:
        for line in handle:
            record = parser.feed(line)
            if record is not None:
                yield record
    record = parser.finish()
    if record is not None:
        yield record


def _keyed(source: LogSource) -> Iterator[tuple[float, int, int, Record]]:
    # Records without a time keep their place in their file: they sort at the last time seen before them.
    last = -math.inf
    for seq, record in enumerate(read_records(source)):
        if record.time is not None:
            last = record.time
        yield last, source.index, seq, record


def merge_records(sources: Sequence[LogSource]) -> Iterator[Record]:
    """The records of all ``sources`` in time order (ties: file order), one record in memory per file."""
    for _, _, _, record in heapq.merge(*(_keyed(source) for source in sources)):
        yield record


# ---------------------------------------------------------------------------- collapsing
class Group:
    """One output line: a record, and every rank that logged the same record within the window."""

    __slots__ = ('time', 'sort_time', 'seq', 'level', 'logger', 'message', 'ranks', 'key')

    def __init__(self, record: Record, sort_time: float, seq: int):
        self.time = record.time
        self.sort_time = sort_time
        self.seq = seq
        self.level = record.level
        self.logger = record.logger
        self.message = record.message
        self.ranks = {record.rank}
        self.key = (record.level, record.logger, record.message)

    def __lt__(self, other: 'Group') -> bool:
        return (self.sort_time, self.seq) < (other.sort_time, other.seq)


class Collapser:
    """Merges identical records (level, logger, message) from different ranks within ``window`` seconds.

    Feed records in time order with :meth:`add`; it returns the groups that can no longer grow.
    A rank that logs the same record twice gets two groups. Records without a time are never
    collapsed. At most ``max_pending`` groups are held; beyond, the oldest go out early.
    """

    def __init__(self, window: float = DEFAULT_WINDOW, enabled: bool = True, max_pending: int = MAX_PENDING):
        if not window >= 0:
            raise ValueError(f'window must be >= 0 seconds, got {window!r}')
        self.window = float(window)
        self.enabled = enabled
        self.max_pending = max_pending
        self._pending: list[Group] = []  # sorted by (sort_time, seq)
        self._open: dict[tuple, list[Group]] = {}
        self._seq = itertools.count()
        self._last_time = -math.inf

    def add(self, record: Record) -> list[Group]:
        """Take one record; return the groups now final (in time order)."""
        if record.time is not None:
            self._last_time = record.time
        sort_time = self._last_time if record.time is None else record.time
        if not self.enabled:
            return [Group(record, sort_time, next(self._seq))]
        done = self.expire(sort_time)
        if record.time is not None:
            for group in self._open.get((record.level, record.logger, record.message), ()):
                if record.rank not in group.ranks and record.time - group.sort_time <= self.window:
                    group.ranks.add(record.rank)
                    return done
        group = Group(record, sort_time, next(self._seq))
        if self._pending and group < self._pending[-1]:
            bisect.insort(self._pending, group)  # --follow: a file that was read late
        else:
            self._pending.append(group)
        if record.time is not None:
            self._open.setdefault(group.key, []).append(group)
        while len(self._pending) > self.max_pending:
            done.append(self._pop())
        return done

    def expire(self, now: float) -> list[Group]:
        """The groups whose window ended before ``now`` (seconds since the epoch)."""
        done = []
        while self._pending and self._pending[0].sort_time + self.window < now:
            done.append(self._pop())
        return done

    def drain(self) -> list[Group]:
        """Every group still held."""
        done = []
        while self._pending:
            done.append(self._pop())
        return done

    def _pop(self) -> Group:
        group = self._pending.pop(0)
        groups = self._open.get(group.key)
        if groups:
            try:
                groups.remove(group)
            except ValueError:
                pass
            if not groups:
                del self._open[group.key]
        return group


def format_group(group: Group) -> str:
    """``[ranks 0-3] 2026-11-23T11:08:50.123Z INFO train: message``; every further line begins with the tag too."""
    ranks = group.ranks
    tag = f'[rank {next(iter(ranks))}]' if len(ranks) == 1 else f'[ranks {format_ranks(ranks)}]'
    stamp = utc_iso(group.time)[:-3] + 'Z' if group.time is not None else '-'
    who = f'{group.level} {group.logger}: ' if group.logger is not None else f'{group.level} '
    first, *rest = group.message.split('\n')
    if not rest:
        return f'{tag} {stamp} {who}{first}'
    return f'{tag} {stamp} {who}{first}' + ''.join(f'\n{tag} {CONTINUATION}{line}' for line in rest)


# ---------------------------------------------------------------------------- the two modes
def _selector(ranks: Optional[frozenset[int]], min_level: Optional[int]) -> Callable[[Record], bool]:
    def keep(record: Record) -> bool:
        if ranks is not None and record.rank not in ranks:
            return False
        if min_level is not None:
            number = level_number(record.level)
            if (DEFAULT_LEVEL if number is None else number) < min_level:
                return False
        return True

    return keep


def merge_logs(paths: Sequence[str], out: IO[str], *, ranks: Optional[frozenset[int]] = None,
               min_level: Optional[int] = None, collapse: bool = True, window: float = DEFAULT_WINDOW) -> int:
    """Write the merged stream of ``paths`` to ``out``; return the number of lines (groups) written.

    Raises:
        FileNotFoundError, ValueError: as :func:`find_log_files`.
    """
    sources = find_log_files(paths)
    if ranks is not None:
        # A file whose name gives a rank outside the selection is not even opened.
        sources = [s for s in sources if s.rank is None or s.kind == 'python' or s.rank in ranks]
    ensure_open_file_limit(len(sources))
    keep = _selector(ranks, min_level)
    collapser = Collapser(window, collapse)
    written = 0
    for record in merge_records(sources):
        if not keep(record):
            continue
        for group in collapser.add(record):
            out.write(format_group(group) + '\n')
            written += 1
    for group in collapser.drain():
        out.write(format_group(group) + '\n')
        written += 1
    out.flush()
    return written


class _Tail:
    """One followed file: where we are, the unfinished last line, and its parser."""

    def __init__(self, source: LogSource):
        self.source = source
        self.parser = _Parser(source)
        self.handle: Optional[IO[str]] = None
        self.partial = ''
        self.seq = 0
        self.last_time = -math.inf

    def read(self) -> tuple[list[Record], bool]:
        """The records completed by what was appended since the last call, and whether anything was."""
        if self.handle is None:
            try:
                self.handle = open(self.source.path, 'r', encoding='utf-8', errors='replace', newline='\n')
            except FileNotFoundError:
                return [], False
        chunk = self.handle.read(_READ_CHUNK)
        if not chunk:
            return [], False
        records = []
        lines = (self.partial + chunk).split('\n')
        self.partial = lines.pop()  # '' when the chunk ended a line
        for line in lines:
            record = self.parser.feed(line)
            if record is not None:
                records.append(record)
        return records, True

    def settle(self) -> Optional[Record]:
        """The file has not grown: its last record is complete."""
        return self.parser.finish()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def follow_logs(paths: Sequence[str], out: IO[str], *, ranks: Optional[frozenset[int]] = None,
                min_level: Optional[int] = None, collapse: bool = True, window: float = DEFAULT_WINDOW,
                poll_interval: float = 0.25, rescan_interval: float = 2.0,
                should_stop: Callable[[], bool] = lambda: False) -> int:
    """Like :func:`merge_logs`, then keep reading as the files grow (and as new files appear in folders).

    Polls every ``poll_interval`` seconds until ``should_stop()`` is true (the CLI sets it on
    SIGINT/SIGTERM); then writes what it holds and returns the number of lines written. A
    collapsible record is written once its window has passed (up to ``window`` seconds late).

    Raises:
        FileNotFoundError: a path that does not exist.
    """
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f'{path!r} does not exist')
    keep = _selector(ranks, min_level)
    collapser = Collapser(window, collapse)
    tails: dict[str, _Tail] = {}
    written = 0
    next_scan = 0.0

    def write(groups: list[Group]) -> None:
        nonlocal written
        for group in groups:
            out.write(format_group(group) + '\n')
            written += 1

    try:
        while True:
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + rescan_interval
                sources = find_log_files(paths, allow_empty=True, known=tails)
                ensure_open_file_limit(len(sources))
                for source in sources:
                    if source.path not in tails:
                        source.index = len(tails)
                        tails[source.path] = _Tail(source)
            batch: list[tuple[float, int, int, Record]] = []
            for tail in tails.values():
                grew_at_all = False
                while True:  # read until the end, a chunk at a time
                    records, grew = tail.read()
                    for record in records:
                        batch.append(_follow_key(tail, record))
                    if not grew:
                        break
                    grew_at_all = True
                if not grew_at_all:  # quiet for a whole poll: its last record has all its lines
                    settled = tail.settle()
                    if settled is not None:
                        batch.append(_follow_key(tail, settled))
            batch.sort(key=lambda item: item[:3])
            for _, _, _, record in batch:
                if keep(record):
                    write(collapser.add(record))
            write(collapser.expire(time.time()))
            out.flush()
            if should_stop():
                break
            time.sleep(poll_interval)
    finally:
        held = [_follow_key(tail, record) for tail in tails.values() for record in [tail.settle()] if record]
        for _, _, _, record in sorted(held, key=lambda item: item[:3]):
            if keep(record):
                write(collapser.add(record))
        write(collapser.drain())
        out.flush()
        for tail in tails.values():
            tail.close()
    return written


def _follow_key(tail: _Tail, record: Record) -> tuple[float, int, int, Record]:
    if record.time is not None:
        tail.last_time = record.time
    tail.seq += 1
    return tail.last_time, tail.source.index, tail.seq, record
