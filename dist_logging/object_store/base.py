"""The object-store protocol every backend implements, and what backends share to implement it.

:class:`ObjectStore` has five required primitives (``upload_object``, ``download_object``,
``get_object_size``, ``get_uri``, ``list``) and ``delete`` for the checkpoint code; ``list_objects``
is derived once from ``list``; ``read_range`` (ranged reads for checkpoint loads), ``object_checksum``, ``close``
and ``is_transient_error`` have defaults.
Builtin exceptions carry the meaning: ``FileNotFoundError`` for a missing object,
``FileExistsError`` for a refused overwrite. :class:`LazyClient` is the mixin for a backend
whose client is created on first use and left out of the pickled state (``use_procs=True``).

Imports neither torch nor the rest of ``dist_logging`` (upload worker processes import it).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from typing import Any, Callable, Iterator, NamedTuple, Optional, Union

__all__ = [
    'ObjectStore',
    'ObjectInfo',
    'ObjectStoreTransientError',
    'LazyClient',
    'supports_overwrite',
    'check_object_name',
    'check_prefix',
    'download_target',
]


class ObjectStoreTransientError(RuntimeError):
    """A store's way to say "this failed, but trying again may work" (throttled, unavailable, reset).

    Composer's name and meaning: a store (ours or one written for Composer) raises it, often
    ``from`` the backend's own error, and the uploader retries the operation with backoff
    (up to ``num_attempts``) instead of failing it. Any exception class of this name is
    retried, so ``composer.utils.ObjectStoreTransientError`` works too.
    """


class ObjectInfo(NamedTuple):
    """One object as :meth:`ObjectStore.list` reports it.

    Attributes:
        name: the object name, relative to the store's root or prefix.
        size: its size in bytes.
    """

    name: str
    size: int


class ObjectStore:
    """The storage primitives every backend provides. Subclass it and override them all.

    Compatible with Composer's ``ObjectStore``: the same method names, argument names and
    callback contract, and a store is a context manager (``with store: ...`` closes it). A
    store written for Composer, whose ``upload_object(object_name, filename, callback=None)``
    has no ``overwrite`` keyword, can be passed as ``object_store=`` unchanged: the uploader
    then enforces ``overwrite=False`` itself by check-then-put (see :func:`supports_overwrite`).

    An instance is used from several upload threads at once (``num_concurrent_uploads``),
    so methods must be thread-safe. With ``use_procs=True`` the instance is pickled
    into each worker process: keep unpicklable clients out of the pickled state
    (create them lazily) and define the class in an importable module, not ``__main__``.

    Attributes:
        bucket_uri: the URI the store was built from (``'s3://bucket/prefix'``,
            ``'file:///abs/path'``), or ``None`` for a store that has none. Uploads queued
            through a store with a URI can be drained without it; the others need the
            store passed to ``drain`` again.
    """

    bucket_uri: Optional[str] = None

    def upload_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        callback: Optional[Callable[[int, int], None]] = None,
        *,
        overwrite: bool = True,
    ) -> None:
        """Store the local file ``filename`` as the object ``object_name``.

        The object appears whole or not at all (no reader ever sees a torn object).

        Args:
            object_name: the object name, relative to the store's root/prefix, ``/``-separated.
            filename: the local file to read.
            callback: called as ``callback(bytes_transferred_so_far, total_bytes)`` as the upload
                progresses (Composer's contract), the last call with both equal.
            overwrite: when False, refuse to replace an existing object, atomically
                where the backend allows it.

        Raises:
            FileExistsError: ``overwrite=False`` and the object exists.
            ValueError: a name that escapes the store's root.
            ObjectStoreTransientError: a failure worth retrying (the uploader retries it).
            Exception: other backend errors (the uploader also retries those it recognizes as
                transient: connection resets, timeouts, HTTP 5xx, throttling).
        """
        raise NotImplementedError(f'{type(self).__name__}.upload_object is not implemented')

    def download_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        overwrite: bool = False,
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        """Fetch the object ``object_name`` into the local path ``filename``.

        Args:
            object_name: the object name.
            filename: the local destination.
            overwrite: whether an existing local file may be replaced.
            callback: called as ``callback(bytes_transferred_so_far, total_bytes)``.

        Raises:
            FileNotFoundError: no such object.
            FileExistsError: ``filename`` exists and ``overwrite`` is False.
            ObjectStoreTransientError: a failure worth retrying.
        """
        raise NotImplementedError(f'{type(self).__name__}.download_object is not implemented')

    def read_range(self, object_name: str, offset: int, buffer: Any) -> None:
        """Read ``len(buffer)`` bytes of the object ``object_name``, from byte ``offset``, into ``buffer``.

        One ranged read (S3: a ``GetObject`` with ``Range``; a local file: ``pread``; fsspec:
        ``cat_file(start, end)``), straight into memory: nothing is written to local disk.
        :class:`~dist_logging.checkpoint.CheckpointReader` loads checkpoints with it, many in
        flight at once (so it must be thread-safe, like every method here). Optional: the default
        raises ``NotImplementedError`` and the reader then downloads whole files instead.

        Args:
            object_name: the object name.
            offset: the first byte to read (``>= 0``).
            buffer: a writable bytes-like object (``bytearray``, a ``memoryview`` of one, a tensor's
                ``memoryview``); it is filled completely.

        Raises:
            FileNotFoundError: no such object.
            EOFError: the object ends before ``offset + len(buffer)``.
            ValueError: a negative offset, or a name that escapes the store's root.
            ObjectStoreTransientError: a failure worth retrying.
        """
        raise NotImplementedError(f'{type(self).__name__}.read_range is not implemented')

    def get_object_size(self, object_name: str) -> int:
        """The size of the object ``object_name`` in bytes.

        Raises:
            FileNotFoundError: no such object.
            ObjectStoreTransientError: a failure worth retrying.
        """
        raise NotImplementedError(f'{type(self).__name__}.get_object_size is not implemented')

    def get_uri(self, object_name: str) -> str:
        """A URI that names the object (for messages and links), e.g. ``s3://bucket/prefix/name``."""
        raise NotImplementedError(f'{type(self).__name__}.get_uri is not implemented')

    def list_objects(self, prefix: Optional[str] = None) -> list[str]:
        """The names of the objects whose names start with ``prefix`` (all with ``None``), sorted.

        Composer's name and meaning, except that names are relative to the store's root or prefix, as
        everywhere else in this protocol. Derived from :meth:`list` (one listing rule per backend); the
        uploader never calls it.

        Raises:
            ValueError: a prefix that escapes the store's root.
        """
        return [info.name for info in self.list(prefix or '')]

    def list(self, prefix: str = '') -> 'list[ObjectInfo]':
        """Every object whose name starts with ``prefix``, with its size, sorted by name.

        One paginated listing (S3: ``ListObjectsV2`` pages of up to 1,000 keys), never a request
        per object. ``prefix`` is a plain string prefix, not a folder: ``'ckpt/step1'`` also
        matches ``'ckpt/step10/x'``; end it with ``/`` to mean a folder. Objects being written
        (a local store's temporary files) are not listed. The checkpoint code
        (:mod:`dist_logging.checkpoint`) needs it; the uploader never calls it.

        Raises:
            ValueError: a prefix that escapes the store's root.
            ObjectStoreTransientError: a failure worth retrying.
        """
        raise NotImplementedError(f'{type(self).__name__}.list is not implemented')

    def delete(self, object_name: str) -> None:
        """Remove the object ``object_name``; deleting a missing object is not an error (S3's semantics).

        The checkpoint code uses it for un-commit and retention; the uploader never calls it.

        Raises:
            ValueError: a name that escapes the store's root.
            ObjectStoreTransientError: a failure worth retrying.
        """
        raise NotImplementedError(f'{type(self).__name__}.delete is not implemented')

    def object_checksum(self, object_name: str) -> Optional[str]:
        """The CRC32C the store keeps for the object, taken of the bytes that landed (``'crc32c:<base64>'``), or
        None where it keeps none. Never reads the object's bytes (S3: one ``HeadObject``; the local store: an
        extended attribute written with the object).

        Optional: the checkpoint commit compares it with the checksum each shard was written with and
        :func:`~dist_logging.checkpoint.latest_checkpoint` with the commit marker's; where it is None, shards
        are checked when a :class:`~dist_logging.checkpoint.CheckpointReader` loads them. The default
        answers None.

        Raises:
            FileNotFoundError: no such object (where the store looks).
        """
        return None

    def close(self) -> None:
        """Release clients and connections. The default does nothing."""

    def __enter__(self) -> 'ObjectStore':
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        self.close()

    def is_transient_error(self, exc: BaseException) -> Optional[bool]:
        """Classify a backend error for retries: True (retry), False (fail at once), None (use the default rules)."""
        return None

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.bucket_uri!r})'


class LazyClient:
    """Mixin: a client made on first use (thread-safe), never pickled, so a store can go to worker processes.

    A backend calls :meth:`lazy_client` with a factory from its client property; the client lives in
    ``self._client`` and ``close`` may reset it to None. Pickling drops the client and its lock; the
    unpickled copy makes its own on first use.
    """

    _client: Any = None

    def lazy_client(self, make: Callable[[], Any]) -> Any:
        """The client, made by ``make()`` on the first call (once, whichever thread calls first).

        Args:
            make: builds the client.

        Returns:
            The client.
        """
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = make()
                client = self._client
        return client

    @property
    def _client_lock(self) -> threading.Lock:
        lock = self.__dict__.get('_lazy_client_lock')
        if lock is None:
            lock = self.__dict__.setdefault('_lazy_client_lock', threading.Lock())
        return lock

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state['_client'] = None
        state.pop('_lazy_client_lock', None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is ``''`` or a relative prefix that stays inside the store (as for names).

    Raises:
        ValueError: an absolute prefix, a ``..`` component, a NUL byte, or not a string.
    """
    if not isinstance(prefix, str):
        raise ValueError(f'prefix must be a string, got {type(prefix).__name__}')
    if prefix:
        check_object_name(prefix)
    return prefix


def check_object_name(name: str) -> str:
    """Return ``name`` if it is a relative object name that stays inside the store.

    Raises:
        ValueError: an empty or absolute name, a ``..`` component, or a NUL byte.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f'object name must be a non-empty string, got {name!r}')
    if '\x00' in name:
        raise ValueError(f'object name {name!r} contains a NUL byte')
    if name.startswith(('/', '\\')) or (len(name) > 1 and name[1] == ':'):
        raise ValueError(f'object name {name!r} is absolute; use a name relative to the bucket')
    if '..' in name.replace('\\', '/').split('/'):
        raise ValueError(f'object name {name!r} contains a ".." component')
    return name


@contextlib.contextmanager
def download_target(filename: str, overwrite: bool) -> Iterator[str]:
    """A temporary path next to ``filename`` to download into, published when the block succeeds.

    Publishing is atomic: ``os.replace`` with ``overwrite=True``; with ``overwrite=False`` an
    ``os.link`` that the kernel refuses if ``filename`` appeared meanwhile (check-then-replace
    on filesystems without hard links). The temporary file never outlives the block, so a
    failed or refused download leaves nothing behind.

    Raises:
        FileExistsError: ``overwrite=False`` and ``filename`` exists (when it is published).
    """
    directory = os.path.dirname(os.path.abspath(filename))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f'.{os.path.basename(filename)}.{uuid.uuid4().hex[:12]}.tmp')
    exists = f'{filename} exists; pass overwrite=True to replace it'
    try:
        yield tmp
        if overwrite:
            os.replace(tmp, filename)
        else:
            try:
                os.link(tmp, filename)
            except FileExistsError:
                raise FileExistsError(exists) from None
            except OSError:  # no hard links on this filesystem
                if os.path.lexists(filename):
                    raise FileExistsError(exists) from None
                os.replace(tmp, filename)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def supports_overwrite(store: Any) -> bool:
    """Whether ``store.upload_object`` takes an ``overwrite`` keyword (every dist_logging store does).

    A store written for Composer (``upload_object(object_name, filename, callback=None, **kwargs)``)
    does not: for it the uploader enforces ``overwrite=False`` itself, by asking
    ``get_object_size`` first and uploading only on ``FileNotFoundError`` (check-then-put, so two
    writers racing for one name may both write; the last one wins). A ``**kwargs`` catch-all
    does not count: Composer's stores pass those to the backend call.
    """
    cls = type(store)
    known = _OVERWRITE_SUPPORT.get(cls)
    if known is None:
        import inspect

        try:
            parameter = inspect.signature(store.upload_object).parameters.get('overwrite')
            known = parameter is not None and parameter.kind in (
                inspect.Parameter.KEYWORD_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            )
        except (TypeError, ValueError):  # a builtin or C-implemented callable: assume our protocol
            known = True
        _OVERWRITE_SUPPORT[cls] = known
    return known


_OVERWRITE_SUPPORT: dict[type, bool] = {}
