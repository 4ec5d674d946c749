"""The commit rule: a checkpoint in the bucket is complete, or invisible.

Store-level steps, each safe to interrupt at any point (see ``docs/checkpoints.md``):

* :func:`commit_checkpoint`: one listing of ``C/``; if every file the checkpoint lists is there
  with its size and (where the store keeps one) the checksum it was written with, remove older markers of ``C``
  (un-commit), upload ``.metadata`` (DCP), upload the new marker (the commit), then delete the files only the
  un-committed version listed.
* :func:`delete_checkpoint`: markers first (the checkpoint becomes invisible), then
  ``.metadata``, then the rest.

Every request goes through the uploader's retry policy. Nothing here issues a collective.
"""

from __future__ import annotations

import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping, Optional

from dist_logging.checkpoint._chunk_sums import chunk_entries
from dist_logging.checkpoint._layout import (
    METADATA_NAME,
    Marker,
    decode_record,
    encode_record,
    marker_name,
    markers_by_checkpoint,
    missing_files,
)
from dist_logging.object_store import ObjectInfo
from dist_logging.object_store.checksums import file_crc32c
from dist_logging.upload.retry import RetryPolicy, call_with_retries

__all__ = [
    'NotLanded',
    'ChecksumMismatch',
    'CorruptCheckpoint',
    'landed_mismatches',
    'commit_checkpoint',
    'uncommit',
    'delete_checkpoint',
    'read_record',
    'retry',
]

log = logging.getLogger(__name__)
_POLICY = RetryPolicy(num_attempts=3, initial_backoff=0.5)


class NotLanded(Exception):
    """Some files of a checkpoint are not (yet) in the bucket with their size.

    Attributes:
        missing: object name -> what is wrong (``'missing'``, ``'size 3, expected 5'``).
    """

    def __init__(self, checkpoint_id: str, missing: Mapping[str, str]):
        self.checkpoint_id, self.missing = checkpoint_id, dict(missing)
        names = ', '.join(f'{name} ({why})' for name, why in sorted(self.missing.items())[:10])
        more = f' and {len(self.missing) - 10} more' if len(self.missing) > 10 else ''
        super().__init__(f'checkpoint {checkpoint_id!r} is not complete in the bucket: {names}{more}')


class ChecksumMismatch(ValueError):
    """An object (or a downloaded file) whose CRC32C differs from the one recorded when it was written.

    Attributes:
        name: the object name.
        expected: the checksum recorded by the writer (``'crc32c:<base64>'``).
        actual: the checksum of the bytes found.
    """

    def __init__(self, name: str, expected: str, actual: str, where: str = ''):
        self.name, self.expected, self.actual = name, expected, actual
        super().__init__(
            f'{name}: checksum {actual} where {expected} was recorded when it was written'
            f'{" (" + where + ")" if where else ""}: its bytes changed after they were written'
        )


class CorruptCheckpoint(ValueError):
    """Objects of a checkpoint landed with other bytes than were written (their checksums differ): it is
    not committed. Permanent (unlike :class:`NotLanded`): the same objects will not change by waiting.

    Attributes:
        checkpoint_id: the checkpoint.
        mismatches: object name -> :class:`ChecksumMismatch`.
    """

    def __init__(self, checkpoint_id: str, mismatches: Mapping[str, ChecksumMismatch]):
        self.checkpoint_id, self.mismatches = checkpoint_id, dict(mismatches)
        names = ', '.join(sorted(self.mismatches)[:10])
        super().__init__(
            f'checkpoint {checkpoint_id!r} is not committed: {len(self.mismatches)} object(s) landed '
            f'with other bytes than their writer wrote (checksum mismatch): {names}'
        )


def landed_mismatches(
    store: Any, checkpoint_id: str, checksums: Mapping[str, str], policy: Optional[RetryPolicy] = None
) -> dict[str, ChecksumMismatch]:
    """Object name -> mismatch, for each file of ``checksums`` (relative name -> recorded checksum) whose
    checksum kept by the store differs. A store that keeps none (``object_checksum`` missing or None) checks
    nothing here (the reader checks at load). One request per object on S3 (``HeadObject``), a few in flight.
    """
    ask = getattr(store, 'object_checksum', None)
    if ask is None or not checksums:
        return {}

    def check(relative: str) -> Optional[ChecksumMismatch]:
        name = f'{checkpoint_id}/{relative}'
        try:
            actual = retry(store, lambda: ask(name), policy)
        except FileNotFoundError:
            return None  # deleted since the listing: the commit's listing check reports it next time
        expected = checksums[relative]
        if actual is None or actual == expected:
            return None
        return ChecksumMismatch(name, expected, actual, f'checkpoint {checkpoint_id!r}')

    names = sorted(checksums)
    with ThreadPoolExecutor(min(16, len(names)), thread_name_prefix='checkpoint-verify') as pool:
        found = list(pool.map(check, names))
    return {bad.name: bad for bad in found if bad is not None}


def retry(store: Any, fn: Any, policy: Optional[RetryPolicy] = None, stop: Any = None) -> Any:
    """``fn()`` with the uploader's retry rules for ``store``'s transient errors."""
    return call_with_retries(lambda _attempt: fn(), policy or _POLICY, stop, store)


def read_record(store: Any, marker: Marker, scratch: str, policy: Optional[RetryPolicy] = None) -> dict[str, Any]:
    """Download and parse a marker (one GET).

    Raises:
        FileNotFoundError: the marker vanished (un-committed meanwhile).
        ValueError: not a marker this code wrote.
    """
    path = os.path.join(scratch, f'.marker-{uuid.uuid4().hex[:12]}')
    try:
        retry(store, lambda: store.download_object(marker.name, path, overwrite=True), policy)
        with open(path, 'rb') as handle:
            data = handle.read()
    finally:
        if os.path.lexists(path):
            os.unlink(path)
    return decode_record(data, marker.checkpoint_id)


def uncommit(
    store: Any, checkpoint_id: str, listing: Iterable[ObjectInfo], policy: Optional[RetryPolicy] = None
) -> list[Marker]:
    """Delete every marker of ``checkpoint_id`` found in ``listing`` (the checkpoint becomes invisible)."""
    markers = markers_by_checkpoint(listing).get(checkpoint_id, [])
    for marker in reversed(markers):  # newest first: the checkpoint is invisible after the first delete
        retry(store, lambda name=marker.name: store.delete(name), policy)
    return markers


def commit_checkpoint(
    store: Any,
    checkpoint_id: str,
    files: Mapping[str, int],
    scratch: str,
    *,
    metadata_file: Optional[str] = None,
    kind: str = 'dcp',
    extra: Optional[Mapping[str, Any]] = None,
    time_ns: Optional[int] = None,
    policy: Optional[RetryPolicy] = None,
) -> str:
    """Make ``checkpoint_id`` visible if every file in ``files`` landed; returns the marker's name.

    Args:
        store: the object store (needs ``list``, ``delete``, ``upload_object``, ``download_object``).
        checkpoint_id: the checkpoint's folder in the bucket.
        files: relative name -> size of every object the checkpoint needs (``.metadata`` excluded
            when ``metadata_file`` is given: it is uploaded here, after the check).
        scratch: a private local folder for the marker's temporary file.
        metadata_file: the local ``.metadata`` to upload as ``C/.metadata`` before the marker.
        kind: ``'dcp'`` or ``'folder'`` (recorded in the marker).
        extra: more JSON fields for the marker (e.g. ``{'step': 100}``). Its ``'checksums'`` (relative
            name -> ``'crc32c:<base64>'``, taken while each file was written) are compared with what the
            store keeps for each landed object before anything changes in the bucket; the ``.metadata``'s
            is added here. Its entries ``'chunks:<name>'`` (each file's chunk checksums) are recorded as
            the marker's ``'chunk_checksums'``.
        time_ns: the time the marker is named with (when the save was handed over: checkpoints
            order by save, not by when their commit happened); now by default.

    Raises:
        NotLanded: some file is missing or has another size (nothing was changed in the bucket).
        CorruptCheckpoint: some file landed with another checksum than it was written with (nothing was
            changed in the bucket).
    """
    listing = retry(store, lambda: store.list(f'{checkpoint_id}/'), policy)
    wrong = missing_files(checkpoint_id, files, listing)
    if wrong:
        raise NotLanded(checkpoint_id, wrong)
    extra = dict(extra or {})
    checksums, chunk_sums = chunk_entries(extra.get('checksums') or {})  # the writers' chunk sums travel with them
    if 'checksums' in extra:
        extra['checksums'] = checksums
    if chunk_sums:
        extra['chunk_checksums'] = {**chunk_sums, **dict(extra.get('chunk_checksums') or {})}
    bad = landed_mismatches(store, checkpoint_id, checksums, policy)
    if bad:
        raise CorruptCheckpoint(checkpoint_id, bad)
    all_files = dict(files)
    old_markers = markers_by_checkpoint(listing).get(checkpoint_id, [])
    if time_ns is not None and old_markers and old_markers[-1].time_ns >= time_ns:
        # A newer save of this id is committed already (e.g. drain finishing a stale intent):
        # it stays; this older version's files are the garbage.
        log.warning(
            'checkpoint %r: a newer save is committed (%s); not committing the older one',
            checkpoint_id,
            old_markers[-1].name,
        )
        return old_markers[-1].name
    garbage: set[str] = set()
    if old_markers:
        # A re-save of a committed id: its new files have new names (DCP shards carry a per-save
        # nonce), so the old version stayed readable until now. Remember what only it used.
        try:
            old = read_record(store, old_markers[-1], scratch, policy)
            garbage = {name for name in old['files'] if name not in all_files and name != METADATA_NAME}
        except (FileNotFoundError, ValueError) as exc:
            log.warning(
                'checkpoint %r: could not read the marker being replaced (%s); its files stay', checkpoint_id, exc
            )
        uncommit(store, checkpoint_id, listing, policy)
    if metadata_file is not None:
        size = os.path.getsize(metadata_file)
        if checksums:
            checksums[METADATA_NAME] = file_crc32c(metadata_file)
            extra['checksums'] = checksums
        retry(
            store,
            lambda: store.upload_object(f'{checkpoint_id}/{METADATA_NAME}', metadata_file, overwrite=True),
            policy,
        )
        all_files[METADATA_NAME] = size
        bad = landed_mismatches(
            store, checkpoint_id, {METADATA_NAME: checksums[METADATA_NAME]} if checksums else {}, policy
        )
        if bad:
            raise CorruptCheckpoint(checkpoint_id, bad)
    name = marker_name(checkpoint_id, time_ns)
    path = os.path.join(scratch, f'.marker-{uuid.uuid4().hex[:12]}')
    try:
        with open(path, 'wb') as handle:
            handle.write(encode_record(checkpoint_id, all_files, kind, **extra))
        try:
            retry(store, lambda: store.upload_object(name, path, overwrite=False), policy)
        except FileExistsError:
            pass  # this very commit landed already (a retry whose answer was lost, or a second drain)
    finally:
        if os.path.lexists(path):
            os.unlink(path)
    for relative in sorted(garbage):
        try:
            retry(store, lambda r=relative: store.delete(f'{checkpoint_id}/{r}'), policy)
        except Exception as exc:  # noqa: BLE001 - garbage of an older version; the commit stands
            log.warning(
                'checkpoint %r: could not delete %s of the version it replaced: %s', checkpoint_id, relative, exc
            )
    return name


def delete_checkpoint(
    store: Any,
    checkpoint_id: str,
    listing: Iterable[ObjectInfo],
    keep_under: Iterable[str] = (),
    policy: Optional[RetryPolicy] = None,
) -> int:
    """Un-commit then delete ``checkpoint_id``'s objects as listed; returns how many objects were deleted.

    Order: markers, ``.metadata``, the rest, so an interruption at any point leaves an
    invisible folder (and DCP's own readers, which look for ``.metadata``, see no checkpoint
    either). Objects under ``keep_under`` folders (other checkpoints nested inside) are kept.
    """
    prefix = f'{checkpoint_id}/'
    keep = tuple(f'{other}/' for other in keep_under)
    mine = [info for info in listing if info.name.startswith(prefix) and not info.name.startswith(keep)]
    count = len(uncommit(store, checkpoint_id, mine, policy))
    rest = sorted(
        (info.name for info in mine if markers_by_checkpoint([info]) == {}),
        key=lambda name: (name != f'{prefix}{METADATA_NAME}', name),
    )
    for name in rest:
        retry(store, lambda n=name: store.delete(n), policy)
        count += 1
    return count
