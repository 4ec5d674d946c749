"""CheckpointReader: a torch.distributed.checkpoint StorageReader for committed checkpoints in a bucket."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
import shutil
import threading
import uuid
import warnings
import weakref
from concurrent.futures import Future as ThreadFuture, ThreadPoolExecutor
from torch.futures import Future
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from torch.distributed.checkpoint._extension import ExtensionRegistry
from torch.distributed.checkpoint.filesystem import FileSystemReader, _generate_uuid
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from dist_logging.checkpoint._chunk_sums import chunk_entries, crc32c, encode, file_crc32c
from dist_logging.checkpoint._layout import (
    METADATA_NAME,
    CheckpointIdMixin,
    check_checkpoint_id,
    decode_record,
    missing_files,
)
from dist_logging.checkpoint._node_share import (
    SHARE_KEY,
    SharedLoad,
    local_annotation,
    share_plans,
    sweep_segments,
    unlink_segments,
)
from dist_logging.checkpoint._paths import default_cache_folder
from dist_logging.checkpoint._ranged import FileSums, RangedLoad, fetch_object
from dist_logging.checkpoint.commit import ChecksumMismatch, retry
from dist_logging.checkpoint.latest import committed_markers, open_store
from dist_logging.object_store import ObjectStore

__all__ = ['CheckpointReader', 'MAX_IN_FLIGHT', 'PART_BYTES', 'sweep_cache', 'sweep_shared_memory']

log = logging.getLogger(__name__)
MiB = 1024 * 1024
# Ranged GETs per rank at a time, and the largest: S3 serves each connection at ~100 MB/s, so 8 per rank (64 on a
# node of 8 ranks) fill a node's NIC, and 16 MiB (the top of S3's 8-16 MB guidance for byte-range fetches) makes
# each request's first-byte latency small beside its transfer. Measured against 16 x 8 MiB (benchmarks/README.md,
# issue 43): half the requests and half the concurrency loaded 256 MiB on 2 ranks in 0.70x the time.
MAX_IN_FLIGHT = 8
PART_BYTES = 16 * MiB


# torch's checkpoint_id property is never None; ours is None before the first load (what torch's would be is a path).
class CheckpointReader(CheckpointIdMixin, FileSystemReader):  # type: ignore[misc]
    """Reads a committed checkpoint from the bucket for ``dcp.load``, straight into memory.

    ``dcp.load(state_dict, checkpoint_id=latest_checkpoint(bucket, 'run/checkpoints'),
    storage_reader=CheckpointReader(bucket))``. Each rank lists the checkpoint's folder once
    (refusing an uncommitted or incomplete checkpoint), reads the commit marker and the ``.metadata``
    into memory, then reads only the byte ranges its load plan needs (``ReadItem`` offsets and lengths,
    widened to the checksum chunks that cover them, merged, cut in parts of at most ``part_bytes``) with
    ``max_in_flight`` ranged reads at a time (S3: ``GetObject`` with ``Range``), each into the memory of
    the item it belongs to, and loads every item as torch's ``FileSystemReader`` does. Nothing is written
    to local disk (unless ``node_cache=True``), so nothing is left behind either, whether or not the
    reader is closed.

    Every byte is verified before it is loaded (``docs/checkpoints.md``, "Integrity"): a shard file
    with chunk checksums in its marker (recorded by the writer, one CRC32C per MiB) chunk by chunk as
    each part arrives; a file of a checkpoint committed before chunk checksums existed is read whole
    and checked against its whole-file CRC32C (combined from the parts') before any of its items is
    loaded; the ``.metadata`` against its CRC32C. A byte that differs fails the load with a
    :class:`~dist_logging.checkpoint.commit.ChecksumMismatch` naming the object, the chunk and the
    checkpoint. Checkpoints committed before checksums were recorded at all are checked by size only.

    Straight into the tensors: a saved tensor loaded whole into a plain contiguous CPU tensor of its dtype and
    size (the common resume: same world, same dtypes) is not deserialized: the parts holding its head (torch.save's
    records, ~700 bytes) are read first and parsed, then the rest of its storage is read into the destination
    tensor's memory and verified there, chunk by chunk (the chunk or two it shares with its neighbours are read
    into a buffer and copied once). Anything else (resharded or partial reads, another dtype, non-contiguous
    tensors, bytes, checkpoints without chunk checksums) is deserialized as torch's ``FileSystemReader`` does.

    Memory: the tensors being loaded, plus at most ``max_in_flight * part_bytes`` bytes of parts in
    flight (128 MiB by default), plus, per saved item deserialized (not read straight in), one more copy of it
    (torch's ``torch.load`` of the item, copied into the destination tensor). Shared memory (below) adds, per
    node, the segments being shared: at most the node's replicated bytes once, read straight into them.

    Sharing a node's reads (``share_node_reads``; on by default for a remote store; ``docs/checkpoints.md``): the
    items two or more ranks of a node read (replicated tensors: under DDP, the whole model) are downloaded once per
    node. The coordinator's :meth:`prepare_global_plan` gives each run of such items (segments of about 64 MiB) an
    owner among its readers; the owner ranged-reads it (verified) into a segment under ``/dev/shm`` named by its
    pid, the others wait for it (polling, bounded by ``timeout`` without progress), verify its chunks again and
    load from it; the last reader unlinks it. An owner that fails, dies or stalls leaves its node-mates to read its
    items from the bucket themselves. What a killed owner left is removed by the next reader built on the node
    (:func:`sweep_shared_memory`); the rest at the owner's next load, ``close()``, collection or exit.

    With ``node_cache=True`` (and for a store without ``read_range``, e.g. one written for Composer) the
    reader works as it did before ranged reads: every shard file its plan reads is downloaded whole into
    a cache folder shared by the ranks of the node (once per node, checked against its CRC32C), then read
    with torch's ``FileSystemReader``. The cache folder is removed when its last reader of the node is
    gone: closed, garbage-collected, at interpreter exit, or killed (the next reader of the node sweeps
    folders no live process holds).

    Args:
        bucket: a bucket URI, an object store with ``list``, or a ``RemoteUploaderDownloader``.
        backend_kwargs: with a URI: the store's keyword arguments.
        max_in_flight: ranged reads at a time per rank (a positive int).
        part_bytes: the largest ranged read, in bytes (at least 1 MiB).
        timeout: seconds a load waits without any range arriving before it fails.
        node_cache: download whole files into a node cache instead of reading ranges into memory.
        cache_folder: with ``node_cache=True`` only (a ValueError without it): where downloaded files go; must be
            the same folder for the ranks of a node (default: ``<private base>/<run_name>/checkpoint-cache``, see
            :mod:`dist_logging._private_dirs`).
        run_name: with ``node_cache``: names the default cache folder (use the same on every rank of a node).
        share_node_reads: ranks of a node that read the same saved item (replicated tensors) share one ranged
            download of it through shared memory (``/dev/shm``; see "Sharing a node's reads" above); False: every
            rank reads its whole plan from the bucket; None (default): share from a remote store (S3...), not from
            a local-filesystem bucket (the ranks' reads of one local file share the node's page cache already,
            so a copy through shared memory only adds work: 2-3x slower where measured). No effect with
            ``node_cache``.
        _extension_registry: as torch's ``FileSystemReader``'s (EXPERIMENTAL there too): the stream
            transforms (e.g. ``ZStandard``) the reader may find named in the ``.metadata``; None: torch's
            default registry.

    Attributes:
        downloaded_bytes: bytes this rank read from the bucket (with ``node_cache``: downloaded; the others of
            its node reused them).
        direct_bytes: bytes of tensors this rank read straight into their destination (not deserialized).
        shared_bytes: bytes of items this rank loaded from a node-mate's download (shared memory), not the bucket.

    Raises:
        TypeError, ValueError: a bad bucket (see :func:`latest_checkpoint`), a bad ``max_in_flight``,
            ``part_bytes``, ``timeout`` or ``share_node_reads`` (named), or a ``cache_folder`` without
            ``node_cache=True``.
    """

    def __init__(
        self,
        bucket: Any,
        *,
        backend_kwargs: Optional[Mapping[str, Any]] = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        part_bytes: int = PART_BYTES,
        timeout: float = 600.0,
        node_cache: bool = False,
        cache_folder: Optional[Union[str, 'os.PathLike[str]']] = None,
        run_name: Optional[str] = None,
        share_node_reads: Optional[bool] = None,
        _extension_registry: Optional[ExtensionRegistry] = None,
    ):
        for label, value, least in (('max_in_flight', max_in_flight, 1), ('part_bytes', part_bytes, MiB)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f'CheckpointReader: {label} must be an int >= {least}, got {value!r}')
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f'CheckpointReader: timeout must be a positive number, got {timeout!r}')
        if share_node_reads is not None and not isinstance(share_node_reads, bool):
            raise ValueError(
                f'CheckpointReader: share_node_reads must be None, True or False, got {share_node_reads!r}'
            )
        if cache_folder is not None and not node_cache:
            raise ValueError(
                f'CheckpointReader: cache_folder={os.fspath(cache_folder)!r} is only used with node_cache=True '
                f'(got node_cache={node_cache!r}): without it nothing is cached (ranged reads straight into '
                'memory); pass node_cache=True to download into that folder, or drop cache_folder'
            )
        self.store, self._owns_store = open_store(bucket, backend_kwargs)
        super().__init__('.', _extension_registry=_extension_registry)
        self.max_in_flight, self.part_bytes, self.timeout = max_in_flight, part_bytes, float(timeout)
        ranged = getattr(type(self.store), 'read_range', None)
        self.node_cache = bool(node_cache) or ranged is None or ranged is ObjectStore.read_range
        if self.node_cache and not node_cache:
            warnings.warn(
                f'CheckpointReader: {self.store!r} has no read_range(): whole files are downloaded into '
                'a node cache on local disk',
                RuntimeWarning,
                stacklevel=2,
            )
        self.cache_root: Optional[str] = None
        if self.node_cache:
            self.cache_root = (
                os.path.abspath(os.fspath(cache_folder)) if cache_folder else default_cache_folder(run_name)
            )
            os.makedirs(self.cache_root, mode=0o700, exist_ok=True)
            sweep_cache(self.cache_root)  # what killed readers of this node left
        # The node cache shares whole files already; ranged loads share the items 2+ ranks of a node read, by
        # default from a remote store only: the ranks of a node reading the same local file share the page cache.
        if share_node_reads is None:
            from dist_logging.object_store import LocalObjectStore

            share_node_reads = not isinstance(self.store, LocalObjectStore)
        self.share_node_reads = share_node_reads and not self.node_cache
        sweep_segments()  # what killed readers of this node left in shared memory (one listdir of /dev/shm)
        self._cid: Optional[str] = None
        self._files: dict[str, int] = {}
        self._checksums: dict[str, str] = {}
        self._chunk_sums: dict[str, str] = {}
        self._dirs: set[str] = set()
        self._holder = f'.held-by-{os.getpid()}-{uuid.uuid4().hex[:8]}'  # this reader's claim on a cache folder
        self._pools: list[ThreadPoolExecutor] = []  # the read pool, created on first use (_pool)
        self._metadata_read: Optional[ThreadFuture] = None  # the .metadata being read beside the marker (_resolve)
        self._lock = threading.Lock()
        self._segments: set[str] = set()  # shared-memory segments this reader created (and may still be there)
        self.downloaded_bytes = 0
        self.direct_bytes = 0
        self.shared_bytes = 0
        # Runs at close(), when the reader is garbage-collected, or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _release, self._dirs, self._holder, self._pools, self._segments)

    def reset(self, checkpoint_id: Union[str, 'os.PathLike[str]', None] = None) -> None:
        """Start a load of ``checkpoint_id`` (all ranks). Raises ValueError without one."""
        if checkpoint_id is None:
            raise ValueError('CheckpointReader: pass checkpoint_id= (e.g. latest_checkpoint(...)) to dcp.load')
        self._cid = check_checkpoint_id(checkpoint_id)
        unlink_segments(self._segments)  # the last load's: every rank finished it (dcp.load ends with a collective)
        self.storage_data = {}
        self.load_id = _generate_uuid()
        self._files = {}
        self._checksums = {}
        self._chunk_sums = {}
        self._metadata_read = None

    def _pool(self) -> ThreadPoolExecutor:
        """The reader's thread pool (``max_in_flight`` threads; made on first use, shut down at close)."""
        with self._lock:
            if not self._pools:
                self._pools.append(ThreadPoolExecutor(self.max_in_flight, thread_name_prefix='dist_logging-ckpt-read'))
            return self._pools[0]

    def _count(self, size: int) -> None:
        with self._lock:
            self.downloaded_bytes += size

    def _resolve(self) -> None:
        cid = self._cid
        if cid is None:
            raise RuntimeError('CheckpointReader: reset(checkpoint_id) was not called')
        listing = retry(self.store, lambda: self.store.list(f'{cid}/'))
        markers = [m for m in committed_markers(listing) if m.checkpoint_id == cid]
        where = getattr(self.store, 'bucket_uri', None) or repr(self.store)
        if not markers:
            raise FileNotFoundError(
                f'checkpoint {cid!r} is not committed in {where} (no commit marker: being '
                'written, failed, or deleted); latest_checkpoint() finds the newest committed one'
            )
        marker = markers[-1]
        if self.node_cache:
            key = hashlib.sha1(f'{where}\0{cid}'.encode()).hexdigest()[:16]
            folder = os.path.join(self.cache_root, f'{key}-{marker.time_ns}')  # type: ignore[arg-type]
            self._hold(folder)
            marker_file = self._fetch(marker.name, os.path.join(folder, '.marker.json'), marker.size)
            with open(marker_file, 'rb') as handle:
                data = handle.read()
            self.path = Path(folder)
        else:
            # The .metadata is read while the marker is (one round trip less); the marker's size and CRC32C of it
            # are checked before it is unpickled (read_metadata).
            listed = {info.name: info.size for info in listing}.get(f'{cid}/{METADATA_NAME}')
            if listed is not None:
                self._metadata_read = self._pool().submit(
                    fetch_object, self.store, f'{cid}/{METADATA_NAME}', listed, None, f'checkpoint {cid!r}'
                )
            data = fetch_object(self.store, marker.name, marker.size, None, f'checkpoint {cid!r}')
            self._count(len(data))
        record = decode_record(data, cid)
        wrong = missing_files(cid, record['files'], listing)
        if wrong:
            raise FileNotFoundError(
                f'checkpoint {cid!r} is committed but files are missing now: {sorted(wrong.items())[:10]}'
            )
        if METADATA_NAME not in record['files']:
            raise ValueError(
                f'checkpoint {cid!r} has no {METADATA_NAME}: it is a committed folder '
                '(Logger.upload_folder), not a DCP checkpoint'
            )
        self._files = dict(record['files'])
        # A marker committed by a version that did not split the chunk sums out keeps them among the checksums.
        whole, chunks = chunk_entries({str(k): str(v) for k, v in (record.get('checksums') or {}).items()})
        self._checksums = whole
        self._chunk_sums = {**chunks, **{str(k): str(v) for k, v in (record.get('chunk_checksums') or {}).items()}}

    def _hold(self, folder: str) -> None:
        """Claim the node's cache folder of a checkpoint: it is removed when its last claim goes (:meth:`close`)."""
        import filelock

        for attempt in range(3):
            with filelock.FileLock(folder + '.lock', thread_local=False):
                try:
                    os.makedirs(folder, mode=0o700, exist_ok=True)
                    with open(os.path.join(folder, self._holder), 'wb'):
                        pass
                    break
                except FileNotFoundError:  # its last holder removed it just now (its lock file was replaced)
                    if attempt == 2:
                        raise
        self._dirs.add(folder)

    def _fetch(self, name: str, dest: str, size: int, checksum: Optional[str] = None) -> str:
        """``dest`` holding the object ``name``: downloaded and checked (size, and ``checksum`` when recorded),
        or reused when another reader of the node fetched and checked it already."""
        import filelock

        with filelock.FileLock(dest + '.lock', thread_local=False):
            if os.path.isfile(dest) and os.path.getsize(dest) == size:
                return dest  # another rank of this node fetched (and checked) it
            retry(self.store, lambda: self.store.download_object(name, dest, overwrite=True))
            got = os.path.getsize(dest)
            if got != size:
                os.unlink(dest)
                raise OSError(f'{name}: downloaded {got} bytes, the commit marker says {size}')
            if checksum is not None:
                actual = file_crc32c(dest)  # read back from the page cache: ~0.07 CPU s per GiB
                if actual != checksum:
                    os.unlink(dest)
                    raise ChecksumMismatch(name, checksum, actual, f'checkpoint {self._cid!r}; not loaded')
            self.downloaded_bytes += got
        return dest

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read and unpickle the checkpoint's ``.metadata`` (all ranks; into memory, or once per node with the cache).

        Raises:
            FileNotFoundError: the checkpoint is not committed, or files it lists are missing.
            ChecksumMismatch: the ``.metadata`` in the bucket is not the one its checkpoint committed.
            TimeoutError: the ``.metadata`` did not arrive in ``timeout`` seconds.
        """
        self._resolve()
        name = f'{self._cid}/{METADATA_NAME}'
        if self.node_cache:
            path = self._fetch(
                name,
                os.path.join(str(self.path), METADATA_NAME),
                self._files[METADATA_NAME],
                self._checksums.get(METADATA_NAME),
            )
            with open(path, 'rb') as handle:
                data = handle.read()
        else:
            pending, self._metadata_read = self._metadata_read, None
            assert pending is not None  # listed with the size the marker records (_resolve checked)
            data = pending.result(timeout=self.timeout)  # the store's own timeouts end it first
            self._count(len(data))
            expected = self._checksums.get(METADATA_NAME)
            actual = encode(crc32c(data))
            if expected is not None and actual != expected:
                raise ChecksumMismatch(name, expected, actual, f'checkpoint {self._cid!r}; not loaded')
        metadata = pickle.loads(data)  # DCP's own format, as FileSystemReader reads it
        if getattr(metadata, 'storage_meta', None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Read the byte ranges this rank's plan needs, verify them, and load them into the planner's tensors.

        Raises:
            FileNotFoundError: a file the plan reads is not in the commit marker (or not in the bucket).
            ChecksumMismatch: a shard's bytes differ from those its writer wrote (named, with the checkpoint).
            TimeoutError: no range arrived for ``timeout`` seconds.
        """
        assert self._cid is not None  # reset() set it (or raised): dcp.load calls it first
        if self.node_cache:
            return self._read_cached(plan, planner)
        sums = self._sums()
        pool = self._pool()
        note = plan.storage_data.get(SHARE_KEY) if isinstance(plan.storage_data, dict) else None
        if not note or 'id' not in note:
            self._ranged(plan, planner, sums, pool)
        else:
            shared = SharedLoad(
                note,
                self._cid,
                self.store,
                sums,
                pool,
                self.max_in_flight,
                self.part_bytes,
                self.timeout,
                self._count,
                self._segments,
            )
            keys = shared.keys()
            groups: dict[tuple[str, int, int], tuple[Any, list[Any]]] = {}
            private = []
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                key = (info.relative_path, info.offset, info.length)
                if key in keys:
                    groups.setdefault(key, (info, []))[1].append(item)
                else:
                    private.append(item)
            try:
                shared.publish()  # first on every rank: a rank waits for node-mates only once they published
                self._ranged(dataclasses.replace(plan, items=private), planner, sums, pool)
                fallback = shared.take(groups, planner, self.transforms)
            except BaseException:
                shared.abandon()  # the others need not wait for this rank to let go of the segments
                raise
            finally:
                self.shared_bytes += shared.shared_bytes
                self.direct_bytes += shared.direct_bytes
            if fallback:
                self._ranged(dataclasses.replace(plan, items=fallback), planner, sums, pool)
        future: Future = Future()
        future.set_result(None)
        return future

    def _sums(self) -> dict[str, FileSums]:
        return {
            relative: FileSums.from_record(
                f'{self._cid}/{relative}', size, self._checksums.get(relative), self._chunk_sums.get(relative)
            )
            for relative, size in self._files.items()
        }

    def _ranged(
        self, plan: LoadPlan, planner: LoadPlanner, sums: dict[str, FileSums], pool: ThreadPoolExecutor
    ) -> None:
        if not plan.items:
            return
        assert self._cid is not None
        load = RangedLoad(
            self.store,
            self._cid,
            sums,
            pool,
            self.max_in_flight,
            self.part_bytes,  # type: ignore[arg-type]
            self.timeout,
            self._count,
        )
        load.run(plan, planner, self.storage_data, self.transforms)
        self.direct_bytes += load.direct_bytes

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Attach this rank's node (host, boot id, shared-memory mount) and pid for :meth:`prepare_global_plan`."""
        if self.share_node_reads and plan.storage_data is None:
            annotation = local_annotation()
            if annotation is not None:
                return dataclasses.replace(plan, storage_data=annotation)
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The coordinator: every saved item 2+ ranks of a node read gets one owner there (spread over the node's
        ranks), who publishes it in shared memory; the others take it from there (see ``share_node_reads``)."""
        if not self.share_node_reads or self.node_cache:
            return [
                dataclasses.replace(plan, storage_data=None)
                if isinstance(plan.storage_data, dict) and SHARE_KEY in plan.storage_data
                else plan
                for plan in plans
            ]
        sums = self._sums()

        def shareable(key: tuple[str, int, int]) -> bool:
            found = sums.get(key[0])
            return found is not None and found.chunks is not None and key[2] > 0

        return share_plans(plans, self.storage_data, shareable)

    def _read_cached(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """The node cache: fetch the files this rank's plan reads (once per node), read them as torch does."""
        needed = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
        for relative in needed:
            size = self._files.get(relative)
            if size is None:
                raise FileNotFoundError(f'checkpoint {self._cid!r}: {relative} is not in its commit marker')
            self._fetch(
                f'{self._cid}/{relative}', os.path.join(str(self.path), relative), size, self._checksums.get(relative)
            )
        return super().read_data(plan, planner)

    def close(self) -> None:
        """Stop the read threads; give up this reader's node-cache folders (each is removed with its files once no
        other reader of the node holds it: a rank that closes first does not pull files from under one still
        loading); close an owned store. Idempotent; the same runs when the reader is garbage-collected or at exit."""
        self._finalizer()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> 'CheckpointReader':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _release(dirs: set[str], holder: str, pools: list[ThreadPoolExecutor], segments: set[str]) -> None:
    """Shut the read pool down, remove the shared-memory ``segments`` this reader created, and give up
    ``holder``'s claim on each cache folder of ``dirs``, removing the folders no live process holds any more (a
    finalizer: references no reader)."""
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    pools.clear()
    unlink_segments(segments)
    for folder in sorted(dirs):
        try:
            os.unlink(os.path.join(folder, holder))
        except FileNotFoundError:
            pass
        _remove_if_unheld(folder)
    dirs.clear()


def _remove_if_unheld(folder: str) -> bool:
    """Remove a cache folder (and its lock file) if no live process holds it; whether it is gone."""
    import filelock

    try:
        with filelock.FileLock(folder + '.lock', thread_local=False, timeout=60):
            if _live_holders(folder):
                return False
            shutil.rmtree(folder, ignore_errors=True)
            try:
                os.unlink(folder + '.lock')  # held: a reader arriving now makes a new one, and the folder
            except FileNotFoundError:
                pass
    except filelock.Timeout:
        log.warning('CheckpointReader: %s stays: its lock was held for 60 s', folder)
        return False
    return True


def sweep_cache(cache_root: Union[str, 'os.PathLike[str]']) -> list[str]:
    """Remove the node-cache folders under ``cache_root`` that no live reader holds (what readers that were
    killed left); the removed folders. Every node-cache reader runs it when it is built."""
    root = os.fspath(cache_root)
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        folder = os.path.join(root, entry)
        if entry.endswith('.lock') or not os.path.isdir(folder):
            continue
        if _remove_if_unheld(folder):
            removed.append(folder)
    for entry in entries:  # lock files whose folder is gone (a killed reader between the two)
        if entry.endswith('.lock') and not os.path.exists(os.path.join(root, entry[: -len('.lock')])):
            try:
                os.unlink(os.path.join(root, entry))
            except FileNotFoundError:
                pass
    return removed


def _live_holders(folder: str) -> list[str]:
    """The claims on a cache folder whose process still runs (a killed reader's claim does not keep it)."""
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return []
    live = []
    for entry in entries:
        if not entry.startswith('.held-by-'):
            continue
        pid = entry[len('.held-by-') :].split('-', 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        except (ValueError, PermissionError):
            pass  # not ours to judge: counts as live
        live.append(entry)
    return live


def sweep_shared_memory() -> list[str]:
    """Remove the shared-memory segments (``/dev/shm/dist_logging-ckpt-*``) whose owner process is gone (a reader
    killed while loading); the removed paths. Every reader runs it when it is built."""
    return sweep_segments()
