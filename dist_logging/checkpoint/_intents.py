"""Commit intents: the coordinator's durable record of a checkpoint waiting to be committed.

``<staging>/checkpoint-commits/<ns>-<hash>.json`` (with the DCP ``.metadata`` next to it as
``<ns>-<hash>.metadata``) says: "when these files are in this bucket with these sizes,
upload this metadata and commit". It is written (temp file, then ``os.replace``) in the
coordinator's ``finish()``, so a coordinator killed before the commit leaves it behind: the
next job's writer on the same staging folder, or ``dist-logging drain``, finishes the commit
once the shards landed. Removed after the commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from dist_logging.checkpoint._paths import INTENTS_FOLDER

__all__ = ['CommitIntent', 'INTENTS_FOLDER', 'write_intent', 'read_intents', 'remove_intent']

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitIntent:
    """One checkpoint waiting for its commit.

    Attributes:
        path: the intent's JSON file.
        checkpoint_id: the checkpoint's folder in the bucket.
        files: relative name -> size of every object the commit needs (``.metadata`` excluded).
        metadata_file: the local ``.metadata`` to upload at commit, or None (a folder upload).
        time_ns: when the save was handed over (the marker is named with it, so checkpoints
            order by save, whenever they commit).
        bucket_uri: the store's URI (None for a custom store), and ``backend_kwargs`` (non-secret).
        keep_last: the retention to apply after the commit, or None.
        extra: more fields for the marker.
    """

    path: str
    checkpoint_id: str
    files: dict
    metadata_file: Optional[str]
    time_ns: int
    bucket_uri: Optional[str]
    backend_kwargs: dict = field(default_factory=dict)
    keep_last: Optional[int] = None
    kind: str = 'dcp'
    extra: dict = field(default_factory=dict)


def _base(folder: str, checkpoint_id: str, time_ns: int) -> str:
    return os.path.join(folder, f'{time_ns:020d}-{hashlib.sha1(checkpoint_id.encode()).hexdigest()[:12]}')


def write_intent(
    folder: str,
    checkpoint_id: str,
    files: dict,
    time_ns: int,
    *,
    metadata: Optional[bytes],
    bucket_uri: Optional[str],
    backend_kwargs: Optional[dict] = None,
    keep_last: Optional[int] = None,
    kind: str = 'dcp',
    extra: Optional[dict] = None,
    fsync: bool = False,
) -> CommitIntent:
    """Write an intent (its ``.metadata`` first, then the JSON, each by temp file + ``os.replace``)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    base = _base(folder, checkpoint_id, time_ns)
    metadata_file = None
    if metadata is not None:
        metadata_file = base + '.metadata'
        publish(metadata_file, metadata, fsync)
    record = {
        'checkpoint_id': checkpoint_id,
        'files': files,
        'metadata_file': metadata_file,
        'time_ns': time_ns,
        'bucket_uri': bucket_uri,
        'backend_kwargs': dict(backend_kwargs or {}),
        'keep_last': keep_last,
        'kind': kind,
        'extra': dict(extra or {}),
    }
    publish(base + '.json', json.dumps(record, sort_keys=True).encode(), fsync)
    return _from_record(base + '.json', record)


def publish(path: str, data: bytes, fsync: bool) -> None:
    """Write ``path`` atomically (temp file, then ``os.replace``); fsync the file and its folder with ``fsync``."""
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'wb') as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(os.path.dirname(path) or '.', os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _from_record(path: str, record: dict[str, Any]) -> CommitIntent:
    return CommitIntent(
        path,
        str(record['checkpoint_id']),
        {str(k): int(v) for k, v in record['files'].items()},
        record.get('metadata_file'),
        int(record['time_ns']),
        record.get('bucket_uri'),
        dict(record.get('backend_kwargs') or {}),
        record.get('keep_last'),
        str(record.get('kind', 'dcp')),
        dict(record.get('extra') or {}),
    )


def read_intents(folder: str) -> list[CommitIntent]:
    """Every intent in ``folder``, oldest first (unreadable ones are skipped with a warning)."""
    try:
        entries = sorted(entry for entry in os.listdir(folder) if entry.endswith('.json'))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        path = os.path.join(folder, entry)
        try:
            with open(path, 'rb') as handle:
                found.append(_from_record(path, json.loads(handle.read())))
        except FileNotFoundError:
            continue  # committed meanwhile
        except (ValueError, KeyError, TypeError) as exc:
            log.warning('ignoring unreadable checkpoint commit intent %s: %s', path, exc)
    return found


def remove_intent(intent: CommitIntent) -> None:
    """Delete the intent (JSON first: without it the ``.metadata`` is an orphan, never half an intent)."""
    for path in (intent.path, intent.metadata_file):
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
