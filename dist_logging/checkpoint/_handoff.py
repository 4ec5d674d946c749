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
from typing import TYPE_CHECKING, Any, Callable, Optional

from dist_logging.checkpoint._process_side import (COMMIT, COMMIT_METADATA, MANIFEST, STARTED, ProcessSideWriter,
                                                   read_json)
from dist_logging.checkpoint._intents import publish, write_intent
from dist_logging.dist import _process_alive

if TYPE_CHECKING:
    from dist_logging.checkpoint.writer import CheckpointWriter

__all__ = ['PROCESS_FOLDER', 'HandOff', 'LeftSave', 'take_left_saves']

log = logging.getLogger(__name__)
PROCESS_FOLDER = 'checkpoint-process'
WRITER_INFO = 'writer.json'
POLL_S = 0.015


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
        writer: the owning writer (started: its uploader runs).
        rank_folder: ``<staging>/checkpoint-process/rank{r}``; this writer's saves go below it in
            ``<pid>-<token>/``, the pid telling later writers whether its owner is alive.
    """

    def __init__(self, writer: 'CheckpointWriter', rank_folder: str):
        self.writer = writer
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
        writer = self.writer
        t0, started_at = time.monotonic(), time.time()
        with self._lock:
            if self._seq == 0:
                os.makedirs(self.folder, mode=0o700, exist_ok=True)
                info = {'bucket_uri': writer._bucket_uri(), 'backend_kwargs': writer._backend_kwargs,
                        'keep_last': writer.keep_last, 'pid': os.getpid()}
                publish(os.path.join(self.folder, WRITER_INFO), json.dumps(info).encode(), writer.sync_files)
            self._seq += 1
            seq = self._seq
            folder = os.path.join(self.folder, f'{seq:06d}')
            os.mkdir(folder, mode=0o700)
            self._sent[seq] = _Sent(seq, folder, t0, started_at, threading.current_thread())
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name='checkpoint-process-handoff', daemon=True)
            self._watcher.start()
        if writer.max_staged_bytes is not None:
            self.poll()  # the previous save's files count as staged once handed over
            writer._wait_for_room()
        return ProcessSideWriter(folder, files_per_rank=writer.files_per_rank, thread_count=writer.thread_count,
                                 sync_files=writer.sync_files, per_thread_copy_ahead=writer.per_thread_copy_ahead,
                                 serialization_format=writer.serialization_format)

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
        writer = self.writer
        if not sent.files_done:
            manifest = read_json(os.path.join(sent.folder, MANIFEST))
            if manifest is None:
                if over:
                    self._fail(sent, 'it ended before its files were written (in the checkpoint process, or before '
                               'reaching it; the async_save future holds the error)', remove=True)
                elif timed_out:
                    self._fail(sent, 'the checkpoint process did not finish writing it within commit_timeout',
                               remove=False)
                return over or timed_out
            sent.cid = manifest.get('checkpoint_id')
            if not manifest.get('ok'):
                self._fail(sent, f"its write failed in the checkpoint process: {manifest.get('error')}", remove=True)
                return True
            sent.coordinator = bool(manifest['coordinator'])
            total = writer._queue_for_upload(sent.folder, sent.cid, manifest['files'])
            sent.timing = writer._record_process_save(sent.cid, sent.started_at, sent.t0, total)
            sent.files_done = True
        if sent.coordinator:
            commit = read_json(os.path.join(sent.folder, COMMIT))
            if commit is None:
                if over or timed_out:
                    why = ('the save did not finish (DCP\'s finish never ran: it failed on this or another rank, '
                           'or the checkpoint process died; the async_save future holds the error)' if over else
                           'its commit record did not come within commit_timeout')
                    self._fail(sent, f'this rank\'s shards were queued, but {why}', remove=over)
                    return True
                return False
            with open(os.path.join(sent.folder, COMMIT_METADATA), 'rb') as handle:
                metadata = handle.read()
            writer._submit_process_commit(commit['checkpoint_id'], commit['files'], int(commit['time_ns']), metadata,
                                          sent.timing, sent.t0)
        shutil.rmtree(sent.folder, ignore_errors=True)
        return True

    def _fail(self, sent: _Sent, why: str, *, remove: bool) -> None:
        cid = sent.cid or (read_json(os.path.join(sent.folder, STARTED)) or {}).get('checkpoint_id')
        name = cid if cid else f'<process save #{sent.seq}, no checkpoint id recorded>'
        what = f'checkpoint {cid!r}' if cid else 'a save'
        error = RuntimeError(f"{what} (async_save in the checkpoint process: this writer's process save "
                             f'#{sent.seq}): {why}; it stays uncommitted (invisible to latest_checkpoint)')
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

    def _adopt(self, left: 'LeftSave') -> Optional[bool]:
        writer = self.writer
        if left.bucket_uri != writer._bucket_uri():  # both None: a custom store, resumed as the uploader does
            return False
        writer._queue_for_upload(left.folder, left.checkpoint_id, left.manifest['files'], skip_missing=True)
        if left.commit is not None:
            # The committer resumes it as any intent a killed coordinator left.
            left.write_intent(writer._intents_dir, writer._bucket_uri(), writer._backend_kwargs, writer.keep_last,
                              writer.sync_files)
        return True


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

    def write_intent(self, intents_dir: str, bucket_uri: Optional[str], backend_kwargs: dict,
                     keep_last: Optional[int], fsync: bool) -> None:
        """Record the commit intent of the save (coordinator, with its commit record).

        With the time the dead writer would have used: an intent it wrote already is rewritten in place,
        not doubled."""
        assert self.commit is not None
        with open(os.path.join(self.folder, COMMIT_METADATA), 'rb') as handle:
            metadata = handle.read()
        write_intent(intents_dir, self.checkpoint_id, self.commit['files'], int(self.commit['time_ns']),
                     metadata=metadata, bucket_uri=bucket_uri, backend_kwargs=backend_kwargs, keep_last=keep_last,
                     fsync=fsync)


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
        owner = entry.split('-', 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or _process_alive(int(owner)):
            continue
        folder = os.path.join(rank_folder, entry)
        info = read_json(os.path.join(folder, WRITER_INFO)) or {}
        kept = False
        for seq in sorted(os.listdir(folder)):
            path = os.path.join(folder, seq)
            if not os.path.isdir(path):
                continue
            started = read_json(os.path.join(path, STARTED)) or {}
            if isinstance(started.get('pid'), int) and _process_alive(started['pid']):
                kept = True
                continue
            manifest = read_json(os.path.join(path, MANIFEST))
            cid = (manifest or started).get('checkpoint_id')
            if manifest is not None and manifest.get('ok'):
                commit = read_json(os.path.join(path, COMMIT)) if manifest.get('coordinator') else None
                left = LeftSave(path, info.get('bucket_uri'), dict(info.get('backend_kwargs') or {}),
                                info.get('keep_last'), cid, manifest, commit)
                taken = adopt(left)
                if taken is None:
                    kept = True
                    continue
                if taken:
                    log.warning('CheckpointWriter: handed over the shards of checkpoint %r that a killed process left '
                                'in %s%s', cid, path, ' (and its commit intent)' if commit is not None else '')
                else:
                    log.warning('CheckpointWriter: removing the process save of checkpoint %r that a killed process '
                                'left in %s: it was for another bucket (%r); it was never committed', cid, path,
                                left.bucket_uri)
            else:
                log.warning('CheckpointWriter: removing the unfinished process save of checkpoint %r that a killed '
                            'process left in %s (it was never committed)', cid, path)
            shutil.rmtree(path, ignore_errors=True)
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)
