"""RemoteUploaderDownloader: Composer's upload/download destination, a thin Logger destination over an
:class:`~dist_logging.upload.Uploader` (non-blocking, crash-durable uploads to an object store)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from dist_logging import _private_dirs, dist
from dist_logging.destination import LoggerDestination
from dist_logging.errors import UploadError
from dist_logging.naming import DIST_PLACEHOLDERS, format_name_with_dist, validate_object_name, validate_template
from dist_logging.object_store import ObjectStore
from dist_logging.upload.retry import call_with_retries
from dist_logging.upload.staging import default_staging_folder
from dist_logging.upload.uploader import Uploader

if TYPE_CHECKING:
    import pathlib

    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['RemoteUploaderDownloader', 'default_staging_folder']

_PROGRESS_MIN_BYTES = 4 * 1024 * 1024


def _uploaders(name: str, doc: str, *, settable: bool = False) -> property:
    """A property of the destination that is its uploader's attribute ``name``."""

    def set_(self: 'RemoteUploaderDownloader', value: Any) -> None:
        setattr(self.uploader, name, value)

    return property(lambda self: getattr(self.uploader, name), set_ if settable else None, doc=doc)


class RemoteUploaderDownloader(LoggerDestination):
    """Uploads files to an object store in the background; durable against the death of the process.

    The Logger destination of :class:`~dist_logging.upload.Uploader` (its :attr:`uploader`): it adds
    the rank policy, object names from ``file_path_format_string``, Composer's API
    (``upload_file``, ``download_file``, ``remote_backend``...) and folder uploads. ``upload_file``
    snapshots the file into this rank's staging folder (a reflink or an in-kernel copy with
    ``copy=True``; a hard link with ``copy=False``), appends one line to the rank's journal, hands
    the upload to a worker and returns. Workers upload with retries on transient errors; a failure
    is raised as :class:`~dist_logging.UploadError` at the next ``upload_file`` call or at close,
    and its file stays in the staging folder. A process killed with uploads pending loses nothing:
    a new uploader on the same staging folder resumes them, and ``python -m dist_logging drain
    STAGING`` uploads them without a job. See ``docs/uploads.md``.

    Args:
        bucket_uri: where objects go: ``'s3://bucket/prefix'``, ``'file:///abs/path'`` or a
            local path. Exactly one of ``bucket_uri`` and ``object_store`` is required.
        object_store: a custom :class:`~dist_logging.object_store.ObjectStore` instance
            (thread-safe; picklable, from an importable module, with ``use_procs=True``).
        backend_kwargs: keyword arguments for the store built from ``bucket_uri`` (e.g.
            ``{'endpoint_url': ...}`` for S3). Names that look secret are never written to disk.
        file_path_format_string: template for the object name, with ``{remote_file_name}``
            and the rank placeholders (``{run_name}``, ``{rank}``...).
        num_concurrent_uploads: upload workers per rank (>= 1).
        upload_staging_folder: where snapshots and journals live (each rank uses
            ``<folder>/rank{rank}``); default :func:`default_staging_folder` of the run name.
            Put it on the filesystem of the files you upload so ``copy=False`` can hard-link.
        num_attempts: attempts per upload, with exponential backoff and jitter (>= 1).
        use_procs: run the workers as child processes instead of threads.
        ranks: rank policy (default ``'all'``: every rank uploads its own files).
        max_staged_bytes: when set, ``upload_file(copy=True)`` waits (warning once) while the
            snapshots waiting to be uploaded would exceed this many bytes. Nothing is dropped.
        upload_priority: ``'idle'`` (default): workers run under ``SCHED_IDLE`` at nice 19 and
            the lowest best-effort I/O priority, per worker thread on Linux, so uploads use the
            CPU the training step leaves idle and hand a core back at once when a training
            thread wakes. ``'low'``: nice 19 and the lowest I/O priority only. ``'normal'``:
            workers keep the priority of the process. See ``docs/uploads.md`` (other platforms,
            measurements).

    Attributes:
        uploader: the :class:`~dist_logging.upload.Uploader` doing the uploads (built from the
            arguments above; a :class:`~dist_logging.checkpoint.CheckpointWriter` given this
            destination shares it).
        retry_policy: the uploader's :class:`~dist_logging.upload.retry.RetryPolicy` (may be replaced
            before the first upload, e.g. to shorten backoffs).
        fsync: flush snapshots and journal records to stable storage at every call, so queued
            uploads survive a machine crash too (default False: durable against process death;
            the environment variable ``DIST_LOGGING_UPLOAD_FSYNC=1`` also turns it on).
        staging_dir: this rank's staging folder, once started.
        commit_timeout: seconds a folder of ``upload_folder(commit=True)`` may wait for its files.

    Raises:
        ValueError: no store or two stores, an unsupported URI scheme (named), a bad template,
            ``num_concurrent_uploads``/``num_attempts``/``max_staged_bytes`` out of range, an
            unknown ``ranks`` or ``upload_priority``, or a custom store that ``use_procs=True``
            cannot send to a process.
        TypeError: ``object_store`` is not an ObjectStore-like object.
        ImportError: the store's optional dependency is missing (with an install hint).
    """

    ranks = 'all'

    def __init__(
        self,
        bucket_uri: Optional[str] = None,
        *,
        object_store: Optional[ObjectStore] = None,
        backend_kwargs: Optional[dict[str, Any]] = None,
        file_path_format_string: str = '{remote_file_name}',
        num_concurrent_uploads: int = 4,
        upload_staging_folder: Optional[str] = None,
        num_attempts: int = 3,
        use_procs: bool = False,
        ranks: str = 'all',
        max_staged_bytes: Optional[int] = None,
        upload_priority: str = 'idle',
    ):
        super().__init__(ranks=ranks)
        self.uploader = Uploader(
            bucket_uri,
            object_store=object_store,
            backend_kwargs=backend_kwargs,
            upload_staging_folder=upload_staging_folder,
            num_concurrent_uploads=num_concurrent_uploads,
            num_attempts=num_attempts,
            use_procs=use_procs,
            max_staged_bytes=max_staged_bytes,
            upload_priority=upload_priority,
        )
        validate_template(file_path_format_string, DIST_PLACEHOLDERS + ('remote_file_name',))
        self.file_path_format_string = file_path_format_string
        self._plain_names = file_path_format_string == '{remote_file_name}'
        self.commit_timeout = 600.0
        self._folders: Any = None  # FolderCommits for upload_folder(commit=True), made on first use
        self._started = False  # a plain flag: upload_file checks it on every call
        self._folders_lock = threading.Lock()

    # ------------------------------------------------------------------ the uploader's settings
    # Read through to self.uploader (the one owner of them); retry_policy and fsync may be set here too.
    object_store = _uploaders('object_store', 'The object store uploads go to.')
    bucket_uri = _uploaders('bucket_uri', "The store's URI (None for an ``object_store=`` without one).")
    retry_policy = _uploaders(
        'retry_policy', "The uploader's RetryPolicy (may be replaced before the first upload).", settable=True
    )
    fsync = _uploaders('fsync', 'Whether snapshots and journal records are fsynced at every call.', settable=True)
    staging_dir = _uploaders(
        'staging_dir', "This rank's staging folder (``<upload_staging_folder>/rank{rank}``), once started."
    )
    upload_staging_folder = _uploaders(
        'upload_staging_folder', 'The ``upload_staging_folder`` given (absolute), or None for the run\'s default.'
    )
    num_concurrent_uploads = _uploaders('num_concurrent_uploads', 'Upload workers per rank.')
    use_procs = _uploaders('use_procs', 'Whether the workers are processes.')
    max_staged_bytes = _uploaders('max_staged_bytes', 'The staging bound of ``upload_file(copy=True)``, or None.')
    upload_priority = _uploaders('upload_priority', "The workers' CPU and I/O priority.")
    uploaded_count = _uploaders('uploaded_count', 'Uploads that landed so far.')
    _run_name = _uploaders('run_name', 'The run name the uploader started with (names objects with ``{run_name}``).')

    # Composer's names for the store and its URI.
    @property
    def remote_backend(self) -> ObjectStore:
        """The object store uploads go to (the same object as ``object_store``)."""
        return self.uploader.object_store

    def _uri_parts(self) -> Optional[tuple[str, str]]:
        match = re.match(r'^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)', self.bucket_uri or '')
        return (match.group(1).lower(), match.group(2)) if match else None

    @property
    def remote_backend_name(self) -> Optional[str]:
        """The store's URI scheme (``'s3'``, ``'file'``, ``'gs'``, ...); None for an ``object_store=``
        that has no ``bucket_uri``."""
        parts = self._uri_parts()
        return parts[0] if parts else None

    @property
    def remote_bucket_name(self) -> Optional[str]:
        """The bucket (``'my-bucket'`` for ``s3://my-bucket/runs``; ``''`` for a local folder); None for
        an ``object_store=`` that has no ``bucket_uri``."""
        parts = self._uri_parts()
        return parts[1] if parts else None

    def get_uri_for_file(self, remote_file_name: str) -> str:
        """The URI of the object a file uploaded as ``remote_file_name`` is stored at.

        The name goes through ``file_path_format_string`` as an upload's does (a leading ``/``
        is dropped, as in Composer), then through the store's ``get_uri``.

        Raises:
            ValueError: a name that is no valid object name (``..``, empty, ...).
        """
        name = validate_object_name(remote_file_name.lstrip('/'))
        return self.object_store.get_uri(self._object_name(name))

    # ------------------------------------------------------------------ lifecycle
    def can_upload_files(self) -> bool:
        return True

    def init(self, state: 'State', logger: 'Logger') -> None:
        self.start(state.run_name)

    def start(self, run_name: Optional[str] = None) -> None:
        """Open this rank's staging folder and start the workers now (``init`` or the first upload otherwise
        does); ``run_name`` names the default staging folder. Idempotent: a started uploader keeps its run name.

        Raises:
            RuntimeError: the uploader is closed.
            StagingBusyError: another live process holds this rank's staging folder.
        """
        self.uploader.start(run_name)
        self._started = True

    def close(self, state: 'State', logger: 'Logger') -> None:
        """Nothing: uploads are awaited in :meth:`post_close`, after every destination's close had its say."""

    def post_close(self) -> None:
        """Wait for every pending upload (a progress bar after a couple of seconds), stop the workers.

        Issues no collective. Raises:
            UploadError: uploads that failed and were not yet reported; their files stay in staging.
        """
        self.shutdown()

    def shutdown(self) -> None:
        """Wait for every upload and folder commit, stop the workers, compact the journal, release the
        staging folder (:meth:`Uploader.shutdown <dist_logging.upload.Uploader.shutdown>`).

        Idempotent. Ctrl-C while waiting stops at once: what did not land stays in staging.

        Raises:
            UploadError: failed uploads (and folder commits) not yet reported by an ``upload_file`` call.
        """
        self.uploader.shutdown()

    def failed_uploads(self) -> dict[str, BaseException]:
        """Object name -> error, for uploads that failed for good and were not superseded (reported or not)."""
        return self.uploader.failed_uploads()

    def wait_for_uploads(self, timeout: Optional[float] = None) -> bool:
        """Block until every upload queued so far landed or failed, and every folder handed to
        ``upload_folder(commit=True)`` committed or failed; False on timeout (never raises for failures)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.uploader.wait_for_uploads(timeout):
            return False
        folders = self._folders
        return folders is None or folders.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def add_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(object_name)`` (on an upload worker's thread; keep it short, it must not raise)
        each time an upload lands. A committer uses it to look at the bucket again at once."""
        self.uploader.add_landed_listener(listener)

    def remove_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener``; no error if it was not added."""
        self.uploader.remove_landed_listener(listener)

    # ------------------------------------------------------------------ uploads
    def _object_name(self, remote_file_name: str, run_name: Optional[str] = None) -> str:
        if self._plain_names:
            return remote_file_name
        return validate_object_name(
            format_name_with_dist(
                self.file_path_format_string,
                run_name or self.uploader.run_name or '',
                remote_file_name=remote_file_name,
            )
        )

    def upload_file(
        self,
        state: 'State',
        remote_file_name: str,
        file_path: Union[str, 'pathlib.Path'],
        *,
        overwrite: bool = False,
        copy: bool = True,
    ) -> None:
        """Snapshot ``file_path`` and queue its upload as ``remote_file_name``; returns at once.

        Args:
            state: the run state.
            remote_file_name: the (already validated) name, formatted through ``file_path_format_string``.
            file_path: the file.
            overwrite: whether an existing object may be replaced.
            copy: True snapshots the file (reflink/in-kernel copy); False hard-links it (the caller
                promises not to modify or delete it; across filesystems the original is used in place).

        Raises:
            FileExistsError: ``overwrite=False`` and this uploader has an upload of the name pending,
                failed or just landed (a name queued by an earlier process, found in staging on
                resume, is superseded instead, with a ``RuntimeWarning``: see ``docs/uploads.md``).
            FileNotFoundError: the file does not exist.
            UploadError: earlier uploads failed (this call's file was still queued).
            RuntimeError: the uploader is closed.
        """
        if not self._started:
            self.start(state.run_name if state is not None else None)
        self.uploader.enqueue(file_path, self._object_name(remote_file_name), copy=copy, overwrite=overwrite)

    # ------------------------------------------------------------------ folders
    def upload_folder(
        self,
        state: 'State',
        remote_prefix: str,
        local_dir: Union[str, 'pathlib.Path'],
        *,
        commit: bool = True,
        copy: bool = True,
    ) -> list[str]:
        """Queue every file under ``local_dir`` as ``<remote_prefix>/<relative path>``; with ``commit``, make
        the folder visible as one object once every file landed (the checkpoint commit rule).

        For a folder that is a checkpoint but not a DCP one (an HF ``save_pretrained`` folder, a
        Lightning checkpoint directory): :func:`dist_logging.checkpoint.latest_checkpoint` finds
        it once committed. With ``commit`` a committed folder of that name is first un-committed
        (one listing and a delete, on the calling thread), so its files are never seen half
        replaced; the files are then queued like ``upload_file`` calls (``overwrite=True``), and
        a background committer writes the commit marker after all of them landed with their
        sizes (:class:`dist_logging.checkpoint.folders.FolderCommits`). Returns at once;
        :meth:`shutdown` waits for the commit too.

        Args:
            state: the run state.
            remote_prefix: the folder's name in the bucket (formatted through
                ``file_path_format_string`` like file names).
            local_dir: the folder; every regular file below it is uploaded (symbolic links
                to files are followed, links to folders are not).
            commit: commit the folder (needs a store with ``list`` and ``delete``).
            copy: as in :meth:`upload_file`.

        Returns:
            The object names queued.

        Raises:
            NotADirectoryError: ``local_dir`` is not a folder.
            ValueError: an empty folder, a bad prefix, or a ``file_path_format_string`` that does
                not keep the folder's files under one prefix.
            TypeError: ``commit=True`` with a store that has no ``list``/``delete``.
            UploadError: earlier uploads failed (this folder's files were still queued).
        """
        from dist_logging.checkpoint.folders import FolderCommits, check_folder_id, folder_files

        files = folder_files(local_dir)
        prefix = check_folder_id(remote_prefix)
        if not self._started:
            self.start(state.run_name if state is not None else None)
        cid = self._object_name(prefix)
        names = {rel: self._object_name(f'{prefix}/{rel}') for rel in files}
        outside = [name for name in names.values() if not name.startswith(cid + '/')]
        if outside:
            raise ValueError(
                f'upload_folder: file_path_format_string {self.file_path_format_string!r} puts '
                f'{outside[0]!r} outside the folder {cid!r}; use a template that only prefixes names'
            )
        folders = None
        if commit:
            with self._folders_lock:
                if self._folders is None:
                    self._folders = FolderCommits(self.uploader, self.commit_timeout)
                folders = self._folders
            folders.uncommit(cid)
        sizes = {rel: os.stat(path).st_size for rel, path in files.items()}
        earlier: Optional[UploadError] = None
        for rel, path in files.items():
            try:
                self.uploader.enqueue(path, names[rel], copy=copy, overwrite=True)
            except UploadError as exc:  # earlier uploads failed: raised once the folder is handed over
                earlier = earlier or exc
        if folders is not None:
            folders.commit(cid, sizes)
        if earlier is not None:
            raise earlier
        return list(names.values())

    # ------------------------------------------------------------------ downloads
    def download_file(
        self, remote_file_name: str, destination: str, overwrite: bool = False, progress_bar: bool = True
    ) -> None:
        """Download ``remote_file_name`` to ``destination`` (temp file, then rename into place).

        When several processes of a machine ask for the same object at the same path, one
        downloads (under a file lock) and the others wait and reuse its file. The lock and the
        "already downloaded" marker live in ``downloads/`` of this user's private folder (see
        :mod:`dist_logging._private_dirs`; in ``upload_staging_folder`` when one was given and
        ``DIST_LOGGING_TMPDIR`` is not set); a marker is trusted only there, only if it is a
        0600 file of this user, and only if it names this run, this object and the very file at
        ``destination`` (inode, size, mtime). Any other marker is ignored: the object is fetched
        again. A progress bar is shown on global rank zero for objects over 4 MiB.

        Raises:
            FileNotFoundError: no such object.
            FileExistsError: ``destination`` exists and ``overwrite`` is False (and it is not the
                file another process of this run just downloaded).
            PermissionError: the private folder, or a lock or marker in it, is not this user's
                (names it, says why and how to choose another place).
        """
        import filelock

        name = self._object_name(remote_file_name, self._run_name)
        destination = os.path.abspath(os.fspath(destination))
        uri = self.object_store.get_uri(name)
        key = hashlib.sha1(destination.encode()).hexdigest()[:24]
        lock_dir = _private_dirs.private_dir('downloads', root=_private_dirs.state_dir(self.upload_staging_folder))
        marker = os.path.join(lock_dir, key + '.json')
        with filelock.FileLock(os.path.join(lock_dir, key + '.lock'), mode=0o600, thread_local=False):
            _private_dirs.check_private_dir(lock_dir)  # the lock is ours: nobody swapped the folder meanwhile
            if os.path.exists(destination):
                if self._reusable(marker, destination, uri):
                    return
                if not overwrite:
                    raise FileExistsError(f'{destination} exists; pass overwrite=True to replace it')
            size = call_with_retries(
                lambda _: self.object_store.get_object_size(name), self.retry_policy, store=self.object_store
            )
            bar = None
            if progress_bar and size > _PROGRESS_MIN_BYTES and dist.get_global_rank() == 0:
                from tqdm.auto import tqdm

                bar = tqdm(total=size, unit='B', unit_scale=True, desc=f'downloading {name}', leave=False)

            def progress(done: int, total: int) -> None:
                bar.update(done - bar.n)  # type: ignore[union-attr]

            def attempt(_: int) -> None:
                if bar is not None:
                    bar.reset()
                self.object_store.download_object(
                    name, destination, overwrite=True, callback=progress if bar is not None else None
                )

            try:
                call_with_retries(attempt, self.retry_policy, store=self.object_store)
            finally:
                if bar is not None:
                    bar.close()
            stat = os.stat(destination)
            record = {
                'run': self._run_name,
                'uri': uri,
                'ino': stat.st_ino,
                'size': stat.st_size,
                'mtime_ns': stat.st_mtime_ns,
                'time': time.time(),
            }
            tmp = f'{marker}.{os.getpid()}.{threading.get_ident()}.tmp'
            try:
                os.unlink(tmp)  # left by a killed process of the same pid
            except FileNotFoundError:
                pass
            with os.fdopen(_private_dirs.create_private_file(tmp), 'w') as handle:
                json.dump(record, handle)
            os.replace(tmp, marker)

    def _reusable(self, marker: str, destination: str, uri: str) -> bool:
        # The file at `destination` is the one another process of this run downloaded from `uri`
        # (and nobody touched it since): reuse it instead of downloading again. The marker must be
        # a private file of ours (open_private_file); anything else that does not match is ignored.
        try:
            with os.fdopen(_private_dirs.open_private_file(marker), 'r') as handle:
                record = json.load(handle)
            stat = os.stat(destination)
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        return (
            record.get('run') == self._run_name
            and self._run_name is not None
            and record.get('uri') == uri
            and record.get('ino') == stat.st_ino
            and record.get('size') == stat.st_size
            and record.get('mtime_ns') == stat.st_mtime_ns
        )

    def __repr__(self) -> str:
        return f'RemoteUploaderDownloader({self.bucket_uri or self.object_store!r}, ranks={self.ranks!r})'
