"""Finishing commits a killed coordinator left: run by ``dist-logging drain`` after the uploads."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from dist_logging.checkpoint._committer import commit_intent
from dist_logging.checkpoint._intents import INTENTS_FOLDER, read_intents
from dist_logging.checkpoint._paths import scratch_folder
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
    """

    committed: list[str] = field(default_factory=list)
    not_ready: dict[str, BaseException] = field(default_factory=dict)
    skipped_custom_store: list[str] = field(default_factory=list)


def finish_commits(staging_folder: str, *, object_store: Any = None) -> CommitReport:
    """Commit every checkpoint whose intent is in ``staging_folder`` and whose files all landed.

    The coordinator's staging folder holds an intent for each checkpoint it handed over and
    did not commit yet. Each is committed exactly as the live committer would (metadata, then
    the marker, then retention); one whose files are not all in the bucket stays uncommitted
    (invisible) and is reported. Run it after draining the uploads of every node.

    Raises:
        FileNotFoundError: ``staging_folder`` does not exist.
    """
    folder = os.path.abspath(os.fspath(staging_folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f'staging folder {folder} does not exist')
    report = CommitReport()
    intents = read_intents(os.path.join(folder, INTENTS_FOLDER))
    if not intents:
        return report
    from dist_logging.object_store import store_from_uri

    stores: dict[str, Any] = {}
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
                key = json.dumps([intent.bucket_uri, intent.backend_kwargs], sort_keys=True)
                if key not in stores:
                    stores[key] = store_from_uri(intent.bucket_uri, intent.backend_kwargs)
                store = stores[key]
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
        for store in stores.values():
            try:
                store.close()
            except Exception:  # noqa: BLE001
                pass
    return report
