"""The upload half of ``dist-logging drain``: listing and uploading what a staging folder holds, without a job.

Used by ``python -m dist_logging drain STAGING_FOLDER`` after a job died with
uploads pending (or when uploads failed and the cause is fixed). Each rank's
folder is locked while it is drained, so a drain never races a live uploader.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from dist_logging.errors import UploadError
from dist_logging.upload.journal import JOURNAL_NAME, QueuedRecord, read_journal
from dist_logging.upload.retry import RetryPolicy
from dist_logging.upload.staging import FILES_FOLDER, RankStaging, StagingBusyError, rank_dirs
from dist_logging.upload.workers import UploadScheduler, UploadTask

__all__ = ['PendingUpload', 'DrainReport', 'StagingBusyError', 'list_pending', 'drain']

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingUpload:
    """An upload recorded in a staging folder that has not landed yet.

    Attributes:
        rank: the global rank that queued it (its subfolder ``rank{rank}``).
        remote_name: the object name.
        size: bytes (-1 if the file is missing).
        bucket_uri: the store it was queued for; ``None`` for a custom ``object_store=`` instance.
        snapshot_path: the file that will be uploaded (the snapshot, or the original for an
            in-place hand-over).
        overwrite: whether it may replace an existing object.
        upload_id: its id in the rank's journal.
        queued_at: Unix time of the ``upload_file`` call.
        custom_store: for a custom store, its class (``module.Class``); else ``None``.
        backend_kwargs: the non-secret backend keyword arguments recorded with the URI.
    """

    rank: int
    remote_name: str
    size: int
    bucket_uri: Optional[str]
    snapshot_path: str
    overwrite: bool
    upload_id: int = 0
    queued_at: float = 0.0
    custom_store: Optional[str] = None
    backend_kwargs: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class DrainReport:
    """What :func:`drain` did.

    Attributes:
        uploaded: names that landed.
        skipped_custom_store: names queued through a custom ``object_store=`` instance that
            could not be uploaded because none was given; they stay in staging.
        failed: name -> the error; they stay in staging.
        superseded: names of older uploads dropped because a newer upload of the same name
            (``overwrite=True``) was pending in the same rank.
    """

    uploaded: list[str] = field(default_factory=list)
    skipped_custom_store: list[str] = field(default_factory=list)
    failed: dict[str, BaseException] = field(default_factory=dict)
    superseded: list[str] = field(default_factory=list)


def _rank_folders(staging_folder: str) -> dict[int, str]:
    folder = os.path.abspath(os.fspath(staging_folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f'staging folder {folder} does not exist')
    base = os.path.basename(folder)
    if base.startswith('rank') and base[4:].isdigit() and os.path.exists(os.path.join(folder, JOURNAL_NAME)):
        return {int(base[4:]): folder}  # a single rank's folder was given
    return rank_dirs(folder)


def _size(record: QueuedRecord, path: str) -> int:
    # Hand-overs (copy=False) are recorded without a size (-1): measured here, off the call path.
    if record.size >= 0:
        return record.size
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _pending(rank: int, folder: str, record: QueuedRecord, stores: dict) -> PendingUpload:
    store = stores.get(record.sid)
    path = record.src if record.src is not None else os.path.join(folder, FILES_FOLDER, str(record.id))
    return PendingUpload(
        rank=rank,
        remote_name=record.name,
        size=_size(record, path),
        bucket_uri=store.uri if store is not None else None,
        snapshot_path=path,
        overwrite=record.overwrite,
        upload_id=record.id,
        queued_at=record.time,
        custom_store=(store.custom if store is not None else 'unknown'),
        backend_kwargs=dict(store.kwargs) if store is not None else {},
    )


def list_pending(staging_folder: str) -> list[PendingUpload]:
    """Every pending upload in ``staging_folder`` (all ``rank*`` subfolders, or one rank's folder).

    Read-only and lock-free: safe while uploaders run (the answer may be stale at once).

    Raises:
        FileNotFoundError: ``staging_folder`` does not exist.
    """
    found = []
    for rank, folder in _rank_folders(staging_folder).items():
        state = read_journal(os.path.join(folder, JOURNAL_NAME))
        found += [_pending(rank, folder, record, state.stores) for record in state.pending.values()]
    return found


def drain(
    staging_folder: str, *, object_store: Any = None, num_workers: int = 4, progress_bar: bool = True
) -> DrainReport:
    """Upload every pending upload in ``staging_folder``.

    Each upload goes to the store recorded with it, rebuilt from its bucket URI (plus the
    non-secret backend kwargs recorded with it; credentials come from the environment).
    Uploads queued through a custom store go to ``object_store`` when given, and are
    otherwise listed in :attr:`DrainReport.skipped_custom_store` (never silently skipped).
    Of several pending uploads of one name in a rank, only the newest is uploaded.

    Args:
        staging_folder: the ``upload_staging_folder`` of a run (or one ``rank{r}`` folder in it).
        object_store: the store for uploads queued through a custom ``object_store=``.
        num_workers: concurrent uploads.
        progress_bar: show a ``tqdm`` bar (bytes).

    Returns:
        The :class:`DrainReport`.

    Raises:
        FileNotFoundError: ``staging_folder`` does not exist.
        StagingBusyError: a rank folder is held by a live uploader or another drain (nothing is done).
        UploadError: some uploads failed (naming each); its ``report`` attribute is the DrainReport.
        ValueError: ``num_workers`` < 1.
    """
    from dist_logging.object_store import store_from_uri

    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f'num_workers must be an int >= 1, got {num_workers!r}')
    folders = _rank_folders(staging_folder)
    stagings: list[RankStaging] = []
    busy = []
    try:
        for rank, folder in folders.items():
            try:
                stagings.append(RankStaging(os.path.dirname(folder), rank))
            except StagingBusyError:
                busy.append(folder)
        if busy:
            raise StagingBusyError(f'cannot drain: {", ".join(busy)} held by a live uploader or another drain')
        return _drain(stagings, object_store, num_workers, progress_bar, store_from_uri)
    finally:
        for staging in stagings:
            staging.close()


def _drain(
    stagings: list[RankStaging], object_store: Any, num_workers: int, progress_bar: bool, store_from_uri: Any
) -> DrainReport:
    report = DrainReport()
    built: dict[str, Any] = {}
    build_errors: dict[str, BaseException] = {}
    work: list[tuple[RankStaging, UploadTask]] = []
    for staging in stagings:
        state = staging.recovered
        newest: dict[str, QueuedRecord] = {}
        for record in state.pending.values():  # journal order = queue order
            older = newest.get(record.name)
            if older is not None and record.overwrite:
                staging.finish(older.id, staging.path_of(older))
                report.superseded.append(older.name)
            newest[record.name] = record
        for record in newest.values():
            store_record = state.stores.get(record.sid)
            if store_record is None or store_record.uri is None:
                if object_store is None:
                    report.skipped_custom_store.append(record.name)
                    continue
                store = object_store
            else:
                key = json.dumps([store_record.uri, store_record.kwargs], sort_keys=True)
                if key not in built and key not in build_errors:
                    try:
                        built[key] = store_from_uri(store_record.uri, store_record.kwargs)
                    except Exception as exc:  # noqa: BLE001 - reported per upload
                        build_errors[key] = exc
                if key in build_errors:
                    report.failed[record.name] = build_errors[key]
                    continue
                store = built[key]
            path = staging.path_of(record)
            task = UploadTask(
                record.id,
                record.name,
                path,
                _size(record, path),
                record.overwrite,
                resumed=True,
                store=store,
                owned=record.owned and record.src is None,
                staging_folder=staging.root,
            )
            work.append((staging, task))
    if report.skipped_custom_store:
        log.warning(
            'drain: %d upload(s) were queued through a custom object_store and need it passed to drain: %s',
            len(report.skipped_custom_store),
            report.skipped_custom_store,
        )
    if work:
        _run(work, num_workers, progress_bar, report)
    for store in built.values():
        try:
            store.close()
        except Exception:  # noqa: BLE001
            pass
    if report.failed:
        error = UploadError(report.failed)
        error.add_note('the files of the failed uploads stay in the staging folder')
        error.report = report  # type: ignore[attr-defined]
        raise error
    return report


def _run(work: list[tuple[RankStaging, UploadTask]], num_workers: int, progress_bar: bool, report: DrainReport) -> None:
    owners = {(task.path, task.id): staging for staging, task in work}
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(max(task.size, 0) for _, task in work), unit='B', unit_scale=True, desc='draining uploads')

    def done(task: UploadTask) -> None:
        owners[(task.path, task.id)].finish(task.id, task.path)
        report.uploaded.append(task.name)
        if bar is not None:
            bar.update(max(task.size, 0))

    def failed(task: UploadTask, error: BaseException) -> None:
        report.failed[task.name] = error

    def superseded(task: UploadTask) -> None:  # cannot happen: one task per name and rank
        owners[(task.path, task.id)].finish(task.id, task.path)

    scheduler = UploadScheduler(
        None, RetryPolicy(), num_workers, on_done=done, on_failed=failed, on_superseded=superseded, name='drain'
    )
    try:
        for _, task in work:
            scheduler.submit(task)
        scheduler.wait()
    finally:
        scheduler.shutdown()
        if bar is not None:
            bar.close()
