"""Shard checksums, taken while torch's file writer writes each shard file (never by reading it again).

The CRC32C of every file travels with DCP's own write results to the coordinator (each result's
``storage_data`` is a :class:`CheckedInfo`, torch's ``_StorageInfo`` plus the file's checksum), which
records them in the commit intent and so in the commit marker (``'checksums'``: relative name ->
``'crc32c:<base64>'``), then strips them before the ``.metadata`` is pickled, so the ``.metadata`` stays
exactly torch's (its own ``FileSystemReader`` reads our checkpoints). See ``docs/checkpoints.md``, "Integrity".
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import queue
import threading
from typing import Any, Callable, Iterator, Optional

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.storage import WriteResult

from dist_logging.object_store.checksums import crc32c, encode

__all__ = ['CheckedInfo', 'SummingWriter', 'ChecksummedResults', 'summing_streams', 'file_checksums',
           'plain_results']


@dataclasses.dataclass
class CheckedInfo(_StorageInfo):
    """torch's ``_StorageInfo`` (where an item is in which file) with the CRC32C of the whole file."""

    checksum: Optional[str] = None

    def plain(self) -> _StorageInfo:
        """The same location as torch's own ``_StorageInfo`` (what goes into the ``.metadata``)."""
        return _StorageInfo(self.relative_path, self.offset, self.length,
                            transform_descriptors=self.transform_descriptors)


class SummingWriter(io.RawIOBase):
    """The stream torch's file writer writes a shard file through: every byte goes to ``raw`` and into a CRC32C.

    torch writes a shard file front to back (``tell`` for offsets, ``fileno`` to fsync, never a seek back),
    so once it is closed :attr:`checksum` is the checksum of the whole file. The CRC costs about 0.07 CPU s
    per GiB (SSE4.2), on the writer's thread, while the bytes are in cache.
    """

    def __init__(self, raw: Any):
        super().__init__()
        self.raw = raw
        self.value = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast('B')
        written = self.raw.write(view)
        if written is None:  # a raw stream that did not say: buffered streams take everything
            written = len(view)
        self.value = crc32c(view[:written] if written < len(view) else view, self.value)
        return written

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes through to raw first
            finally:
                self.raw.close()

    @property
    def checksum(self) -> str:
        return encode(self.value)


def summing_streams(create_stream: Callable, sums: dict[str, str],
                    lock: threading.Lock) -> Callable[[Any, str], Any]:
    """Wrap ``create_stream(path, mode)`` (a context manager, torch's contract) so each file is written through a
    :class:`SummingWriter`; the checksum lands in ``sums[basename]`` when the file is closed."""

    @contextlib.contextmanager
    def open_summing(path: Any, mode: str) -> Iterator[SummingWriter]:
        with create_stream(path, mode) as raw:
            stream = SummingWriter(raw)
            yield stream
            stream.close()  # torch closes it itself (then this does nothing): the file is complete here
            with lock:
                sums[os.path.basename(os.fspath(path))] = stream.checksum

    return open_summing


class ChecksummedResults(queue.Queue):
    """In front of the result queue torch's file writer puts a closed file's write results in: each result goes
    on with its file's checksum (``sums``, filled when the file closed) in a :class:`CheckedInfo`."""

    def __init__(self, target: queue.Queue, sums: dict[str, str], lock: threading.Lock):
        super().__init__()
        self.target, self.sums, self.lock = target, sums, lock

    def put(self, item: list[WriteResult], block: bool = True, timeout: Optional[float] = None) -> None:
        checked = []
        for result in item:
            info = result.storage_data
            with self.lock:
                checksum = self.sums.get(info.relative_path)
            if checksum is None:
                raise RuntimeError(f'CheckpointWriter: no checksum was taken of {info.relative_path} (was it '
                                   'written through another stream?)')
            checked.append(dataclasses.replace(result, storage_data=CheckedInfo(
                info.relative_path, info.offset, info.length, transform_descriptors=info.transform_descriptors,
                checksum=checksum)))
        self.target.put(checked)


def file_checksums(results: list[WriteResult]) -> dict[str, str]:
    """Relative file name -> checksum, from write results carrying :class:`CheckedInfo`."""
    found: dict[str, str] = {}
    for result in results:
        checksum = getattr(result.storage_data, 'checksum', None)
        if checksum is not None:
            found[result.storage_data.relative_path] = checksum
    return found


def plain_results(results: list[WriteResult]) -> list[WriteResult]:
    """The results with torch's own ``_StorageInfo`` (for the ``.metadata``)."""
    return [dataclasses.replace(r, storage_data=r.storage_data.plain()) if isinstance(r.storage_data, CheckedInfo)
            else r for r in results]
