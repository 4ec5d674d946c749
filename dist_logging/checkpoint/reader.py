"""CheckpointReader: a torch.distributed.checkpoint StorageReader for committed checkpoints in a bucket."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
from torch.futures import Future
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from torch.distributed.checkpoint.filesystem import FileSystemReader, _generate_uuid
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from dist_logging.checkpoint._layout import (METADATA_NAME, CheckpointIdMixin, check_checkpoint_id, decode_record,
                                            missing_files)
from dist_logging.checkpoint._paths import default_cache_folder
from dist_logging.checkpoint.commit import retry
from dist_logging.checkpoint.latest import committed_markers, open_store

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
    ``FileSystemReader`` on the cached files. Cached files stay until :meth:`close`.

    Args:
        bucket: a bucket URI, an object store with ``list``, or a ``RemoteUploaderDownloader``.
        backend_kwargs: with a URI: the store's keyword arguments.
        cache_folder: where downloaded files go; must be the same folder for the ranks of a node
            (default: ``<private base>/<run_name>/checkpoint-cache``, see :mod:`dist_logging._private_dirs`).
        run_name: names the default cache folder (use the same on every rank of a node).

    Raises:
        TypeError, ValueError: a bad bucket (see :func:`latest_checkpoint`).
    """

    def __init__(self, bucket: Any, *, backend_kwargs: Optional[Mapping[str, Any]] = None,
                 cache_folder: Optional[Union[str, 'os.PathLike[str]']] = None, run_name: Optional[str] = None):
        self.store, self._owns_store = open_store(bucket, backend_kwargs)
        super().__init__('.')
        self.cache_root = os.path.abspath(os.fspath(cache_folder)) if cache_folder else default_cache_folder(run_name)
        os.makedirs(self.cache_root, mode=0o700, exist_ok=True)
        self._cid: Optional[str] = None
        self._files: dict[str, int] = {}
        self._dirs: set[str] = set()
        self.downloaded_bytes = 0  # by this rank (the others of its node reused them)

    def reset(self, checkpoint_id: Union[str, 'os.PathLike[str]', None] = None) -> None:
        """Start a load of ``checkpoint_id`` (all ranks). Raises ValueError without one."""
        if checkpoint_id is None:
            raise ValueError('CheckpointReader: pass checkpoint_id= (e.g. latest_checkpoint(...)) to dcp.load')
        self._cid = check_checkpoint_id(checkpoint_id)
        self.storage_data = {}
        self.load_id = _generate_uuid()
        self._files = {}

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
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._dirs.add(folder)
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
        self.path = Path(folder)

    def _fetch(self, name: str, dest: str, size: int) -> str:
        import filelock

        with filelock.FileLock(dest + '.lock', thread_local=False):
            if os.path.isfile(dest) and os.path.getsize(dest) == size:
                return dest  # another rank of this node fetched it
            retry(self.store, lambda: self.store.download_object(name, dest, overwrite=True))
            got = os.path.getsize(dest)
            if got != size:
                os.unlink(dest)
                raise OSError(f'{name}: downloaded {got} bytes, the commit marker says {size}')
            self.downloaded_bytes += got
        return dest

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Fetch and unpickle the checkpoint's ``.metadata`` (all ranks; once per node).

        Raises:
            FileNotFoundError: the checkpoint is not committed, or files it lists are missing.
        """
        self._resolve()
        path = self._fetch(f'{self._cid}/{METADATA_NAME}', os.path.join(str(self.path), METADATA_NAME),
                           self._files[METADATA_NAME])
        with open(path, 'rb') as handle:
            metadata = pickle.load(handle)  # DCP's own format, as FileSystemReader reads it
        if getattr(metadata, 'storage_meta', None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Fetch the files this rank's plan reads (once per node), then read them as ``FileSystemReader`` does."""
        needed = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
        for relative in needed:
            size = self._files.get(relative)
            if size is None:
                raise FileNotFoundError(f'checkpoint {self._cid!r}: {relative} is not in its commit marker')
            self._fetch(f'{self._cid}/{relative}', os.path.join(str(self.path), relative), size)
        return super().read_data(plan, planner)

    def close(self) -> None:
        """Remove the files this reader cached (other ranks holding them open keep reading), close an owned store."""
        for folder in self._dirs:
            shutil.rmtree(folder, ignore_errors=True)
        self._dirs.clear()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> 'CheckpointReader':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
