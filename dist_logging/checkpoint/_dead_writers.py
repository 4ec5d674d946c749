"""What writers whose process is gone left in the staging folder, and the hand-off folder's file names.

Imports nothing of torch's checkpoint package (``dist-logging drain`` imports it through
:mod:`dist_logging.checkpoint.drain`); a writer is dead when :func:`dist_logging._world.watch.process_state`,
the one liveness check, says its process has ended:

* :func:`remove_dead_writes`: the local-write folders (``checkpoint-writes/rank{r}/<pid>-<token>``) of
  dead writers: files of a save killed before their hand-over, and spare files.
* :func:`take_left_saves`: the saves torch's checkpoint process wrote into a dead trainer's hand-off
  folder (``checkpoint-process/rank{r}/<pid>-<token>/<seq>``) that the trainer never handed over.

The hand-off folder of one save holds (published whole: temp file, then rename) :data:`STARTED`,
:data:`MANIFEST` and, on the coordinator, :data:`COMMIT_METADATA` then :data:`COMMIT`; the writer's
folder holds :data:`WRITER_INFO` (see ``_process_side`` and ``_handoff``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Callable, Optional, cast

from dist_logging.checkpoint._intents import write_intent
from dist_logging.checkpoint._paths import WRITES_FOLDER
from dist_logging._world.watch import process_state
from dist_logging.upload.staging import rank_folder_name

__all__ = [
    'STARTED',
    'MANIFEST',
    'COMMIT',
    'COMMIT_METADATA',
    'WRITER_INFO',
    'read_json',
    'remove_dead_writes',
    'LeftSave',
    'take_left_saves',
]

log = logging.getLogger(__name__)
STARTED, MANIFEST, COMMIT, COMMIT_METADATA = 'started.json', 'manifest.json', 'commit.json', 'commit.metadata'
WRITER_INFO = 'writer.json'


def read_json(path: str) -> Optional[dict]:
    """The JSON record at ``path``, or None while it does not exist (records are published whole)."""
    try:
        with open(path, 'rb') as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def _owner_dead(entry: str) -> bool:
    """Whether a ``<pid>-<token>`` folder name names a process that is gone (never this one)."""
    pid = entry.split('-', 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and process_state(int(pid)) is None


def remove_dead_writes(staging_root: str, rank: Optional[int] = None) -> None:
    """Delete the local-write folders (``checkpoint-writes/rank{r}/<pid>-<token>``) of writers whose process
    is gone, for ``rank`` or every rank: files of a save killed before their hand-over and spare files
    (nothing queued refers to them: staging holds its own link or copy of every handed-over file)."""
    writes = os.path.join(staging_root, WRITES_FOLDER)
    ranks = [rank_folder_name(rank)] if rank is not None else (os.listdir(writes) if os.path.isdir(writes) else [])
    for rank_folder in ranks:
        folder = os.path.join(writes, rank_folder)
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            continue
        for entry in entries:
            if _owner_dead(entry):
                shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)


@dataclasses.dataclass
class LeftSave:
    """A complete save (its manifest says ok) that a dead writer left in its hand-off folder.

    Attributes:
        folder: the save's folder.
        bucket_uri, backend_kwargs: the dead writer's bucket (None: a custom store).
        keep_last: the dead writer's retention.
        checkpoint_id: the checkpoint.
        manifest: the rank's manifest (``files``: relative name -> size; ``coordinator``).
        commit: the coordinator's commit record, when DCP's ``finish`` ran; else None.
    """

    folder: str
    bucket_uri: Optional[str]
    backend_kwargs: dict
    keep_last: Optional[int]
    checkpoint_id: str
    manifest: dict
    commit: Optional[dict]

    def write_intent(
        self, intents_dir: str, bucket_uri: Optional[str], backend_kwargs: dict, keep_last: Optional[int], fsync: bool
    ) -> None:
        """Record the commit intent of the save (coordinator, with its commit record).

        With the time the dead writer would have used: an intent it wrote already is rewritten in place,
        not doubled."""
        assert self.commit is not None
        with open(os.path.join(self.folder, COMMIT_METADATA), 'rb') as handle:
            metadata = handle.read()
        checksums = self.commit.get('checksums')
        write_intent(
            intents_dir,
            self.checkpoint_id,
            self.commit['files'],
            int(self.commit['time_ns']),
            metadata=metadata,
            bucket_uri=bucket_uri,
            backend_kwargs=backend_kwargs,
            keep_last=keep_last,
            fsync=fsync,
            extra={'checksums': checksums} if checksums else None,
        )


def take_left_saves(rank_folder: str, adopt: Callable[[LeftSave], Optional[bool]]) -> None:
    """Go through the hand-off folders below ``rank_folder`` whose writer (trainer pid in the folder name) is dead.

    A save whose checkpoint process is still alive (an orphan still writing) is left for a later look. A
    complete save goes to ``adopt``, which hands its files over and returns True, returns False when it
    cannot take it (another bucket: the save is deleted), or None to leave it where it is. Every other save
    (no manifest, a failure manifest) is deleted: it never was, and never will be, committed.
    """
    try:
        entries = sorted(os.listdir(rank_folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if not _owner_dead(entry):
            continue
        folder = os.path.join(rank_folder, entry)
        info = read_json(os.path.join(folder, WRITER_INFO)) or {}
        kept = False
        for seq in sorted(os.listdir(folder)):
            path = os.path.join(folder, seq)
            if not os.path.isdir(path):
                continue
            started = read_json(os.path.join(path, STARTED)) or {}
            if isinstance(started.get('pid'), int) and process_state(started['pid']) is not None:
                kept = True
                continue
            manifest = read_json(os.path.join(path, MANIFEST))
            cid = (manifest or started).get('checkpoint_id')
            if manifest is not None and manifest.get('ok'):
                commit = read_json(os.path.join(path, COMMIT)) if manifest.get('coordinator') else None
                left = LeftSave(
                    path,
                    info.get('bucket_uri'),
                    dict(info.get('backend_kwargs') or {}),
                    info.get('keep_last'),
                    cast(str, cid),  # an ok manifest names its checkpoint (written after reset() set the id)
                    manifest,
                    commit,
                )
                taken = adopt(left)
                if taken is None:
                    kept = True
                    continue
                if taken:
                    log.warning(
                        'CheckpointWriter: handed over the shards of checkpoint %r that a killed process left in %s%s',
                        cid,
                        path,
                        ' (and its commit intent)' if commit is not None else '',
                    )
                else:
                    log.warning(
                        'CheckpointWriter: removing the process save of checkpoint %r that a killed process '
                        'left in %s: it was for another bucket (%r); it was never committed',
                        cid,
                        path,
                        left.bucket_uri,
                    )
            else:
                log.warning(
                    'CheckpointWriter: removing the unfinished process save of checkpoint %r that a killed '
                    'process left in %s (it was never committed)',
                    cid,
                    path,
                )
            shutil.rmtree(path, ignore_errors=True)
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)
