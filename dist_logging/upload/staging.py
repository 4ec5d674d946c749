"""A rank's staging folder: ``<staging>/rank{r}/`` with its lock, journal and snapshots.

Layout::

    <staging>/rank{r}/.lock            filelock held while an uploader (or a drain) owns the folder
    <staging>/rank{r}/journal.jsonl    queued/done records (see dist_logging.upload.journal)
    <staging>/rank{r}/files/<id>       snapshots (copies or hard links) waiting to be uploaded

Opening a :class:`RankStaging` takes the lock (failing at once if another live
process holds it), reads the journal, deletes snapshots no pending record refers
to (left by a process killed between snapshot and record, or after an upload
finished), and compacts the journal. Closing it with nothing pending deletes the rank's folder.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat

from dist_logging._private_dirs import make_dirs
from dist_logging.upload.journal import JOURNAL_NAME, Journal, JournalState, QueuedRecord, compact, read_journal

__all__ = ['RankStaging', 'StagingBusyError', 'rank_dirs']

log = logging.getLogger(__name__)


class StagingBusyError(RuntimeError):
    """A rank's staging folder is held by another live process (an uploader or a drain)."""


def rank_dirs(staging_folder: str) -> dict[int, str]:
    """Rank -> ``<staging>/rank{r}`` for every rank folder present."""
    found = {}
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
        self.dir = os.path.join(self.root, f'rank{rank}')
        self.files_dir = os.path.join(self.dir, 'files')
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
                raise StagingBusyError(f'staging folder {self.dir} is in use by another live process (an uploader '
                                       'or a drain); use a different upload_staging_folder or wait for it to '
                                       'finish') from None
            if _holds_current_lock(self._lock, self._lock_path) and os.path.isdir(self.files_dir):
                break
            self._lock.release()
        else:
            raise StagingBusyError(f'staging folder {self.dir} keeps being removed while it is opened')
        self.dev = os.stat(self.files_dir).st_dev
        try:
            state = read_journal(self.journal_path)
            if state.torn_lines:
                log.warning('%s: ignored %d unreadable journal line(s) (a process was killed while writing)',
                            self.journal_path, state.torn_lines)
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
                log.warning('%s: the file of pending upload %r (%s) is missing; it will fail',
                            self.dir, record.name, self.path_of(record))

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

