"""CheckpointReader: a torch.distributed.checkpoint StorageReader for committed checkpoints in a bucket."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
import uuid
from torch.futures import Future
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from torch.distributed.checkpoint._extension import ExtensionRegistry
from torch.distributed.checkpoint.filesystem import FileSystemReader, _generate_uuid
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from dist_logging.checkpoint._layout import (METADATA_NAME, CheckpointIdMixin, check_checkpoint_id, decode_record,
                                            missing_files)
from dist_logging.checkpoint._paths import default_cache_folder
from dist_logging.checkpoint.commit import ChecksumMismatch, retry
from dist_logging.checkpoint.latest import committed_markers, open_store
from dist_logging.object_store.checksums import file_crc32c

__all__ = ['CheckpointReader']

log = logging.getLogger(__name__)


class CheckpointReader(CheckpointIdMixin, FileSystemReader):
    """Reads a committed checkpoint from the bucket for ``dcp.load``.

    ``dcp.load(state_dict, checkpoint_id=latest_checkpoint(bucket, 'run/checkpoints'),
    storage_reader=CheckpointReader(bucket))``. Each rank lists the checkpoint's folder once
    (refusing an uncommitted or incomplete checkpoint), then fetches the commit marker, the
    ``.metadata`` and only the shard files its load plan reads, into a cache folder shared by
    the ranks of the node: a file needed by several ranks of a node is downloaded once (under
    a per-file lock; the others wait and reuse it, checked by the size the marker records;
    names are unique per save, so a cached file is never stale). Reading then works as torch's
    ``FileSystemReader`` on the cached files. Cached files stay until the last reader of the node that uses
    them is closed.

    Every file is checked as it arrives: its size and the CRC32C its writer recorded in the commit marker
    (taken while the shard was written). A file whose bytes differ fails the load with a
    :class:`~dist_logging.checkpoint.commit.ChecksumMismatch` naming the object and the checkpoint (the
    bad copy is removed from the cache); nothing unverified is loaded. Checkpoints committed before
    checksums were recorded are checked by size only.

    Args:
        bucket: a bucket URI, an object store with ``list``, or a ``RemoteUploaderDownloader``.
        backend_kwargs: with a URI: the store's keyword arguments.
        cache_folder: where downloaded files go; must be the same folder for the ranks of a node
            (default: ``<private base>/<run_name>/checkpoint-cache``, see :mod:`dist_logging._private_dirs`).
        run_name: names the default cache folder (use the same on every rank of a node).
        _extension_registry: as torch's ``FileSystemReader``'s (EXPERIMENTAL there too): the stream
            transforms (e.g. ``ZStandard``) the reader may find named in the ``.metadata``; None: torch's
            default registry.

    Raises:
        TypeError, ValueError: a bad bucket (see :func:`latest_checkpoint`).
    """

    def __init__(self, bucket: Any, *, backend_kwargs: Optional[Mapping[str, Any]] = None,
                 cache_folder: Optional[Union[str, 'os.PathLike[str]']] = None, run_name: Optional[str] = None,
                 _extension_registry: Optional[ExtensionRegistry] = None):
        self.store, self._owns_store = open_store(bucket, backend_kwargs)
        super().__init__('.', _extension_registry=_extension_registry)
        self.cache_root = os.path.abspath(os.fspath(cache_folder)) if cache_folder else default_cache_folder(run_name)
        os.makedirs(self.cache_root, mode=0o700, exist_ok=True)
        self._cid: Optional[str] = None
        self._files: dict[str, int] = {}
        self._checksums: dict[str, str] = {}
        self._dirs: set[str] = set()
        self._holder = f'.held-by-{os.getpid()}-{uuid.uuid4().hex[:8]}'  # this reader's claim on a cache folder
        self.downloaded_bytes = 0  # by this rank (the others of its node reused them)

    def reset(self, checkpoint_id: Union[str, 'os.PathLike[str]', None] = None) -> None:
        """Start a load of ``checkpoint_id`` (all ranks). Raises ValueError without one."""
        if checkpoint_id is None:
            raise ValueError('CheckpointReader: pass checkpoint_id= (e.g. latest_checkpoint(...)) to dcp.load')
        self._cid = check_checkpoint_id(checkpoint_id)
        self.storage_data = {}
        self.load_id = _generate_uuid()
        self._files = {}
        self._checksums = {}

    def _resolve(self) -> None:
        cid = self._cid
        if cid is None:
            raise RuntimeError('CheckpointReader: reset(checkpoint_id) was not called')
        listing = retry(self.store, lambda: self.store.list(f'{cid}/'))
        markers = [m for m in committed_markers(listing) if m.checkpoint_id == cid]
        where = getattr(self.store, 'bucket_uri', None) or repr(self.store)
        if not markers:
            raise FileNotFoundError(f'checkpoint {cid!r} is not committed in {where} (no commit marker: being '
                                    'written, failed, or deleted); latest_checkpoint() finds the newest committed one')
        marker = markers[-1]
        key = hashlib.sha1(f'{where}\0{cid}'.encode()).hexdigest()[:16]
        folder = os.path.join(self.cache_root, f'{key}-{marker.time_ns}')
        self._hold(folder)
        marker_file = self._fetch(marker.name, os.path.join(folder, '.marker.json'), marker.size)
        with open(marker_file, 'rb') as handle:
            record = decode_record(handle.read(), cid)
        wrong = missing_files(cid, record['files'], listing)
        if wrong:
            raise FileNotFoundError(f'checkpoint {cid!r} is committed but files are missing now: '
                                    f'{sorted(wrong.items())[:10]}')
        if METADATA_NAME not in record['files']:
            raise ValueError(f'checkpoint {cid!r} has no {METADATA_NAME}: it is a committed folder '
                             '(Logger.upload_folder), not a DCP checkpoint')
        self._files = dict(record['files'])
        self._checksums = {str(k): str(v) for k, v in (record.get('checksums') or {}).items()}
        self.path = Path(folder)

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
        """Fetch and unpickle the checkpoint's ``.metadata`` (all ranks; once per node).

        Raises:
            FileNotFoundError: the checkpoint is not committed, or files it lists are missing.
            ChecksumMismatch: the ``.metadata`` in the bucket is not the one its checkpoint committed.
        """
        self._resolve()
        path = self._fetch(f'{self._cid}/{METADATA_NAME}', os.path.join(str(self.path), METADATA_NAME),
                           self._files[METADATA_NAME], self._checksums.get(METADATA_NAME))
        with open(path, 'rb') as handle:
            metadata = pickle.load(handle)  # DCP's own format, as FileSystemReader reads it
        if getattr(metadata, 'storage_meta', None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Fetch the files this rank's plan reads (once per node), then read them as ``FileSystemReader`` does.

        Raises:
            FileNotFoundError: a file the plan reads is not in the commit marker.
            ChecksumMismatch: a shard's bytes differ from those its writer wrote (named, with the checkpoint).
        """
        needed = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
        for relative in needed:
            size = self._files.get(relative)
            if size is None:
                raise FileNotFoundError(f'checkpoint {self._cid!r}: {relative} is not in its commit marker')
            self._fetch(f'{self._cid}/{relative}', os.path.join(str(self.path), relative), size,
                        self._checksums.get(relative))
        return super().read_data(plan, planner)

    def close(self) -> None:
        """Give up this reader's cache folders (each is removed with its files once no other reader of the node
        holds it: a rank that closes first does not pull files from under one still loading), close an owned
        store."""
        import filelock

        for folder in sorted(self._dirs):
            with filelock.FileLock(folder + '.lock', thread_local=False):
                try:
                    os.unlink(os.path.join(folder, self._holder))
                except FileNotFoundError:
                    pass
                if not _live_holders(folder):
                    shutil.rmtree(folder, ignore_errors=True)
                    try:
                        os.unlink(folder + '.lock')  # held: a reader arriving now makes a new one, and the folder
                    except FileNotFoundError:
                        pass
        self._dirs.clear()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> 'CheckpointReader':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
        pid = entry[len('.held-by-'):].split('-', 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        except (ValueError, PermissionError):
            pass  # not ours to judge: counts as live
        live.append(entry)
    return live
