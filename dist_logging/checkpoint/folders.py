"""Folder commits: a folder uploaded through an :class:`~dist_logging.upload.Uploader` becomes visible as one object.

What ``RemoteUploaderDownloader.upload_folder(commit=True)`` (and ``Logger.upload_folder``) runs for
a checkpoint folder that is not a DCP one (an HF ``save_pretrained`` folder, a Lightning checkpoint
directory): the committed version of the folder is un-committed first (so its files are never seen
half replaced), the files are queued, then a background committer writes the commit marker once
every file is in the bucket with its size, the rule :class:`~dist_logging.checkpoint.CheckpointWriter`
follows (see ``docs/checkpoints.md``). Imports no torch.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional, Union

from dist_logging.checkpoint._committer import Committer
from dist_logging.checkpoint._intents import write_intent
from dist_logging.checkpoint._layout import check_checkpoint_id
from dist_logging.checkpoint._paths import INTENTS_FOLDER, scratch_folder
from dist_logging.checkpoint.commit import retry, uncommit

__all__ = ['FolderCommits', 'folder_files', 'check_folder_id']


def check_folder_id(folder_id: Union[str, 'os.PathLike[str]']) -> str:
    """The folder's name in the bucket, checked as a checkpoint id (no ``..``, not empty, ...).

    Raises:
        ValueError: not a valid checkpoint id (naming it).
    """
    return check_checkpoint_id(folder_id)


def folder_files(local_dir: Union[str, 'os.PathLike[str]']) -> dict[str, str]:
    """Relative name (``/``-separated) -> path of every regular file below ``local_dir``, sorted (symbolic
    links to files are followed, links to folders are not).

    Raises:
        NotADirectoryError: ``local_dir`` is not a folder.
        ValueError: it holds no files.
    """
    local = os.path.abspath(os.fspath(local_dir))
    if not os.path.isdir(local):
        raise NotADirectoryError(f'upload_folder: {local!r} is not a folder')
    files = {}
    for folder, subfolders, names in os.walk(local):
        subfolders.sort()
        for entry in sorted(names):
            path = os.path.join(folder, entry)
            if os.path.isfile(path):
                files[os.path.relpath(path, local).replace(os.sep, '/')] = path
    if not files:
        raise ValueError(f'upload_folder: {local!r} holds no files')
    return files


class FolderCommits:
    """Commits the folders whose files were queued on ``uploader``, each once all of them landed.

    A commit that fails (a file failed for good, or did not land within ``timeout``) is reported
    through :meth:`Uploader.report_failure <dist_logging.upload.Uploader.report_failure>`: it is
    raised with the upload failures at the next upload or at the uploader's shutdown, which also
    waits for the commits (a close hook).

    Args:
        uploader: the started :class:`~dist_logging.upload.Uploader` the files go through.
        timeout: seconds a folder may wait for its files before its commit fails.

    Raises:
        TypeError: the uploader's store has no ``list``/``delete``.
    """

    def __init__(self, uploader: Any, timeout: float = 600.0):
        store = uploader.object_store
        if not callable(getattr(store, 'list', None)) or not callable(getattr(store, 'delete', None)):
            raise TypeError(f'upload_folder(commit=True) needs a store with list and delete; {store!r} has not')
        self.uploader = uploader
        self.timeout = timeout
        self._lock = threading.Lock()
        self._committer: Optional[Committer] = None

    def uncommit(self, folder_id: str) -> None:
        """Make the committed version of ``folder_id`` invisible (one listing and a delete, on this thread)."""
        store, policy = self.uploader.object_store, self.uploader.retry_policy
        uncommit(store, folder_id, retry(store, lambda: store.list(f'{folder_id}/'), policy), policy)

    def commit(self, folder_id: str, sizes: dict[str, int]) -> None:
        """Record the folder's commit intent (relative name -> size of each file) and hand it to the committer."""
        uploader = self.uploader
        with self._lock:
            if self._committer is None:
                self._committer = Committer(
                    uploader.object_store,
                    scratch_folder(uploader.upload_staging_folder),
                    self.timeout,
                    uploader.failed_uploads,
                    self._on_commit,
                )
                uploader.add_landed_listener(self._committer.nudge)
                uploader.add_close_hook(self._close)
        record = uploader.store_record
        intent = write_intent(
            os.path.join(uploader.staging_folder, INTENTS_FOLDER),
            folder_id,
            sizes,
            time.time_ns(),
            metadata=None,
            bucket_uri=record.uri,
            backend_kwargs=record.kwargs,
            kind='folder',
            fsync=uploader.fsync,
        )
        self._committer.submit(intent)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every folder handed over committed or failed; False on timeout."""
        committer = self._committer
        return True if committer is None else committer.wait(timeout)

    def _on_commit(self, intent: Any, error: Optional[BaseException], *args: Any) -> None:
        if error is None:
            return
        for name, exc in (getattr(error, 'failures', None) or {intent.checkpoint_id: error}).items():
            self.uploader.report_failure(name, exc)

    def _close(self, aborted: bool) -> None:
        committer = self._committer
        if committer is None:
            return
        self.uploader.remove_landed_listener(committer.nudge)
        if aborted:
            committer.abort()
            return
        committer.wait()
        committer.close()
        try:
            os.rmdir(os.path.join(self.uploader.staging_folder, INTENTS_FOLDER))  # only when empty
        except OSError:
            pass
