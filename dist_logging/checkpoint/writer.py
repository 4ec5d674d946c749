"""CheckpointWriter: a torch.distributed.checkpoint StorageWriter over the durable upload path."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import math
import os
import pickle
import queue
import shutil
import threading
import time
import uuid
import warnings
from torch.futures import Future
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from dist_logging import dist
from dist_logging.checkpoint._committer import Committer
from dist_logging.checkpoint._handoff import PROCESS_FOLDER, HandOff
from dist_logging.checkpoint._intents import INTENTS_FOLDER, CommitIntent, read_intents, write_intent
from dist_logging.checkpoint._layout import CheckpointIdMixin, check_checkpoint_id
from dist_logging.checkpoint._paths import scratch_folder
from dist_logging.checkpoint._staging import StagingBuffers
from dist_logging.checkpoint._shards import (SHARD_NAME, check_file_size, check_role, file_sizes, name_rank_files,
                                             no_checkpoint_id, seal_metadata, write_rank_files)
from dist_logging.destinations.remote import RemoteUploaderDownloader
from dist_logging.errors import UploadError
from dist_logging.object_store import persistable_kwargs, persistable_uri

__all__ = ['CheckpointWriter', 'SaveTiming']

log = logging.getLogger(__name__)
_WRITES_FOLDER = 'checkpoint-writes'
_SPARE_SAVES = 2  # spare files kept: up to this many saves' bytes per rank
_TIMINGS_KEPT = 100  # SaveTiming records kept (about 250 bytes each)
# files_per_rank=None for a save off the training thread (dcp.async_save): one file per ASYNC_FILE_BYTES of the
# rank's shard bytes, from ASYNC_FILES_PER_RANK up to ASYNC_MAX_FILES_PER_RANK
ASYNC_FILES_PER_RANK = 4
ASYNC_MAX_FILES_PER_RANK = 16
ASYNC_FILE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass
class SaveTiming:
    """One save as this rank saw it.

    Attributes:
        checkpoint_id: the checkpoint's id (its folder in the bucket).
        rank: the global rank.
        started_at: Unix time the save started on this rank (DCP's ``reset``; for a save in torch's
            checkpoint process, when the trainer sent it there).
        local_s: seconds from the start until this rank's shards were written locally and queued
            in the durable upload journal (the moment a SIGKILL no longer loses them).
        bytes_written: this rank's shard bytes.
        commit_s: seconds from the start until the checkpoint was committed in the bucket
            (coordinator only; None elsewhere, and until then).
        error: why the commit failed (coordinator), else None.
    """

    checkpoint_id: str
    rank: int
    started_at: float
    local_s: Optional[float] = None
    bytes_written: int = 0
    commit_s: Optional[float] = None
    error: Optional[BaseException] = None


class CheckpointWriter(CheckpointIdMixin, FileSystemWriter):
    """Writes a DCP checkpoint to local staging, uploads it in the background, commits it when complete.

    Use it as ``dcp.save(state_dict, checkpoint_id='run/checkpoints/step100', storage_writer=writer)``
    or with ``dcp.async_save`` (thread or process checkpointer); the ``checkpoint_id`` is the checkpoint's
    folder in the bucket. On every rank the shards are written (by torch's own file writer)
    into a folder next to the rank's upload staging folder, then handed to the uploader by hard
    link (no second copy) and recorded in its durable journal: ``dcp.save`` returns then. The
    coordinator's ``finish`` records a commit intent (with the ``.metadata``) on local disk and
    hands it to a background committer, which commits the checkpoint once every shard is in the
    bucket with its size: ``.metadata`` first, then the commit marker (see ``docs/checkpoints.md``).
    Until then the checkpoint is invisible to :func:`latest_checkpoint` and :class:`CheckpointReader`.

    Shard files get a per-save nonce in their names (``__0_1a2b3c4d_0.distcp``), so saving again
    to a committed id never overwrites the files the committed version's metadata points at:
    that version stays readable until the new one commits (which removes the old marker first).

    With ``dcp.async_save(..., async_checkpointer_type=AsyncCheckpointerType.PROCESS)`` torch pickles
    the writer into its checkpoint process for every save: the copy only writes this rank's shard
    files (and, on the coordinator, the commit record) into a hand-off folder in the writer's staging
    state; this writer, in the trainer, hands them to the uploader, records the commit intent,
    the timings and the metrics, and reports failures at ``close`` (see ``docs/checkpoints.md``).

    One save at a time per writer (as with torch's ``FileSystemWriter``): wait for an
    ``async_save`` future before starting the next save with the same writer.

    Args:
        bucket: a bucket URI (``'s3://bucket/prefix'``, ``'file:///abs'``, a local path), or a
            :class:`~dist_logging.destinations.remote.RemoteUploaderDownloader` whose staging
            folder and workers the writer shares (its ``file_path_format_string`` must be
            ``'{remote_file_name}'``, and its store must have ``list`` and ``delete``).
        keep_last: after each commit, delete older committed checkpoints in the same parent
            folder so that ``keep_last`` remain (uncommitted folders are never counted or touched).
        backend_kwargs: with a URI: the store's keyword arguments (e.g. ``{'endpoint_url': ...}``).
        upload_staging_folder: with a URI: the staging folder (default: per run, in the system
            temp dir). Shards are written next to it, so it must have room for them.
        run_name: with a URI: names the default staging folder (use the same on every rank of a node).
        max_staged_bytes: a save waits (warned once) only while the staging folder holds bytes
            not yet uploaded and those plus this rank's previous save would exceed this; None:
            never waits (the disk is the limit).
        commit_timeout: seconds the committer waits for a checkpoint's shards before it fails
            (the checkpoint stays uncommitted; ``close`` raises); also how long ``close`` waits for
            saves still running in torch's checkpoint process.
        logger: a :class:`~dist_logging.Logger`: each save's ``checkpoint/local_s`` (every rank)
            and ``checkpoint/commit_s`` (coordinator) are logged through it.
        sync_files: fsync shard files, journal records and commit intents, so a queued save
            survives a machine crash too. Off by default, as for every upload of the product:
            durable against process death (a journal line is written only after its shard file
            is complete, and the page cache outlives the process). The environment variable
            ``DIST_LOGGING_UPLOAD_FSYNC=1`` also turns it on (torch's ``FileSystemWriter``
            fsyncs by default).
        thread_count: torch's file-writer threads per rank.
        files_per_rank: shard files per rank and save (at least ``thread_count``; fewer when the
            rank has fewer items). Each file is queued for upload as soon as it is written, so
            with several files the upload of the first ones overlaps the write of the next.
            None (default): one file for a save that runs on the training thread (``dcp.save``:
            there the overlap made the call block longer on a 2-core VM, the upload's CPU
            competing with the write) and, for one that runs on another thread
            (``dcp.async_save``: nothing waits for the write), one file per 64 MiB of the rank's
            shard bytes, at least 4 and at most 16: the smaller the last file, the sooner its
            upload ends after the write (on a 2-core VM, 1 GiB over 2 ranks: 8 files committed
            14 % sooner than 4; benchmarks/README.md). The process checkpointer hands a save's
            files over together, so there it is one file unless set.
        num_concurrent_uploads: with a URI: upload workers per rank.
        use_procs: with a URI: upload workers as processes.
        upload_priority: with a URI: the upload workers' CPU and I/O priority (``'idle'``,
            ``'low'`` or ``'normal'``; see ``RemoteUploaderDownloader``).
        recycle_files: keep each shard file whose upload landed as a spare (up to two saves' bytes
            per rank, next to staging) and write the next save's shards over the spares instead of
            into new files, as databases recycle their log segments: writing over pages the page
            cache already holds skips the page and block allocation of a new file (measured on a
            2-vCPU VM: 0.14 CPU s per GiB, against 0.24 for a new file and up to 2.4 when the VM
            had handed the freed memory back to its host). A spare is reused only once no other
            link to it is left (its upload landed and the uploader let go of it). The spares are
            deleted at ``close``; with ``max_staged_bytes`` they hold at most that many bytes.
            Off (or without hard links into staging): every shard is a new file.
        cache_staged_state_dict: keep the CPU copy that ``dcp.async_save`` stages the state into
            (before it returns) for the next save, pinned where an accelerator is available, instead
            of allocating a new copy every save: the next ``async_save`` copies into memory already
            allocated and touched (2-vCPU VM, 1 GiB over 2 ranks: 75 ms against 746 ms). The copy
            stays allocated between saves (the memory each save takes anyway, kept instead of freed
            and taken again) until ``close``. It is reused only while the state keeps its structure,
            shapes and dtypes (otherwise replaced), and only once the previous save is over (if it
            is not, this save is staged into fresh memory, warned once). Off: torch's staging, a
            new copy per save.

    Raises:
        ValueError: a bad URI, ``keep_last``/``max_staged_bytes``/``commit_timeout`` out of
            range, ``files_per_rank`` not a positive int, keyword arguments that only apply to a
            URI given with an uploader, an uploader with a name template.
        TypeError: a store without ``list``/``delete``, or a ``bucket`` of another type.
    """

    def __init__(self, bucket: Union[str, 'os.PathLike[str]', RemoteUploaderDownloader], *,
                 keep_last: Optional[int] = None, backend_kwargs: Optional[dict] = None,
                 upload_staging_folder: Optional[str] = None, run_name: Optional[str] = None,
                 max_staged_bytes: Optional[int] = None, commit_timeout: float = 600.0, logger: Any = None,
                 sync_files: bool = False, thread_count: int = 1, files_per_rank: Optional[int] = None,
                 num_concurrent_uploads: int = 4, use_procs: bool = False, upload_priority: str = 'idle',
                 recycle_files: bool = True, cache_staged_state_dict: bool = True):
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f'CheckpointWriter: keep_last must be an int >= 1 or None, got {keep_last!r}')
        if max_staged_bytes is not None and (isinstance(max_staged_bytes, bool) or not isinstance(max_staged_bytes, int)
                                             or max_staged_bytes < 1):
            raise ValueError(f'CheckpointWriter: max_staged_bytes must be a positive int or None, '
                             f'got {max_staged_bytes!r}')
        if files_per_rank is not None and (isinstance(files_per_rank, bool) or not isinstance(files_per_rank, int)
                                           or files_per_rank < 1):
            raise ValueError(f'CheckpointWriter: files_per_rank must be a positive int or None, got {files_per_rank!r}')
        if isinstance(commit_timeout, bool) or not isinstance(commit_timeout, (int, float)) or not commit_timeout > 0:
            raise ValueError(f'CheckpointWriter: commit_timeout must be a positive number, got {commit_timeout!r}')
        if isinstance(bucket, RemoteUploaderDownloader):
            given = {k: v for k, v in (('backend_kwargs', backend_kwargs), ('upload_staging_folder',
                     upload_staging_folder), ('use_procs', use_procs or None),
                     ('upload_priority', None if upload_priority == 'idle' else upload_priority)) if v}
            if given or num_concurrent_uploads != 4:
                raise ValueError(f'CheckpointWriter: {sorted(given) or ["num_concurrent_uploads"]} only apply to a '
                                 'bucket URI; configure the RemoteUploaderDownloader instead')
            self.uploader, self._owns_uploader = bucket, False
            sync_files = bool(sync_files) or bucket.fsync
            if bucket.file_path_format_string != '{remote_file_name}':
                raise ValueError(f'CheckpointWriter: the uploader names objects with '
                                 f'{bucket.file_path_format_string!r}; checkpoints need the plain '
                                 "'{remote_file_name}' (put the prefix in the checkpoint id or the bucket URI)")
        elif isinstance(bucket, (str, os.PathLike)):
            self.uploader = RemoteUploaderDownloader(os.fspath(bucket), backend_kwargs=backend_kwargs,
                                                     upload_staging_folder=upload_staging_folder,
                                                     num_concurrent_uploads=num_concurrent_uploads,
                                                     use_procs=use_procs, upload_priority=upload_priority)
            self._owns_uploader = True
            # The uploader's fsync flag already holds DIST_LOGGING_UPLOAD_FSYNC.
            self.uploader.fsync = sync_files = self.uploader.fsync or bool(sync_files)
        else:
            raise TypeError(f'CheckpointWriter: bucket must be a URI or a RemoteUploaderDownloader, '
                            f'got {type(bucket).__name__}')
        store = self.uploader.object_store
        for method in ('list', 'delete'):
            if not callable(getattr(type(store), method, None)) or getattr(type(store), method) is getattr(
                    _protocol_base(), method):
                raise TypeError(f'CheckpointWriter: {store!r} has no {method}(); checkpoints need a store with '
                                'list and delete (every dist_logging.object_store store has them)')
        super().__init__('.', single_file_per_rank=True, sync_files=sync_files, thread_count=thread_count,
                         overwrite=True)
        self.store = store
        self.keep_last = keep_last
        self.max_staged_bytes = max_staged_bytes
        self.commit_timeout = float(commit_timeout)
        self.files_per_rank = files_per_rank
        self.recycle_files = bool(recycle_files)
        # Our stage() replaces torch's (whose cache pins memory, failing without an accelerator) either way.
        self.cache_staged_state_dict = bool(cache_staged_state_dict)
        self._staging_buffers = StagingBuffers(reuse=self.cache_staged_state_dict)
        self.logger = logger
        self.run_name = run_name
        self._backend_kwargs = persistable_kwargs(backend_kwargs)
        if 'endpoint_url' not in self._backend_kwargs and getattr(store, 'endpoint_url', None):
            self._backend_kwargs['endpoint_url'] = store.endpoint_url
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._cid: Optional[str] = None
        self._armed = False
        self._links = True
        self._is_coordinator = False
        self._committer: Optional[Committer] = None
        self._timing: Optional[SaveTiming] = None
        self._t0 = 0.0
        self._last_bytes = 0
        self._warned_full = False
        self._earlier: dict[str, BaseException] = {}
        self._commit_errors: dict[str, BaseException] = {}
        self._pending_metrics: collections.deque[dict] = collections.deque()
        self._owner_thread = threading.get_ident()
        self._committer_lock = threading.Lock()
        self._handoff: Optional[HandOff] = None
        self._spares: list[tuple[str, int]] = []  # (path, size): shard files kept for the next save to write over
        self._save_bytes = 0  # what this save handed over so far
        self.timings: collections.deque[SaveTiming] = collections.deque(maxlen=_TIMINGS_KEPT)

    # ------------------------------------------------------------------ pickling (process checkpointer)
    def __reduce__(self) -> Any:
        """Pickle for torch's checkpoint process (``dcp.async_save(..., async_checkpointer_type=PROCESS)``).

        torch pickles the storage writer for every such save and runs ``dcp.save`` on the copy in its
        checkpoint process. The copy is a small process-side writer that only writes this rank's shard
        files (and, on the coordinator, the commit record) into a hand-off folder of this writer; this
        writer, in the trainer, hands them to its uploader and commits, as for a thread save. Each pickle
        is one save: this writer waits for it at ``close()``.

        Raises:
            RuntimeError: the writer is closed.
        """
        self._start()
        self._staging_buffers.claim()  # torch's thread that sends the save waits for the process to finish it
        return self._handoff.send().__reduce__()

    def __copy__(self) -> Any:
        raise TypeError('a CheckpointWriter cannot be copied: it owns upload workers and a staging folder')

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError('a CheckpointWriter cannot be copied: it owns upload workers and a staging folder')

    # ------------------------------------------------------------------ setup
    def _start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError('this CheckpointWriter is closed')
            if self._started:
                return
            self.uploader.start(self.run_name)
            rank_dir = self.uploader.staging_dir
            self.staging_root = os.path.dirname(rank_dir)
            self._files_dir = os.path.join(rank_dir, 'files')
            rank_writes = os.path.join(self.staging_root, _WRITES_FOLDER, f'rank{dist.get_global_rank()}')
            self._writes_dir = os.path.join(rank_writes, f'{os.getpid()}-{uuid.uuid4().hex[:8]}')
            self._intents_dir = os.path.join(self.staging_root, INTENTS_FOLDER)
            remove_dead_writes(self.staging_root, dist.get_global_rank())
            for attempt in range(3):
                try:
                    os.makedirs(self._writes_dir, mode=0o700, exist_ok=True)
                    break
                except FileNotFoundError:  # another rank's closing writer removed the empty parent meanwhile
                    if attempt == 2:
                        raise
            self._links = _links_work(self._writes_dir, self._files_dir)
            self._spares_dir = os.path.join(self._writes_dir, 'spares')
            if not self._links:
                log.warning('CheckpointWriter: no hard links from %s to %s: shards are copied into staging (a '
                            'second write of every byte)', self._writes_dir, self._files_dir)
            self._handoff = HandOff(self, os.path.join(self.staging_root, PROCESS_FOLDER,
                                                       f'rank{dist.get_global_rank()}'))
            self._started = True
        try:
            self._handoff.adopt_dead()
        except Exception as exc:  # noqa: BLE001 - what stays is looked at again by the next writer
            log.warning('CheckpointWriter: could not take over the process saves a killed writer left in %s: %s: %s',
                        self._handoff.rank_folder, type(exc).__name__, exc)

    def _start_committer(self) -> Committer:
        with self._committer_lock:  # the hand-off watcher may start it too
            if self._committer is None:
                self._committer = Committer(self.store, scratch_folder(self.staging_root), self.commit_timeout,
                                            self.uploader.failed_uploads, self._on_commit)
                self.uploader.add_landed_listener(self._committer.nudge)
                uri = self._bucket_uri()
                for intent in read_intents(self._intents_dir):
                    if intent.bucket_uri == uri and uri is not None:
                        log.warning('resuming the commit of checkpoint %r left by an earlier process',
                                    intent.checkpoint_id)
                        self._committer.submit(intent, resumed=True)
            return self._committer

    def _bucket_uri(self) -> Optional[str]:
        uri = getattr(self.store, 'bucket_uri', None)
        return persistable_uri(uri) if uri else None

    # ------------------------------------------------------------------ StorageWriter
    def reset(self, checkpoint_id: Union[str, 'os.PathLike[str]', None] = None) -> None:
        """Start a save (all ranks). Raises ValueError without a ``checkpoint_id``, RuntimeError when closed."""
        if checkpoint_id is None:
            raise no_checkpoint_id()
        cid = check_checkpoint_id(checkpoint_id)
        self._start()
        self._staging_buffers.claim()  # a thread save runs on this thread: the staged copy is read until it ends
        self._emit_metrics()
        super().reset(None)
        self._cid = cid
        self._armed = True
        self._t0 = time.monotonic()
        self._timing = SaveTiming(cid, dist.get_global_rank(), time.time())
        local = os.path.join(self._writes_dir, uuid.uuid4().hex[:12])
        os.makedirs(local, mode=0o700)
        self.path = Path(local)

    def stage(self, state_dict: Any) -> Any:
        """``dcp.async_save``'s copy of the state to CPU memory, on the caller's thread.

        With ``cache_staged_state_dict`` (default) into the buffers kept from the previous save when the
        state has the same layout and that save is over; otherwise into fresh memory (as torch stages).
        """
        self._emit_metrics()
        return self._staging_buffers.stage(state_dict)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record the role (all ranks). Raises ValueError for ``use_collectives=False`` (no coordinator to commit)."""
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        armed, self._armed = self._armed, False
        check_role(self, armed)
        self._is_coordinator = bool(is_coordinator)
        if self._is_coordinator:
            self._start_committer()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.fs.mkdir(self.path)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Name each rank's files ``__{rank}_{nonce}_{n}.distcp`` (coordinator; the nonce is fresh per save)."""
        return name_rank_files(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Write this rank's shard files locally, queueing each for upload as soon as it is complete (all ranks).

        The files are written as torch's ``FileSystemWriter.write_data`` writes them (its file writer,
        ``thread_count`` threads), split in ``max(files_per_rank, thread_count)`` files balanced by size
        (``files_per_rank=None``: 1 on the thread that built the writer, elsewhere one per ``ASYNC_FILE_BYTES`` of
        the rank's bytes, from ``ASYNC_FILES_PER_RANK`` to ``ASYNC_MAX_FILES_PER_RANK``).
        """
        self._wait_for_room()
        handed = _HandOver(self)
        files = self.files_per_rank
        if files is None:
            files = 1 if threading.get_ident() == self._owner_thread else _async_files(plan)
        self._save_bytes = 0
        write_rank_files(self, plan, planner, handed, files, create_stream=self._create_shard_stream)
        results = handed.results()
        self._finish_hand_over(handed.total)
        future: Future = Future()
        future.set_result(results)
        return future

    def _hand_over_file(self, results: list[WriteResult]) -> int:
        """Queue one complete, closed shard file for upload (a link and a journal line); its size."""
        return self._queue_for_upload(str(self.path), self._cid, file_sizes(results), recyclable=True)

    def _queue_for_upload(self, local: str, cid: str, files: dict[str, int], skip_missing: bool = False,
                          recyclable: bool = False) -> int:
        """Queue complete, closed shard files of ``local`` (relative name -> size) as ``{cid}/{name}``; their bytes.

        ``skip_missing``: a file no longer there was queued already (by a writer killed before the end).
        ``recyclable``: this writer wrote them (not torch's checkpoint process): they may stay as spares.
        """
        total = 0
        for relative, size in files.items():
            path = os.path.join(local, relative)
            if skip_missing and not os.path.exists(path):
                continue
            check_file_size(path, size)
            name = f'{cid}/{relative}'
            try:
                # A hard link into staging (copy=False), or, where links do not work, a kernel copy:
                # either way the staging name holds the bytes and ours can go at once.
                self.uploader.upload_file(None, name, path, overwrite=True, copy=not self._links)
            except UploadError as exc:  # earlier uploads failed; this file was queued all the same
                with self._lock:
                    self._earlier.update(exc.failures)
                warnings.warn(f'CheckpointWriter: earlier uploads failed (raised at close): {exc}', RuntimeWarning,
                              stacklevel=3)
            finally:
                # The uploader remembers every name it queued (to refuse a second overwrite=False call of
                # it); shard names carry a per-save nonce and never come again: forgetting them keeps
                # memory flat over any number of saves.
                self.uploader._queued_names.discard(name)
            if recyclable:
                self._keep_or_remove(path, size)
            else:
                os.unlink(path)
            total += size
        return total

    # ------------------------------------------------------------------ recycled shard files
    @contextlib.contextmanager
    def _create_shard_stream(self, path: Union[str, 'os.PathLike[str]'], mode: str) -> Iterator[io.BufferedIOBase]:
        """torch's file writer opens each shard file here: over a spare when one is free, else a new file."""
        spare = self._take_spare()
        if spare is None:
            stream: io.BufferedIOBase = open(path, mode)
        else:
            os.rename(spare, path)
            stream = _WrittenOver(path, self.sync_files)
        with stream:
            yield stream

    def _take_spare(self) -> Optional[str]:
        """The largest spare no other link points to any more (its upload landed), taken out of the pool."""
        with self._lock:
            best: Optional[tuple[str, int]] = None
            for spare in list(self._spares):
                try:
                    links = os.stat(spare[0]).st_nlink
                except FileNotFoundError:
                    self._spares.remove(spare)  # removed by someone else: forget it
                    continue
                if links == 1 and (best is None or spare[1] > best[1]):
                    best = spare
            if best is None:
                return None
            self._spares.remove(best)
            return best[0]

    def _keep_or_remove(self, path: str, size: int) -> None:
        """After a shard file's hand-over: keep it as a spare while the pool holds less than two saves, else delete it.

        Two: when uploads run a save behind (saves as frequent as the uploads allow), the spares of the save
        before the previous one are the ones free for the next.
        """
        with self._lock:
            self._save_bytes += size
            budget = _SPARE_SAVES * max(self._last_bytes, self._save_bytes)
            if self.max_staged_bytes is not None:
                budget = min(budget, self.max_staged_bytes)
            if (self.recycle_files and self._links and sum(s for _, s in self._spares) + size <= budget):
                os.makedirs(self._spares_dir, mode=0o700, exist_ok=True)
                spare = os.path.join(self._spares_dir, uuid.uuid4().hex[:12])
                os.rename(path, spare)
                self._spares.append((spare, size))
                return
        os.unlink(path)

    def _finish_hand_over(self, total: int) -> None:
        shutil.rmtree(str(self.path), ignore_errors=True)
        self._last_bytes = total
        timing = self._timing
        if timing is not None:
            timing.local_s = time.monotonic() - self._t0
            timing.bytes_written = total
            with self._lock:
                self.timings.append(timing)
            if self.logger is not None:
                self._pending_metrics.append({'checkpoint/local_s': timing.local_s})
                self._emit_metrics()

    def _record_process_save(self, cid: str, started_at: float, t0: float, total: int) -> SaveTiming:
        """A process save's files are queued (hand-off watcher): its timing, measured from the pickle."""
        self._last_bytes = total
        timing = SaveTiming(cid, dist.get_global_rank(), started_at, local_s=time.monotonic() - t0,
                            bytes_written=total)
        with self._lock:
            self.timings.append(timing)
        if self.logger is not None:
            self._pending_metrics.append({'checkpoint/local_s': timing.local_s})
            self._emit_metrics()
        return timing

    def _submit_process_commit(self, cid: str, files: dict[str, int], time_ns: int, metadata: bytes,
                               timing: Optional[SaveTiming], t0: float) -> None:
        """A process save's commit record (coordinator, hand-off watcher): as ``finish`` does in a thread save."""
        committer = self._start_committer()
        intent = write_intent(self._intents_dir, cid, files, time_ns, metadata=metadata,
                              bucket_uri=self._bucket_uri(), backend_kwargs=self._backend_kwargs,
                              keep_last=self.keep_last, fsync=self.sync_files)
        committer.submit(intent, timing=timing, t0=t0)

    def _staged_bytes(self) -> int:
        total = 0
        try:
            with os.scandir(self._files_dir) as entries:
                for entry in entries:
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            pass
        return total

    def _wait_for_room(self) -> None:
        limit = self.max_staged_bytes
        if limit is None:
            return
        need = self._last_bytes
        staged = self._staged_bytes()
        while staged and staged + need > limit:
            if not self._warned_full:
                self._warned_full = True
                warnings.warn(f'CheckpointWriter: staging holds {staged} bytes not yet uploaded, the previous save '
                              f'wrote {need}, max_staged_bytes={limit}: the save waits for uploads (warned once)',
                              RuntimeWarning, stacklevel=4)
            if self.uploader.wait_for_uploads(0.05):
                return  # nothing in flight: what stays staged (failed uploads) will not free up by waiting
            staged = self._staged_bytes()

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Record the commit intent and hand it to the background committer (coordinator only; no I/O to the bucket)."""
        files = seal_metadata(metadata, results, self.storage_meta())
        committer = self._start_committer()
        intent = write_intent(self._intents_dir, self._cid, files, time.time_ns(), metadata=pickle.dumps(metadata),
                              bucket_uri=self._bucket_uri(), backend_kwargs=self._backend_kwargs,
                              keep_last=self.keep_last, fsync=self.sync_files)
        committer.submit(intent, timing=self._timing, t0=self._t0)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self._cid, save_id=self.save_id)


    # ------------------------------------------------------------------ commits
    def _on_commit(self, intent: CommitIntent, error: Optional[BaseException], committed_at: float,
                   timing: Optional[SaveTiming], t0: Optional[float], resumed: bool) -> None:
        if timing is not None and t0 is not None:
            timing.error = error
            if error is None:
                timing.commit_s = time.monotonic() - t0
                self._pending_metrics.append({'checkpoint/commit_s': timing.commit_s})
        if error is None:
            log.info('checkpoint %r committed', intent.checkpoint_id)
            return
        if resumed:
            log.warning('checkpoint %r left by an earlier process is still not committable: %s (its intent stays '
                        'for `dist-logging drain`)', intent.checkpoint_id, error)
            return
        log.error('checkpoint %r was not committed: %s', intent.checkpoint_id, error)
        with self._lock:
            failures = getattr(error, 'failures', None) or {intent.checkpoint_id: error}
            self._commit_errors.update(failures)

    def _emit_metrics(self) -> None:
        # The Logger is called only from the thread that built the writer (the training loop): not from the
        # committer thread, nor from torch's async_save thread. Their metrics wait for the next save's
        # reset (dcp.save) or stage (dcp.async_save), or for close().
        if self.logger is None:
            self._pending_metrics.clear()
            return
        if threading.get_ident() != self._owner_thread:
            return
        while self._pending_metrics:
            self.logger.log_metrics(self._pending_metrics.popleft())

    def wait_for_commits(self, timeout: Optional[float] = None) -> bool:
        """Block until every checkpoint this coordinator handed over committed or failed; False on timeout.

        A save in torch's checkpoint process whose ``async_save`` future is done is handed over first.

        On other ranks it returns True at once (they commit nothing). Never raises for failures.
        """
        if self._handoff is not None:
            self._handoff.poll()  # a process save whose future is done: its commit record is there
        committer = self._committer
        return True if committer is None else committer.wait(timeout)

    def close(self) -> None:
        """Wait for every upload of this rank and (coordinator) every commit; stop what the writer owns.

        Idempotent. Call it on every rank after the last save (and after its ``async_save`` future).
        Saves sent to torch's checkpoint process are handed over first (a save still running there is
        waited for, up to ``commit_timeout``).

        Raises:
            UploadError: uploads that failed, and (coordinator) checkpoints that did not commit,
                naming each object that is missing or failed; and each save sent to torch's
                checkpoint process that did not reach the hand-over (its write failed, the process
                ended it, or on the coordinator DCP's ``finish`` never ran), named by its checkpoint id.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        self._staging_buffers.release()  # a save still running keeps what it reads alive itself
        failures: dict[str, BaseException] = {}
        try:
            if started:
                self._handoff.close(self.commit_timeout)
                self.uploader.wait_for_uploads()
                with self._lock:
                    self._spares.clear()
                shutil.rmtree(self._spares_dir, ignore_errors=True)  # a spare still staged keeps its staging link
            if started and self._committer is None and dist.get_global_rank() == 0 and read_intents(self._intents_dir):
                self._start_committer()  # a restarted job that did not save again: finish what it left
            if self._committer is not None:
                self._committer.retry_resumed()
                self._committer.wait()
                self._committer.close()
        finally:
            if self._committer is not None:
                self.uploader.remove_landed_listener(self._committer.nudge)
            if self._owns_uploader:
                try:
                    self.uploader.shutdown()
                except UploadError as exc:
                    failures.update(exc.failures)
            else:
                failures.update({name: exc for name, exc in self.uploader.failed_uploads().items()
                                 if SHARD_NAME.search(name)})  # a shared uploader's other failures are its own
        if started:
            writes = self._writes_dir
            for folder in (writes, os.path.dirname(writes), os.path.dirname(os.path.dirname(writes)),
                           self._intents_dir):
                try:
                    os.rmdir(folder)  # only when empty: a killed save's files or a pending intent stay
                except OSError:
                    pass
        self._emit_metrics()
        failures.update(self._earlier)
        failures.update(self._commit_errors)
        process_errors = self._handoff.errors if self._handoff is not None else {}
        failures.update(process_errors)
        if failures:
            error = UploadError(failures)
            if self._commit_errors:
                error.add_note(f'{len(self._commit_errors)} checkpoint file(s) never landed: their checkpoints stay '
                               'uncommitted (invisible to latest_checkpoint)')
            if process_errors:
                error.add_note(f'{len(process_errors)} async_save(s) to the checkpoint process did not reach the '
                               'hand-over: they stay uncommitted (invisible to latest_checkpoint)')
            raise error

    def __enter__(self) -> 'CheckpointWriter':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f'CheckpointWriter({self.uploader.bucket_uri or self.store!r}, keep_last={self.keep_last})'


class _HandOver(queue.Queue):
    """The result queue torch's file writer puts each file's write results in, once the file is closed:
    the put hands that file to the uploader first, so its upload starts while the next files are written."""

    def __init__(self, writer: CheckpointWriter):
        super().__init__()
        self.writer = writer
        self.total = 0
        self._collected: list[WriteResult] = []

    def put(self, item: list[WriteResult], block: bool = True, timeout: Optional[float] = None) -> None:
        size = self.writer._hand_over_file(item)
        with self.mutex:
            self.total += size
            self._collected.extend(item)

    def results(self) -> list[WriteResult]:
        with self.mutex:
            return list(self._collected)


class _WrittenOver(io.BufferedWriter):
    """A spare shard file written over from its start: closing it cuts it where the writing ended
    (fsynced again when ``sync``), so it ends up exactly as a new file with the same bytes would."""

    def __init__(self, path: Union[str, 'os.PathLike[str]'], sync: bool):
        super().__init__(io.FileIO(path, 'r+'))
        self._sync = sync

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.truncate()  # flushes, then cuts at the current position
            if self._sync:
                os.fsync(self.fileno())
        finally:
            super().close()


def _async_files(plan: SavePlan) -> int:
    """Shard files for a save off the training thread: one per ``ASYNC_FILE_BYTES`` of the plan, within bounds."""
    planned = sum(math.prod(item.tensor_data.size) * item.tensor_data.properties.dtype.itemsize
                  for item in plan.items if item.tensor_data is not None)  # tensors; byte items are small
    return min(ASYNC_MAX_FILES_PER_RANK, max(ASYNC_FILES_PER_RANK, -(-planned // ASYNC_FILE_BYTES)))


def _links_work(src_dir: str, dst_dir: str) -> bool:
    """Whether a file in ``src_dir`` can be hard-linked into ``dst_dir`` (same filesystem, links allowed)."""
    probe = os.path.join(src_dir, f'.link-probe-{uuid.uuid4().hex[:8]}')
    target = os.path.join(dst_dir, os.path.basename(probe))
    with open(probe, 'wb'):
        pass
    try:
        os.link(probe, target)
    except OSError:
        return False
    else:
        os.unlink(target)
        return True
    finally:
        os.unlink(probe)


def remove_dead_writes(staging_root: str, rank: Optional[int] = None) -> None:
    """Delete the local-write folders (``checkpoint-writes/rank{r}/<pid>-<token>``) of writers whose process
    is gone, for ``rank`` or every rank: files of a save killed before their hand-over and spare files
    (nothing queued refers to them: staging holds its own link or copy of every handed-over file)."""
    writes = os.path.join(staging_root, _WRITES_FOLDER)
    ranks = [f'rank{rank}'] if rank is not None else (os.listdir(writes) if os.path.isdir(writes) else [])
    for rank_folder in ranks:
        folder = os.path.join(writes, rank_folder)
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            continue
        for entry in entries:
            pid = entry.split('-', 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or dist._process_alive(int(pid)):
                continue
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)


def _protocol_base() -> type:
    from dist_logging.object_store import ObjectStore

    return ObjectStore
