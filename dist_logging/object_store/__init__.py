"""Object stores: a small :class:`ObjectStore` protocol, its backends, and a lazy registry.

A backend implements eight primitives (upload, download, ranged read, size, URI, list,
delete, close); the upload machinery (snapshots, journal, retries, workers) is built above them and
knows nothing about any one backend. Builtin exceptions carry the meaning:
``FileNotFoundError`` for a missing object, ``FileExistsError`` for a refused
overwrite.

Backends are found from a bucket URI's scheme through a lazy registry, so
``import dist_logging`` never imports boto3; a missing optional dependency is an
``ImportError`` that says what to install.

This package imports neither torch nor the rest of ``dist_logging``: upload
worker processes import it without paying for torch.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import uuid
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Union

__all__ = [
    'ObjectStore',
    'ObjectInfo',
    'ObjectStoreTransientError',
    'LocalObjectStore',
    'S3ObjectStore',
    'FsspecObjectStore',
    'supports_overwrite',
    'SCHEMES',
    'get_store_class',
    'split_bucket_uri',
    'store_from_uri',
    'check_object_name',
    'check_prefix',
    'download_target',
]

# scheme -> (module, class name, pip extra or None)
_REGISTRY: dict[str, tuple[str, str, Optional[str]]] = {
    'file': ('dist_logging.object_store.local', 'LocalObjectStore', None),
    's3': ('dist_logging.object_store.s3', 'S3ObjectStore', 's3'),
}
SCHEMES = tuple(_REGISTRY)
_LAZY_EXTRA: dict[str, tuple[str, str, Optional[str]]] = {
    'fsspec': ('dist_logging.object_store.fsspec_store', 'FsspecObjectStore', 'fsspec'),
}
# Any other scheme goes to FsspecObjectStore when fsspec knows it. Without fsspec installed these
# common ones are still recognized, so the error is an install hint rather than "unknown scheme".
_FSSPEC_COMMON = ('gs', 'gcs', 'az', 'abfs', 'abfss', 'adl', 'oci', 'sftp', 'ssh', 'hf', 'memory', 'hdfs',
                  'webhdfs', 'ftp', 'dbfs', 'oss', 'r2', 'box', 'dropbox', 'gdrive', 'lakefs', 'wandb')
_NATIVE_SCHEME_HINT = 's3://, file://, a local path, or a scheme fsspec implements (gs://, az://, sftp://, ...)'

# Backend kwargs never written to staging journals (boto3's, and fsspec backends': adlfs's account_key /
# connection_string / sas_token, sftp's pkey / password, gcsfs's token, ...).
_SECRET_KEY = re.compile(r'secret|token|password|passwd|credential|access_key|session|key_id|account_key|'
                         r'connection_string|private_key|pkey|^key$|sas', re.IGNORECASE)


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

    def upload_object(self, object_name: str, filename: Union[str, 'os.PathLike[str]'],
                      callback: Optional[Callable[[int, int], None]] = None, *, overwrite: bool = True) -> None:
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

    def download_object(self, object_name: str, filename: Union[str, 'os.PathLike[str]'], overwrite: bool = False,
                        callback: Optional[Callable[[int, int], None]] = None) -> None:
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

        Optional (the uploader never calls it); Composer's name and meaning, except that names are
        relative to the store's root or prefix, as everywhere else in this protocol.
        """
        raise NotImplementedError(f'{type(self).__name__}.list_objects is not implemented')

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


def split_bucket_uri(bucket_uri: str) -> tuple[str, str]:
    """``'s3://bucket/prefix'`` -> ``('s3', 'bucket/prefix')``; a plain local path -> ``('file', '/abs/path')``.

    Raises:
        ValueError: an empty URI, an unknown scheme (naming it and the known ones), or a
            ``file://`` URI that is not absolute.
    """
    if not isinstance(bucket_uri, (str, os.PathLike)):
        raise TypeError(f'bucket_uri must be a str, got {type(bucket_uri).__name__}')
    uri = os.fspath(bucket_uri)
    if not uri:
        raise ValueError('bucket_uri must not be empty')
    match = re.match(r'^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$', uri)
    if match is None:
        return 'file', os.path.abspath(os.path.expanduser(uri))
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in _REGISTRY:
        if not _fsspec_knows(scheme):
            raise ValueError(f'bucket_uri {uri!r}: unsupported scheme {scheme!r}; supported: {_NATIVE_SCHEME_HINT} '
                             '(or pass a custom object_store=)')
        if not rest.strip('/') and scheme != 'memory':
            raise ValueError(f'bucket_uri {uri!r}: missing a location after {scheme}://')
        return scheme, rest
    if scheme == 'file':
        if rest.startswith('localhost/'):
            rest = rest[len('localhost'):]
        if not rest.startswith('/'):
            raise ValueError(f'bucket_uri {uri!r}: a file:// URI needs an absolute path (file:///abs/path)')
        return scheme, os.path.normpath(rest)
    if not rest or rest.startswith('/'):
        raise ValueError(f'bucket_uri {uri!r}: missing bucket name ({scheme}://bucket/prefix)')
    return scheme, rest


def _fsspec_knows(scheme: str) -> bool:
    """Whether fsspec implements ``scheme`` (or, without fsspec installed, whether it is a well-known one)."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return scheme in _FSSPEC_COMMON
    return scheme in known_implementations or scheme in registry


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
            known = parameter is not None and parameter.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                                 inspect.Parameter.POSITIONAL_OR_KEYWORD)
        except (TypeError, ValueError):  # a builtin or C-implemented callable: assume our protocol
            known = True
        _OVERWRITE_SUPPORT[cls] = known
    return known


_OVERWRITE_SUPPORT: dict[type, bool] = {}


def get_store_class(scheme: str) -> type:
    """The :class:`ObjectStore` class for ``scheme``, imported on first use.

    ``file`` and ``s3`` have native stores; any other scheme fsspec implements gets
    :class:`FsspecObjectStore`.

    Raises:
        ValueError: an unknown scheme.
        ImportError: the backend's optional dependency is missing (says what to install).
    """
    if scheme not in _REGISTRY and _fsspec_knows(scheme):
        scheme = 'fsspec'
    try:
        module_name, class_name, extra = _REGISTRY.get(scheme) or _LAZY_EXTRA[scheme]
    except KeyError:
        raise ValueError(f'unsupported object store scheme {scheme!r}; supported: {_NATIVE_SCHEME_HINT}') from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f'pip install "dist-logging[{extra}]"' if extra else 'reinstall dist-logging'
        what = 'FsspecObjectStore' if scheme == 'fsspec' else f'the {scheme}:// object store'
        raise ImportError(f'{what} needs {exc.name or "a missing package"}: {hint}', name=exc.name) from exc
    return getattr(module, class_name)


def store_from_uri(bucket_uri: str, backend_kwargs: Optional[Mapping[str, Any]] = None) -> ObjectStore:
    """Build the store for ``bucket_uri`` (``file://``, a local path, ``s3://``, or any scheme fsspec implements).

    ``backend_kwargs`` go to the store's constructor (for fsspec schemes: the filesystem's
    storage options).

    Raises:
        ValueError: a bad URI or scheme.
        TypeError: ``backend_kwargs`` the backend does not take.
        ImportError: a missing optional dependency (with an install hint).
    """
    scheme, location = split_bucket_uri(bucket_uri)
    cls = get_store_class(scheme)
    if scheme not in _REGISTRY:
        return cls(f'{scheme}://{location}', **dict(backend_kwargs or {}))
    return cls.from_location(location, **dict(backend_kwargs or {}))


def persistable_uri(uri: str) -> str:
    """``uri`` without the password of its user-info (``sftp://alice:pw@host/x`` -> ``sftp://alice@host/x``).

    Staging journals record the bucket URI so ``drain`` can rebuild the store; a password in it
    must not reach the disk (at drain time it comes from the backend's own configuration:
    an SSH agent, a key file, the environment).
    """
    scheme, sep, rest = uri.partition('://')
    authority, slash, path = rest.partition('/')
    userinfo, at, host = authority.rpartition('@')
    if not sep or not at or ':' not in userinfo:
        return uri
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{host}{slash}{path}"


def persistable_kwargs(backend_kwargs: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The part of ``backend_kwargs`` that may be written to disk: JSON scalars whose names do not look secret.

    Staging journals record it so ``drain`` can rebuild a store (e.g. its
    ``endpoint_url``); credentials come from the environment at drain time.
    """
    # Imported here: this package stays free of dist_logging/torch for upload worker processes.
    from dist_logging.redaction import redact_text

    kept = {}
    for key, value in (backend_kwargs or {}).items():
        if _SECRET_KEY.search(str(key)):
            continue
        if isinstance(value, str) and redact_text(value) != value:
            continue  # a credential in the value (e.g. a password in an endpoint URL)
        if value is None or isinstance(value, (str, int, float, bool)):
            kept[str(key)] = value
    return kept


def __getattr__(name: str) -> Any:
    # LocalObjectStore / S3ObjectStore as attributes of the package, imported lazily.
    if name == 'LocalObjectStore':
        return get_store_class('file')
    if name == 'S3ObjectStore':
        return get_store_class('s3')
    if name == 'FsspecObjectStore':
        return get_store_class('fsspec')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
