"""CheckpointWriter: a ``torch.distributed.checkpoint`` StorageWriter over the upload port (``upload.Uploader``).

The data path, top to bottom: ``reset`` opens a local folder next to the uploader's staging folder;
``write_data`` writes the shard files there with torch's file writer (over recycled spares, ``_spares``),
handing each complete file to the uploader (``Uploader.enqueue``, a hard link and a journal line) as
soon as it is closed; ``finish`` (coordinator) records the commit intent and hands it to the background
committer (``_committer``), which commits once every shard landed. Saves in torch's checkpoint process go
through the hand-off (``_handoff``); what dead writers left is cleaned up by ``_dead_writers``.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import shutil
import threading
import time
import uuid
import warnings
from torch.futures import Future
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from dist_logging import dist
from dist_logging.checkpoint._committer import Committer
from dist_logging.checkpoint._dead_writers import remove_dead_writes
from dist_logging.checkpoint._handoff import HandOff, TargetInfo
from dist_logging.checkpoint._intents import CommitIntent, read_intents, remove_intent, write_intent
from dist_logging.checkpoint._layout import CheckpointIdMixin, check_checkpoint_id
from dist_logging.checkpoint._options import check_torch_options, probe_bucket, refuse_existing
from dist_logging.checkpoint._paths import INTENTS_FOLDER, PROCESS_FOLDER, WRITES_FOLDER, scratch_folder
from dist_logging.checkpoint._shards import (  # noqa: F401 - the ASYNC_ constants: re-exported for docs and tests
    ASYNC_FILE_BYTES,
    ASYNC_FILES_PER_RANK,
    ASYNC_MAX_FILES_PER_RANK,
    SHARD_NAME,
    HandOverQueue,
    check_file_size,
    check_role,
    file_sizes,
    name_rank_files,
    no_checkpoint_id,
    seal_metadata,
    write_rank_files,
)
from dist_logging.checkpoint._shards import async_files as _async_files
from dist_logging.checkpoint._spares import SparePool
from dist_logging.checkpoint._state_copy import StagingBuffers
from dist_logging.checkpoint._timing import SaveTiming
from dist_logging.checkpoint._writer_uploader import UPLOADER_OPTIONS, uploader_for  # noqa: F401 - OPTIONS: docs
from dist_logging.errors import UploadError
from dist_logging.upload.staging import rank_folder_name
from dist_logging.upload.uploader import Uploader

__all__ = ['CheckpointWriter', 'SaveTiming', 'remove_dead_writes']

log = logging.getLogger(__name__)
_TIMINGS_KEPT = 100  # SaveTiming records kept (about 250 bytes each)


# torch's checkpoint_id property is never None; ours is None before the first save (what torch's would be is a path).
class CheckpointWriter(CheckpointIdMixin, FileSystemWriter):  # type: ignore[misc]
    """Writes a DCP checkpoint to local staging, uploads it in the background, commits it when complete.

    Use it as ``dcp.save(state_dict, checkpoint_id='run/checkpoints/step100', storage_writer=writer)``
    or with ``dcp.async_save`` (thread or process checkpointer); the ``checkpoint_id`` is the checkpoint's
    folder in the bucket. On every rank the shards are written (by torch's own file writer)
    into a folder next to the rank's upload staging folder, then handed to the
    :class:`~dist_logging.upload.Uploader` by hard link (no second copy) and recorded in its durable journal:
    ``dcp.save`` returns then. The coordinator's ``finish`` records a commit intent (with the ``.metadata``) on
    local disk and hands it to a background committer, which commits the checkpoint once every shard is in the
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
        bucket: a bucket URI (``'s3://bucket/prefix'``, ``'file:///abs'``, a local path): the writer
            builds and owns an :class:`~dist_logging.upload.Uploader` for it, from ``uploader_options``;
            or an :class:`~dist_logging.upload.Uploader` whose staging folder and workers the writer
            shares (its owner shuts it down; its store must have ``list`` and ``delete``); or a
            :class:`~dist_logging.destinations.RemoteUploaderDownloader`, whose :attr:`uploader` is
            shared (its ``file_path_format_string`` must be ``'{remote_file_name}'``).
        keep_last: after each commit, delete older committed checkpoints in the same parent
            folder so that ``keep_last`` remain (uncommitted folders are never counted or touched).
        max_staged_bytes: a save waits (warned once) only while the uploader holds bytes not yet
            uploaded and those plus this rank's previous save would exceed this; None: never waits
            (the disk is the limit). The uploader's one staging bound (``Uploader.wait_for_room``).
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
            None (default): one file for a save that runs on the training thread (``dcp.save``) and,
            for one that runs on another thread (``dcp.async_save``), one file per 64 MiB of the
            rank's shard bytes, at least 4 and at most 16. The process checkpointer hands a save's
            files over together, so there it is one file unless set. Why: ``docs/checkpoints.md``,
            "Why the writer's defaults".
        recycle_files: keep each shard file whose upload landed as a spare (up to two saves' bytes
            per rank, next to staging) and write the next save's shards over the spares instead of
            into new files, as databases recycle their log segments (writing over pages the page
            cache already holds skips the allocation of a new file; figures in ``docs/checkpoints.md``).
            A spare is reused only once no other link to it is left (its upload landed and the uploader
            let go of it). The spares are deleted at ``close``; with ``max_staged_bytes`` they hold at
            most that many bytes. Off (or without hard links into staging): every shard is a new file.
        cache_staged_state_dict: keep the CPU copy that ``dcp.async_save`` stages the state into
            (before it returns) for the next save, pinned where an accelerator is available, instead
            of allocating a new copy every save: the next ``async_save`` copies into memory already
            allocated and touched (figures in ``docs/checkpoints.md``). The copy stays allocated
            between saves (the memory each save takes anyway, kept instead of freed and taken again)
            until ``close``. It is reused only while the state keeps its structure,
            shapes and dtypes (otherwise replaced), and only once the previous save is over (if it
            is not, this save is staged into fresh memory, warned once). Off: torch's staging, a
            new copy per save.
        overwrite, single_file_per_rank, per_thread_copy_ahead, _extensions, serialization_format: torch's
            ``FileSystemWriter`` arguments with torch's meaning (table in ``docs/checkpoints.md``).
            ``overwrite=False`` refuses an id committed in the bucket or waiting for its commit here
            (``Checkpoint already exists``, one listing by the coordinator) before any shard is written.
            ``_extensions`` (e.g. ``[ZStandard()]``) transform each item's bytes as in torch's writer.
            ``serialization_format`` must be ``TORCH_SAVE`` (torch's readers cannot read safetensors shards).
        validate_bucket: at construction, write one empty object (``.dist_logging-write-probe`` at the
            bucket URI's root, rewritten by each writer; local rank 0 of each node only), so a missing bucket,
            a wrong URI or wrong credentials fail here, naming the bucket, not at the first commit. False
            skips it (e.g. a job that starts offline).
        **uploader_options: with a URI only: keyword arguments of the :class:`~dist_logging.upload.Uploader`
            the writer builds (``UPLOADER_OPTIONS``): ``backend_kwargs`` (the store's, e.g.
            ``{'endpoint_url': ...}``), ``upload_staging_folder`` (default: per run, in the system temp
            dir; shards are written next to it, so it must have room for them), ``run_name`` (names the
            default staging folder: use the same on every rank of a node), ``num_concurrent_uploads``,
            ``num_attempts``, ``use_procs``, ``upload_priority`` (``'idle'``, ``'low'`` or ``'normal'``).

    Attributes:
        uploader: the :class:`~dist_logging.upload.Uploader` the shards go through.
        timings: the last 100 :class:`SaveTiming` records of this rank.

    Raises:
        ValueError: a bad URI, ``keep_last``/``max_staged_bytes``/``commit_timeout`` out of
            range, ``files_per_rank`` not a positive int, uploader options given with an uploader,
            a destination with a name template, a bad uploader option (as ``Uploader`` raises), or one
            of torch's arguments it cannot honour (``serialization_format=SAFETENSORS``), saying why.
        RuntimeError: ``validate_bucket`` and the bucket cannot be written (naming it and the store's error).
        TypeError: a store without ``list``/``delete``, a ``bucket`` of another type, or an unknown
            keyword argument.
    """

    def __init__(
        self,
        bucket: Union[str, 'os.PathLike[str]', Uploader, Any],
        *,
        keep_last: Optional[int] = None,
        max_staged_bytes: Optional[int] = None,
        commit_timeout: float = 600.0,
        logger: Any = None,
        sync_files: bool = False,
        thread_count: int = 1,
        files_per_rank: Optional[int] = None,
        recycle_files: bool = True,
        cache_staged_state_dict: bool = True,
        overwrite: bool = True,
        single_file_per_rank: bool = True,
        per_thread_copy_ahead: int = 10_000_000,
        _extensions: Optional[Sequence[Any]] = None,
        serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE,
        validate_bucket: bool = True,
        **uploader_options: Any,
    ):
        for label, value in (
            ('keep_last', keep_last),
            ('max_staged_bytes', max_staged_bytes),
            ('files_per_rank', files_per_rank),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f'CheckpointWriter: {label} must be a positive int or None, got {value!r}')
        if isinstance(commit_timeout, bool) or not isinstance(commit_timeout, (int, float)) or not commit_timeout > 0:
            raise ValueError(f'CheckpointWriter: commit_timeout must be a positive number, got {commit_timeout!r}')
        check_torch_options(
            single_file_per_rank=single_file_per_rank,
            per_thread_copy_ahead=per_thread_copy_ahead,
            overwrite=overwrite,
            extensions=_extensions,
            serialization_format=serialization_format,
            thread_count=thread_count,
        )
        self.uploader, self._owns_uploader = uploader_for(bucket, uploader_options, sync_files=bool(sync_files))
        store = self.uploader.object_store
        if validate_bucket and dist.get_local_rank() == 0:
            try:
                probe_bucket(store, self.uploader.bucket_uri or repr(store))
            except RuntimeError:
                if self._owns_uploader:
                    self.uploader.shutdown()
                raise
        # The uploader's fsync flag already holds DIST_LOGGING_UPLOAD_FSYNC.
        sync_files = bool(sync_files) or self.uploader.fsync
        super().__init__(
            '.',
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            overwrite=overwrite,
            _extensions=_extensions,
            serialization_format=serialization_format,
        )
        self._extensions = list(_extensions or ())
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
        self._spare_pool: Optional[SparePool] = None
        self._staged_async = False  # stage() ran: the next save runs on async_save's thread
        self._async = False  # this save runs on async_save's thread
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
        self._staged_async = False  # this staged save runs in the checkpoint process, not in our reset()
        assert self._handoff is not None  # made by _start(), never unset
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
            self.uploader.start()
            self.staging_root = root = self.uploader.staging_folder
            assert root is not None  # the uploader made its staging folder when it started
            rank = dist.get_global_rank()
            self._writes_dir = os.path.join(
                root, WRITES_FOLDER, rank_folder_name(rank), f'{os.getpid()}-{uuid.uuid4().hex[:8]}'
            )
            self._intents_dir = os.path.join(root, INTENTS_FOLDER)
            remove_dead_writes(root, rank)
            for attempt in range(3):
                try:
                    os.makedirs(self._writes_dir, mode=0o700, exist_ok=True)
                    break
                except FileNotFoundError:  # another rank's closing writer removed the empty parent meanwhile
                    if attempt == 2:
                        raise
            self._links = self.uploader.can_link(self._writes_dir)
            if not self._links:
                log.warning(
                    'CheckpointWriter: no hard links from %s into the staging folder %s: shards are copied '
                    'into staging (a second write of every byte)',
                    self._writes_dir,
                    root,
                )
            self._spare_pool = SparePool(
                os.path.join(self._writes_dir, 'spares'),
                sync=self.sync_files,
                enabled=self.recycle_files and self._links,
            )
            self._handoff = HandOff(WriterTarget(self), os.path.join(root, PROCESS_FOLDER, rank_folder_name(rank)))
            self._started = True
        try:
            self._handoff.adopt_dead()
        except Exception as exc:  # noqa: BLE001 - what stays is looked at again by the next writer
            log.warning(
                'CheckpointWriter: could not take over the process saves a killed writer left in %s: %s: %s',
                self._handoff.rank_folder,
                type(exc).__name__,
                exc,
            )

    def _start_committer(self) -> Committer:
        with self._committer_lock:  # the hand-off watcher may start it too
            if self._committer is None:
                self._committer = Committer(
                    self.store,
                    scratch_folder(self.staging_root),
                    self.commit_timeout,
                    self.uploader.failed_uploads,
                    self._on_commit,
                )
                self.uploader.add_landed_listener(self._committer.nudge)
                uri = self.uploader.store_record.uri
                for intent in read_intents(self._intents_dir):
                    if intent.bucket_uri == uri and uri is not None:
                        log.warning(
                            'resuming the commit of checkpoint %r left by an earlier process', intent.checkpoint_id
                        )
                        self._committer.submit(intent, resumed=True)
            return self._committer

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
        self._async, self._staged_async = self._staged_async, False
        local = os.path.join(self._writes_dir, uuid.uuid4().hex[:12])
        os.makedirs(local, mode=0o700)
        self.path = Path(local)

    def stage(self, state_dict: Any) -> Any:
        """``dcp.async_save``'s copy of the state to CPU memory, on the caller's thread.

        With ``cache_staged_state_dict`` (default) into the buffers kept from the previous save when the
        state has the same layout and that save is over; otherwise into fresh memory (as torch stages).
        """
        self._emit_metrics()
        staged = self._staging_buffers.stage(state_dict)
        self._staged_async = True  # async_save stages, then runs the save on its own thread
        return staged

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
        """Name each rank's files ``__{rank}_{nonce}_{n}.distcp`` (coordinator; the nonce is fresh per save).

        With ``overwrite=False``, first refuse an id that is committed or waiting for its commit (one listing).

        Raises:
            RuntimeError: ``overwrite=False`` and the checkpoint exists (DCP raises it on every rank as a
                ``CheckpointException`` before any shard is written).
        """
        if not self.overwrite:
            pending = [intent.checkpoint_id for intent in read_intents(self._intents_dir)]
            where = self.uploader.bucket_uri or repr(self.store)
            refuse_existing(self.store, self._cid, pending, where)  # type: ignore[arg-type]
        return name_rank_files(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Write this rank's shard files locally, queueing each for upload as soon as it is complete (all ranks).

        The files are written as torch's ``FileSystemWriter.write_data`` writes them (its file writer,
        ``thread_count`` threads), split in ``max(files_per_rank, thread_count)`` files balanced by size
        (``files_per_rank=None``: 1 for ``dcp.save``, whatever thread calls it; for a save on ``dcp.async_save``'s
        thread one per ``ASYNC_FILE_BYTES`` of the rank's bytes, from ``ASYNC_FILES_PER_RANK`` to
        ``ASYNC_MAX_FILES_PER_RANK``). A save whose write fails leaves no local file (its folder is removed).
        """
        self._wait_for_room()
        handed = HandOverQueue(self._hand_over_file)
        files = self.files_per_rank
        if files is None:
            files = _async_files(plan) if self._async else 1
        self._spare_pool.start_save()  # type: ignore[union-attr]
        try:
            spares = self._spare_pool
            write_rank_files(self, plan, planner, handed, files, create_stream=spares.open)  # type: ignore[union-attr]
        except BaseException:
            shutil.rmtree(str(self.path), ignore_errors=True)  # a half-written file of a failed save: nothing stays
            raise
        results = handed.results()
        self._finish_hand_over(handed.total)
        future: Future = Future()
        future.set_result(results)
        return future

    def _save_cid(self) -> str:
        """The id of the save in progress: reset() set it before torch calls the save's other methods."""
        assert self._cid is not None
        return self._cid

    def _hand_over_file(self, results: list[WriteResult]) -> int:
        """Queue one complete, closed shard file for upload (a link and a journal line); its size."""
        return self._queue_for_upload(str(self.path), self._save_cid(), file_sizes(results), recyclable=True)

    def _queue_for_upload(
        self, local: str, cid: str, files: dict[str, int], skip_missing: bool = False, recyclable: bool = False
    ) -> int:
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
            try:
                # A hard link into staging (copy=False), or, where links do not work, a kernel copy:
                # either way the staging name holds the bytes and ours can go at once.
                self.uploader.enqueue(path, f'{cid}/{relative}', copy=not self._links, overwrite=True, size=size)
            except UploadError as exc:  # earlier uploads failed; this file was queued all the same
                with self._lock:
                    self._earlier.update(exc.failures)
                warnings.warn(
                    f'CheckpointWriter: earlier uploads failed (raised at close): {exc}', RuntimeWarning, stacklevel=3
                )
            if recyclable:
                spares = self._spare_pool
                spares.keep_or_remove(path, size, self._last_bytes, self.max_staged_bytes)  # type: ignore[union-attr]
            else:
                os.unlink(path)
            total += size
        return total

    def _finish_hand_over(self, total: int) -> None:
        shutil.rmtree(str(self.path), ignore_errors=True)
        self._last_bytes = total
        timing = self._timing
        if timing is not None:
            timing.local_s = time.monotonic() - self._t0
            timing.bytes_written = total
            self._record_timing(timing)

    def _record_timing(self, timing: SaveTiming) -> None:
        with self._lock:
            self.timings.append(timing)
        if self.logger is not None:
            self._pending_metrics.append({'checkpoint/local_s': timing.local_s})
            self._emit_metrics()

    def _record_process_save(self, cid: str, started_at: float, t0: float, total: int) -> SaveTiming:
        """A process save's files are queued (hand-off watcher): its timing, measured from the pickle."""
        self._last_bytes = total
        timing = SaveTiming(cid, dist.get_global_rank(), started_at, local_s=time.monotonic() - t0, bytes_written=total)
        self._record_timing(timing)
        return timing

    def _submit_commit(
        self,
        cid: str,
        files: dict[str, int],
        time_ns: int,
        metadata: bytes,
        timing: Optional[SaveTiming],
        t0: float,
        checksums: dict[str, str],
    ) -> None:
        """Record the commit intent (coordinator) and hand it to the background committer (no I/O to the bucket).

        ``checksums`` (each file's CRC32C, taken as it was written) go into the intent and the commit marker: the
        committer compares them with what landed, the reader with what it downloads."""
        committer = self._start_committer()
        record = self.uploader.store_record
        intent = write_intent(
            self._intents_dir,
            cid,
            files,
            time_ns,
            metadata=metadata,
            bucket_uri=record.uri,
            backend_kwargs=record.kwargs,
            keep_last=self.keep_last,
            fsync=self.sync_files,
            extra={'checksums': checksums} if checksums else None,
        )
        try:
            committer.submit(intent, timing=timing, t0=t0)
        except BaseException:
            remove_intent(intent)  # a finish that fails leaves no intent a later job would commit
            raise

    def _wait_for_room(self) -> None:
        if self.max_staged_bytes is not None:
            self.uploader.wait_for_room(self._last_bytes, self.max_staged_bytes, on_wait=self._warn_full)

    def _warn_full(self, staged: int, limit: int) -> None:
        if not self._warned_full:
            self._warned_full = True
            warnings.warn(
                f'CheckpointWriter: staging holds {staged} bytes not yet uploaded, the previous save '
                f'wrote {self._last_bytes}, max_staged_bytes={limit}: the save waits for uploads (warned '
                'once)',
                RuntimeWarning,
                stacklevel=5,
            )

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Record the commit intent and hand it to the background committer (coordinator only; no I/O to the bucket)."""
        files, checksums = seal_metadata(metadata, results, self.storage_meta())
        self._submit_commit(
            self._save_cid(),
            files,
            time.time_ns(),
            pickle.dumps(metadata),  # type: ignore[arg-type]
            self._timing,
            self._t0,
            checksums,
        )

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self._cid, save_id=self.save_id)

    # ------------------------------------------------------------------ commits
    def _on_commit(
        self,
        intent: CommitIntent,
        error: Optional[BaseException],
        committed_at: float,
        timing: Optional[SaveTiming],
        t0: Optional[float],
        resumed: bool,
    ) -> None:
        if timing is not None and t0 is not None:
            timing.error = error
            if error is None:
                timing.commit_s = time.monotonic() - t0
                self._pending_metrics.append({'checkpoint/commit_s': timing.commit_s})
        if error is None:
            log.info('checkpoint %r committed', intent.checkpoint_id)
            note = getattr(self.logger, 'note_checkpoint_committed', None)
            if note is not None:  # the Logger's Prometheus endpoint shows the last commit
                note(intent.checkpoint_id)
            return
        if resumed:
            log.warning(
                'checkpoint %r left by an earlier process is still not committable: %s (its intent stays '
                'for `dist-logging drain`)',
                intent.checkpoint_id,
                error,
            )
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
                assert self._handoff is not None  # made by _start() before it set _started
                self._handoff.close(self.commit_timeout)
                self.uploader.wait_for_uploads()
                self._spare_pool.clear()  # type: ignore[union-attr]
                # A save that failed or was abandoned after its reset: its local folder goes too.
                for entry in os.listdir(self._writes_dir):
                    shutil.rmtree(os.path.join(self._writes_dir, entry), ignore_errors=True)
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
                failures.update(
                    {name: exc for name, exc in self.uploader.failed_uploads().items() if SHARD_NAME.search(name)}
                )  # a shared uploader's other failures are its own
        if started:
            writes = self._writes_dir
            for folder in (
                writes,
                os.path.dirname(writes),
                os.path.dirname(os.path.dirname(writes)),
                self._intents_dir,
            ):
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
                error.add_note(
                    f'{len(self._commit_errors)} checkpoint file(s) never landed: their checkpoints stay '
                    'uncommitted (invisible to latest_checkpoint)'
                )
            if process_errors:
                error.add_note(
                    f'{len(process_errors)} async_save(s) to the checkpoint process did not reach the '
                    'hand-over: they stay uncommitted (invisible to latest_checkpoint)'
                )
            raise error

    def __enter__(self) -> 'CheckpointWriter':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f'CheckpointWriter({self.uploader.bucket_uri or self.store!r}, keep_last={self.keep_last})'


class WriterTarget:
    """A ``CheckpointWriter`` as its hand-off sees it (a ``HandOffTarget``): the only writer members the
    hand-off reaches, in one place, beside the writer whose private members it reads."""

    def __init__(self, writer: Any):
        self._writer = writer

    def info(self) -> TargetInfo:
        """What the checkpoint process's copy of the writer needs (store, options, folders)."""
        writer = self._writer
        record = writer.uploader.store_record
        return TargetInfo(
            record.uri,
            dict(record.kwargs),
            writer.keep_last,
            writer.sync_files,
            writer._intents_dir,
            writer.max_staged_bytes,
            dict(
                files_per_rank=writer.files_per_rank,
                thread_count=writer.thread_count,
                sync_files=writer.sync_files,
                per_thread_copy_ahead=writer.per_thread_copy_ahead,
                serialization_format=writer.serialization_format,
                single_file_per_rank=writer.single_file_per_rank,
                extensions=writer._extensions,
                overwrite=writer.overwrite,
                intents_dir=writer._intents_dir,
                bucket_uri=record.uri,
                backend_kwargs=dict(record.kwargs),
            ),
        )

    def wait_for_room(self) -> None:
        """Wait, as a save in the trainer would, until the uploader has room (``max_staged_bytes``)."""
        self._writer._wait_for_room()

    def queue_files(self, folder: str, checkpoint_id: str, files: dict[str, int], *, skip_missing: bool = False) -> int:
        """Hand a save's files in ``folder`` to the uploader; returns their bytes."""
        return self._writer._queue_for_upload(folder, checkpoint_id, files, skip_missing=skip_missing)

    def saved(self, checkpoint_id: str, started_at: float, t0: float, total: int) -> Any:
        """Record a process save's timing and metrics; returns its timing record."""
        return self._writer._record_process_save(checkpoint_id, started_at, t0, total)

    def commit(
        self,
        checkpoint_id: str,
        files: dict[str, int],
        time_ns: int,
        metadata: bytes,
        timing: Any,
        t0: float,
        checksums: dict[str, str],
    ) -> None:
        """Record the commit intent of a process save and hand it to the committer (coordinator)."""
        self._writer._submit_commit(checkpoint_id, files, time_ns, metadata, timing, t0, checksums)
