"""Uploader: the public upload port of a rank. Everything that uploads files goes through one.

Like :class:`logging.handlers.QueueHandler` and ``QueueListener``: a small, cheap queue between the
producer (a Logger destination, the checkpoint writer) and the I/O threads. The producer hands a
complete file over (:meth:`Uploader.enqueue`, a reflink/copy or a hard link into the rank's staging
folder plus one journal line) and goes on; workers upload it with retries at a lowered priority; a
failure is raised at the producer's next call or at :meth:`Uploader.shutdown`. The staging folder
layout, the journal, the workers, retries, priority, the staging bound (``max_staged_bytes``),
landed/failed callbacks, resume after a crash and the drain of a dead process's staging all live
here, once. See ``docs/uploads.md``.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import threading
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Union

from dist_logging.errors import UploadError
from dist_logging.object_store import ObjectStore, split_bucket_uri, store_from_uri
from dist_logging.upload._progress import (
    FATAL_STALL_SECONDS,
    process_fatal_error,
    wait_while_landing,
    wait_with_progress,
)
from dist_logging.upload.journal import StoreRecord
from dist_logging.upload.node_slots import ENV_VAR as _SLOTS_VAR, parse_slots
from dist_logging.upload.priority import check_priority
from dist_logging.upload.rate_limit import ENV_VAR as _RATE_VAR, parse_byte_rate
from dist_logging.upload.retry import RetryPolicy
from dist_logging._files import copy_file, fsync_dir, link_file, links_work
from dist_logging.upload.staging import RankStaging, default_staging_folder, remove_empty_default_folders, store_record
from dist_logging.upload.workers import UploadScheduler, UploadTask

__all__ = ['Uploader', 'UploadCallback', 'default_staging_folder']

log = logging.getLogger(__name__)

UploadCallback = Callable[[str, Optional[BaseException]], None]
# The last names enqueued with overwrite=False, for which a second overwrite=False enqueue is refused at the
# call even once the first landed. Older ones (and names queued with overwrite=True, once landed) are refused
# by the store when that upload runs (an UploadError at a later call): remembering every name ever queued
# would grow by one per upload for the life of the process.
RECENT_NAMES = 1024


class _GaveUp(Exception):
    """(Internal) close stopped waiting for uploads that do not land after a fatal error."""


def _check_int(label: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{label} must be {"a positive int or None" if optional else "an int >= 1"}, got {value!r}')


class Uploader:
    """A rank's background uploads to one object store, durable against the death of the process.

    Thread-safe. :meth:`enqueue` snapshots the file into this rank's staging folder
    (``<upload_staging_folder>/rank{rank}/files/<id>``: a reflink or in-kernel copy with
    ``copy=True``, a hard link with ``copy=False``), appends one line to the rank's journal, hands
    the upload to a worker and returns. A process killed with uploads pending loses nothing: the
    next ``Uploader`` on the same staging folder resumes them, and :meth:`drain` (``python -m
    dist_logging drain STAGING``) uploads them without a job.

    Args:
        bucket_uri: where objects go: ``'s3://bucket/prefix'``, ``'file:///abs/path'`` or a local
            path. Exactly one of ``bucket_uri`` and ``object_store`` is required.
        object_store: a custom :class:`~dist_logging.object_store.ObjectStore` instance
            (thread-safe; picklable, from an importable module, with ``use_procs=True``).
        backend_kwargs: keyword arguments for the store built from ``bucket_uri`` (e.g.
            ``{'endpoint_url': ...}`` for S3). Names that look secret are never written to disk.
        upload_staging_folder: where snapshots and journals live (each rank uses
            ``<folder>/rank{rank}``); default :func:`default_staging_folder` of the run name. Put it
            on the filesystem of the files you upload so ``copy=False`` can hard-link.
        num_concurrent_uploads: upload workers (>= 1).
        num_attempts: attempts per upload, with exponential backoff and jitter (>= 1).
        use_procs: run the workers as child processes instead of threads.
        max_staged_bytes: when set, ``enqueue(copy=True)`` waits (warning once) while the bytes
            waiting to be uploaded would exceed this many. Nothing is dropped.
        upload_priority: ``'idle'`` (default), ``'low'`` or ``'normal'``: the workers' CPU and I/O
            priority (see ``docs/uploads.md``).
        run_name: names the default staging folder (when :meth:`start` is given none).
        fsync: flush snapshots and journal records to stable storage at every call, so queued
            uploads survive a machine crash too. None (default): on only when the environment
            variable ``DIST_LOGGING_UPLOAD_FSYNC=1`` is set.

    Attributes:
        object_store: the store.
        bucket_uri: the store's URI (None for a custom store without one).
        retry_policy: the :class:`~dist_logging.upload.retry.RetryPolicy` (may be replaced before
            the first upload, e.g. to shorten backoffs).
        fsync: see above (may be changed before the first upload).
        uploaded_count: uploads that landed so far.

    Raises:
        ValueError: no store or two stores, an unsupported URI scheme (named), a count out of
            range, an unknown ``upload_priority``, a bad ``DIST_LOGGING_UPLOAD_*`` cap, or a custom
            store that ``use_procs=True`` cannot send to a process.
        TypeError: ``object_store`` is not an ObjectStore-like object, or an argument of the wrong type.
        ImportError: the store's optional dependency is missing (with an install hint).
    """

    def __init__(
        self,
        bucket_uri: Optional[Union[str, 'os.PathLike[str]']] = None,
        *,
        object_store: Optional[ObjectStore] = None,
        backend_kwargs: Optional[Mapping[str, Any]] = None,
        upload_staging_folder: Optional[Union[str, 'os.PathLike[str]']] = None,
        num_concurrent_uploads: int = 4,
        num_attempts: int = 3,
        use_procs: bool = False,
        max_staged_bytes: Optional[int] = None,
        upload_priority: str = 'idle',
        run_name: Optional[str] = None,
        fsync: Optional[bool] = None,
    ):
        self.upload_priority = check_priority(upload_priority)
        if (bucket_uri is None) == (object_store is None):
            raise ValueError('pass exactly one of bucket_uri and object_store')
        if object_store is not None:
            if backend_kwargs:
                raise ValueError('backend_kwargs only applies to a bucket_uri store')
            for method in ('upload_object', 'download_object', 'get_object_size', 'get_uri'):
                if not callable(getattr(object_store, method, None)):
                    raise TypeError(
                        f'object_store {object_store!r} has no {method}(); see dist_logging.object_store.ObjectStore'
                    )
            self.object_store = object_store
        else:
            if backend_kwargs is not None and not isinstance(backend_kwargs, Mapping):
                raise TypeError(f'backend_kwargs must be a dict, got {type(backend_kwargs).__name__}')
            uri = os.fspath(bucket_uri)  # type: ignore[arg-type]
            split_bucket_uri(uri)  # ValueError naming a bad scheme, before any import
            self.object_store = store_from_uri(uri, backend_kwargs)
        self.bucket_uri: Optional[str] = getattr(self.object_store, 'bucket_uri', None)
        _check_int('num_concurrent_uploads', num_concurrent_uploads)
        _check_int('num_attempts', num_attempts)
        _check_int('max_staged_bytes', max_staged_bytes, optional=True)
        if upload_staging_folder is not None and not isinstance(upload_staging_folder, (str, os.PathLike)):
            raise TypeError(f'upload_staging_folder must be a path, got {type(upload_staging_folder).__name__}')
        if run_name is not None and not isinstance(run_name, str):
            raise TypeError(f'run_name must be a str, got {type(run_name).__name__}')
        self.use_procs = bool(use_procs)
        if self.use_procs:
            cls = type(self.object_store)
            if cls.__module__ == '__main__':
                raise ValueError(
                    f'use_procs=True: the store class {cls.__qualname__} is defined in __main__, which '
                    'worker processes cannot import; move it to a module'
                )
            try:
                pickle.dumps(self.object_store)
            except Exception as exc:  # noqa: BLE001
                raise ValueError(
                    f'use_procs=True needs a picklable object_store; {self.object_store!r}: {exc}'
                ) from exc
        self.num_concurrent_uploads = num_concurrent_uploads
        self.upload_staging_folder = (
            os.path.abspath(os.fspath(upload_staging_folder)) if upload_staging_folder else None
        )
        self.max_staged_bytes = max_staged_bytes
        self.run_name = run_name
        self.retry_policy = RetryPolicy(num_attempts=num_attempts)
        env_fsync = os.environ.get('DIST_LOGGING_UPLOAD_FSYNC', '') not in ('', '0', 'false', 'False')
        self.fsync = env_fsync or bool(fsync)
        # A bad cap fails here, not on a worker; their folders are made when an upload needs them.
        parse_slots(os.environ.get(_SLOTS_VAR, ''))
        if os.environ.get(_RATE_VAR, '').strip():
            parse_byte_rate(os.environ[_RATE_VAR])
        self.store_record: StoreRecord = store_record(self.object_store, backend_kwargs)
        self.uploaded_count = 0

        self._start_lock = threading.Lock()
        self._staging: Optional[RankStaging] = None
        self._scheduler: Optional[UploadScheduler] = None
        self._closed = False
        # Names: a second overwrite=False enqueue of one is refused while an upload of it is pending (the
        # scheduler knows), failed, or among the RECENT_NAMES last claimed. Memory stays flat over any run.
        self._names_lock = threading.Lock()
        self._recent_names: dict[str, None] = {}
        self._recent_order: collections.deque[str] = collections.deque()  # the same names, oldest first
        self._leftover_names: set[str] = set()  # queued by an earlier process, not yet superseded by a call
        self._failed: dict[str, tuple[UploadTask, BaseException]] = {}  # name -> newest failure
        self._unraised: dict[str, BaseException] = {}
        self._callbacks: dict[int, UploadCallback] = {}
        # The staging bound: bytes of the uploads in flight, one Condition woken by every landing.
        self._budget = threading.Condition(threading.Lock())
        self._staged_bytes = 0
        self._counted: dict[int, int] = {}
        self._warned_full = False
        self._pending_since: dict[int, tuple[float, int]] = {}  # upload id -> (time.time() queued, bytes)
        self._landed_listeners: list[Callable[[str], None]] = []
        self._close_hooks: list[Callable[[bool], None]] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def staging_dir(self) -> Optional[str]:
        """This rank's staging folder (``<staging_folder>/rank{rank}``), once started; else None."""
        return self._staging.dir if self._staging is not None else None

    @property
    def staging_folder(self) -> Optional[str]:
        """The staging folder shared by the ranks of a node (``upload_staging_folder`` or the run's default),
        once started; else None. Other rooms may keep their own folders next to the ``rank*`` folders."""
        return self._staging.root if self._staging is not None else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._closed

    def start(self, run_name: Optional[str] = None) -> None:
        """Open this rank's staging folder, resume what an earlier process left there, start the workers.

        The first :meth:`enqueue` does it otherwise. Idempotent: a started uploader keeps its run name.

        Args:
            run_name: names the default staging folder (default: the constructor's, else ``'standalone'``).

        Raises:
            RuntimeError: the uploader is closed.
            StagingBusyError: another live process holds this rank's staging folder.
            PermissionError: the default staging folder is not private to this user.
        """
        if self._staging is not None and not self._closed:
            return
        from dist_logging import dist  # imports torch: not at module level (upload workers import this package)

        with self._start_lock:
            if self._staging is not None:
                return
            if self._closed:
                raise RuntimeError('this Uploader is closed')
            if run_name is not None:
                self.run_name = run_name
            root = self.upload_staging_folder or default_staging_folder(self.run_name or 'standalone')
            staging = RankStaging(root, dist.get_global_rank(), fsync=self.fsync)
            try:
                scheduler = UploadScheduler(
                    self.object_store,
                    self.retry_policy,
                    self.num_concurrent_uploads,
                    use_procs=self.use_procs,
                    on_done=self._on_done,
                    on_failed=self._on_failed,
                    on_superseded=self._on_superseded,
                    name=f'upload-rank{staging.rank}',
                    priority=self.upload_priority,
                )
            except BaseException:
                staging.close()
                raise
            staging.journal.append_store(self.store_record)
            self._staging, self._scheduler = staging, scheduler
            self._resume(staging, scheduler)

    def _matches(self, record: StoreRecord) -> bool:
        mine = self.store_record
        return record.uri == mine.uri if mine.uri is not None else record.custom == mine.custom

    def _resume(self, staging: RankStaging, scheduler: UploadScheduler) -> None:
        recovered = staging.recovered
        if not recovered.pending:
            return
        mine = {sid for sid, record in recovered.stores.items() if self._matches(record)}
        foreign = [r for r in recovered.pending.values() if r.sid not in mine]
        if foreign:
            warnings.warn(
                f'{staging.dir}: {len(foreign)} pending upload(s) queued for another store stay in '
                f'staging (use `python -m dist_logging drain`): {sorted(r.name for r in foreign)[:10]}',
                RuntimeWarning,
                stacklevel=4,
            )
        resumed = [r for r in recovered.pending.values() if r.sid in mine]
        if resumed:
            log.warning('%s: resuming %d upload(s) left by an earlier process', staging.dir, len(resumed))
        for record in resumed:
            # Re-point the record at this session's store line, so compaction keeps it.
            if record.sid != self.store_record.sid:
                staging.journal.append_done(record.id)
                staging.journal.append_queued(
                    record.id,
                    record.name,
                    record.size,
                    record.overwrite,
                    self.store_record.sid,
                    record.src,
                    record.owned,
                )
            self._leftover_names.add(record.name)
            scheduler.submit(
                UploadTask(
                    record.id,
                    record.name,
                    staging.path_of(record),
                    record.size,  # type: ignore[union-attr]
                    record.overwrite,
                    resumed=True,
                    owned=record.owned and record.src is None,
                    staging_folder=self.upload_staging_folder,
                )
            )

    # ------------------------------------------------------------------ enqueue
    def enqueue(
        self,
        path: Union[str, 'os.PathLike[str]'],
        name: str,
        *,
        copy: bool = True,
        overwrite: bool = False,
        size: Optional[int] = None,
        callback: Optional[UploadCallback] = None,
    ) -> None:
        """Snapshot the complete file ``path`` and queue its upload as the object ``name``; returns at once.

        Args:
            path: the file (complete and closed).
            name: the object name, used as given (validate user input first, e.g. with
                :func:`dist_logging.naming.validate_object_name`).
            copy: True snapshots the file (reflink/in-kernel copy: the caller may change it at once);
                False hard-links it (the caller promises not to write to it again; across
                filesystems the original is uploaded in place, so it must not be deleted either).
            overwrite: whether an existing object may be replaced.
            size: the file's size when the caller knows it: a hard-linked file counts toward
                :attr:`staged_bytes` only with it (a copy is always counted).
            callback: ``callback(name, error)``, called once on a worker's thread (keep it short;
                it must not raise): ``error`` None when the bytes landed, or when a newer enqueue of
                the same name replaced this one before it started (that one's bytes are what the name
                will hold); else the error it failed with for good.

        Raises:
            FileExistsError: ``overwrite=False`` and this uploader has an upload of the name pending or
                failed, or the name is among the last ``RECENT_NAMES`` (1,024) enqueued with
                ``overwrite=False`` (a name an earlier process left queued is superseded instead, with a
                ``RuntimeWarning``). Other existing names are refused by the store when the upload
                runs (an ``UploadError`` at a later call).
            FileNotFoundError: the file does not exist.
            OSError: the file could not be staged (e.g. the staging disk is full): nothing was queued.
            UploadError: earlier uploads failed (this call's file was still queued).
            RuntimeError: the uploader is closed.
        """
        scheduler, staging = self._scheduler, self._staging
        if scheduler is None or staging is None:
            self.start()
            scheduler, staging = self._scheduler, self._staging
            assert scheduler is not None and staging is not None  # start() set both (they are never unset), or raised
        if self._closed:
            raise RuntimeError('this Uploader is closed')
        if name in self._leftover_names:
            self._supersede_leftover(name, staging)
        elif not overwrite and (scheduler.is_pending(name) or name in self._recent_names or name in self._failed):
            raise FileExistsError(f'upload of {name!r} with overwrite=False: this rank already queued that name')
        path = os.fspath(path)
        if copy and self.max_staged_bytes is not None:
            self.wait_for_room(os.stat(path).st_size)
        upload_id = staging.next_id()  # type: ignore[union-attr]
        snapshot = staging.snapshot_path(upload_id)  # type: ignore[union-attr]
        src = None
        try:
            if copy:
                size = copy_file(path, snapshot, fsync=self.fsync, dst_dev=staging.dev)[0]  # type: ignore[union-attr]
            elif link_file(path, snapshot):
                size = -1 if size is None else size  # not measured on the call path; the worker stats the file
            else:
                src = snapshot = os.path.abspath(path)  # across filesystems: upload the original in place
                size = os.stat(src).st_size
            if self.fsync:
                fsync_dir(staging.files_dir)  # type: ignore[union-attr]
            staging.journal.append_queued(  # type: ignore[union-attr]
                upload_id, name, size, overwrite, self.store_record.sid, src, copy
            )
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
            exc.add_note(
                f'upload of {name!r}: could not stage {path!r} in {staging.dir}; '  # type: ignore[union-attr]
                'nothing was queued'
            )
            raise
        if not overwrite and name not in self._recent_names:
            # A name claimed with overwrite=False: a repeat is refused at the call (RECENT_NAMES). No lock on
            # this path: a race between two producer threads can only make the window forget a name early.
            self._recent_names[name] = None
            order = self._recent_order
            order.append(name)
            if len(order) > RECENT_NAMES:
                self._recent_names.pop(order.popleft(), None)
        if callback is not None:
            self._callbacks[upload_id] = callback
        with self._budget:
            self._pending_since[upload_id] = (time.time(), max(size, 0))
            if size > 0:
                self._staged_bytes += size
                self._counted[upload_id] = size
        scheduler.submit(
            UploadTask(
                upload_id,
                name,
                snapshot,
                size,
                overwrite,
                owned=copy,  # type: ignore[union-attr]
                staging_folder=self.upload_staging_folder,
            )
        )
        if self._unraised:
            self._raise_failures()

    def _supersede_leftover(self, name: str, staging: RankStaging) -> None:
        # A restarted job is never refused by its own leftovers: the scheduler drops or replaces the
        # earlier process's upload of this name (UploadScheduler.submit); a failure of it not yet
        # reported is dropped too, since this call's file replaces it.
        with self._names_lock:
            self._leftover_names.discard(name)
            earlier = self._failed.get(name)
            if earlier is not None and earlier[0].resumed:
                del self._failed[name]
                self._unraised.pop(name, None)
            else:
                earlier = None
        if earlier is not None:
            staging.finish(earlier[0].id, earlier[0].path)
        warnings.warn(
            f'upload_file({name!r}) supersedes the upload of that name that an earlier process left '
            f'queued in {staging.dir}: the new file wins',
            RuntimeWarning,
            stacklevel=5,
        )

    def can_link(self, folder: Union[str, 'os.PathLike[str]']) -> bool:
        """Whether ``enqueue(copy=False)`` of a file in ``folder`` hard-links it into staging (same
        filesystem, links allowed) rather than uploading it in place. Starts the uploader.

        Raises:
            FileNotFoundError: ``folder`` does not exist.
        """
        self.start()
        return links_work(os.fspath(folder), self._staging.files_dir)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ the staging bound
    @property
    def staged_bytes(self) -> int:
        """Bytes of the uploads queued and not yet landed or failed (copies, and links given a ``size``)."""
        with self._budget:
            return self._staged_bytes

    def wait_for_room(
        self, nbytes: int, limit: Optional[int] = None, *, on_wait: Optional[Callable[[int, int], None]] = None
    ) -> None:
        """Block while :attr:`staged_bytes` is not 0 and ``staged_bytes + nbytes`` exceeds ``limit``.

        Woken by each landing (no polling). Returns at once when ``limit`` and ``max_staged_bytes``
        are None. A failed upload stops counting, so this never waits for what will not land.

        Args:
            nbytes: the bytes the caller is about to stage.
            limit: the bound (default: ``max_staged_bytes``).
            on_wait: called once, as ``on_wait(staged_bytes, limit)``, before this call blocks (default:
                a ``RuntimeWarning`` the first time this uploader waits).
        """
        limit = self.max_staged_bytes if limit is None else limit
        if limit is None:
            return

        def room() -> bool:
            return self._staged_bytes == 0 or self._staged_bytes + nbytes <= limit  # type: ignore[operator]

        with self._budget:
            if room():
                return
            staged = self._staged_bytes
        (on_wait or self._warn_full)(staged, limit)
        with self._budget:
            self._budget.wait_for(room)

    def _warn_full(self, staged: int, limit: int) -> None:
        if not self._warned_full:
            self._warned_full = True
            warnings.warn(
                f'upload staging holds {staged} bytes, max_staged_bytes={limit}: upload_file waits for '
                'uploads to finish (warned once)',
                RuntimeWarning,
                stacklevel=6,
            )

    # ------------------------------------------------------------------ results
    def add_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(object_name)`` (on an upload worker's thread; keep it short, it must not raise)
        each time an upload lands. A committer uses it to look at the bucket again at once."""
        self._landed_listeners.append(listener)

    def remove_landed_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener``; no error if it was not added."""
        if listener in self._landed_listeners:
            self._landed_listeners.remove(listener)

    def failed_uploads(self) -> dict[str, BaseException]:
        """Object name -> error, for uploads that failed for good and were not superseded (reported or not)."""
        with self._names_lock:
            return {name: error for name, (_, error) in self._failed.items()}

    def report_failure(self, name: str, error: BaseException) -> None:
        """Raise ``error`` for ``name`` with the upload failures, at the next :meth:`enqueue` or at
        :meth:`shutdown` (for work built on the uploads, e.g. a folder whose commit failed)."""
        with self._names_lock:
            self._unraised[name] = error

    def wait_for_uploads(self, timeout: Optional[float] = None) -> bool:
        """Block until every upload queued so far landed or failed; False on timeout (never raises for failures)."""
        return self._scheduler.wait(timeout) if self._scheduler is not None else True

    def pending_stats(self) -> tuple[int, int, float]:
        """The uploads queued by :meth:`enqueue` that have not landed or failed yet (any thread may call it).

        Returns:
            ``(count, bytes, age of the oldest in seconds)``; ``(0, 0, 0.0)`` when none is pending.
            ``bytes`` counts the files whose size is known (copies, and links given a ``size``).
        """
        with self._budget:
            pending = list(self._pending_since.values())
        if not pending:
            return 0, 0, 0.0
        return len(pending), sum(n for _, n in pending), max(time.time() - min(t for t, _ in pending), 0.0)

    def _finish(self, task: UploadTask, error: Optional[BaseException]) -> None:
        """What every end of an upload does: release its staged bytes and its callback."""
        if self._pending_since:
            with self._budget:
                self._pending_since.pop(task.id, None)
        if task.id in self._counted:
            with self._budget:
                self._staged_bytes -= self._counted.pop(task.id, 0)
                self._budget.notify_all()
        callback = self._callbacks.pop(task.id, None) if self._callbacks else None
        if callback is not None:
            try:
                callback(task.name, error)
            except Exception:  # noqa: BLE001 - a caller's bug must not fail the upload's bookkeeping
                log.exception('upload callback %r failed', callback)

    def _on_done(self, task: UploadTask) -> None:
        self._staging.finish(task.id, task.path)  # type: ignore[union-attr]
        self.uploaded_count += 1
        with self._names_lock:
            earlier = self._failed.get(task.name)
            if earlier is not None and earlier[0].id < task.id:
                # A newer upload of the name landed: the older failure has nothing left to deliver.
                del self._failed[task.name]
                self._unraised.pop(task.name, None)
            else:
                earlier = None
        self._finish(task, None)
        for listener in list(self._landed_listeners):
            try:
                listener(task.name)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the upload that landed
                log.exception('landed-upload listener %r failed', listener)
        if earlier is not None:
            self._staging.finish(earlier[0].id, earlier[0].path)  # type: ignore[union-attr]

    def _on_failed(self, task: UploadTask, error: BaseException) -> None:
        log.error(
            'upload of %r failed: %s: %s (the file stays in %s)',
            task.name,
            type(error).__name__,
            error,
            self.staging_dir,
        )
        with self._names_lock:
            self._failed[task.name] = (task, error)
            self._unraised[task.name] = error
        self._finish(task, error)

    def _on_superseded(self, task: UploadTask) -> None:
        self._staging.finish(task.id, task.path)  # type: ignore[union-attr]
        self._finish(task, None)

    def _raise_failures(self, final: bool = False) -> None:
        if not self._unraised:
            return
        with self._names_lock:
            failures, self._unraised = self._unraised, {}
        where = (
            f'; their files stay in {self.staging_dir} (retry with `python -m dist_logging drain '
            f'{os.path.dirname(self.staging_dir)}`)'
            if self.staging_dir
            else ''
        )
        error = UploadError(failures)
        error.add_note(f'{len(failures)} upload(s) to {self.bucket_uri or self.object_store!r} failed{where}')
        if not final:
            error.add_note('the file of the call that raised this was queued normally')
        raise error

    # ------------------------------------------------------------------ close
    def add_close_hook(self, hook: Callable[[bool], None]) -> None:
        """Call ``hook(False)`` in :meth:`shutdown` once every upload landed or failed, before the workers
        stop (work that needs the landed uploads: a folder commit); or ``hook(True)`` when the wait is
        interrupted (Ctrl-C): stop at once. A hook that raises on ``False`` makes the shutdown raise."""
        self._close_hooks.append(hook)

    def shutdown(self) -> None:
        """Wait for every upload (a progress bar after a couple of seconds), run the close hooks, stop the
        workers, compact the journal, release the staging folder, close the store.

        Idempotent. Issues no collective. Ctrl-C while waiting stops at once: what did not land stays in staging.
        After a fatal error in this process (``dist_logging.dist.note_fatal_error``: the job is ending), it waits
        only as long as uploads land: after ``FATAL_STALL_SECONDS`` (10 s) with none (an unreachable bucket) it
        stops the workers, and what did not land stays in staging for ``dist-logging drain`` (reported in the
        UploadError), instead of waiting out every upload's attempts and client timeouts (102 s seen).

        Raises:
            UploadError: failed uploads not yet reported by an :meth:`enqueue` call; their files stay in staging.
        """
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        scheduler, staging = self._scheduler, self._staging
        if scheduler is not None and staging is not None:
            try:
                fatal = process_fatal_error()
                if fatal is not None and not wait_while_landing(scheduler, lambda: self.uploaded_count):
                    log.warning(
                        '%s: no upload landed for %g s after a fatal error in this process (%s): the '
                        '%d upload(s) left stay in staging; deliver them with `dist-logging drain %s`',
                        self.bucket_uri or self.object_store,
                        FATAL_STALL_SECONDS,
                        type(fatal).__name__,
                        scheduler.outstanding,
                        os.path.dirname(self.staging_dir or '') or '<staging folder>',
                    )
                    raise _GaveUp()
                wait_with_progress(scheduler)
                for hook in self._close_hooks:
                    hook(False)
                scheduler.shutdown()
            except BaseException as exc:
                for hook in self._close_hooks:
                    try:
                        hook(True)
                    except Exception:  # noqa: BLE001 - already failing: the first error is the one raised
                        log.exception('upload close hook %r failed while aborting', hook)
                scheduler.shutdown(abort=True, timeout=5)
                staging.close()
                if isinstance(exc, _GaveUp):  # the uploads left failed as interrupted: raised below
                    return self._close_store_and_raise()
                raise
            left = staging.close()
            if left.pending:
                log.warning('%s keeps %d upload(s) that did not land', staging.dir, len(left.pending))
            elif staging.removed and self.upload_staging_folder is None:
                remove_empty_default_folders(staging.root)
        self._close_store_and_raise()

    def _close_store_and_raise(self) -> None:
        try:
            close = getattr(self.object_store, 'close', None)  # optional for a Composer-written store
            if close is not None:
                close()
        except Exception as exc:  # noqa: BLE001
            log.warning('closing %r failed: %s', self.object_store, exc)
        self._raise_failures(final=True)

    close = shutdown

    def __enter__(self) -> 'Uploader':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ a dead process's staging
    @staticmethod
    def drain(
        staging_folder: Union[str, 'os.PathLike[str]'],
        *,
        object_store: Any = None,
        num_workers: int = 4,
        progress_bar: bool = True,
    ) -> Any:
        """Upload what dead processes left pending in ``staging_folder``, without a job (the folder's
        ranks must not be held by a live uploader). See :func:`dist_logging.upload.drain.drain`, whose
        :class:`~dist_logging.upload.drain.DrainReport` this returns.

        Raises:
            FileNotFoundError: ``staging_folder`` does not exist.
            StagingBusyError: a rank folder is held by a live uploader or another drain.
            UploadError: some uploads failed (naming each).
            ValueError: ``num_workers`` < 1.
        """
        from dist_logging.upload.drain import drain

        return drain(
            os.fspath(staging_folder), object_store=object_store, num_workers=num_workers, progress_bar=progress_bar
        )

    def __repr__(self) -> str:
        return f'Uploader({self.bucket_uri or self.object_store!r}, staging={self.staging_folder!r})'
