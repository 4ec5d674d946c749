"""The alternatives the upload benchmarks compare against, written small and faithfully.

* :class:`Backend` -- a minimal store used by the baselines (independent of ``dist_logging``
  so a baseline never benefits from, or pays for, the code under test): a local folder
  (copy to a temp name, then ``os.replace``) or S3 through boto3's managed ``upload_file``.
* :func:`sync_upload` -- a synchronous upload on the training thread.
* :class:`ComposerDesignUploader` -- Composer's ``RemoteUploaderDownloader`` design
  (composer/loggers/remote_uploader_downloader.py): ``upload_file`` does ``shutil.copy2`` into
  a staging folder under a uuid name and records it in a dict under a lock; an enqueue
  thread moves records to a spawn-context ``multiprocessing.JoinableQueue`` every 0.2 s
  (at most one in flight per object name); worker processes upload (checking existence
  first when ``overwrite=False``), delete the staged copy and report completion. The only
  addition is instrumentation: the enqueue thread keeps the set of completed names and a
  condition so the benchmark can see when an object landed.
* the floors: :func:`floor_copy_file_range`, :func:`floor_copy2`, :func:`floor_link`.

This module must stay importable without side effects: spawned workers import it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import threading
import time
import uuid
from typing import Any, Optional

# ----------------------------------------------------------------------------- floors


def floor_copy_file_range(src: str, dst: str) -> None:
    """A bare in-kernel copy: ``os.copy_file_range`` (``os.sendfile`` where unavailable)."""
    fin = os.open(src, os.O_RDONLY)
    try:
        size = os.fstat(fin).st_size
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            copied = 0
            if hasattr(os, 'copy_file_range'):
                while copied < size:
                    n = os.copy_file_range(fin, fout, size - copied)
                    if n == 0:
                        break
                    copied += n
            else:  # pragma: no cover - old Pythons / non-Linux
                while copied < size:
                    n = os.sendfile(fout, fin, copied, size - copied)
                    if n == 0:
                        break
                    copied += n
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def floor_copy2(src: str, dst: str) -> None:
    shutil.copy2(src, dst)


def floor_link(src: str, dst: str) -> None:
    os.link(src, dst)


# ----------------------------------------------------------------------------- a minimal store


class Backend:
    """``{'kind': 'local', 'root': ...}`` or ``{'kind': 's3', 'bucket': ..., 'endpoint': ...}``; picklable."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        self._client: Any = None

    def __getstate__(self) -> dict:
        return {'spec': self.spec, '_client': None}

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client('s3', endpoint_url=self.spec['endpoint'])
        return self._client

    def upload_object(self, name: str, filename: str) -> None:
        if self.spec['kind'] == 'local':
            dest = os.path.join(self.spec['root'], name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = f'{dest}.tmp-{uuid.uuid4().hex}'
            shutil.copyfile(filename, tmp)
            os.replace(tmp, dest)
        else:
            self.client.upload_file(filename, self.spec['bucket'], name)

    def get_object_size(self, name: str) -> int:
        if self.spec['kind'] == 'local':
            return os.stat(os.path.join(self.spec['root'], name)).st_size
        from botocore.exceptions import ClientError

        try:
            return int(self.client.head_object(Bucket=self.spec['bucket'], Key=name)['ContentLength'])
        except ClientError as exc:
            if exc.response.get('Error', {}).get('Code') in ('404', 'NoSuchKey', 'NotFound'):
                raise FileNotFoundError(name) from exc
            raise


def sync_upload(backend: Backend, name: str, path: str) -> None:
    """The simplest alternative: upload on the training thread and wait."""
    backend.upload_object(name, path)


# ----------------------------------------------------------------------------- Composer's design


def _upload_worker(
    file_queue: Any, completed_queue: Any, exception_queue: Any, is_finished: Any, backend_spec: dict, num_attempts: int
) -> None:
    """Composer's ``_upload_worker``: poll the queue, check existence unless overwriting, upload, clean up."""
    backend = Backend(backend_spec)
    while True:
        try:
            file_path_to_upload, remote_file_name, overwrite = file_queue.get(block=True, timeout=0.5)
        except queue.Empty:
            if is_finished.is_set():
                break
            continue
        for attempt in range(num_attempts):
            try:
                if not overwrite:
                    try:
                        backend.get_object_size(remote_file_name)
                    except FileNotFoundError:
                        pass
                    else:
                        error = FileExistsError(
                            f'Object {remote_file_name} already exists, but overwrite was set to False.'
                        )
                        exception_queue.put_nowait(error)
                        raise error
                backend.upload_object(remote_file_name, file_path_to_upload)
                break
            except FileExistsError:
                raise
            except Exception as exc:  # noqa: BLE001 - Composer retries transient errors
                if attempt + 1 == num_attempts:
                    exception_queue.put_nowait(exc)
                    raise
                time.sleep(0.1 * 2**attempt)
        os.remove(file_path_to_upload)
        file_queue.task_done()
        completed_queue.put_nowait(remote_file_name)


class ComposerDesignUploader:
    """Composer's RemoteUploaderDownloader design (see the module docstring); defaults as Composer's."""

    def __init__(
        self,
        backend_spec: dict,
        staging_folder: str,
        num_concurrent_uploads: int = 1,
        use_procs: bool = True,
        num_attempts: int = 3,
    ):
        self._upload_staging_folder = staging_folder
        self._object_lock = threading.Lock()
        self._logged_objects: dict[str, tuple[str, bool]] = {}
        self._enqueued_objects: set[str] = set()
        if use_procs:
            mp_ctx = multiprocessing.get_context('spawn')
            self._file_upload_queue: Any = mp_ctx.JoinableQueue()
            self._completed_queue: Any = mp_ctx.JoinableQueue()
            self._exception_queue: Any = mp_ctx.JoinableQueue()
            finished_cls: Any = mp_ctx.Event
            proc_class: Any = mp_ctx.Process
        else:
            self._file_upload_queue = queue.Queue()
            self._completed_queue = queue.Queue()
            self._exception_queue = queue.Queue()
            finished_cls = threading.Event
            proc_class = threading.Thread
        # Instrumentation (not in Composer): names whose upload completed, to time landing.
        self.completed: set[str] = set()
        self._completed_cond = threading.Condition(self._object_lock)

        self._worker_flag = finished_cls()
        self._enqueue_thread_flag = finished_cls()
        self._enqueue_thread = threading.Thread(target=self._enqueue_uploads, daemon=True)
        self._enqueue_thread.start()
        self._workers = []
        for _ in range(num_concurrent_uploads):
            worker = proc_class(
                target=_upload_worker,
                kwargs={
                    'file_queue': self._file_upload_queue,
                    'completed_queue': self._completed_queue,
                    'exception_queue': self._exception_queue,
                    'is_finished': self._worker_flag,
                    'backend_spec': backend_spec,
                    'num_attempts': num_attempts,
                },
                daemon=True,
            )
            worker.start()
            self._workers.append(worker)

    def upload_file(self, remote_file_name: str, file_path: str, *, overwrite: bool = False) -> None:
        copied_path = os.path.join(self._upload_staging_folder, str(uuid.uuid4()))
        os.makedirs(self._upload_staging_folder, exist_ok=True)
        shutil.copy2(file_path, copied_path)
        with self._object_lock:
            if remote_file_name in self._logged_objects and not overwrite:
                raise FileExistsError(
                    f'Object {remote_file_name} was already enqueued to be uploaded, but overwrite=False.'
                )
            self._logged_objects[remote_file_name] = (copied_path, overwrite)

    def _enqueue_uploads(self) -> None:
        while True:
            with self._object_lock:
                while True:
                    try:
                        object_name = self._completed_queue.get_nowait()
                    except queue.Empty:
                        break
                    self._enqueued_objects.remove(object_name)
                    self._completed_queue.task_done()
                    self.completed.add(object_name)
                    self._completed_cond.notify_all()
                objects_to_delete = []
                for object_name, (copied_path, overwrite) in self._logged_objects.items():
                    if object_name in self._enqueued_objects:
                        continue
                    self._file_upload_queue.put_nowait((copied_path, object_name, overwrite))
                    objects_to_delete.append(object_name)
                    self._enqueued_objects.add(object_name)
                for object_name in objects_to_delete:
                    del self._logged_objects[object_name]
                if self._enqueue_thread_flag.is_set():
                    if all(w.is_alive() for w in self._workers) and not self._logged_objects:
                        break
                    if not all(w.is_alive() for w in self._workers):
                        break
            time.sleep(0.2)  # Composer: "Yield lock for `self.upload_file`"

    def wait_landed(self, names: list[str], timeout: float) -> bool:
        """Block until every name in ``names`` completed (instrumentation for the benchmark)."""
        deadline = time.monotonic() + timeout
        with self._completed_cond:
            while not all(n in self.completed for n in names):
                if not self._exception_queue.empty():
                    raise self._exception_queue.get_nowait()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._completed_cond.wait(min(left, 0.5))
            for n in names:
                self.completed.discard(n)
        return True

    def close(self) -> None:
        self._enqueue_thread_flag.set()
        self._enqueue_thread.join()
        self._worker_flag.set()
        for worker in self._workers:
            worker.join()


def composer_real_uploader(store: str, backend_spec: dict, staging: str) -> Optional[Any]:
    """Composer's own RemoteUploaderDownloader for the S3 target, when ``mosaicml`` is importable."""
    if store != 's3':
        return None  # Composer has no plain local-folder bucket URI to point it at
    from composer.loggers import RemoteUploaderDownloader  # noqa: PLC0415

    return RemoteUploaderDownloader(
        bucket_uri=f"s3://{backend_spec['bucket']}",
        backend_kwargs={'endpoint_url': backend_spec['endpoint']},
        upload_staging_folder=staging,
    )
