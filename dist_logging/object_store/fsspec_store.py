"""FsspecObjectStore: any filesystem fsspec implements (GCS, Azure, OCI, SFTP, Hugging Face, memory, ...)."""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable, Optional, Union

try:
    import fsspec
    from fsspec.callbacks import Callback
except ImportError as _exc:  # the registry turns this into an install hint
    raise ImportError('FsspecObjectStore needs fsspec: pip install "dist-logging[fsspec]"', name='fsspec') from _exc

from dist_logging.object_store.base import (
    LazyClient,
    ObjectInfo,
    ObjectStore,
    check_object_name,
    check_prefix,
    download_target,
)

__all__ = ['FsspecObjectStore', 'filesystem_class']

# Backends whose put_file(mode='create') is an atomic conditional write, so two writers racing
# for one name with overwrite=False cannot both win. Elsewhere it is check-then-put.
ATOMIC_CREATE = frozenset({'s3', 's3a', 'gs', 'gcs', 'memory'})
# memory:// lives in this process: a lock makes its check-then-put atomic.
_MEMORY_LOCK = threading.Lock()


def _install_hint(protocol: str, error: BaseException) -> str:
    """Which package to install for ``protocol``, from fsspec's own registry of known implementations."""
    from fsspec.registry import known_implementations

    known = known_implementations.get(protocol, {})
    module = str(known.get('class', '')).split('.')[0]
    package = getattr(error, 'name', None) or (module if module and module != 'fsspec' else None)
    if package is None:
        quoted = re.search(r'"([A-Za-z0-9_.-]+)"|`([A-Za-z0-9_.-]+)`', str(known.get('err', '')))
        package = next((g for g in quoted.groups() if g), None) if quoted else None
    package = package.split('.')[0] if package else None
    wanted = f'pip install {package}' if package else (known.get('err') or str(error))
    return f'the {protocol}:// object store needs {package or "a missing package"} ({wanted})'


def filesystem_class(protocol: str) -> type[Any]:
    """fsspec's filesystem class for ``protocol``, imported now.

    Raises:
        ValueError: fsspec does not know ``protocol``.
        ImportError: the package implementing it is missing (the message names it).
    """
    try:
        return fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(f'fsspec has no implementation for {protocol}://') from None
    except ImportError as exc:
        raise ImportError(_install_hint(protocol, exc), name=getattr(exc, 'name', None)) from exc


class _Progress(Callback):
    """fsspec's callback protocol (set_size, relative_update) -> ``callback(done, total)``."""

    def __init__(self, fn: Callable[[int, int], None]):
        super().__init__()
        self._fn = fn

    def call(self, *args: Any, **kwargs: Any) -> None:
        if self.size is not None:
            self._fn(int(self.value), int(self.size))


class FsspecObjectStore(LazyClient, ObjectStore):
    """Objects under a URL on any filesystem fsspec implements.

    Used for every scheme dist_logging has no native store for: ``gs://bucket/prefix``
    (gcsfs), ``az://container/prefix`` and ``abfs://`` (adlfs), ``oci://`` (ocifs),
    ``sftp://host/path`` (paramiko), ``hf://datasets/org/repo`` (huggingface_hub),
    ``memory://`` (tests), and more. A missing implementation package fails at construction
    with an ``ImportError`` that names it.

    Writes use the backend's ``put_file``. On object stores (S3, GCS, Azure Blob) an object
    appears whole or not at all; on filesystem-like backends (SFTP, HDFS) a reader may see a
    partial file while it is written. ``overwrite=False`` is atomic where the backend offers a
    conditional create (``put_file(mode='create')``: s3fs uses S3's ``If-None-Match``, gcsfs,
    experimentally, GCS's generation precondition; ``memory://`` a lock); everywhere else it is
    check-then-put, so two writers racing for one name may both succeed (the last one wins).

    The filesystem instance is created lazily and not pickled: the store can be sent to
    upload worker processes.

    Args:
        url: ``protocol://location`` (the root; object names are joined under it).
        **storage_options: passed to the fsspec filesystem (e.g. ``endpoint_url``, ``token``,
            ``account_name``); those that look secret are never written to staging journals.

    Raises:
        ValueError: a URL without ``protocol://``, or a protocol fsspec does not know.
        ImportError: the package implementing the protocol is missing (named in the message).
    """

    def __init__(self, url: Union[str, 'os.PathLike[str]'], **storage_options: Any):
        url = os.fspath(url)
        match = re.match(r'^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$', url)
        if match is None:
            raise ValueError(f'FsspecObjectStore: {url!r} is not a protocol://location URL')
        self.protocol = match.group(1).lower()
        cls = filesystem_class(self.protocol)
        self.storage_options = dict(storage_options)
        self.endpoint_url = self.storage_options.get('endpoint_url')  # recorded in staging journals for drain
        root = cls._strip_protocol(url)
        self.root = root.rstrip('/') if isinstance(root, str) else str(root)
        self.bucket_uri = f'{self.protocol}://{match.group(2).rstrip("/")}'
        self._client: Any = None  # the filesystem

    @classmethod
    def from_location(cls, location: str, **kwargs: Any) -> 'FsspecObjectStore':  # pragma: no cover - by URL
        raise TypeError('FsspecObjectStore is built from a full URL: FsspecObjectStore(url, **storage_options)')

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created on first use; thread-safe)."""
        return self.lazy_client(lambda: fsspec.filesystem(self.protocol, **self.storage_options))

    def _path(self, object_name: str) -> str:
        check_object_name(object_name)
        return f'{self.root}/{object_name}' if self.root else object_name

    def get_uri(self, object_name: str) -> str:
        return f'{self.bucket_uri}/{object_name}'

    def upload_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        callback: Optional[Callable[[int, int], None]] = None,
        *,
        overwrite: bool = True,
    ) -> None:
        path = self._path(object_name)
        filename = os.fspath(filename)
        progress = _Progress(callback) if callback is not None else None
        extra = {'callback': progress} if progress is not None else {}
        fs = self.fs
        parent = path.rsplit('/', 1)[0] if '/' in path else ''
        if parent and not self._is_object_store():
            fs.makedirs(parent, exist_ok=True)
        if overwrite:
            fs.put_file(filename, path, **extra)
        elif self.protocol == 'memory':
            with _MEMORY_LOCK:
                self._refuse_existing(object_name, path)
                fs.put_file(filename, path, **extra)
        else:
            self._refuse_existing(object_name, path)
            try:
                try:
                    fs.put_file(filename, path, mode='create', **extra)
                except TypeError as exc:  # an implementation whose put_file takes no mode: checked above
                    if 'mode' not in str(exc):
                        raise
                    fs.put_file(filename, path, **extra)
            except FileExistsError:
                raise FileExistsError(f'{self.get_uri(object_name)} already exists') from None
            except OSError as exc:  # s3fs maps S3's 412 Precondition Failed to a plain OSError
                if 'precondition' in str(exc).lower() or getattr(exc, 'errno', None) == 17:
                    raise FileExistsError(f'{self.get_uri(object_name)} already exists') from exc
                raise
        if progress is not None and not progress.value:
            size = os.path.getsize(filename)
            callback(size, size)  # type: ignore[misc]  # a backend that reports no progress (or an empty file)

    def _is_object_store(self) -> bool:
        # Object stores have no real folders; creating "directories" there is at best a no-op.
        return self.protocol in ATOMIC_CREATE or self.protocol in ('az', 'abfs', 'abfss', 'oci', 'oss', 'r2', 'hf')

    def _refuse_existing(self, object_name: str, path: str) -> None:
        if self.fs.exists(path):
            raise FileExistsError(f'{self.get_uri(object_name)} already exists')

    def download_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        overwrite: bool = False,
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        path = self._path(object_name)
        filename = os.fspath(filename)
        if not overwrite and os.path.lexists(filename):
            raise FileExistsError(f'{filename} exists; pass overwrite=True to replace it')
        size = self.get_object_size(object_name)  # FileNotFoundError before any local file is created
        progress = _Progress(callback) if callback is not None else None
        with download_target(filename, overwrite) as tmp:
            self.fs.get_file(path, tmp, **({'callback': progress} if progress is not None else {}))
        if callback is not None and (progress is None or progress.value != size):
            callback(size, size)

    def read_range(self, object_name: str, offset: int, buffer: Any) -> None:
        """``cat_file(path, start, end)`` into ``buffer`` (see :meth:`ObjectStore.read_range`)."""
        view = memoryview(buffer).cast('B')
        if offset < 0:
            raise ValueError(f'read_range: negative offset {offset}')
        path = self._path(object_name)
        if not view:
            self.get_object_size(object_name)  # a missing object fails even for an empty range
            return
        try:
            data = self.fs.cat_file(path, start=offset, end=offset + len(view))
        except FileNotFoundError:
            raise FileNotFoundError(f'{self.get_uri(object_name)} does not exist') from None
        if len(data) != len(view):
            raise EOFError(
                f'{self.get_uri(object_name)} ends before byte {offset + len(view)} '
                f'(got {len(data)} bytes from {offset})'
            )
        view[:] = data

    def get_object_size(self, object_name: str) -> int:
        path = self._path(object_name)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            raise FileNotFoundError(f'{self.get_uri(object_name)} does not exist') from None
        if info.get('type') == 'directory':
            raise FileNotFoundError(f'{self.get_uri(object_name)} is a folder, not an object')
        return int(info['size'])

    def list(self, prefix: str = '') -> 'list[ObjectInfo]':
        """Objects under ``prefix`` with sizes: one ``find(detail=True)`` below the deepest folder the prefix names."""
        check_prefix(prefix)
        folder = prefix.rsplit('/', 1)[0] if '/' in prefix else ''
        root = self.fs._strip_protocol(self.root) if self.root else ''
        start = '/'.join(p for p in (root.rstrip('/'), folder) if p)
        try:
            found = self.fs.find(start or '/', detail=True)
        except FileNotFoundError:
            return []
        skip = len(root.rstrip('/')) + 1 if root else 0
        out = []
        for path, info in found.items():
            if info.get('type') == 'directory':
                continue
            name = path[skip:] if root else path.lstrip('/')
            if name.startswith(prefix):
                out.append(ObjectInfo(name, int(info.get('size') or 0)))
        return sorted(out)

    def delete(self, object_name: str) -> None:
        path = self._path(object_name)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._client = None

    def __repr__(self) -> str:
        return f'FsspecObjectStore({self.bucket_uri!r})'
