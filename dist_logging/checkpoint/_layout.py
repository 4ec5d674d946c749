"""How a checkpoint looks in the bucket: its folder, its commit marker, and the marker's record.

A checkpoint with id ``C`` is the objects under ``C/``. It is *committed* when a marker
``C/.committed-<unix ns, 20 digits>.json`` exists; the marker is always the last object written
and the first one removed. Its JSON record lists every object of the checkpoint with its size,
so a reader can check, from one listing, that nothing it needs is missing. The time in the
marker's name orders committed checkpoints without reading them.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterable, Mapping, NamedTuple, Optional

from dist_logging.object_store import ObjectInfo, check_object_name

__all__ = [
    'METADATA_NAME',
    'MARKER_RE',
    'Marker',
    'CheckpointIdMixin',
    'check_checkpoint_id',
    'marker_name',
    'parse_marker',
    'markers_by_checkpoint',
    'encode_record',
    'decode_record',
    'missing_files',
]

METADATA_NAME = '.metadata'
MARKER_RE = re.compile(r'^(?P<cid>.+)/\.committed-(?P<ns>\d{20})\.json$')
FORMAT = 1


class Marker(NamedTuple):
    """A commit marker found in a listing: the checkpoint id, the commit time (ns) and the object name."""

    checkpoint_id: str
    time_ns: int
    name: str
    size: int


def check_checkpoint_id(checkpoint_id: Any) -> str:
    """The checkpoint id as an object-name prefix (no leading/trailing ``/``).

    Raises:
        TypeError: not a string or path.
        ValueError: empty, absolute or escaping (``..``).
    """
    import os

    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(f'checkpoint_id must be a str, got {type(checkpoint_id).__name__}')
    text = os.fspath(checkpoint_id)
    if text.startswith('/'):
        raise ValueError(
            f'checkpoint_id {text!r} is absolute; it is a prefix inside the bucket (e.g. \'run/checkpoints/step100\')'
        )
    cid = text.strip('/')
    try:
        check_object_name(cid)
    except ValueError as exc:
        raise ValueError(f'bad checkpoint_id {text!r}: {exc}') from None
    if '//' in cid:
        raise ValueError(f'bad checkpoint_id {text!r}: empty path component')
    return cid


class CheckpointIdMixin:
    """The ``checkpoint_id`` property and ``validate_checkpoint_id`` DCP asks a storage writer or reader for;
    the class sets ``_cid`` (the id of the current or last save or load)."""

    _cid: Optional[str] = None

    @property
    def checkpoint_id(self) -> Optional[str]:
        """The id of the current (or last) save or load."""
        return self._cid

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            check_checkpoint_id(checkpoint_id)
        except (TypeError, ValueError):
            return False
        return True


def marker_name(checkpoint_id: str, time_ns: Optional[int] = None) -> str:
    """``C/.committed-<ns>.json`` for a commit at ``time_ns`` (now by default)."""
    return f'{checkpoint_id}/.committed-{time.time_ns() if time_ns is None else time_ns:020d}.json'


def parse_marker(info: ObjectInfo) -> Optional[Marker]:
    """The marker an object is, or None for any other object."""
    match = MARKER_RE.match(info.name)
    if match is None:
        return None
    return Marker(match.group('cid'), int(match.group('ns')), info.name, info.size)


def markers_by_checkpoint(listing: Iterable[ObjectInfo]) -> dict[str, list[Marker]]:
    """Checkpoint id -> its markers in the listing, oldest first (normally one)."""
    found: dict[str, list[Marker]] = {}
    for info in listing:
        marker = parse_marker(info)
        if marker is not None:
            found.setdefault(marker.checkpoint_id, []).append(marker)
    for markers in found.values():
        markers.sort(key=lambda m: m.time_ns)
    return found


def encode_record(checkpoint_id: str, files: Mapping[str, int], kind: str, **extra: Any) -> bytes:
    """The marker's JSON: every object of the checkpoint (relative name -> size), and what wrote it."""
    record = {
        'format': FORMAT,
        'checkpoint_id': checkpoint_id,
        'kind': kind,
        'files': dict(sorted(files.items())),
        'committed_at': time.time(),
        **extra,
    }
    return json.dumps(record, sort_keys=True).encode()


def decode_record(data: bytes, checkpoint_id: str) -> dict[str, Any]:
    """Parse and check a marker's record.

    Raises:
        ValueError: not a marker this code wrote for ``checkpoint_id`` (names what is wrong).
    """
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise ValueError(f'commit marker of {checkpoint_id!r} is not JSON: {exc}') from None
    if not isinstance(record, dict) or record.get('format') != FORMAT:
        raise ValueError(f'commit marker of {checkpoint_id!r}: unknown format {record!r:.80}')
    files = record.get('files')
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in files.items()):
        raise ValueError(f'commit marker of {checkpoint_id!r}: bad file list')
    if record.get('checkpoint_id') != checkpoint_id:
        raise ValueError(
            f'commit marker in {checkpoint_id!r} names another checkpoint: '
            f'{record.get("checkpoint_id")!r} (copied folder?)'
        )
    return record


def missing_files(checkpoint_id: str, files: Mapping[str, int], listing: Iterable[ObjectInfo]) -> dict[str, str]:
    """Object name -> what is wrong with it, for every file of ``files`` not in ``listing`` with its size."""
    sizes = {info.name: info.size for info in listing}
    wrong = {}
    for relative, size in files.items():
        name = f'{checkpoint_id}/{relative}'
        got = sizes.get(name)
        if got is None:
            wrong[name] = 'missing'
        elif got != size:
            wrong[name] = f'size {got}, expected {size}'
    return wrong
