"""The checkpoint half of ``dist-logging drain``: finishing commits a killed coordinator left (after uploads)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from dist_logging.checkpoint._committer import commit_intent
from dist_logging.checkpoint._dead_writers import LeftSave, remove_dead_writes, take_left_saves
from dist_logging.checkpoint._intents import read_intents
from dist_logging.checkpoint._paths import INTENTS_FOLDER, PROCESS_FOLDER, scratch_folder
from dist_logging.checkpoint.commit import NotLanded

__all__ = ['CommitReport', 'finish_commits']

log = logging.getLogger(__name__)


@dataclass
class CommitReport:
    """What :func:`finish_commits` did.

    Attributes:
        committed: checkpoint ids committed now.
        not_ready: checkpoint id -> why it stays uncommitted (files missing: its shards were lost
            with a rank, or still sit in another node's staging folder); its intent stays.
        skipped_custom_store: ids queued through a custom store, when none was given.
        handed_over: ids of saves a killed trainer left in its checkpoint-process hand-off folder,
            uploaded now (and, from the coordinator's folder, their commit intents recorded).
    """

    committed: list[str] = field(default_factory=list)
    handed_over: list[str] = field(default_factory=list)
    not_ready: dict[str, BaseException] = field(default_factory=dict)
    skipped_custom_store: list[str] = field(default_factory=list)


def finish_commits(staging_folder: str, *, object_store: Any = None) -> CommitReport:
    """Commit every checkpoint whose intent is in ``staging_folder`` and whose files all landed.

    The coordinator's staging folder holds an intent for each checkpoint it handed over and
    did not commit yet. Each is committed exactly as the live committer would (metadata, then
    the marker, then retention); one whose files are not all in the bucket stays uncommitted
    (invisible) and is reported. Run it after draining the uploads of every node.

    First, the saves that killed trainers left in ``<staging>/checkpoint-process/`` (written by
    torch's checkpoint process, not yet handed to the uploader) are taken over: complete ones are
    uploaded and, from the coordinator's folder, their commit intents recorded; unfinished ones are
    deleted (see ``docs/checkpoints.md``). The local-write folders of writers whose process is gone
    (a save killed before its hand-over, spare files) are deleted.

    Raises:
        FileNotFoundError: ``staging_folder`` does not exist.
    """
    folder = os.path.abspath(os.fspath(staging_folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f'staging folder {folder} does not exist')
    report = CommitReport()
    from dist_logging.object_store import store_from_uri

    stores: dict[str, Any] = {}

    def store_for(uri: str, kwargs: dict) -> Any:
        key = json.dumps([uri, kwargs], sort_keys=True)
        if key not in stores:
            stores[key] = store_from_uri(uri, kwargs)
        return stores[key]

    remove_dead_writes(folder)
    try:
        _take_process_saves(folder, store_for, object_store, report)
        intents = read_intents(os.path.join(folder, INTENTS_FOLDER))
        if intents:
            _commit_intents(intents, folder, store_for, object_store, report)
    finally:
        _close_stores(stores)
    return report


def _commit_intents(intents: list, folder: str, store_for: Any, object_store: Any, report: CommitReport) -> None:
    scratch = scratch_folder(folder)
    try:
        for intent in intents:
            if not os.path.exists(intent.path):
                continue  # removed by a newer commit of the same checkpoint in this loop
            if intent.bucket_uri is None:
                if object_store is None:
                    report.skipped_custom_store.append(intent.checkpoint_id)
                    continue
                store = object_store
            else:
                store = store_for(intent.bucket_uri, intent.backend_kwargs)
            try:
                commit_intent(store, intent, scratch)
                report.committed.append(intent.checkpoint_id)
            except NotLanded as exc:
                report.not_ready[intent.checkpoint_id] = exc
                log.warning('drain: %s (it stays uncommitted)', exc)
            except Exception as exc:  # noqa: BLE001 - reported per checkpoint
                report.not_ready[intent.checkpoint_id] = exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _close_stores(stores: dict[str, Any]) -> None:
    for store in stores.values():
        try:
            store.close()
        except Exception:  # noqa: BLE001
            pass


def _take_process_saves(folder: str, store_for: Any, object_store: Any, report: CommitReport) -> None:
    """Upload the complete saves killed trainers left in ``<staging>/checkpoint-process/`` (the files their
    checkpoint process wrote that the trainer had not handed to its uploader yet), record the coordinator's
    commit intents, delete the unfinished saves (never committed). A save for a custom store is uploaded to
    ``object_store`` when given, else left (reported) for a writer given that store."""
    root = os.path.join(folder, PROCESS_FOLDER)
    try:
        ranks = sorted(os.listdir(root))
    except FileNotFoundError:
        return

    def adopt(left: LeftSave) -> Any:
        if left.bucket_uri is None and object_store is None:
            report.skipped_custom_store.append(left.checkpoint_id)
            return None
        try:
            store = object_store if left.bucket_uri is None else store_for(left.bucket_uri, left.backend_kwargs)
            for name in left.manifest['files']:
                path = os.path.join(left.folder, name)
                if os.path.exists(path):  # else: handed to the uploader before the kill (drained already)
                    store.upload_object(f'{left.checkpoint_id}/{name}', path)
                    os.unlink(path)
            if left.commit is not None:
                left.write_intent(
                    os.path.join(folder, INTENTS_FOLDER),
                    left.bucket_uri,
                    left.backend_kwargs,
                    left.keep_last,
                    fsync=False,
                )
        except Exception as exc:  # noqa: BLE001 - reported; the save stays for the next drain or writer
            report.not_ready[left.checkpoint_id] = exc
            return None
        report.handed_over.append(left.checkpoint_id)
        return True

    for rank in ranks:
        take_left_saves(os.path.join(root, rank), adopt)
    for path in (os.path.join(root, rank) for rank in ranks):
        try:
            os.rmdir(path)
        except OSError:
            pass
    try:
        os.rmdir(root)
    except OSError:
        pass
