"""The per-rank upload journal: an append-only JSON Lines file of ``queued`` and ``done`` records.

One file per rank (``<staging>/rank{r}/journal.jsonl``) stays open for the life of
the uploader; recording an upload is one ``write`` of one short line to it (a few
microseconds), not a new file per call. Lines:

* ``{"op":"s","sid":..,"uri":..,"kwargs":{..},"custom":..}``: a store the later lines refer to
  (``uri`` is null for a custom ``object_store=`` instance; ``custom`` names its class).
* ``{"op":"q","id":7,"name":"run/ckpt.pt","size":123,"ow":0,"s":"<sid>","t":<unix time>}``:
  upload 7 is queued; its snapshot is ``files/7``, or ``"src"`` names the original
  file when the hand-over could not hard-link it (across filesystems). ``"own":1`` marks a
  snapshot the uploader owns (a ``copy=True`` copy, never written again), which a local store
  may place by linking it; a hand-over's hard link (absent flag) is the caller's inode.
* ``{"op":"d","id":7}``: upload 7 is finished (landed, or superseded by a newer upload of
  the same name); its snapshot is gone.

A record is appended only after its snapshot is complete, so a process killed at
any moment leaves either a complete snapshot with its record or an unrecorded file
that the next reader deletes. A torn last line (the process died mid-write) is
ignored. :func:`compact` rewrites the journal with only what is still pending
(temp file, then ``os.replace``); the open journal also starts over by itself, keeping only
its store lines, whenever nothing is pending and it has grown past ``COMPACT_AT`` bytes, so a
run of any length keeps it small (a killed process leaves at worst an empty journal, which
is right: nothing was pending).

Records survive the death of the process as soon as ``write`` returns (the page
cache belongs to the kernel). Surviving a machine crash needs ``fsync=True``,
which costs a disk flush per call and is off by default.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ['Journal', 'QueuedRecord', 'StoreRecord', 'JournalState', 'read_journal', 'compact', 'JOURNAL_NAME']

JOURNAL_NAME = 'journal.jsonl'
COMPACT_AT = 64 * 1024  # bytes: an open journal with nothing pending starts over past this size

try:
    from json.encoder import c_encode_basestring_ascii as _quote  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - pure-Python json
    from json.encoder import py_encode_basestring_ascii as _quote  # type: ignore[attr-defined]
if _quote is None:  # pragma: no cover
    from json.encoder import py_encode_basestring_ascii as _quote  # type: ignore[attr-defined]


@dataclass(frozen=True)
class StoreRecord:
    """Where a group of uploads goes: a bucket URI (+ non-secret backend kwargs), or a custom store."""

    sid: str
    uri: Optional[str]
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    custom: Optional[str] = None

    def to_json(self) -> str:
        return (
            json.dumps(
                {'op': 's', 'sid': self.sid, 'uri': self.uri, 'kwargs': self.kwargs, 'custom': self.custom},
                sort_keys=True,
            )
            + '\n'
        )


@dataclass(frozen=True)
class QueuedRecord:
    """One queued upload as the journal holds it."""

    id: int
    name: str
    size: int
    overwrite: bool
    sid: str
    src: Optional[str] = None  # the original file, when it is referenced in place instead of staged
    time: float = 0.0
    owned: bool = False  # the snapshot is the uploader's own copy (copy=True), not the caller's inode

    def to_json(self) -> str:
        return _queued_line(self.id, self.name, self.size, self.overwrite, self.sid, self.src, self.time, self.owned)


def _queued_line(
    upload_id: int,
    name: str,
    size: int,
    overwrite: bool,
    sid: str,
    src: Optional[str],
    when: float,
    owned: bool = False,
) -> str:
    # Hand-built (one C-level string quote per field): json.dumps of a dict costs several microseconds.
    src_part = f',"src":{_quote(src)}' if src is not None else ''
    own_part = ',"own":1' if owned else ''
    return (
        f'{{"op":"q","id":{upload_id},"name":{_quote(name)},"size":{size},"ow":{1 if overwrite else 0},'
        f'"s":{_quote(sid)}{src_part}{own_part},"t":{when:.3f}}}\n'
    )


@dataclass
class JournalState:
    """What a journal says: its stores, the uploads still pending (in queue order), the highest id."""

    stores: dict[str, StoreRecord]
    pending: dict[int, QueuedRecord]
    max_id: int = 0
    torn_lines: int = 0


class Journal:
    """An open, append-only journal. Thread-safe; each append is one ``write`` call.

    Args:
        path: the journal file (created if missing).
        fsync: ``fdatasync`` after every append (durable against machine crashes; slow).
        state: what the file held when opened (:func:`read_journal`): its pending uploads
            and stores. Needed for the journal to start over when nothing is pending;
            without it (None) the journal never does.
    """

    def __init__(self, path: str, *, fsync: bool = False, state: Optional['JournalState'] = None):
        self.path = path
        self.fsync = fsync
        self._can_restart = state is not None
        self._open_ids: set[int] = set(state.pending) if state is not None else set()
        self._store_lines: dict[str, str] = (
            {sid: record.to_json() for sid, record in state.stores.items()} if state is not None else {}
        )
        self._fd: Optional[int] = os.open(
            path,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0),
            0o600,
        )
        if os.fstat(self._fd).st_mode & 0o077:  # written by an older version under a loose umask
            os.fchmod(self._fd, 0o600)
        self._lock = threading.Lock()
        # A torn last line from a killed writer must not glue onto our first record.
        size = os.fstat(self._fd).st_size
        if size:
            with open(path, 'rb') as handle:
                handle.seek(size - 1)
                if handle.read(1) != b'\n':
                    os.write(self._fd, b'\n')

    def _write(
        self, line: str, *, queued: Optional[int] = None, done: Optional[int] = None, store: Optional[str] = None
    ) -> None:
        data = line.encode('utf-8')
        with self._lock:
            if self._fd is None:
                raise ValueError(f'journal {self.path} is closed')
            written = os.write(self._fd, data)
            if written != len(data):
                self._finish_short_write(self._fd, data, written)
            if store is not None:
                self._store_lines[store] = line
            if queued is not None:
                self._open_ids.add(queued)
            if done is not None:
                self._open_ids.discard(done)
                if self._can_restart and not self._open_ids and os.fstat(self._fd).st_size >= COMPACT_AT:
                    self._start_over(self._fd)
            if self.fsync:
                os.fdatasync(self._fd)

    def _start_over(self, fd: int) -> None:
        # Nothing is pending: only the store lines matter (later queued lines refer to them).
        # Cut and rewrite under the lock; a kill in between leaves an empty journal, which says
        # the same (nothing pending) to whoever reads it next.
        os.ftruncate(fd, 0)
        stores = ''.join(self._store_lines.values()).encode('utf-8')
        if stores:
            written = os.write(fd, stores)
            if written != len(stores):
                self._finish_short_write(fd, stores, written)

    @staticmethod
    def _finish_short_write(fd: int, data: bytes, written: int) -> None:
        # A short write (the disk filled up mid-line) must not leave half a record: the next
        # append would glue onto it and both lines would be lost. Finish the line, or cut the
        # file back to where this record started and raise (we hold the lock and the folder's).
        try:
            while written < len(data):
                n = os.write(fd, data[written:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
        except OSError:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise

    def append_store(self, record: StoreRecord) -> None:
        """Record a store that later ``queued`` lines refer to by ``sid``."""
        self._write(record.to_json(), store=record.sid)

    def append_queued(
        self,
        upload_id: int,
        name: str,
        size: int,
        overwrite: bool,
        sid: str,
        src: Optional[str] = None,
        owned: bool = False,
    ) -> None:
        """Record that upload ``upload_id`` is queued (its snapshot is already complete)."""
        self._write(_queued_line(upload_id, name, size, overwrite, sid, src, time.time(), owned), queued=upload_id)

    def append_done(self, upload_id: int) -> None:
        """Record that upload ``upload_id`` needs nothing more."""
        self._write(f'{{"op":"d","id":{upload_id}}}\n', done=upload_id)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_journal(path: str) -> JournalState:
    """Parse a journal; a missing file is an empty journal, unparsable lines (a torn tail) are skipped."""
    state = JournalState(stores={}, pending={})
    try:
        with open(path, 'rb') as handle:
            raw = handle.read()
    except FileNotFoundError:
        return state
    for line in raw.split(b'\n'):
        if not line.strip():
            continue
        try:
            record: dict[str, Any] = json.loads(line)
            op = record['op']
            if op == 'q':
                upload_id = int(record['id'])
                state.pending[upload_id] = QueuedRecord(
                    upload_id,
                    str(record['name']),
                    int(record['size']),
                    bool(record['ow']),
                    str(record['s']),
                    record.get('src'),
                    float(record.get('t', 0.0)),
                    bool(record.get('own', 0)),
                )
                state.max_id = max(state.max_id, upload_id)
            elif op == 'd':
                state.pending.pop(int(record['id']), None)
            elif op == 's':
                state.stores[str(record['sid'])] = StoreRecord(
                    str(record['sid']), record.get('uri'), dict(record.get('kwargs') or {}), record.get('custom')
                )
        except (ValueError, KeyError, TypeError):
            state.torn_lines += 1
    return state


def compact(path: str, state: JournalState, *, fsync: bool = False) -> None:
    """Rewrite the journal at ``path`` with only ``state``'s pending uploads (and the stores they use).

    With nothing pending the journal is removed. Atomic: temp file, then ``os.replace``.
    """
    if not state.pending:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    used = {record.sid for record in state.pending.values()}
    lines = [state.stores[sid].to_json() for sid in sorted(used) if sid in state.stores]
    lines += [record.to_json() for record in state.pending.values()]
    tmp = f'{path}.{os.getpid()}.tmp'
    try:
        os.unlink(tmp)  # left by a killed process of the same pid: O_EXCL below must not trip on it
    except FileNotFoundError:
        pass
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0), 0o600
    )  # private whatever the umask, like the journal itself
    with open(fd, 'w', encoding='utf-8') as handle:
        handle.write(''.join(lines))
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
