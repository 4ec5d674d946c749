"""The trainer's side of ``dcp.async_save(async_checkpointer_type=PROCESS)``: the hand-off folder and its watcher.

For each save pickled into torch's checkpoint process, the ``CheckpointWriter`` makes a folder
``<staging>/checkpoint-process/rank{r}/<pid>-<token>/<seq>/``; the :class:`ProcessSideWriter` there
writes the shard files and publishes its records (see ``_process_side``). A watcher thread owned by the
writer polls the folders and, for each manifest, hands the files to the uploader exactly as a thread
save does (a hard link into staging and a journal line, then the unlink), records the save's timing
and, on the coordinator, the commit intent; then it removes the folder.

A save is over in the checkpoint process once torch's thread that sent it has ended (it waits for the
process's answer, and torch ends it after the save): what the folder holds then is all it will hold, so
a missing manifest (or, on the coordinator, a missing commit record: DCP's ``finish`` never ran) is
final and reported at once, not after a timeout. (Were a torch version to keep that thread for later
saves, such a failure would be reported when ``close()``'s bounded wait ends instead.)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import time
import uuid
from typing import Any, Optional, Protocol, cast

from dist_logging.checkpoint._dead_writers import (
    COMMIT,
    COMMIT_METADATA,
    MANIFEST,
    STARTED,
    WRITER_INFO,
    LeftSave,
    read_json,
    take_left_saves,
)
from dist_logging.checkpoint._intents import publish
from dist_logging.checkpoint._process_side import ProcessSideWriter

__all__ = ['HandOff', 'HandOffTarget', 'TargetInfo']

log = logging.getLogger(__name__)
POLL_S = 0.015


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """What a process save needs of the writer's settings.

    Attributes:
        bucket_uri: the store's URI without secrets (None: a custom store).
        backend_kwargs: the store's non-secret keyword arguments.
        keep_last: the writer's retention.
        sync_files: fsync files and records.
        intents_dir: where the coordinator's commit intents go.
        max_staged_bytes: the writer's staging bound (None: none).
        process_writer: keyword arguments of the :class:`ProcessSideWriter` (besides its folder).
    """

    bucket_uri: Optional[str]
    backend_kwargs: dict
    keep_last: Optional[int]
    sync_files: bool
    intents_dir: str
    max_staged_bytes: Optional[int]
    process_writer: dict


class HandOffTarget(Protocol):
    """The narrow interface a :class:`HandOff` talks to its writer through (the writer gives it an adapter)."""

    def info(self) -> TargetInfo:
        """The writer's settings, now."""

    def wait_for_room(self) -> None:
        """Block while the staging bound is reached (before a save is sent)."""

    def queue_files(self, folder: str, checkpoint_id: str, files: dict[str, int], *, skip_missing: bool = False) -> int:
        """Hand the complete files of ``folder`` (relative name -> size) to the uploader as ``{checkpoint_id}/{name}``
        and delete them; their bytes. ``skip_missing``: a file no longer there was queued before a kill."""

    def saved(self, checkpoint_id: str, started_at: float, t0: float, total: int) -> Any:
        """A process save's files are queued: record its timing (returned, for :meth:`commit`)."""

    def commit(
        self,
        checkpoint_id: str,
        files: dict[str, int],
        time_ns: int,
        metadata: bytes,
        timing: Any,
        t0: float,
        checksums: dict[str, str],
    ) -> None:
        """The coordinator's commit record of a process save (with each file's checksum, taken as it was written):
        record the intent and hand it to the committer."""


@dataclasses.dataclass
class _Sent:
    """One save pickled for the checkpoint process, until its files (and commit record) are handed over."""

    seq: int
    folder: str
    t0: float  # monotonic, when the request was pickled
    started_at: float  # Unix time of the same moment
    sender: threading.Thread  # torch's thread that sent it and waits for the answer
    cid: Optional[str] = None
    coordinator: bool = False
    files_done: bool = False
    timing: Any = None


class HandOff:
    """The process saves of one ``CheckpointWriter`` (one rank, one trainer process).

    Args:
        target: the owning writer's adapter (started: its uploader runs).
        rank_folder: ``<staging>/checkpoint-process/rank{r}``; this writer's saves go below it in
            ``<pid>-<token>/``, the pid telling later writers whether its owner is alive.
    """

    def __init__(self, target: HandOffTarget, rank_folder: str):
        self.target = target
        self.rank_folder = rank_folder
        self.folder = os.path.join(rank_folder, f'{os.getpid()}-{uuid.uuid4().hex[:8]}')
        self.errors: dict[str, BaseException] = {}
        self._sent: dict[int, _Sent] = {}
        self._seq = 0
        self._lock = threading.Lock()  # one poll at a time (watcher, send, close)
        self._stop = threading.Event()
        self._watcher: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ trainer side of a save
    def send(self) -> ProcessSideWriter:
        """Register one more save (called while torch pickles the writer) and return its process-side writer."""
        info = self.target.info()
        t0, started_at = time.monotonic(), time.time()
        with self._lock:
            if self._seq == 0:
                os.makedirs(self.folder, mode=0o700, exist_ok=True)
                record = {
                    'bucket_uri': info.bucket_uri,
                    'backend_kwargs': info.backend_kwargs,
                    'keep_last': info.keep_last,
                    'pid': os.getpid(),
                }
                publish(os.path.join(self.folder, WRITER_INFO), json.dumps(record).encode(), info.sync_files)
            self._seq += 1
            seq = self._seq
            folder = os.path.join(self.folder, f'{seq:06d}')
            os.mkdir(folder, mode=0o700)
            self._sent[seq] = _Sent(seq, folder, t0, started_at, threading.current_thread())
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name='checkpoint-process-handoff', daemon=True)
            self._watcher.start()
        if info.max_staged_bytes is not None:
            self.poll()  # the previous save's files count as staged once handed over
            self.target.wait_for_room()
        return ProcessSideWriter(folder, **info.process_writer)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a poll records per-save failures itself; never die silently
                log.exception('checkpoint hand-off watcher: poll failed')

    def poll(self, timed_out: bool = False) -> None:
        """Hand over what the checkpoint process finished; with ``timed_out``, give up on the rest."""
        with self._lock:
            for sent in list(self._sent.values()):
                over = not sent.sender.is_alive()  # read first: the folder read after it is final
                try:
                    done = self._advance(sent, over, timed_out)
                except Exception as exc:  # noqa: BLE001 - recorded for close()
                    self._fail(sent, f'its hand-over failed: {type(exc).__name__}: {exc}', remove=True)
                    done = True
                if done:
                    del self._sent[sent.seq]

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._sent)

    def _advance(self, sent: _Sent, over: bool, timed_out: bool) -> bool:
        target = self.target
        if not sent.files_done:
            manifest = read_json(os.path.join(sent.folder, MANIFEST))
            if manifest is None:
                if over:
                    self._fail(
                        sent,
                        'it ended before its files were written (in the checkpoint process, or before '
                        'reaching it; the async_save future holds the error)',
                        remove=True,
                    )
                elif timed_out:
                    self._fail(
                        sent, 'the checkpoint process did not finish writing it within commit_timeout', remove=False
                    )
                return over or timed_out
            sent.cid = manifest.get('checkpoint_id')
            if not manifest.get('ok'):
                self._fail(sent, f"its write failed in the checkpoint process: {manifest.get('error')}", remove=True)
                return True
            sent.coordinator = bool(manifest['coordinator'])
            # An ok manifest names its checkpoint: the process-side writer writes it after reset() set the id.
            cid = cast(str, sent.cid)
            total = target.queue_files(sent.folder, cid, manifest['files'])
            sent.timing = target.saved(cid, sent.started_at, sent.t0, total)
            sent.files_done = True
        if sent.coordinator:
            commit = read_json(os.path.join(sent.folder, COMMIT))
            if commit is None:
                if over or timed_out:
                    why = (
                        'the save did not finish (DCP\'s finish never ran: it failed on this or another rank, '
                        'or the checkpoint process died; the async_save future holds the error)'
                        if over
                        else 'its commit record did not come within commit_timeout'
                    )
                    self._fail(sent, f'this rank\'s shards were queued, but {why}', remove=over)
                    return True
                return False
            with open(os.path.join(sent.folder, COMMIT_METADATA), 'rb') as handle:
                metadata = handle.read()
            target.commit(
                commit['checkpoint_id'],
                commit['files'],
                int(commit['time_ns']),
                metadata,
                sent.timing,
                sent.t0,
                dict(commit.get('checksums') or {}),
            )
        shutil.rmtree(sent.folder, ignore_errors=True)
        return True

    def _fail(self, sent: _Sent, why: str, *, remove: bool) -> None:
        cid = sent.cid or (read_json(os.path.join(sent.folder, STARTED)) or {}).get('checkpoint_id')
        name = cid if cid else f'<process save #{sent.seq}, no checkpoint id recorded>'
        what = f'checkpoint {cid!r}' if cid else 'a save'
        error = RuntimeError(
            f"{what} (async_save in the checkpoint process: this writer's process save "
            f'#{sent.seq}): {why}; it stays uncommitted (invisible to latest_checkpoint)'
        )
        log.error('%s', error)
        self.errors[name] = error
        if remove:
            shutil.rmtree(sent.folder, ignore_errors=True)

    # ------------------------------------------------------------------ close
    def close(self, timeout: float) -> None:
        """Stop the watcher, then hand over every save sent (waiting up to ``timeout`` s for the checkpoint
        process); the saves that never came are in :attr:`errors`. Removes this writer's empty folders."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if not self.pending:
                break
            if time.monotonic() >= deadline:
                self.poll(timed_out=True)
                break
            time.sleep(POLL_S)
        if os.path.isdir(self.folder) and not [entry for entry in os.listdir(self.folder) if entry != WRITER_INFO]:
            try:
                os.unlink(os.path.join(self.folder, WRITER_INFO))
            except FileNotFoundError:
                pass
        for folder in (self.folder, self.rank_folder, os.path.dirname(self.rank_folder)):
            try:
                os.rmdir(folder)  # only when empty: a save still being written stays for the next writer
            except OSError:
                pass

    # ------------------------------------------------------------------ a restarted writer
    def adopt_dead(self) -> None:
        """Hand over the complete saves that dead writers of this rank left in their hand-off folders; remove
        the incomplete ones (never committed). A folder whose checkpoint process is still alive is left alone."""
        take_left_saves(self.rank_folder, self._adopt)

    def _adopt(self, left: LeftSave) -> Optional[bool]:
        info = self.target.info()
        if left.bucket_uri != info.bucket_uri:  # both None: a custom store, resumed as the uploader does
            return False
        self.target.queue_files(left.folder, left.checkpoint_id, left.manifest['files'], skip_missing=True)
        if left.commit is not None:
            # The committer resumes it as any intent a killed coordinator left.
            left.write_intent(info.intents_dir, info.bucket_uri, info.backend_kwargs, info.keep_last, info.sync_files)
        return True
