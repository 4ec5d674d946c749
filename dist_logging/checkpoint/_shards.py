"""What both DCP writers (``CheckpointWriter`` in the trainer, the process-side writer in torch's
checkpoint process) do alike: name the shard files, write them with torch's file writer, build the
``.metadata``."""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import re
import threading
import uuid
from typing import Any, Callable, Optional

from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    DEFAULT_SUFFIX,
    _split_by_size_and_type,
    _StoragePrefix,
    _write_files_from_queue,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from dist_logging.checkpoint._checksums import ChecksummedResults, file_checksums, plain_results, summing_streams

__all__ = [
    'SHARD_NAME',
    'name_rank_files',
    'write_rank_files',
    'seal_metadata',
    'file_sizes',
    'no_checkpoint_id',
    'check_role',
    'check_file_size',
    'HandOverQueue',
    'async_files',
]

SHARD_NAME = re.compile(r'/__\d+_[0-9a-f]{8}_\d+\.distcp$')  # name_rank_files' names
# files_per_rank=None for a save off the training thread (dcp.async_save): one file per ASYNC_FILE_BYTES of the
# rank's shard bytes, from ASYNC_FILES_PER_RANK up to ASYNC_MAX_FILES_PER_RANK
ASYNC_FILES_PER_RANK = 4
ASYNC_MAX_FILES_PER_RANK = 16
ASYNC_FILE_BYTES = 64 * 1024 * 1024


def name_rank_files(plans: list[SavePlan]) -> list[SavePlan]:
    """Name each rank's files ``__{rank}_{nonce}_{n}.distcp`` (coordinator; the nonce is fresh per save)."""
    nonce = uuid.uuid4().hex[:8]
    return [dataclasses.replace(plan, storage_data=_StoragePrefix(f'__{i}_{nonce}_')) for i, plan in enumerate(plans)]


def write_rank_files(
    writer: Any,
    plan: SavePlan,
    planner: SavePlanner,
    results: queue.Queue,
    files: Optional[int] = None,
    create_stream: Optional[Callable] = None,
) -> None:
    """Write this rank's shard files into ``writer.path`` as torch's ``FileSystemWriter.write_data`` does
    (its file writer, ``writer.thread_count`` threads), split in ``max(files, thread_count)`` files
    balanced by size. torch's writer puts each file's write results in ``results`` once the file is closed.

    ``writer`` is a torch ``FileSystemWriter`` with ``files_per_rank`` (None: one file), used when
    ``files`` is not given; with ``single_file_per_rank=False`` every item gets a file of its own, as torch
    writes then. ``create_stream(path, mode)`` opens each file (default: ``writer.fs``'s). Every file is
    written through a CRC32C (``_checksums``): its results reach ``results`` carrying the file's checksum.
    Raises what a writer thread raised.
    """
    if files is None:
        files = writer.files_per_rank or 1
    prefix: _StoragePrefix = plan.storage_data
    queued: queue.Queue = queue.Queue()
    if writer.single_file_per_rank:
        buckets = [bucket for bucket in _split_by_size_and_type(max(files, writer.thread_count), plan.items) if bucket]
    else:
        buckets = [[item] for item in plan.items]
    for n, bucket in enumerate(buckets):
        name = f'{prefix.prefix}{n}{DEFAULT_SUFFIX}'
        queued.put((writer.fs.concat_path(writer.path, name), name, bucket))
    errors: list[BaseException] = []
    sums: dict[str, str] = {}
    lock = threading.Lock()
    opener = summing_streams(create_stream or writer.fs.create_stream, sums, lock)
    checked = ChecksummedResults(results, sums, lock)

    def write() -> None:
        try:
            _write_files_from_queue(
                opener,
                queued,
                checked,
                planner,
                writer.transforms,
                writer.per_thread_copy_ahead,
                writer.sync_files,
                writer.thread_count,
                writer.serialization_format,
            )
        except BaseException as exc:  # noqa: BLE001 - raised below, on the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=write, name=f'dist_logging-ckpt-write-{i}', daemon=True)
        for i in range(1, min(writer.thread_count, len(buckets)))
    ]
    for thread in threads:
        thread.start()
    write()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def seal_metadata(
    metadata: Metadata, results: list[list[WriteResult]], storage_meta: Optional[StorageMeta]
) -> tuple[dict[str, int], dict[str, str]]:
    """Fill ``metadata`` as torch's ``FileSystemWriter.finish`` does (version, storage data of every rank's
    results, ``storage_meta``), with torch's own ``_StorageInfo`` (the checksums stay out of the ``.metadata``);
    return every shard file's relative name -> size, and -> checksum."""
    metadata.version = CURRENT_DCP_VERSION
    everything = [result for rank_results in results for result in rank_results]
    metadata.storage_data = {result.index: result.storage_data for result in plain_results(everything)}
    metadata.storage_meta = storage_meta
    return file_sizes(everything), file_checksums(everything)


def file_sizes(results: list[WriteResult]) -> dict[str, int]:
    """Relative file name -> size, from write results (each item's offset + length; torch writes them back to back)."""
    sizes: dict[str, int] = {}
    for result in results:
        info = result.storage_data
        end = info.offset + info.length
        if end > sizes.get(info.relative_path, -1):
            sizes[info.relative_path] = end
    return sizes


def no_checkpoint_id() -> ValueError:
    """The error for a save without ``checkpoint_id=`` (torch calls ``reset`` only when one is given)."""
    return ValueError(
        "CheckpointWriter: pass checkpoint_id= (the checkpoint's folder in the bucket) to dcp.save / dcp.async_save"
    )


def check_role(writer: Any, armed: bool) -> None:
    """What ``set_up_storage_writer`` checks on both writers: a ``reset`` with an id came first
    (``armed``), and collectives are on. Raises ValueError otherwise."""
    if not armed:
        raise no_checkpoint_id()
    if not writer.use_collectives:
        raise ValueError(
            'CheckpointWriter needs use_collectives=True: the coordinator commits the checkpoint '
            "from every rank's write results"
        )


def check_file_size(path: str, size: int) -> None:
    """Raise RuntimeError unless the closed shard file ``path`` holds exactly ``size`` bytes (where its
    write results end)."""
    actual = os.path.getsize(path)
    if actual != size:
        raise RuntimeError(
            f'CheckpointWriter: {path} has {actual} bytes but its write results end at {size}; '
            'this torch writes a file layout the commit check does not understand'
        )


class HandOverQueue(queue.Queue):
    """The result queue torch's file writer puts each file's write results in, once the file is closed:
    the put hands that file over first (``hand_over(results)`` returns its size), so its upload starts
    while the next files are written."""

    def __init__(self, hand_over: Callable[[list[WriteResult]], int]):
        super().__init__()
        self.hand_over = hand_over
        self.total = 0
        self._collected: list[WriteResult] = []

    def put(self, item: list[WriteResult], block: bool = True, timeout: Optional[float] = None) -> None:
        size = self.hand_over(item)
        with self.mutex:
            self.total += size
            self._collected.extend(item)

    def results(self) -> list[WriteResult]:
        with self.mutex:
            return list(self._collected)


def async_files(plan: SavePlan) -> int:
    """Shard files for a save off the training thread: one per ``ASYNC_FILE_BYTES`` of the plan, within bounds."""
    planned = sum(
        math.prod(item.tensor_data.size) * item.tensor_data.properties.dtype.itemsize
        for item in plan.items
        if item.tensor_data is not None
    )  # tensors; byte items are small
    return min(ASYNC_MAX_FILES_PER_RANK, max(ASYNC_FILES_PER_RANK, -(-planned // ASYNC_FILE_BYTES)))
