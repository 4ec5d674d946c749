"""Finding committed checkpoints: one listing of the prefix, and one read of the newest marker."""

from __future__ import annotations

import logging
import shutil
from typing import Any, Mapping, Optional, Union

from dist_logging.checkpoint._layout import Marker, markers_by_checkpoint, missing_files
from dist_logging.checkpoint._paths import scratch_folder
from dist_logging.checkpoint.commit import landed_mismatches, read_record, retry
from dist_logging.object_store import ObjectInfo, ObjectStore, check_prefix, store_from_uri

__all__ = ['latest_checkpoint', 'list_checkpoints', 'committed_markers', 'open_store']

log = logging.getLogger(__name__)


def open_store(bucket: Any, backend_kwargs: Optional[Mapping[str, Any]] = None) -> tuple[Any, bool]:
    """``(store, owned)`` for a bucket URI, an object store, or a RemoteUploaderDownloader.

    Raises:
        TypeError: something else, or a store without ``list``/``delete``.
        ValueError: a bad URI.
    """
    if isinstance(bucket, str) or hasattr(bucket, '__fspath__'):
        return store_from_uri(str(bucket), backend_kwargs), True
    if backend_kwargs:
        raise ValueError('backend_kwargs only applies to a bucket URI')
    store = getattr(bucket, 'object_store', bucket)  # a RemoteUploaderDownloader, or a store
    for method in ('list', 'delete', 'upload_object', 'download_object'):
        if not callable(getattr(store, method, None)):
            raise TypeError(
                f'{store!r} has no {method}(): checkpoints need an ObjectStore with list and delete '
                '(dist_logging.object_store)'
            )
    return store, False


def _prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f'prefix must be a str, got {type(prefix).__name__}')
    prefix = prefix.strip('/')
    check_prefix(prefix)
    return f'{prefix}/' if prefix else ''


def committed_markers(listing: list[ObjectInfo]) -> list[Marker]:
    """The newest marker of every committed checkpoint in ``listing``, oldest commit first."""
    newest = [markers[-1] for markers in markers_by_checkpoint(listing).values()]
    return sorted(newest, key=lambda m: (m.time_ns, m.checkpoint_id))


def list_checkpoints(
    bucket: Union[str, ObjectStore, Any], prefix: str = '', *, backend_kwargs: Optional[Mapping[str, Any]] = None
) -> list[str]:
    """Ids of the committed checkpoints under ``prefix``, oldest commit first (one listing, no reads).

    Raises:
        TypeError: a bucket that is no URI, store or uploader, or a non-string prefix.
        ValueError: a bad URI or prefix.
    """
    store, owned = open_store(bucket, backend_kwargs)
    try:
        listing = retry(store, lambda: store.list(_prefix(prefix)))
    finally:
        if owned:
            store.close()
    return [marker.checkpoint_id for marker in committed_markers(listing)]


def latest_checkpoint(
    bucket: Union[str, ObjectStore, Any], prefix: str = '', *, backend_kwargs: Optional[Mapping[str, Any]] = None
) -> Optional[str]:
    """The id of the newest committed checkpoint under ``prefix``, or None.

    One listing of ``prefix`` and one read (the newest marker), whatever the number of
    checkpoints or shards. Folders without a marker (being written, half-deleted, partial,
    or not checkpoints at all) are skipped. The marker's file list is checked against the
    listing; a checkpoint with a file missing or of another size (deleted by hand, or a
    marker copied from elsewhere) is skipped with a warning, costing one more read. Where the
    store keeps each object's checksum (S3: one ``HeadObject`` per file of the candidate; the local
    store: an extended attribute), a checkpoint whose objects' checksums differ from those its marker
    recorded is skipped too.

    Args:
        bucket: a bucket URI (``'s3://b/p'``, a local path), an object store, or a
            ``RemoteUploaderDownloader`` (its store is used).
        prefix: where the checkpoints live, e.g. ``'run/checkpoints'`` (any depth below it).
        backend_kwargs: for a URI: the store's keyword arguments.

    Returns:
        The id (``'run/checkpoints/step200'``) to pass as ``checkpoint_id`` to ``dcp.load``, or None.

    Raises:
        TypeError: a bucket that is no URI, store or uploader, or a non-string prefix.
        ValueError: a bad URI or prefix.
    """
    store, owned = open_store(bucket, backend_kwargs)
    scratch = None
    try:
        listing = retry(store, lambda: store.list(_prefix(prefix)))
        for marker in reversed(committed_markers(listing)):
            if scratch is None:
                scratch = scratch_folder()
            try:
                record = read_record(store, marker, scratch)
            except FileNotFoundError:
                continue  # un-committed since the listing (retention, a re-save)
            except ValueError as exc:
                log.warning('latest_checkpoint: skipping %r: %s', marker.checkpoint_id, exc)
                continue
            wrong = missing_files(marker.checkpoint_id, record['files'], listing)
            if wrong:
                log.warning(
                    'latest_checkpoint: skipping %r, committed but incomplete now: %s',
                    marker.checkpoint_id,
                    sorted(wrong.items())[:5],
                )
                continue
            corrupt = landed_mismatches(store, marker.checkpoint_id, record.get('checksums') or {})
            if corrupt:
                log.warning(
                    'latest_checkpoint: skipping %r, its objects do not hold the bytes its marker records: %s',
                    marker.checkpoint_id,
                    '; '.join(str(error) for error in list(corrupt.values())[:3]),
                )
                continue
            return marker.checkpoint_id
        return None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if owned:
            store.close()
