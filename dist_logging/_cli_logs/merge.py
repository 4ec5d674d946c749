"""Interleaving ranks' log records by time, collapsing identical ones, and following growing files."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import os
import time
from typing import IO, Callable, Iterator, Optional, Sequence

from dist_logging._cli_logs.sources import (
    LogSource,
    Record,
    LineParser,
    ensure_open_file_limit,
    find_log_files,
    format_ranks,
    read_records,
)
from dist_logging._log_line import CONTINUATION, level_number, utc_iso

__all__ = ['Group', 'merge_records', 'Collapser', 'format_group', 'merge_logs', 'follow_logs', 'DEFAULT_WINDOW']

DEFAULT_WINDOW = 5.0  # seconds: identical records from several ranks this close together become one line
MAX_PENDING = 10_000  # groups held for collapsing at most; beyond, the oldest are written out early
DEFAULT_LEVEL = 20  # records without a standard level (FileLogger's kinds) count as INFO for --level
_READ_CHUNK = 1 << 20  # --follow reads at most this much of a file per poll


def _keyed(source: LogSource, all_attempts: bool = True) -> Iterator[tuple[float, int, int, Record]]:
    # Records without a time keep their place in their file: they sort at the last time seen before them.
    last = -math.inf
    for seq, record in enumerate(read_records(source, all_attempts=all_attempts)):
        if record.time is not None:
            last = record.time
        yield last, source.index, seq, record


def merge_records(sources: Sequence[LogSource], all_attempts: bool = True) -> Iterator[Record]:
    """The records of all ``sources`` in time order (ties: file order), one record in memory per file.

    With ``all_attempts=False`` the lines a FileLogger resume marker supersedes are left out.
    """
    for _, _, _, record in heapq.merge(*(_keyed(source, all_attempts) for source in sources)):
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


def merge_logs(
    paths: Sequence[str],
    out: IO[str],
    *,
    ranks: Optional[frozenset[int]] = None,
    min_level: Optional[int] = None,
    collapse: bool = True,
    window: float = DEFAULT_WINDOW,
    all_attempts: bool = False,
) -> int:
    """Write the merged stream of ``paths`` to ``out``; return the number of lines (groups) written.

    Lines of FileLogger logs at steps a later resume marker supersedes (the resumed run logged those
    steps again) are left out unless ``all_attempts``; the markers themselves are shown.

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
    for record in merge_records(sources, all_attempts):
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
        self.parser = LineParser(source)
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


def follow_logs(
    paths: Sequence[str],
    out: IO[str],
    *,
    ranks: Optional[frozenset[int]] = None,
    min_level: Optional[int] = None,
    collapse: bool = True,
    window: float = DEFAULT_WINDOW,
    poll_interval: float = 0.25,
    rescan_interval: float = 2.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
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
