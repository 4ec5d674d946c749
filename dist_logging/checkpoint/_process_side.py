"""The writer torch's checkpoint process runs for ``dcp.async_save(async_checkpointer_type=PROCESS)``.

torch keeps one spawned checkpoint process per trainer process and, for every such save, pickles the
storage writer into it and runs ``dcp.save`` there on the copy. A ``CheckpointWriter`` pickles into a
:class:`ProcessSideWriter`: configuration only, no uploader, no thread. It writes this rank's shard
files into a hand-off folder the trainer's writer watches, then publishes (temp file + rename):

- ``started.json`` at ``reset``: the checkpoint id and this process's pid;
- ``manifest.json`` after ``write_data``: the checkpoint id, the role (coordinator or not), every file's
  relative name and size and the total; or, if ``write_data`` failed, ``ok: false`` with the error;
- on the coordinator, ``commit.metadata`` (the pickled ``.metadata``) then ``commit.json`` (every
  rank's files with their sizes, the save's time) in ``finish``.

The trainer's writer hands the files to its uploader, records the commit intent and removes the folder:
the checkpoint process only writes files (see ``docs/checkpoints.md``).
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import time
from pathlib import Path
from typing import Any, Optional, Union

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from dist_logging.checkpoint._dead_writers import COMMIT, COMMIT_METADATA, MANIFEST, STARTED
from dist_logging.checkpoint._layout import CheckpointIdMixin, check_checkpoint_id
from dist_logging.checkpoint._intents import publish
from dist_logging.checkpoint._shards import (
    check_file_size,
    check_role,
    file_sizes,
    name_rank_files,
    no_checkpoint_id,
    seal_metadata,
    write_rank_files,
)

__all__ = ['ProcessSideWriter']


# torch's checkpoint_id property is never None; ours is None before the first save (what torch's would be is a path).
class ProcessSideWriter(CheckpointIdMixin, FileSystemWriter):  # type: ignore[misc]
    """One save of a ``CheckpointWriter`` in torch's checkpoint process: writes files, uploads nothing.

    Built by ``CheckpointWriter.__reduce__``; not meant to be made by hand.

    Args:
        folder: the save's hand-off folder (made by the trainer's writer; private to it).
        files_per_rank, thread_count, sync_files, per_thread_copy_ahead, serialization_format,
            single_file_per_rank, extensions, overwrite: as the trainer's writer has them.
        intents_dir: the trainer's commit intents (``overwrite=False`` refuses an id waiting there).
        bucket_uri, backend_kwargs: the bucket (``overwrite=False`` lists the checkpoint's folder).
    """

    def __init__(
        self,
        folder: str,
        *,
        files_per_rank: int,
        thread_count: int,
        sync_files: bool,
        per_thread_copy_ahead: int,
        serialization_format: Any,
        single_file_per_rank: bool = True,
        extensions: Optional[list] = None,
        overwrite: bool = True,
        intents_dir: Optional[str] = None,
        bucket_uri: Optional[str] = None,
        backend_kwargs: Optional[dict] = None,
    ):
        super().__init__(
            folder,
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            overwrite=overwrite,
            _extensions=extensions,
            serialization_format=serialization_format,
        )
        self.folder = folder
        self.files_per_rank = files_per_rank
        self._config = dict(
            files_per_rank=files_per_rank,
            thread_count=thread_count,
            sync_files=sync_files,
            per_thread_copy_ahead=per_thread_copy_ahead,
            serialization_format=serialization_format,
            single_file_per_rank=single_file_per_rank,
            extensions=extensions,
            overwrite=overwrite,
            intents_dir=intents_dir,
            bucket_uri=bucket_uri,
            backend_kwargs=backend_kwargs,
        )
        self._is_coordinator = False

    def __reduce__(self) -> Any:
        return (_rebuild, (self.folder, self._config))

    def reset(self, checkpoint_id: Union[str, 'os.PathLike[str]', None] = None) -> None:
        """Start the save: record its id and this process in ``started.json``.

        Raises:
            ValueError: no ``checkpoint_id``, or a bad one.
        """
        if checkpoint_id is None:
            raise no_checkpoint_id()
        cid = check_checkpoint_id(checkpoint_id)
        super().reset(None)
        self._cid = cid
        self.path = Path(self.folder)
        publish(
            os.path.join(self.folder, STARTED),
            json.dumps({'checkpoint_id': cid, 'pid': os.getpid()}).encode(),
            self.sync_files,
        )

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record the role. Raises ValueError without a ``checkpoint_id`` or for ``use_collectives=False``."""
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        check_role(self, self._cid is not None)
        self._is_coordinator = bool(is_coordinator)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Name each rank's files ``__{rank}_{nonce}_{n}.distcp``, as the trainer's writer does (and with
        ``overwrite=False`` refuse an existing checkpoint first, as it does; RuntimeError)."""
        config = self._config
        if not self.overwrite and config['bucket_uri'] is not None:
            from dist_logging.checkpoint._intents import read_intents
            from dist_logging.checkpoint._options import refuse_existing
            from dist_logging.object_store import store_from_uri

            store = store_from_uri(config['bucket_uri'], config['backend_kwargs'])
            try:
                pending = [intent.checkpoint_id for intent in read_intents(config['intents_dir'] or '')]
                refuse_existing(store, self._cid, pending, config['bucket_uri'])  # type: ignore[arg-type]
            finally:
                store.close()
        return name_rank_files(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Write this rank's shard files, then ``manifest.json`` (a failure manifest if the write failed)."""
        results: queue.Queue = queue.Queue()
        try:
            write_rank_files(self, plan, planner, results)
            collected: list[WriteResult] = []
            while not results.empty():
                collected.extend(results.get_nowait())
            files = file_sizes(collected)
            for relative, size in files.items():
                check_file_size(os.path.join(self.folder, relative), size)
        except BaseException as exc:
            record: dict[str, Any] = {'checkpoint_id': self._cid, 'ok': False, 'error': f'{type(exc).__name__}: {exc}'}
            try:
                publish(os.path.join(self.folder, MANIFEST), json.dumps(record).encode(), self.sync_files)
            except OSError as also:
                exc.add_note(f'and its failure manifest could not be written: {also}')
            raise
        record = {
            'checkpoint_id': self._cid,
            'ok': True,
            'coordinator': self._is_coordinator,
            'files': files,
            'total_bytes': sum(files.values()),
        }
        publish(os.path.join(self.folder, MANIFEST), json.dumps(record, sort_keys=True).encode(), self.sync_files)
        future: Future = Future()
        future.set_result(collected)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Publish the commit info: the ``.metadata`` then ``commit.json`` (coordinator only; no I/O to the bucket)."""
        files, checksums = seal_metadata(metadata, results, self.storage_meta())
        publish(os.path.join(self.folder, COMMIT_METADATA), pickle.dumps(metadata), self.sync_files)
        record = {'checkpoint_id': self._cid, 'files': files, 'checksums': checksums, 'time_ns': time.time_ns()}
        publish(os.path.join(self.folder, COMMIT), json.dumps(record, sort_keys=True).encode(), self.sync_files)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self._cid, save_id=self.save_id)


def _rebuild(folder: str, config: dict) -> ProcessSideWriter:
    return ProcessSideWriter(folder, **config)
