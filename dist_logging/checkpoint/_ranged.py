"""Ranged loads: a rank's DCP read plan as verified byte ranges, fetched concurrently from the bucket into memory.

For every shard file the plan reads, the items' byte ranges are widened to the file's checksum chunks
(``_chunk_sums``), merged, and cut into parts of at most ``part_bytes``; ``max_in_flight`` parts are read at a
time (``ObjectStore.read_range``: ranged GETs on S3), each straight into the buffer of the item it lies in
when it lies in one (no copy), else into a buffer of its own. Every part is verified before any of its bytes is
used: chunk by chunk against the CRC32C its writer recorded, or, for a file of a checkpoint committed before
chunk checksums existed, the whole file is read and its CRC32C (combined from the parts') compared with the
marker's before any of its items is loaded. Items are then deserialized as torch's ``FileSystemReader`` does.
Nothing is written to local disk.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses
import io
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Optional

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed._shard._utils import narrow_tensor_by_index

from dist_logging.checkpoint._chunk_sums import crc32c, decode, decode_chunks, encode, fast_combine
from dist_logging.checkpoint._saved_tensor import HEAD_BYTES, TAIL_BYTES, saved_layout
from dist_logging.checkpoint.commit import ChecksumMismatch, retry

__all__ = [
    'FileSums',
    'RangedLoad',
    'MemoryReader',
    'plan_parts',
    'fetch_object',
    'fetch_verified',
    'check_chunks',
    'load_item',
]

MiB = 1024 * 1024


@dataclasses.dataclass
class FileSums:
    """What the commit marker says about one file: its size, whole-file CRC32C and chunk CRC32Cs (each may be
    missing: a checkpoint committed before they were recorded)."""

    size: int
    whole: Optional[int] = None
    chunk: int = 0
    chunks: Optional[list[int]] = None

    @classmethod
    def from_record(cls, name: str, size: int, whole: Optional[str], chunks: Optional[str]) -> 'FileSums':
        """Parse the marker's texts; chunk checksums that do not cover ``size`` are ignored (whole-file check).

        Raises:
            ValueError: a malformed checksum text (naming the object).
        """
        try:
            value = decode(whole) if whole else None
            chunk, sums = decode_chunks(chunks) if chunks else (0, None)
        except ValueError as exc:
            raise ValueError(f'{name}: {exc}') from None
        if sums is not None and len(sums) != -(-size // chunk):
            chunk, sums = 0, None
        return cls(size, value, chunk, sums)


def plan_parts(
    ranges: list[tuple[int, int]], sums: FileSums, part_bytes: int, cuts: Iterable[int] = ()
) -> list[tuple[int, int]]:
    """``(start, length)`` of the parts to read so that every byte of ``ranges`` (``(offset, length)``) is read
    and verifiable: widened to whole chunks (or the whole file without chunk checksums), merged, cut at ``cuts``
    (chunk-aligned offsets where a part must end) and into parts of at most ``part_bytes`` (chunk-aligned)."""
    size = sums.size
    if sums.chunks is not None:
        chunk = sums.chunk
        spans = sorted((o // chunk * chunk, min(-(-(o + n) // chunk) * chunk, size)) for o, n in ranges if n > 0)
        step = max(chunk, part_bytes // chunk * chunk)
    else:
        spans = [(0, size)] if size else []
        step = part_bytes
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    boundaries = sorted(set(cuts))
    parts = []
    for start, end in merged:
        inner = [cut for cut in boundaries[bisect.bisect_right(boundaries, start) :] if cut < end]
        for low, high in zip([start] + inner, inner + [end]):
            for offset in range(low, high, step):
                parts.append((offset, min(step, high - offset)))
    return parts


class MemoryReader(io.RawIOBase):
    """A seekable read-only stream over a buffer (``readinto`` copies once, straight into the caller's memory)."""

    def __init__(self, view: memoryview):
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        """Always True."""
        return True

    def seekable(self) -> bool:
        """Always True."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Copy the next bytes into ``buffer``; how many (0 at the end)."""
        target = memoryview(buffer).cast('B')
        count = max(0, min(len(target), len(self._view) - self._pos))
        target[:count] = self._view[self._pos : self._pos + count]
        self._pos += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from ``whence``; the new position."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        """The position."""
        return self._pos


@dataclasses.dataclass
class _Blob:
    """One saved item's bytes in a file (``offset``, ``length``) and the read items that load from it."""

    offset: int
    length: int
    info: Any  # torch's _StorageInfo
    requests: list[ReadItem]
    buffer: Optional[bytearray] = None
    remaining: int = 0  # parts still to arrive
    target: Optional[torch.Tensor] = None  # the one request's destination, resolved once (direct candidates)
    # Direct reads: '' (general), 'pending' (waiting for its head), 'direct' (storage read into ``target``).
    mode: str = ''
    body: tuple[int, int] = (0, 0)  # chunk-aligned file range inside the storage, read straight into ``target``
    head_left: int = 0  # parts covering the item's head (its torch.save records) still to arrive
    stash: list[tuple[int, memoryview]] = dataclasses.field(default_factory=list)  # parts that came while pending
    data_start: int = 0  # where the storage's bytes start in the file (direct)
    dest: Optional[memoryview] = None  # the bytes of ``target`` (direct)


@dataclasses.dataclass
class _File:
    name: str
    sums: FileSums
    parts: list[tuple[int, int]]
    blobs: list[_Blob]
    offsets: list[int]
    verified: bool
    gates: dict[int, _Blob] = dataclasses.field(default_factory=dict)  # part index -> blob whose body it is
    heads: set[int] = dataclasses.field(default_factory=set)  # indexes of the parts with a pending blob's head
    crcs: dict[int, int] = dataclasses.field(default_factory=dict)  # whole-file check: part index -> crc
    ready: list[tuple[_Blob, memoryview]] = dataclasses.field(default_factory=list)  # waiting for that check

    def blobs_in(self, start: int, length: int) -> list[_Blob]:
        """The blobs with bytes in ``[start, start + length)`` (blobs never overlap: torch writes them back to back)."""
        index = max(bisect.bisect_right(self.offsets, start) - 1, 0)
        found = []
        while index < len(self.blobs) and self.blobs[index].offset < start + length:
            blob = self.blobs[index]
            if blob.offset + blob.length > start:
                found.append(blob)
            index += 1
        return found


class RangedLoad:
    """One ``read_data`` call: fetch, verify and load the items of ``plan``.

    Args:
        store: the object store (``read_range``).
        checkpoint_id: names objects (``<id>/<relative>``) and errors.
        sums: relative name -> :class:`FileSums` of every file of the checkpoint.
        pool: the reader's thread pool (at least ``max_in_flight`` threads).
        max_in_flight: parts read at a time.
        part_bytes: the largest part.
        timeout: seconds without any part arriving before the load fails.
        on_bytes: called with the size of every part read (from the pool's threads).
    """

    def __init__(
        self,
        store: Any,
        checkpoint_id: str,
        sums: dict[str, FileSums],
        pool: ThreadPoolExecutor,
        max_in_flight: int,
        part_bytes: int,
        timeout: float,
        on_bytes: Callable[[int], None],
    ):
        self.store, self.cid, self.sums, self.pool = store, checkpoint_id, sums, pool
        self.max_in_flight, self.part_bytes, self.timeout, self.on_bytes = max_in_flight, part_bytes, timeout, on_bytes
        self.planner: Any = None
        self.transforms: Any = None
        self.budget = max_in_flight * part_bytes  # bytes of buffers held at a time (beyond one item)
        self.held = 0
        self.direct_bytes = 0  # bytes of tensors read straight into their destination

    def run(self, plan: LoadPlan, planner: LoadPlanner, storage_data: dict[Any, Any], transforms: Any) -> None:
        """Load every item of ``plan`` into the planner's tensors (or ``load_bytes``).

        Raises:
            FileNotFoundError: a file the plan reads is not in the commit marker, or not in the bucket.
            ChecksumMismatch: bytes that differ from those written (naming the object and the chunk).
            TimeoutError: no part arrived for ``timeout`` seconds.
        """
        self.planner, self.transforms = planner, transforms
        files = self._files(plan, storage_data)
        # The parts holding the heads of items that may be read straight into their tensors go first: the rest of
        # such an item waits for its head (where its storage lies in the item).
        heads = [(entry, index) for entry in files for index in sorted(entry.heads)]
        rest = [(entry, index) for entry in files for index in range(len(entry.parts)) if index not in entry.heads]
        queue = heads + rest
        running: dict[Future, tuple[_File, int, Optional[memoryview]]] = {}
        position = 0
        try:
            while position < len(queue) or running:
                while (
                    position < len(queue)
                    and len(running) < self.max_in_flight
                    and (not running or self.held < self.budget)
                ):
                    entry, index = queue[position]
                    gate = entry.gates.get(index)
                    if gate is not None and gate.mode == 'pending':
                        if running:
                            break  # its head is on its way
                        self._decide(gate)  # cannot happen (heads go first); never wait for nothing
                    position += 1
                    target = self._target(entry, index)
                    own = None if target is not None else memoryview(bytearray(entry.parts[index][1]))
                    self.held += 0 if own is None else len(own)
                    into = target if target is not None else own
                    assert into is not None
                    future = self.pool.submit(self._fetch, entry, entry.parts[index][0], into)
                    running[future] = (entry, index, own)
                done, _ = wait(running, timeout=self.timeout, return_when=FIRST_COMPLETED)
                if not done:
                    raise TimeoutError(
                        f'checkpoint {self.cid!r}: no range arrived in {self.timeout:.0f} s ({len(running)} in flight)'
                    )
                for future in done:
                    entry, index, own = running.pop(future)
                    self._arrived(entry, index, own, future.result())
        finally:
            for future in running:
                future.cancel()
            wait(running, timeout=self.timeout)  # reads already running finish (they write into our buffers)

    def _files(self, plan: LoadPlan, storage_data: dict[Any, Any]) -> list[_File]:
        grouped: dict[str, dict[tuple[int, int], _Blob]] = {}
        for request in plan.items:
            info = storage_data[request.storage_index]
            blobs = grouped.setdefault(info.relative_path, {})
            key = (info.offset, info.length)
            if key not in blobs:
                blobs[key] = _Blob(info.offset, info.length, info, [])
            blobs[key].requests.append(request)
        files = []
        for relative, by_range in grouped.items():
            sums = self.sums.get(relative)
            if sums is None:
                raise FileNotFoundError(f'checkpoint {self.cid!r}: {relative} is not in its commit marker')
            ordered = sorted(by_range.values(), key=lambda blob: blob.offset)
            cuts: list[int] = []
            for blob in ordered:
                if self._candidate(blob, sums):
                    cuts.extend(blob.body)
            parts = plan_parts([(blob.offset, blob.length) for blob in ordered], sums, self.part_bytes, cuts)
            entry = _File(
                f'{self.cid}/{relative}',
                sums,
                parts,
                ordered,
                [blob.offset for blob in ordered],
                verified=sums.chunks is not None or sums.whole is None,
            )
            starts = [start for start, _ in parts]
            for blob in ordered:
                if blob.length == 0:
                    self._ready(entry, blob, memoryview(b''))
                    continue
                first = bisect.bisect_right(starts, blob.offset) - 1
                last = bisect.bisect_right(starts, blob.offset + blob.length - 1) - 1
                blob.remaining = last - first + 1
                if blob.mode == 'pending':
                    for index in range(first, last + 1):
                        start, length = parts[index]
                        if blob.body[0] <= start < blob.body[1]:
                            entry.gates[index] = blob
                        elif start < blob.offset + min(HEAD_BYTES, blob.length):
                            entry.heads.add(index)
                            blob.head_left += 1
            files.append(entry)
        return files

    def _candidate(self, blob: _Blob, sums: FileSums) -> bool:
        """Whether ``blob`` may be read straight into its tensor: one request for the whole saved tensor into a
        plain contiguous CPU tensor of its size, in a file with chunk checksums, big enough to hold whole chunks
        past its head and before its tail (then ``pending``: the head tells; else the general path)."""
        if len(blob.requests) != 1 or sums.chunks is None or blob.info.transform_descriptors:
            return False
        chunk = sums.chunk
        low = -(-(blob.offset + HEAD_BYTES) // chunk) * chunk
        high = (blob.offset + blob.length - TAIL_BYTES) // chunk * chunk
        if low >= high:
            return False
        target = plain_target(self.planner, blob.requests[0])
        if target is None or not 0 < target.numel() * target.element_size() < blob.length:
            return False
        blob.target = target  # resolved once: the general path loads into it too
        blob.mode, blob.body = 'pending', (low, high)
        return True

    def _decide(self, blob: _Blob) -> None:
        """Its head arrived (or never will): read the rest straight into its tensor if the saved tensor's storage
        is exactly the tensor's bytes (same dtype, size, contiguous) and holds the body; else the general path."""
        target = blob.target
        assert target is not None
        size = min(HEAD_BYTES, blob.length)
        head = bytearray(size)
        for start, view in blob.stash:
            low, high = max(start, blob.offset), min(start + len(view), blob.offset + size)
            if low < high:
                head[low - blob.offset : high - blob.offset] = view[low - start : high - start]
        layout = saved_layout(bytes(head)) if blob.head_left == 0 else None
        nbytes = target.numel() * target.element_size()
        direct = (
            layout is not None
            and layout.holds_exactly(target, blob.length)
            and blob.offset + layout.offset <= blob.body[0]
            and blob.body[1] <= blob.offset + layout.offset + nbytes
        )
        stash, blob.stash = blob.stash, []
        if direct:
            assert layout is not None
            blob.mode, blob.data_start = 'direct', blob.offset + layout.offset
            blob.dest = memoryview((ctypes.c_ubyte * nbytes).from_address(target.data_ptr())).cast('B')
            for start, view in stash:
                self._place(blob, start, view)
            if blob.remaining == 0:
                self._commit(blob)
            return
        blob.mode = ''
        blob.buffer = bytearray(blob.length)
        self.held += blob.length
        for start, view in stash:
            low, high = max(start, blob.offset), min(start + len(view), blob.offset + blob.length)
            blob.buffer[low - blob.offset : high - blob.offset] = view[low - start : high - start]
        if blob.remaining == 0:
            buffer, blob.buffer = blob.buffer, None
            self.held -= blob.length
            self._load(blob, memoryview(buffer))

    @staticmethod
    def _place(blob: _Blob, start: int, view: memoryview) -> None:
        """Copy the bytes of a part read into a buffer of its own that belong to a direct blob's tensor."""
        assert blob.dest is not None
        end = blob.data_start + len(blob.dest)
        low, high = max(start, blob.data_start), min(start + len(view), end)
        if low < high:
            blob.dest[low - blob.data_start : high - blob.data_start] = view[low - start : high - start]

    def _commit(self, blob: _Blob) -> None:
        assert blob.dest is not None
        self.direct_bytes += len(blob.dest)
        blob.dest = None
        self.planner.commit_tensor(blob.requests[0], blob.target)

    def _arrived_direct(self, blob: _Blob, start: int, length: int, own: Optional[memoryview]) -> None:
        """A verified part of a pending or direct blob."""
        blob.remaining -= 1
        if blob.mode == 'pending':
            assert own is not None  # its body parts wait for its head
            blob.stash.append((start, own))
            if start < blob.offset + min(HEAD_BYTES, blob.length):
                blob.head_left -= 1
                if blob.head_left == 0:
                    self._decide(blob)
            return
        if own is not None:
            self._place(blob, start, own)
        if blob.remaining == 0:
            self._commit(blob)

    @staticmethod
    def _inside(start: int, length: int, blob: _Blob) -> bool:
        return blob.offset <= start and start + length <= blob.offset + blob.length

    def _target(self, entry: _File, index: int) -> Optional[memoryview]:
        """The part's place in the buffer of a blob that holds all of it and more (read there, no copy)."""
        start, length = entry.parts[index]
        for blob in entry.blobs_in(start, length):
            if blob.mode == 'direct' and blob.body[0] <= start and start + length <= blob.body[1]:
                assert blob.dest is not None
                return blob.dest[start - blob.data_start : start - blob.data_start + length]  # straight in
            if blob.mode:
                continue  # a pending or direct blob's head or tail: a buffer of its own
            if self._inside(start, length, blob) and blob.length > length:
                if blob.buffer is None:
                    blob.buffer = bytearray(blob.length)
                    self.held += blob.length
                begin = start - blob.offset
                return memoryview(blob.buffer)[begin : begin + length]
        return None

    def _fetch(self, entry: _File, start: int, buffer: memoryview) -> int:
        """Read a part and verify its chunks (pool thread); its CRC32C for a whole-file check, else 0."""
        crc = fetch_verified(self.store, entry.name, entry.sums, start, buffer, f'checkpoint {self.cid!r}')
        self.on_bytes(len(buffer))
        return crc

    def _arrived(self, entry: _File, index: int, own: Optional[memoryview], crc: int) -> None:
        """A verified part: hand its bytes to its blobs; load the blobs that are complete."""
        start, length = entry.parts[index]
        if not entry.verified:
            entry.crcs[index] = crc
        for blob in entry.blobs_in(start, length):
            if blob.mode:
                self._arrived_direct(blob, start, length, own)
                continue
            offset, size = blob.offset, blob.length
            if own is not None:
                if start <= offset and offset + size <= start + length:
                    blob.remaining = 0
                    self._ready(entry, blob, own[offset - start : offset - start + size])
                    continue
                if blob.buffer is None:
                    blob.buffer = bytearray(size)
                    self.held += size
                low, high = max(offset, start), min(offset + size, start + length)
                memoryview(blob.buffer)[low - offset : high - offset] = own[low - start : high - start]
            blob.remaining -= 1
            if blob.remaining == 0:
                buffer, blob.buffer = blob.buffer, None
                self._ready(entry, blob, memoryview(buffer))  # type: ignore[arg-type]
                self.held -= size
        if own is not None:
            self.held -= length
        if not entry.verified and len(entry.crcs) == len(entry.parts):
            self._check_whole(entry)

    def _check_whole(self, entry: _File) -> None:
        value = 0
        for index, (_, length) in enumerate(entry.parts):
            value = fast_combine(value, entry.crcs[index], length)
        if value != entry.sums.whole:
            raise ChecksumMismatch(
                entry.name, encode(entry.sums.whole or 0), encode(value), f'checkpoint {self.cid!r}; not loaded'
            )
        entry.verified = True
        ready, entry.ready = entry.ready, []
        for blob, view in ready:
            self._load(blob, view)

    def _ready(self, entry: _File, blob: _Blob, view: memoryview) -> None:
        if entry.verified:
            self._load(blob, view)
        else:
            entry.ready.append((blob, view))

    def _load(self, blob: _Blob, view: memoryview) -> None:
        """Deserialize one saved item for each read item that uses it, as torch's ``FileSystemReader`` does."""
        load_item(self.planner, self.transforms, blob.info, blob.requests, view, blob.target, direct=False)


def fetch_verified(store: Any, name: str, sums: FileSums, start: int, buffer: memoryview, where: str) -> int:
    """Read ``len(buffer)`` bytes of ``name`` from ``start`` into ``buffer`` and verify its chunks (``start``
    chunk-aligned); its CRC32C when the file has no chunk checksums (for a whole-file check), else 0.

    Raises:
        ChecksumMismatch: a chunk differs from the one its writer recorded (naming the object, the chunk and
            ``where``).
    """
    retry(store, lambda: store.read_range(name, start, buffer))
    if sums.chunks is None:
        return crc32c(buffer)
    check_chunks(name, sums, start, buffer, where)
    return 0


def check_chunks(name: str, sums: FileSums, start: int, buffer: memoryview, where: str) -> None:
    """Verify the bytes of ``name`` from ``start`` (chunk-aligned) held in ``buffer`` against its chunk checksums.

    Raises:
        ChecksumMismatch: a chunk differs (naming the object, the chunk and ``where``).
    """
    assert sums.chunks is not None
    chunk = sums.chunk
    for offset in range(0, len(buffer), chunk):
        number = (start + offset) // chunk
        actual = crc32c(buffer[offset : offset + chunk])
        if actual != sums.chunks[number]:
            end = start + min(offset + chunk, len(buffer))
            raise ChecksumMismatch(
                name,
                encode(sums.chunks[number]),
                encode(actual),
                f'{where}, chunk {number}: bytes {start + offset}-{end - 1}; not loaded',
            )


def plain_target(planner: Any, request: ReadItem) -> Optional[torch.Tensor]:
    """The destination of a tensor read whole, when its bytes can be written straight in (a plain contiguous CPU
    tensor of the request's size); else None."""
    if request.type != LoadItemType.TENSOR or any(request.storage_offsets):
        return None
    target = planner.resolve_tensor(request).detach()
    if (
        type(target) is not torch.Tensor
        or target.device.type != 'cpu'
        or target.layout != torch.strided
        or not target.is_contiguous()
        or target.is_conj()
        or target.is_neg()
        or list(target.size()) != list(request.lengths)
    ):
        return None
    return target


def load_item(
    planner: Any,
    transforms: Any,
    info: Any,
    requests: list[ReadItem],
    view: memoryview,
    target: Optional[torch.Tensor] = None,
    direct: bool = True,
) -> int:
    """Load one saved item's verified bytes (``view``, the whole item) for each read item that uses it; the bytes
    copied straight into a tensor (0 when deserialized, as torch's ``FileSystemReader`` does).

    A single read of a whole saved tensor into a plain contiguous CPU tensor of its dtype and size (no stream
    transforms) is copied straight from ``view`` into the tensor (with ``direct``); anything else is deserialized
    (``target``: the first request's destination, when the caller resolved it already).
    """
    if direct and len(requests) == 1 and not info.transform_descriptors and len(view) > 0:
        request = requests[0]
        plain = plain_target(planner, request)
        if plain is not None:
            layout = saved_layout(bytes(view[: min(HEAD_BYTES, len(view))]))
            nbytes = plain.numel() * plain.element_size()
            if layout is not None and layout.holds_exactly(plain, len(view)):
                if nbytes:
                    dest = memoryview((ctypes.c_ubyte * nbytes).from_address(plain.data_ptr())).cast('B')
                    dest[:] = view[layout.offset : layout.offset + nbytes]
                planner.commit_tensor(request, plain)
                return nbytes
            target = plain
    tensor = None
    for request in requests:
        stream = transforms.transform_load_stream(request, info.transform_descriptors or (), MemoryReader(view))
        if request.type == LoadItemType.BYTE_IO:
            planner.load_bytes(request, io.BytesIO(stream.read(-1)))
            continue
        if tensor is None:
            seekable = stream if stream.seekable() else io.BytesIO(stream.read(-1))
            tensor = torch.load(seekable, map_location='cpu', weights_only=True)
        piece = narrow_tensor_by_index(tensor, request.storage_offsets, request.lengths)
        dest_tensor = target if target is not None and request is requests[0] else None
        if dest_tensor is None:
            dest_tensor = planner.resolve_tensor(request).detach()
        if dest_tensor.size() != piece.size():
            raise AssertionError(f'req {request.storage_index} mismatch sizes {dest_tensor.size()} vs {piece.size()}')
        dest_tensor.copy_(piece)
        planner.commit_tensor(request, dest_tensor)
    return 0


def fetch_object(store: Any, name: str, size: int, checksum: Optional[str], where: str) -> bytes:
    """A whole (small) object read into memory with one ranged read, checked against ``checksum`` when given.

    Raises:
        ChecksumMismatch: its bytes differ from those recorded.
    """
    buffer = bytearray(size)
    retry(store, lambda: store.read_range(name, 0, buffer))
    if checksum is not None:
        actual = encode(crc32c(buffer))
        if actual != checksum:
            raise ChecksumMismatch(name, checksum, actual, where)
    return bytes(buffer)
