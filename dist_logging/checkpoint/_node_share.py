"""Node sharing: ranks of one node that read the same saved item share one download through shared memory.

The coordinator (:func:`share_plans`) groups the items the ranks' load plans read by node (the node identity each
rank attached to its plan: host name, boot id and the ``/dev/shm`` mount, so "same node" means "sees the same
shared memory") and by saved item (file, offset, length). Neighbouring items read by the same two or more ranks
of a node make segments of about :data:`SEGMENT_BYTES`, each with one owner there (owners spread over the node's
ranks by bytes); the owner's plan says to publish it, the others' to take it. The owner (:class:`SharedLoad`)
reads the segment's chunk-aligned file range from the bucket straight into a file under ``/dev/shm`` (verified
chunk by chunk, as every ranged read), then marks it complete; every reader of it, the owner too, loads its items
from there (the node-mates verify its chunks again) and counts itself done in the segment's header; the last one
unlinks it. A segment is named ``dist_logging-ckpt-<load>-<pid>-<n>`` by
its owner's pid: what a killed owner left is removed by the next reader of the node (:func:`sweep_segments`). If
the owner fails or dies, or nothing arrives for the reader's ``timeout``, the others read the item themselves.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import mmap
import os
import socket
import struct
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Optional

from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from dist_logging.checkpoint._ranged import FileSums, check_chunks, fetch_verified, load_item, plan_parts

__all__ = [
    'SHM_DIR',
    'PREFIX',
    'SHARE_KEY',
    'node_identity',
    'local_annotation',
    'share_plans',
    'SharedLoad',
    'sweep_segments',
    'unlink_segments',
]

log = logging.getLogger(__name__)
SHM_DIR = '/dev/shm'
PREFIX = 'dist_logging-ckpt-'
SHARE_KEY = 'dist_logging.share'  # our entry in LoadPlan.storage_data (a dict)
# The segment header: magic, status, owner pid, bytes published so far, readers done, readers expected.
_HEADER = struct.Struct('<8s5q')
HEADER_BYTES = 64
_MAGIC = b'dlckpt01'
PENDING, COMPLETE, FAILED = 0, 1, 2

Key = tuple[str, int, int]  # (relative path, offset, length) of a saved item
# A segment holds a run of items read by the same ranks of a node, cut at item boundaries at about this size: big
# enough for few segments (each costs a file, and a chunk read twice where two meet), small enough to spread the
# downloads over the node's ranks and to let node-mates start loading while the rest is on its way.
SEGMENT_BYTES = 64 * 1024 * 1024


def node_identity() -> Optional[str]:
    """This node as the ranks that share its ``/dev/shm`` see it (host, boot id, the mount's device); None when
    there is no writable ``/dev/shm`` (then nothing is shared)."""
    try:
        device = os.stat(SHM_DIR).st_dev
        if not os.access(SHM_DIR, os.W_OK | os.X_OK):
            return None
    except OSError:
        return None
    try:
        with open('/proc/sys/kernel/random/boot_id') as handle:
            boot = handle.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}/{device}'


def local_annotation() -> Optional[dict[str, Any]]:
    """What a rank attaches to its load plan for :func:`share_plans` (None: this rank shares nothing)."""
    node = node_identity()
    return None if node is None else {SHARE_KEY: {'node': node, 'pid': os.getpid()}}


def share_plans(
    plans: list[LoadPlan], storage_data: dict[Any, Any], shareable: Callable[[Key], bool]
) -> list[LoadPlan]:
    """The coordinator's step: annotate every rank's plan with the segments it publishes and takes.

    The items read by the same ranks of a node are laid back to back in their file (torch writes them so): runs of
    them make one segment each, cut at item boundaries into segments of about :data:`SEGMENT_BYTES` (a bigger item
    is a segment of its own), whose owners are spread over the node's ranks (fewest bytes owned first).

    Args:
        plans: every rank's plan (``storage_data`` as :func:`local_annotation` made it, or None).
        storage_data: the checkpoint's storage index -> ``_StorageInfo``.
        shareable: whether an item may be shared (its file has chunk checksums; not empty).

    Returns:
        The plans; those of ranks that publish or take something carry ``{SHARE_KEY: {'id', 'items', 'segments'}}``
        (``items``: item -> segment number; ``segments``: number -> (file, start, end, owner pid, readers)).
    """
    readers: dict[tuple[str, Key], list[int]] = {}
    for rank, plan in enumerate(plans):
        mine = plan.storage_data.get(SHARE_KEY) if isinstance(plan.storage_data, dict) else None
        if not mine:
            continue
        read = set()
        for item in plan.items:
            info = storage_data[item.storage_index]
            read.add((info.relative_path, info.offset, info.length))
        for key in read:
            if shareable(key):
                readers.setdefault((mine['node'], key), []).append(rank)
    runs: dict[tuple[str, str, tuple[int, ...]], list[Key]] = {}
    for (node, key), ranks in readers.items():
        if len(ranks) >= 2:
            runs.setdefault((node, key[0], tuple(ranks)), []).append(key)
    share_id = uuid.uuid4().hex[:12]
    owned: dict[int, int] = {}  # rank -> bytes it publishes
    notes: dict[int, dict[str, Any]] = {}
    number = 0
    for (_, relative, readers_of), keys in sorted(runs.items()):
        keys.sort(key=lambda key: key[1])
        segments: list[list[Key]] = []
        for key in keys:
            last = segments[-1] if segments else None
            if last is None or key[1] != last[-1][1] + last[-1][2] or key[1] + key[2] - last[0][1] > SEGMENT_BYTES:
                segments.append([key])
            else:
                last.append(key)
        for members in segments:
            start, end = members[0][1], members[-1][1] + members[-1][2]
            owner = min(readers_of, key=lambda rank: (owned.get(rank, 0), rank))
            owned[owner] = owned.get(owner, 0) + end - start
            pid = plans[owner].storage_data[SHARE_KEY]['pid']
            for rank in readers_of:
                note = notes.setdefault(rank, {'id': share_id, 'items': {}, 'segments': {}})
                note['segments'][number] = (relative, start, end, pid, len(readers_of))
                note['items'].update({key: number for key in members})
            number += 1
    result = []
    for rank, plan in enumerate(plans):
        given = notes.get(rank)
        if given:
            result.append(dataclasses.replace(plan, storage_data={SHARE_KEY: given}))
        elif isinstance(plan.storage_data, dict) and SHARE_KEY in plan.storage_data:
            result.append(dataclasses.replace(plan, storage_data=None))  # ours, nothing to share: as it came
        else:
            result.append(plan)
    return result


def segment_name(share_id: str, pid: int, number: int) -> str:
    """The path of a segment: its owner's pid in its name (how :func:`sweep_segments` tells a dead owner's)."""
    return os.path.join(SHM_DIR, f'{PREFIX}{share_id}-{pid}-{number}')


@dataclasses.dataclass
class _Segment:
    relative: str
    path: str
    start: int  # the file offset of the segment's first byte (chunk-aligned)
    size: int
    expected: int  # readers on the node, its owner too
    owner: int  # pid
    items: tuple[int, int] = (0, 0)  # the file range of its items (inside the segment)
    number: int = -1
    fd: int = -1
    map: Optional[mmap.mmap] = None
    parts_left: int = 0
    failed: bool = False
    complete: bool = False

    def header(self) -> tuple[bytes, int, int, int, int, int]:
        assert self.map is not None
        return _HEADER.unpack_from(self.map, 0)  # type: ignore[return-value]

    def set_field(self, index: int, value: int) -> None:
        assert self.map is not None
        struct.pack_into('<q', self.map, 8 + 8 * index, value)

    def data(self) -> memoryview:
        assert self.map is not None
        return memoryview(self.map)[HEADER_BYTES : HEADER_BYTES + self.size]

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view of it is still referenced: unmapped when collected
                pass
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedLoad:
    """The shared part of one ``read_data``: publish the items this rank owns, take the others from node-mates.

    Args:
        note: this rank's annotation from :func:`share_plans`.
        checkpoint_id: names objects and errors.
        store: the object store (``read_range``).
        sums: relative name -> :class:`FileSums`.
        pool: the reader's thread pool.
        max_in_flight: parts read at a time.
        part_bytes: the largest part.
        timeout: seconds a read or a wait for a node-mate may go without progress.
        on_bytes: called with the size of every part read from the bucket.
        owned: the reader's set of segment paths it created (removed at its next load, close, collection or exit).
    """

    def __init__(
        self,
        note: dict[str, Any],
        checkpoint_id: str,
        store: Any,
        sums: dict[str, FileSums],
        pool: ThreadPoolExecutor,
        max_in_flight: int,
        part_bytes: int,
        timeout: float,
        on_bytes: Callable[[int], None],
        owned: set[str],
    ):
        self.note, self.cid, self.store, self.sums, self.pool = note, checkpoint_id, store, sums, pool
        self.max_in_flight, self.part_bytes, self.timeout, self.on_bytes = max_in_flight, part_bytes, timeout, on_bytes
        self.owned = owned
        self.shared_bytes = 0  # bytes of items this rank loaded from a node-mate's segment
        self.direct_bytes = 0
        self.counted: set[int] = set()  # segments this rank counted itself out of

    def keys(self) -> set[Key]:
        """The items this rank publishes or takes."""
        return set(self.note['items'])

    def _segment(self, number: int) -> _Segment:
        relative, first, end, pid, expected = self.note['segments'][number]
        sums = self.sums[relative]
        low, high = first // sums.chunk * sums.chunk, min(-(-end // sums.chunk) * sums.chunk, sums.size)
        path = segment_name(self.note['id'], pid, number)
        return _Segment(relative, path, low, high - low, expected, pid, (first, end), number)

    def publish(self) -> None:
        """Create this rank's segments, read their ranges from the bucket into them (verified), mark each complete.

        Raises:
            ChecksumMismatch, TimeoutError, OSError: as a ranged read (every unfinished segment is marked failed
                first, so its node-mates read it themselves at once; a segment that cannot be made is not an
                error: its readers read its items each).
        """
        segments: list[_Segment] = []
        try:
            for number in sorted(self.note['segments']):
                if self.note['segments'][number][3] != os.getpid():
                    continue
                segment = self._segment(number)
                self._create(segment)
                segments.append(segment)
            self._fill([segment for segment in segments if not segment.failed])
        except BaseException:
            for segment in segments:  # the node-mates read what is not complete themselves, and this rank is done
                if segment.map is not None:
                    if not segment.failed and not segment.complete:
                        self._set_status(segment, FAILED)
                    self._done(segment)
            raise
        finally:
            for segment in segments:
                segment.close()

    def _create(self, segment: _Segment) -> None:
        """Make the segment: sized, its pages reserved (``posix_fallocate``: a full ``/dev/shm`` is an error here,
        never a ``SIGBUS`` later), its header written, then renamed into place (a node-mate never sees half a
        header). If that fails, a ``.failed`` marker tells the node-mates to read its items themselves."""
        temp = segment.path + '.new'
        self.owned.update((temp, segment.path, segment.path + '.failed'))
        try:
            segment.fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.posix_fallocate(segment.fd, 0, HEADER_BYTES + segment.size)
            segment.map = mmap.mmap(segment.fd, HEADER_BYTES + segment.size)
            _HEADER.pack_into(segment.map, 0, _MAGIC, PENDING, os.getpid(), 0, 0, segment.expected)
            os.rename(temp, segment.path)
        except OSError as exc:
            segment.close()
            segment.failed = True
            log.warning(
                'CheckpointReader: no segment of %d bytes in %s (%s): the ranks of the node read its items each',
                segment.size,
                SHM_DIR,
                exc,
            )
            try:
                os.unlink(temp)
            except OSError:
                pass
            try:
                os.close(os.open(segment.path + '.failed', os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError:
                pass  # no marker: the node-mates give up after their timeout

    @staticmethod
    def _set_status(segment: _Segment, status: int) -> None:
        fcntl.flock(segment.fd, fcntl.LOCK_EX)
        try:
            segment.set_field(0, status)
        finally:
            fcntl.flock(segment.fd, fcntl.LOCK_UN)

    def _fill(self, segments: list[_Segment]) -> None:
        queue: list[tuple[_Segment, int, int]] = []
        for segment in segments:
            first, end = segment.items
            parts = plan_parts([(first, end - first)], self.sums[segment.relative], self.part_bytes)
            segment.parts_left = len(parts)
            queue.extend((segment, start, size) for start, size in parts)
        running: dict[Future, tuple[_Segment, int]] = {}
        position = 0
        try:
            while position < len(queue) or running:
                while position < len(queue) and len(running) < self.max_in_flight:
                    segment, start, size = queue[position]
                    position += 1
                    view = segment.data()[start - segment.start : start - segment.start + size]
                    future = self.pool.submit(self._read, segment.relative, start, view)
                    running[future] = (segment, size)
                done, _ = wait(running, timeout=self.timeout, return_when=FIRST_COMPLETED)
                if not done:
                    raise TimeoutError(
                        f'checkpoint {self.cid!r}: no range arrived in {self.timeout:.0f} s ({len(running)} in flight)'
                    )
                for future in done:
                    segment, size = running.pop(future)
                    future.result()
                    header = segment.header()
                    segment.set_field(2, header[3] + size)  # progress: the waiters' deadline moves on
                    segment.parts_left -= 1
                    if segment.parts_left == 0:
                        self._set_status(segment, COMPLETE)
                        segment.complete = True
        finally:
            for future in running:
                future.cancel()
            wait(running, timeout=self.timeout)  # reads already running finish (they write into the segments)

    def _read(self, relative: str, start: int, view: memoryview) -> None:
        fetch_verified(
            self.store, f'{self.cid}/{relative}', self.sums[relative], start, view, f'checkpoint {self.cid!r}'
        )
        self.on_bytes(len(view))

    def take(
        self, groups: dict[Key, tuple[Any, list[ReadItem]]], planner: LoadPlanner, transforms: Any
    ) -> list[ReadItem]:
        """Load every shared item of ``groups`` (item -> (storage info, read items)) from its segment, waiting for
        its owner (this rank too); the read items whose owner failed, died or stalled (read them yourself).

        Raises:
            ChecksumMismatch: a segment's bytes differ from the checkpoint's chunk checksums (named).
        """
        members: dict[int, list[Key]] = {}
        for key in groups:
            members.setdefault(self.note['items'][key], []).append(key)
        pending = {number: self._segment(number) for number in members}
        fallback: list[ReadItem] = []
        seen = {number: (-1, time.monotonic()) for number in pending}
        pause = 0.001
        try:
            while pending:
                moved = False
                for number in sorted(pending):
                    segment = pending[number]
                    state = self._poll(segment)
                    if state == PENDING:
                        progress = segment.header()[3] if segment.map is not None else -1
                        if progress != seen[number][0]:
                            seen[number] = (progress, time.monotonic())
                        elif time.monotonic() - seen[number][1] > self.timeout or not _alive(segment.owner):
                            state = FAILED
                            log.warning(
                                'CheckpointReader: %s: its owner (pid %d) %s; reading its items here',
                                segment.path,
                                segment.owner,
                                'is gone' if not _alive(segment.owner) else f'sent nothing for {self.timeout:.0f} s',
                            )
                    if state == PENDING:
                        continue
                    moved = True
                    del pending[number]
                    try:
                        if state == COMPLETE:
                            self._load(segment, [groups[key] for key in members[number]], planner, transforms)
                        else:
                            fallback.extend(request for key in members[number] for request in groups[key][1])
                    finally:
                        self._done(segment)
                if pending and not moved:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
                elif moved:
                    pause = 0.001
        finally:
            for segment in pending.values():  # a failed load: let go of what this rank still holds
                self._done(segment)
        return fallback

    def _poll(self, segment: _Segment) -> int:
        """The segment's status, opening and mapping it first if it exists (PENDING until it does)."""
        if segment.map is None:
            try:
                segment.fd = os.open(segment.path, os.O_RDWR)
            except FileNotFoundError:  # not made yet, or (a marker says) never will be
                return FAILED if os.path.exists(segment.path + '.failed') else PENDING
            try:
                segment.map = mmap.mmap(segment.fd, HEADER_BYTES + segment.size)  # made whole, then renamed
            except (OSError, ValueError):  # not the size it must be: not one of ours, read the items here
                segment.close()
                return FAILED
        fcntl.flock(segment.fd, fcntl.LOCK_SH)
        try:
            magic, status = segment.header()[:2]
        finally:
            fcntl.flock(segment.fd, fcntl.LOCK_UN)
        return status if magic == _MAGIC else FAILED  # not one of ours

    def _load(
        self, segment: _Segment, items: list[tuple[Any, list[ReadItem]]], planner: LoadPlanner, transforms: Any
    ) -> None:
        data = segment.data()
        try:
            if segment.owner != os.getpid():  # the owner verified it as it arrived; a node-mate checks again
                check_chunks(
                    f'{self.cid}/{segment.relative}',
                    self.sums[segment.relative],
                    segment.start,
                    data,
                    f'checkpoint {self.cid!r} (shared memory {segment.path})',
                )
            for info, requests in items:
                view = data[info.offset - segment.start : info.offset - segment.start + info.length]
                self.direct_bytes += load_item(planner, transforms, info, requests, view)
                view.release()
                if segment.owner != os.getpid():
                    self.shared_bytes += info.length
        finally:
            data.release()

    def abandon(self) -> None:
        """After a failed load: count this rank out of every segment of its items it did not finish with (so the
        last of the others unlinks it)."""
        for number in sorted(set(self.note['items'].values()) - self.counted):
            segment = self._segment(number)
            try:
                self._poll(segment)
            except OSError:
                pass
            self._done(segment)

    def _done(self, segment: _Segment) -> None:
        """Count this reader out of the segment; the last one unlinks it."""
        if segment.number in self.counted:
            segment.close()
            return
        self.counted.add(segment.number)
        if segment.fd >= 0:
            fcntl.flock(segment.fd, fcntl.LOCK_EX)
            try:
                if segment.map is not None and segment.header()[0] == _MAGIC:
                    done = segment.header()[4] + 1
                    segment.set_field(3, done)
                    if done >= segment.expected:
                        try:
                            os.unlink(segment.path)
                        except FileNotFoundError:
                            pass
            finally:
                fcntl.flock(segment.fd, fcntl.LOCK_UN)
        segment.close()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f'/proc/{pid}/stat', 'rb') as handle:
            return handle.read().rsplit(b')', 1)[1].split()[0] != b'Z'
    except (OSError, IndexError):
        return True


def unlink_segments(paths: set[str]) -> None:
    """Remove the segments of ``paths`` (an owner's, at its next load, close, collection or exit) and forget them."""
    for path in sorted(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    paths.clear()


def sweep_segments() -> list[str]:
    """Remove the shared-memory segments of this node whose owner process is gone (killed while loading); the
    removed paths. Every reader runs it when it is built."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    removed = []
    for entry in sorted(entries):
        if not entry.startswith(PREFIX):
            continue
        try:
            pid = int(entry.rsplit('-', 2)[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not _alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(os.path.join(SHM_DIR, entry))
            except FileNotFoundError:
                pass
    return removed
