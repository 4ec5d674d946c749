"""RemoteUploaderDownloader: non-blocking, crash-durable uploads to an object store (and downloads)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

from dist_logging import _private_dirs, dist
from dist_logging.destination import LoggerDestination
from dist_logging.errors import UploadError
from dist_logging.naming import DIST_PLACEHOLDERS, format_name_with_dist, validate_object_name, validate_template
from dist_logging.object_store import ObjectStore, persistable_kwargs, persistable_uri, split_bucket_uri, store_from_uri
from dist_logging.upload.node_slots import ENV_VAR as _SLOTS_VAR, parse_slots
from dist_logging.upload.rate_limit import ENV_VAR as _RATE_VAR, parse_byte_rate
from dist_logging.upload.priority import check_priority
from dist_logging.upload.journal import StoreRecord
from dist_logging.upload.retry import RetryPolicy, call_with_retries
from dist_logging.upload.snapshot import copy_file, fsync_dir, link_file
from dist_logging.upload.staging import RankStaging
from dist_logging.upload.workers import UploadScheduler, UploadTask

if TYPE_CHECKING:
    import pathlib

    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['RemoteUploaderDownloader', 'default_staging_folder']

log = logging.getLogger(__name__)

_PROGRESS_MIN_BYTES = 4 * 1024 * 1024
_CLOSE_BAR_AFTER = 2.0


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


def _remove_empty_default_folders(staging_root: str) -> None:
    """After the last rank folder of a default staging folder went: ``.../<run>/staging`` and ``.../<run>``
    if empty (another rank or run may still be using them: rmdir removes only empty folders). The
    per-user base stays: it is checked to be private when created, and must not be re-created
    with the default permissions by a racing job."""
    for folder in (staging_root, os.path.dirname(staging_root)):
        try:
            os.rmdir(folder)
        except OSError:
            return


def _store_record(store: ObjectStore, backend_kwargs: Optional[Mapping[str, Any]]) -> StoreRecord:
    uri = getattr(store, 'bucket_uri', None)
    custom = None
    if uri is None:
        cls = type(store)
        custom = f'{cls.__module__}.{cls.__qualname__}'
        return StoreRecord('c' + hashlib.sha1(custom.encode()).hexdigest()[:10], None, {}, custom)
    uri = persistable_uri(uri)
    kwargs = persistable_kwargs(backend_kwargs)
    if 'endpoint_url' not in kwargs and getattr(store, 'endpoint_url', None):
        kwargs['endpoint_url'] = store.endpoint_url  # type: ignore[attr-defined]
    digest = hashlib.sha1(json.dumps([uri, kwargs], sort_keys=True).encode()).hexdigest()[:10]
    return StoreRecord('u' + digest, uri, kwargs, custom)


class RemoteUploaderDownloader(LoggerDestination):
    """Uploads files to an object store in the background; durable against the death of the process.

    ``upload_file`` snapshots the file into this rank's staging folder (a reflink or an
    in-kernel copy with ``copy=True``; a hard link with ``copy=False``), appends one line to
    the rank's journal, hands the upload to a worker and returns. Workers upload with
    retries on transient errors; a failure is raised as :class:`~dist_logging.UploadError`
    at the next ``upload_file`` call or at close, and its file stays in the staging folder.
    A process killed with uploads pending loses nothing: a new uploader on the same staging
    folder resumes them, and ``python -m dist_logging drain STAGING`` uploads them without a job.
    See ``docs/uploads.md``.

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
        retry_policy: the :class:`~dist_logging.upload.retry.RetryPolicy` (may be replaced before
            the first upload, e.g. to shorten backoffs).
        fsync: flush snapshots and journal records to stable storage at every call, so queued
            uploads survive a machine crash too (default False: durable against process death;
            the environment variable ``DIST_LOGGING_UPLOAD_FSYNC=1`` also turns it on).
        staging_dir: this rank's staging folder, once started.

    Raises:
        ValueError: no store or two stores, an unsupported URI scheme (named), a bad template,
            ``num_concurrent_uploads``/``num_attempts``/``max_staged_bytes`` out of range, an
            unknown ``ranks`` or ``upload_priority``, or a custom store that ``use_procs=True``
            cannot send to a process.
        TypeError: ``object_store`` is not an ObjectStore-like object.
        ImportError: the store's optional dependency is missing (with an install hint).
    """

    ranks = 'all'

    def __init__(self, bucket_uri: Optional[str] = None, *, object_store: Optional[ObjectStore] = None,
                 backend_kwargs: Optional[dict[str, Any]] = None,
                 file_path_format_string: str = '{remote_file_name}', num_concurrent_uploads: int = 4,
                 upload_staging_folder: Optional[str] = None, num_attempts: int = 3, use_procs: bool = False,
                 ranks: str = 'all', max_staged_bytes: Optional[int] = None, upload_priority: str = 'idle'):
        super().__init__(ranks=ranks)
        try:
            self.upload_priority = check_priority(upload_priority)
        except ValueError as exc:
            raise ValueError(f'RemoteUploaderDownloader: {exc}') from None
        if (bucket_uri is None) == (object_store is None):
            raise ValueError('RemoteUploaderDownloader: pass exactly one of bucket_uri and object_store')
        if object_store is not None:
            if backend_kwargs:
                raise ValueError('RemoteUploaderDownloader: backend_kwargs only applies to a bucket_uri store')
            for method in ('upload_object', 'download_object', 'get_object_size', 'get_uri'):
                if not callable(getattr(object_store, method, None)):
                    raise TypeError(f'object_store {object_store!r} has no {method}(); see dist_logging.object_store.ObjectStore')
            self.object_store = object_store
        else:
            if backend_kwargs is not None and not isinstance(backend_kwargs, Mapping):
                raise TypeError(f'backend_kwargs must be a dict, got {type(backend_kwargs).__name__}')
            split_bucket_uri(bucket_uri)  # ValueError naming a bad scheme, before any import
            self.object_store = store_from_uri(bucket_uri, backend_kwargs)
        self.bucket_uri = getattr(self.object_store, 'bucket_uri', None)
        validate_template(file_path_format_string, DIST_PLACEHOLDERS + ('remote_file_name',))
        self.file_path_format_string = file_path_format_string
        self._plain_names = file_path_format_string == '{remote_file_name}'
        for label, value in (('num_concurrent_uploads', num_concurrent_uploads), ('num_attempts', num_attempts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'RemoteUploaderDownloader: {label} must be an int >= 1, got {value!r}')
        if max_staged_bytes is not None and (isinstance(max_staged_bytes, bool) or not isinstance(max_staged_bytes, int)
                                             or max_staged_bytes < 1):
            raise ValueError(f'RemoteUploaderDownloader: max_staged_bytes must be a positive int or None, '
                             f'got {max_staged_bytes!r}')
        if upload_staging_folder is not None and not isinstance(upload_staging_folder, (str, os.PathLike)):
            raise TypeError(f'upload_staging_folder must be a path, got {type(upload_staging_folder).__name__}')
        self.use_procs = bool(use_procs)
        if self.use_procs:
            cls = type(self.object_store)
            if cls.__module__ == '__main__':
                raise ValueError(f'use_procs=True: the store class {cls.__qualname__} is defined in __main__, which '
                                 'worker processes cannot import; move it to a module')
            try:
                pickle.dumps(self.object_store)
            except Exception as exc:  # noqa: BLE001
                raise ValueError(f'use_procs=True needs a picklable object_store; {self.object_store!r}: {exc}') from exc
        self.num_concurrent_uploads = num_concurrent_uploads
        self.upload_staging_folder = os.path.abspath(os.fspath(upload_staging_folder)) if upload_staging_folder else None
        self.max_staged_bytes = max_staged_bytes
        self.retry_policy = RetryPolicy(num_attempts=num_attempts)
        self.fsync = os.environ.get('DIST_LOGGING_UPLOAD_FSYNC', '') not in ('', '0', 'false', 'False')
        # A bad cap fails here, not on a worker; their folders are made when an upload needs them.
        parse_slots(os.environ.get(_SLOTS_VAR, ''))
        if os.environ.get(_RATE_VAR, '').strip():
            parse_byte_rate(os.environ[_RATE_VAR])
        self._store_record = _store_record(self.object_store, backend_kwargs)

        self._start_lock = threading.Lock()
        self._staging: Optional[RankStaging] = None
        self._scheduler: Optional[UploadScheduler] = None
        self._run_name: Optional[str] = None
        self._closed = False
        self._queued_names: set[str] = set()
        self._leftover_names: set[str] = set()  # queued by an earlier process, not yet superseded by a call
        self._failed: dict[str, tuple[UploadTask, BaseException]] = {}  # name -> newest failure
        self._unraised: dict[str, BaseException] = {}
        self._fail_lock = threading.Lock()
        self._budget = threading.Condition(threading.Lock())
        self._staged_bytes = 0
        self._counted: dict[int, int] = {}
        self._warned_full = False
        self.uploaded_count = 0
        self._landed_listeners: list[Callable[[str], None]] = []
        self._committer: Any = None  # commits upload_folder(commit=True) folders, created on first use
        self.commit_timeout = 600.0  # seconds a folder may wait for its files before its commit fails

    # ------------------------------------------------------------------ lifecycle
    def can_upload_files(self) -> bool:
        return True

    @property
    def staging_dir(self) -> Optional[str]:
        """This rank's staging folder (``<upload_staging_folder>/rank{rank}``), once started."""
        return self._staging.dir if self._staging is not None else None

    # Composer's names for the store and its URI.
    @property
    def remote_backend(self) -> ObjectStore:
        """The object store uploads go to (the same object as ``object_store``)."""
        return self.object_store

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
        return self.object_store.get_uri(self._object_name(name, self._run_name))

    def init(self, state: 'State', logger: 'Logger') -> None:
        self._start(state.run_name)

    def _start(self, run_name: Optional[str]) -> None:
        with self._start_lock:
            if self._staging is not None:
                return
            if self._closed:
                raise RuntimeError('this RemoteUploaderDownloader is closed')
            self._run_name = run_name
            root = self.upload_staging_folder
            if root is None:
                root = default_staging_folder(run_name or 'standalone')
            staging = RankStaging(root, dist.get_global_rank(), fsync=self.fsync)
            try:
                scheduler = UploadScheduler(self.object_store, self.retry_policy, self.num_concurrent_uploads,
                                            use_procs=self.use_procs, on_done=self._on_done,
                                            on_failed=self._on_failed, on_superseded=self._on_superseded,
                                            name=f'upload-rank{staging.rank}', priority=self.upload_priority)
            except BaseException:
                staging.close()
                raise
            staging.journal.append_store(self._store_record)
            self._staging, self._scheduler = staging, scheduler
            self._resume(staging)

    def _matches(self, record: StoreRecord) -> bool:
        mine = self._store_record
        return record.uri == mine.uri if mine.uri is not None else record.custom == mine.custom

    def _resume(self, staging: RankStaging) -> None:
        recovered = staging.recovered
        if not recovered.pending:
            return
        mine = {sid for sid, record in recovered.stores.items() if self._matches(record)}
        foreign = [r for r in recovered.pending.values() if r.sid not in mine]
        if foreign:
            warnings.warn(f'{staging.dir}: {len(foreign)} pending upload(s) queued for another store stay in '
                          f'staging (use `python -m dist_logging drain`): {sorted(r.name for r in foreign)[:10]}',
                          RuntimeWarning, stacklevel=3)
        resumed = [r for r in recovered.pending.values() if r.sid in mine]
        if resumed:
            log.warning('%s: resuming %d upload(s) left by an earlier process', staging.dir, len(resumed))
        for record in resumed:
            # Re-point the record at this session's store line, so compaction keeps it.
            if record.sid != self._store_record.sid:
                staging.journal.append_done(record.id)
                staging.journal.append_queued(record.id, record.name, record.size, record.overwrite,
                                              self._store_record.sid, record.src, record.owned)
            self._queued_names.add(record.name)
            self._leftover_names.add(record.name)
            self._scheduler.submit(UploadTask(record.id, record.name, staging.path_of(record), record.size,  # type: ignore[union-attr]
                                              record.overwrite, resumed=True,
                                              owned=record.owned and record.src is None,
                                              staging_folder=self.upload_staging_folder))

    def close(self, state: 'State', logger: 'Logger') -> None:
        """Nothing: uploads are awaited in :meth:`post_close`, after every destination's close had its say."""

    def post_close(self) -> None:
        """Wait for every pending upload (a progress bar after a couple of seconds), stop the workers.

        Issues no collective. Raises:
            UploadError: uploads that failed and were not yet reported; their files stay in staging.
        """
        self.shutdown()

    def shutdown(self) -> None:
        """Wait for every upload, stop the workers, compact the journal, release the staging folder.

        Idempotent. Ctrl-C while waiting stops at once: what did not land stays in staging.

        Raises:
            UploadError: failed uploads not yet reported by an ``upload_file`` call.
        """
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        scheduler, staging = self._scheduler, self._staging
        if scheduler is not None and staging is not None:
            try:
                self._wait_with_progress(scheduler)
                if self._committer is not None:  # folders commit once their files landed
                    self._committer.wait()
                    self._committer.close()
                    try:
                        os.rmdir(os.path.join(staging.root, 'checkpoint-commits'))  # only when empty
                    except OSError:
                        pass
                scheduler.shutdown()
            except BaseException:
                if self._committer is not None:
                    self._committer.abort()
                scheduler.shutdown(abort=True, timeout=5)
                staging.close()
                raise
            left = staging.close()
            if left.pending:
                log.warning('%s keeps %d upload(s) that did not land', staging.dir, len(left.pending))
            elif staging.removed and self.upload_staging_folder is None:
                _remove_empty_default_folders(staging.root)
        try:
            close = getattr(self.object_store, 'close', None)  # optional for a Composer-written store
            if close is not None:
                close()
        except Exception as exc:  # noqa: BLE001
            log.warning('closing %r failed: %s', self.object_store, exc)
        self._raise_failures(final=True)

    def _wait_with_progress(self, scheduler: UploadScheduler) -> None:
        if scheduler.wait(_CLOSE_BAR_AFTER):
            return
        bar = None
        if dist.get_global_rank() == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=scheduler.outstanding, desc='waiting for uploads', unit='file', leave=False)
        else:
            log.info('rank %d: waiting for %d upload(s)', dist.get_global_rank(), scheduler.outstanding)
        try:
            start = scheduler.outstanding
            while not scheduler.wait(0.5):
                if bar is not None:
                    bar.total = max(bar.total, scheduler.outstanding)
                    bar.n = max(0, start - scheduler.outstanding)
                    bar.refresh()
        finally:
            if bar is not None:
                bar.close()

    def start(self, run_name: Optional[str] = None) -> None:
        """Open this rank's staging folder and start the workers now (``init`` or the first upload otherwise
        does); ``run_name`` names the default staging folder. Idempotent: a started uploader keeps its run name.

        Raises:
            RuntimeError: the uploader is closed.
            StagingBusyError: another live process holds this rank's staging folder.
        """
        self._start(run_name)

    def failed_uploads(self) -> dict[str, BaseException]:
        """Object name -> error, for uploads that failed for good and were not superseded (reported or not)."""
        with self._fail_lock:
            return {name: error for name, (_, error) in self._failed.items()}

    def wait_for_uploads(self, timeout: Optional[float] = None) -> bool:
        """Block until every upload queued so far landed or failed; False on timeout (never raises for failures)."""
        return self._scheduler.wait(timeout) if self._scheduler is not None else True

    # ------------------------------------------------------------------ worker callbacks
    def _release(self, task: UploadTask) -> None:
        if self.max_staged_bytes is not None:
            with self._budget:
                self._staged_bytes -= self._counted.pop(task.id, 0)
                self._budget.notify_all()

    def add_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(object_name)`` (on an upload worker's thread; keep it short, it must not raise)
        each time an upload lands. A committer uses it to look at the bucket again at once."""
        self._landed_listeners.append(listener)

    def remove_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener``; no error if it was not added."""
        if listener in self._landed_listeners:
            self._landed_listeners.remove(listener)

    def _on_done(self, task: UploadTask) -> None:
        self._staging.finish(task.id, task.path)  # type: ignore[union-attr]
        self._release(task)
        self.uploaded_count += 1
        for listener in list(self._landed_listeners):
            try:
                listener(task.name)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the upload that landed
                log.exception('landed-upload listener %r failed', listener)
        with self._fail_lock:
            earlier = self._failed.get(task.name)
            if earlier is not None and earlier[0].id < task.id:
                # A newer upload of the name landed: the older failure has nothing left to deliver.
                del self._failed[task.name]
                self._unraised.pop(task.name, None)
            else:
                earlier = None
        if earlier is not None:
            self._staging.finish(earlier[0].id, earlier[0].path)  # type: ignore[union-attr]

    def _on_failed(self, task: UploadTask, error: BaseException) -> None:
        log.error('upload of %r failed: %s: %s (the file stays in %s)', task.name, type(error).__name__, error,
                  self.staging_dir)
        self._release(task)
        with self._fail_lock:
            self._failed[task.name] = (task, error)
            self._unraised[task.name] = error

    def _on_superseded(self, task: UploadTask) -> None:
        self._staging.finish(task.id, task.path)  # type: ignore[union-attr]
        self._release(task)

    def _raise_failures(self, final: bool = False) -> None:
        if not self._unraised:
            return
        with self._fail_lock:
            failures, self._unraised = self._unraised, {}
        where = f'; their files stay in {self.staging_dir} (retry with `python -m dist_logging drain ' \
                f'{os.path.dirname(self.staging_dir)}`)' if self.staging_dir else ''
        error = UploadError(failures)
        error.add_note(f'{len(failures)} upload(s) to {self.bucket_uri or self.object_store!r} failed{where}')
        if not final:
            error.add_note('the file of the call that raised this was queued normally')
        raise error

    # ------------------------------------------------------------------ uploads
    def _object_name(self, remote_file_name: str, run_name: Optional[str]) -> str:
        if self._plain_names:
            return remote_file_name
        return validate_object_name(format_name_with_dist(self.file_path_format_string, run_name or '',
                                                          remote_file_name=remote_file_name))

    def upload_file(self, state: 'State', remote_file_name: str, file_path: Union[str, 'pathlib.Path'], *,
                    overwrite: bool = False, copy: bool = True) -> None:
        """Snapshot ``file_path`` and queue its upload as ``remote_file_name``; returns at once.

        Args:
            state: the run state.
            remote_file_name: the (already validated) name, formatted through ``file_path_format_string``.
            file_path: the file.
            overwrite: whether an existing object may be replaced.
            copy: True snapshots the file (reflink/in-kernel copy); False hard-links it (the caller
                promises not to modify or delete it; across filesystems the original is used in place).

        Raises:
            FileExistsError: ``overwrite=False`` and this uploader already queued the name (a name
                queued by an earlier process, found in staging on resume, is superseded instead,
                with a ``RuntimeWarning``: see ``docs/uploads.md``).
            FileNotFoundError: the file does not exist.
            UploadError: earlier uploads failed (this call's file was still queued).
            RuntimeError: the uploader is closed.
        """
        scheduler, staging = self._scheduler, self._staging
        if scheduler is None or staging is None:
            self._start(state.run_name if state is not None else None)
            scheduler, staging = self._scheduler, self._staging
        if self._closed:
            raise RuntimeError('this RemoteUploaderDownloader is closed')
        name = self._object_name(remote_file_name, self._run_name)
        if name in self._leftover_names:
            self._supersede_leftover(name, staging)
        elif not overwrite and name in self._queued_names:
            raise FileExistsError(f'upload_file({name!r}, overwrite=False): this rank already queued that name')
        path = os.fspath(file_path)
        if copy and self.max_staged_bytes is not None:
            self._wait_for_space(os.stat(path).st_size)
        upload_id = staging.next_id()  # type: ignore[union-attr]
        snapshot = staging.snapshot_path(upload_id)  # type: ignore[union-attr]
        src = None
        try:
            if copy:
                size = copy_file(path, snapshot, fsync=self.fsync, dst_dev=staging.dev)[0]  # type: ignore[union-attr]
            elif link_file(path, snapshot):
                size = -1  # not needed on the call path; whoever needs it stats the file
            else:
                src = snapshot = os.path.abspath(path)  # across filesystems: upload the original in place
                size = os.stat(src).st_size
            if self.fsync:
                fsync_dir(staging.files_dir)  # type: ignore[union-attr]
            staging.journal.append_queued(upload_id, name, size, overwrite, self._store_record.sid, src,  # type: ignore[union-attr]
                                          copy)
        except OSError as exc:
            # E.g. the staging disk is full: nothing may stay half-done (no snapshot without its
            # record, no half record), and the caller learns where and what, then may go on.
            if src is None:
                try:
                    os.unlink(snapshot)
                except OSError:
                    pass
            if exc.filename is None:
                exc.filename = staging.files_dir  # type: ignore[union-attr]
            exc.add_note(f'upload_file({name!r}): could not stage {path!r} in {staging.dir}; '  # type: ignore[union-attr]
                         'nothing was queued')
            raise
        self._queued_names.add(name)
        if copy and self.max_staged_bytes is not None:
            with self._budget:
                self._staged_bytes += size
                self._counted[upload_id] = size
        scheduler.submit(UploadTask(upload_id, name, snapshot, size, overwrite, owned=copy,  # type: ignore[union-attr]
                                    staging_folder=self.upload_staging_folder))
        if self._unraised:
            self._raise_failures()

    def _supersede_leftover(self, name: str, staging: RankStaging) -> None:
        # A restarted job is never refused by its own leftovers: the scheduler drops or replaces the
        # earlier process's upload of this name (UploadScheduler.submit); a failure of it not yet
        # reported is dropped too, since this call's file replaces it.
        self._leftover_names.discard(name)
        with self._fail_lock:
            earlier = self._failed.get(name)
            if earlier is not None and earlier[0].resumed:
                del self._failed[name]
                self._unraised.pop(name, None)
            else:
                earlier = None
        if earlier is not None:
            staging.finish(earlier[0].id, earlier[0].path)
        warnings.warn(f'upload_file({name!r}) supersedes the upload of that name that an earlier process left '
                      f'queued in {staging.dir}: the new file wins', RuntimeWarning, stacklevel=4)

    def _wait_for_space(self, size: int) -> None:
        limit = self.max_staged_bytes
        with self._budget:
            if self._staged_bytes == 0 or self._staged_bytes + size <= limit:  # type: ignore[operator]
                return
            if not self._warned_full:
                self._warned_full = True
                warnings.warn(f'upload staging holds {self._staged_bytes} bytes, max_staged_bytes={limit}: '
                              'upload_file waits for uploads to finish (warned once)', RuntimeWarning, stacklevel=4)
            self._budget.wait_for(lambda: self._staged_bytes == 0 or self._staged_bytes + size <= limit)  # type: ignore[operator]

    # ------------------------------------------------------------------ folders
    def upload_folder(self, state: 'State', remote_prefix: str, local_dir: Union[str, 'pathlib.Path'], *,
                      commit: bool = True, copy: bool = True) -> list[str]:
        """Queue every file under ``local_dir`` as ``<remote_prefix>/<relative path>``; with ``commit``, make
        the folder visible as one object once every file landed (the checkpoint commit rule).

        For a folder that is a checkpoint but not a DCP one (an HF ``save_pretrained`` folder, a
        Lightning checkpoint directory): :func:`dist_logging.checkpoint.latest_checkpoint` finds
        it once committed. With ``commit`` a committed folder of that name is first un-committed
        (one listing and a delete, on the calling thread), so its files are never seen half
        replaced; the files are then queued like ``upload_file`` calls (``overwrite=True``), and
        a background committer writes the commit marker after all of them landed with their
        sizes. Returns at once; :meth:`shutdown` waits for the commit too.

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
        from dist_logging.checkpoint._layout import check_checkpoint_id

        local = os.path.abspath(os.fspath(local_dir))
        if not os.path.isdir(local):
            raise NotADirectoryError(f'upload_folder: {local!r} is not a folder')
        prefix = check_checkpoint_id(remote_prefix)
        files = {}
        for folder, subfolders, names in os.walk(local):
            subfolders.sort()
            for entry in sorted(names):
                path = os.path.join(folder, entry)
                if os.path.isfile(path):
                    files[os.path.relpath(path, local).replace(os.sep, '/')] = path
        if not files:
            raise ValueError(f'upload_folder: {local!r} holds no files')
        if self._scheduler is None:
            self._start(state.run_name if state is not None else None)
        cid = self._object_name(prefix, self._run_name)
        names = {rel: self._object_name(f'{prefix}/{rel}', self._run_name) for rel in files}
        outside = [name for name in names.values() if not name.startswith(cid + '/')]
        if outside:
            raise ValueError(f'upload_folder: file_path_format_string {self.file_path_format_string!r} puts '
                             f'{outside[0]!r} outside the folder {cid!r}; use a template that only prefixes names')
        if commit:
            from dist_logging.checkpoint.commit import retry, uncommit

            store = self.object_store
            if not callable(getattr(store, 'list', None)) or not callable(getattr(store, 'delete', None)):
                raise TypeError(f'upload_folder(commit=True) needs a store with list and delete; {store!r} has not')
            uncommit(store, cid, retry(store, lambda: store.list(f'{cid}/'), self.retry_policy), self.retry_policy)
        sizes = {rel: os.stat(path).st_size for rel, path in files.items()}
        earlier: Optional[UploadError] = None
        for rel, path in files.items():
            try:
                self.upload_file(state, f'{prefix}/{rel}', path, overwrite=True, copy=copy)
            except UploadError as exc:
                earlier = earlier or exc
        if commit:
            self._commit_folder(cid, sizes)
        if earlier is not None:
            raise earlier
        return list(names.values())

    def _commit_folder(self, cid: str, sizes: dict[str, int]) -> None:
        from dist_logging.checkpoint._committer import Committer
        from dist_logging.checkpoint._intents import INTENTS_FOLDER, write_intent
        from dist_logging.checkpoint._paths import scratch_folder

        with self._start_lock:
            if self._committer is None:
                self._committer = Committer(self.object_store, scratch_folder(self.upload_staging_folder), self.commit_timeout,
                                            self.failed_uploads, self._on_folder_commit)
                self.add_landed_listener(self._committer.nudge)
        folder = os.path.join(os.path.dirname(self.staging_dir), INTENTS_FOLDER)  # type: ignore[arg-type]
        intent = write_intent(folder, cid, sizes, time.time_ns(), metadata=None, bucket_uri=self._store_record.uri,
                              backend_kwargs=self._store_record.kwargs, kind='folder', fsync=self.fsync)
        self._committer.submit(intent)

    def _on_folder_commit(self, intent: Any, error: Optional[BaseException], *args: Any) -> None:
        if error is None:
            return
        with self._fail_lock:
            for name, exc in (getattr(error, 'failures', None) or {intent.checkpoint_id: error}).items():
                self._unraised[name] = exc

    # ------------------------------------------------------------------ downloads
    def download_file(self, remote_file_name: str, destination: str, overwrite: bool = False,
                      progress_bar: bool = True) -> None:
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
            size = call_with_retries(lambda _: self.object_store.get_object_size(name), self.retry_policy,
                                     store=self.object_store)
            bar = None
            if progress_bar and size > _PROGRESS_MIN_BYTES and dist.get_global_rank() == 0:
                from tqdm.auto import tqdm

                bar = tqdm(total=size, unit='B', unit_scale=True, desc=f'downloading {name}', leave=False)

            def progress(done: int, total: int) -> None:
                bar.update(done - bar.n)  # type: ignore[union-attr]

            def attempt(_: int) -> None:
                if bar is not None:
                    bar.reset()
                self.object_store.download_object(name, destination, overwrite=True,
                                                  callback=progress if bar is not None else None)

            try:
                call_with_retries(attempt, self.retry_policy, store=self.object_store)
            finally:
                if bar is not None:
                    bar.close()
            stat = os.stat(destination)
            record = {'run': self._run_name, 'uri': uri, 'ino': stat.st_ino, 'size': stat.st_size,
                      'mtime_ns': stat.st_mtime_ns, 'time': time.time()}
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
        return (record.get('run') == self._run_name and self._run_name is not None and record.get('uri') == uri
                and record.get('ino') == stat.st_ino and record.get('size') == stat.st_size
                and record.get('mtime_ns') == stat.st_mtime_ns)

    def __repr__(self) -> str:
        return f'RemoteUploaderDownloader({self.bucket_uri or self.object_store!r}, ranks={self.ranks!r})'
