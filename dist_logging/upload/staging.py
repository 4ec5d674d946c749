"""A rank's staging folder: ``<staging>/rank{r}/`` with its lock, journal and snapshots.

Layout::

    <staging>/rank{r}/.lock            filelock held while an uploader (or a drain) owns the folder
    <staging>/rank{r}/journal.jsonl    queued/done records (see dist_logging.upload.journal)
    <staging>/rank{r}/files/<id>       snapshots (copies or hard links) waiting to be uploaded

This module is the one place that names those folders (:data:`FILES_FOLDER`, :func:`rank_folder_name`)
and the default staging folder of a run (:func:`default_staging_folder`). Other rooms that keep state
next to the rank folders (the checkpoint writer's ``checkpoint-*`` folders) name their own folders in
their own package and reach the staging folder only through :attr:`dist_logging.upload.Uploader.staging_folder`.

Opening a :class:`RankStaging` takes the lock (failing at once if another live
process holds it), reads the journal, deletes snapshots no pending record refers
to (left by a process killed between snapshot and record, or after an upload
finished), and compacts the journal. Closing it with nothing pending deletes the rank's folder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import stat
from typing import Any, Mapping, Optional

from dist_logging import _private_dirs
from dist_logging._private_dirs import make_dirs
from dist_logging.object_store import persistable_kwargs, persistable_uri
from dist_logging.upload.journal import (
    JOURNAL_NAME,
    Journal,
    JournalState,
    QueuedRecord,
    StoreRecord,
    compact,
    read_journal,
)

__all__ = [
    'RankStaging',
    'StagingBusyError',
    'rank_dirs',
    'FILES_FOLDER',
    'rank_folder_name',
    'default_staging_folder',
    'remove_empty_default_folders',
    'store_record',
]

log = logging.getLogger(__name__)
FILES_FOLDER = 'files'  # <staging>/rank{r}/files: the snapshots


def rank_folder_name(rank: int) -> str:
    """``rank{rank}``: a rank's folder inside the staging folder."""
    return f'rank{rank}'


def default_staging_folder(run_name: str) -> str:
    """``<private base>/<run_name>/staging``: one per run, shared by the ranks of a node.

    The private base is ``$DIST_LOGGING_TMPDIR`` or ``<system temp>/dist_logging-<user>``; it and
    the two folders are created with mode 0o700 and checked to be this user's (see
    :mod:`dist_logging._private_dirs`).

    Raises:
        PermissionError: one of the folders is not private to this user (names it, says why and
            how to choose another place).
    """
    safe_run = re.sub(r'[^A-Za-z0-9._-]', '_', run_name).lstrip('.') or 'run'
    try:
        return _private_dirs.private_dir(safe_run, 'staging')
    except PermissionError as exc:
        raise PermissionError(f'{exc}; or pass upload_staging_folder= to choose where uploads are staged') from None


def remove_empty_default_folders(staging_root: str) -> None:
    """After the last rank folder of a default staging folder went: ``.../<run>/staging`` and ``.../<run>``
    if empty (another rank or run may still be using them: rmdir removes only empty folders). The
    per-user base stays: it is checked to be private when created, and must not be re-created
    with the default permissions by a racing job."""
    for folder in (staging_root, os.path.dirname(staging_root)):
        try:
            os.rmdir(folder)
        except OSError:
            return


def store_record(store: Any, backend_kwargs: Optional[Mapping[str, Any]]) -> StoreRecord:
    """What a journal records of ``store``: its URI and non-secret ``backend_kwargs`` (what ``drain``
    rebuilds it from), or, for a store without ``bucket_uri``, its class name."""
    uri = getattr(store, 'bucket_uri', None)
    custom = None
    if uri is None:
        cls = type(store)
        custom = f'{cls.__module__}.{cls.__qualname__}'
        return StoreRecord('c' + hashlib.sha1(custom.encode()).hexdigest()[:10], None, {}, custom)
    uri = persistable_uri(uri)
    kwargs = persistable_kwargs(backend_kwargs)
    if 'endpoint_url' not in kwargs and getattr(store, 'endpoint_url', None):
        kwargs['endpoint_url'] = store.endpoint_url
    digest = hashlib.sha1(json.dumps([uri, kwargs], sort_keys=True).encode()).hexdigest()[:10]
    return StoreRecord('u' + digest, uri, kwargs, custom)


class StagingBusyError(RuntimeError):
    """A rank's staging folder is held by another live process (an uploader or a drain)."""


def rank_dirs(staging_folder: str) -> dict[int, str]:
    """Rank -> ``<staging>/rank{r}`` for every rank folder present."""
    found: dict[int, str] = {}
    try:
        entries = os.listdir(staging_folder)
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.startswith('rank') and entry[4:].isdigit():
            path = os.path.join(staging_folder, entry)
            if os.path.isdir(path):
                found[int(entry[4:])] = path
    return dict(sorted(found.items()))


def _holds_current_lock(lock: object, path: str) -> bool:
    """Whether the locked file descriptor is still the file at ``path`` (not a deleted one)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    fd = getattr(getattr(lock, '_context', None), 'lock_file_fd', None)
    if fd is None:  # another filelock layout: the path exists, which is the best we can check
        return True
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _make_private_dirs(root: str, *private: str) -> None:
    """Create ``root`` (0o700 with any parent it needs; an existing folder is the user's choice) and the
    ``private`` folders below it with mode 0o700, whatever the umask; a private folder that exists
    with wider bits (made by an older version) is narrowed to 0o700."""
    make_dirs(root)
    for folder in private:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(f'staging: {folder} is not a folder (a symlink or a file is in its place)')
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(folder, 0o700, follow_symlinks=False)


class RankStaging:
    """Owns ``<root>/rank{rank}`` while open.

    Args:
        root: the staging folder.
        rank: the global rank whose subfolder this is.
        fsync: flush journal appends and snapshots to stable storage (survives machine crashes).
        lock_timeout: seconds to wait for the folder's lock (0: fail at once).

    Raises:
        StagingBusyError: another process holds the folder.
    """

    def __init__(self, root: str, rank: int, *, fsync: bool = False, lock_timeout: float = 0):
        import filelock

        self.root = os.path.abspath(root)
        self.rank = rank
        self.fsync = fsync
        self.dir = os.path.join(self.root, rank_folder_name(rank))
        self.files_dir = os.path.join(self.dir, FILES_FOLDER)
        self.journal_path = os.path.join(self.dir, JOURNAL_NAME)
        self._lock_path = os.path.join(self.dir, '.lock')
        # A closing owner with nothing pending deletes the folder, lock file included (see close):
        # a lock taken on a lock file that was deleted meanwhile, or a folder that vanished under
        # makedirs, means "start again".
        for _ in range(10):
            try:
                _make_private_dirs(self.root, self.dir, self.files_dir)
            except FileNotFoundError:
                continue
            self._lock = filelock.FileLock(self._lock_path, mode=0o600, thread_local=False)
            try:
                self._lock.acquire(timeout=lock_timeout)
            except filelock.Timeout:
                raise StagingBusyError(
                    f'staging folder {self.dir} is in use by another live process (an uploader '
                    'or a drain); use a different upload_staging_folder or wait for it to '
                    'finish'
                ) from None
            if _holds_current_lock(self._lock, self._lock_path) and os.path.isdir(self.files_dir):
                break
            self._lock.release()
        else:
            raise StagingBusyError(f'staging folder {self.dir} keeps being removed while it is opened')
        self.dev = os.stat(self.files_dir).st_dev
        try:
            state = read_journal(self.journal_path)
            if state.torn_lines:
                log.warning(
                    '%s: ignored %d unreadable journal line(s) (a process was killed while writing)',
                    self.journal_path,
                    state.torn_lines,
                )
            self._remove_orphans(state)
            compact(self.journal_path, state, fsync=fsync)
            self.recovered: JournalState = state
            self.journal = Journal(self.journal_path, fsync=fsync, state=read_journal(self.journal_path))
        except BaseException:
            self._lock.release()
            raise
        self._ids = itertools.count(state.max_id + 1)
        self._closed = False
        self.removed = False

    def _remove_orphans(self, state: JournalState) -> None:
        wanted = {str(record.id) for record in state.pending.values() if record.src is None}
        for entry in os.listdir(self.files_dir):
            if entry not in wanted:
                try:
                    os.unlink(os.path.join(self.files_dir, entry))
                except OSError:
                    pass
        for record in state.pending.values():
            if not os.path.exists(self.path_of(record)):
                log.warning(
                    '%s: the file of pending upload %r (%s) is missing; it will fail',
                    self.dir,
                    record.name,
                    self.path_of(record),
                )

    def next_id(self) -> int:
        """A fresh upload id (thread-safe)."""
        return next(self._ids)

    def snapshot_path(self, upload_id: int) -> str:
        """Where the snapshot of upload ``upload_id`` lives."""
        return f'{self.files_dir}{os.sep}{upload_id}'

    def path_of(self, record: QueuedRecord) -> str:
        """The file a journal record uploads: its snapshot, or the original for an in-place hand-over."""
        return record.src if record.src is not None else self.snapshot_path(record.id)

    def finish(self, upload_id: int, path: str) -> None:
        """Record upload ``upload_id`` as done, then delete its snapshot (never an in-place original)."""
        self.journal.append_done(upload_id)
        if os.path.dirname(path) == self.files_dir:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def pending(self) -> JournalState:
        """What the journal on disk says is still pending."""
        return read_journal(self.journal_path)

    def close(self) -> JournalState:
        """Close the journal, compact it to what is still pending, release the lock; returns what is pending.

        With nothing pending the rank's folder is deleted (:attr:`removed` tells), so a run
        whose uploads all landed leaves no staging behind. A file in it that is not ours keeps it.
        """
        if self._closed:
            return read_journal(self.journal_path)
        self._closed = True
        try:
            self.journal.close()
            state = read_journal(self.journal_path)
            self._remove_orphans(state)
            compact(self.journal_path, state, fsync=self.fsync)
            if not state.pending:
                self.removed = self._remove_folder()
            return state
        finally:
            self._lock.release()

    def _remove_folder(self) -> bool:
        # Under the lock, lock file last but one: whoever opened the old lock file and gets it after
        # us sees it is gone (_holds_current_lock) and starts again. rmdir removes only empty folders.
        try:
            os.rmdir(self.files_dir)
            os.unlink(self._lock_path)
            os.rmdir(self.dir)
        except OSError as exc:
            log.debug('%s stays: %s', self.dir, exc)
            return False
        return True

    def __repr__(self) -> str:
        return f'RankStaging({self.dir!r})'
