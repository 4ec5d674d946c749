"""Object stores: a small :class:`ObjectStore` protocol, its backends, and a lazy registry.

A backend implements five primitives (upload, download, size, URI, close); the
upload machinery (snapshots, journal, retries, workers) is built above them and
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
from typing import Any, Callable, Iterator, Mapping, Optional

__all__ = [
    'ObjectStore',
    'LocalObjectStore',
    'S3ObjectStore',
    'SCHEMES',
    'get_store_class',
    'split_bucket_uri',
    'store_from_uri',
    'check_object_name',
    'download_target',
]

# scheme -> (module, class name, pip extra or None)
_REGISTRY: dict[str, tuple[str, str, Optional[str]]] = {
    'file': ('dist_logging.object_store.local', 'LocalObjectStore', None),
    's3': ('dist_logging.object_store.s3', 'S3ObjectStore', 's3'),
}
SCHEMES = tuple(_REGISTRY)

_SECRET_KEY = re.compile(r'secret|token|password|passwd|credential|access_key|session|key_id', re.IGNORECASE)


class ObjectStore:
    """The storage primitives every backend provides. Subclass it and override all five.

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

    def upload_object(self, name: str, filename: str, callback: Optional[Callable[[int], None]] = None, *,
                      overwrite: bool = True) -> None:
        """Store the local file ``filename`` as the object ``name``.

        The object appears whole or not at all (no reader ever sees a torn object).

        Args:
            name: the object name, relative to the store's root/prefix, ``/``-separated.
            filename: the local file to read.
            callback: called with the number of bytes sent since the last call.
            overwrite: when False, refuse to replace an existing object, atomically
                where the backend allows it.

        Raises:
            FileExistsError: ``overwrite=False`` and the object exists.
            ValueError: a name that escapes the store's root.
            Exception: backend errors (transient ones are retried by the uploader).
        """
        raise NotImplementedError

    def download_object(self, name: str, filename: str, overwrite: bool = False,
                        callback: Optional[Callable[[int], None]] = None) -> None:
        """Fetch the object ``name`` into the local path ``filename``.

        Args:
            name: the object name.
            filename: the local destination.
            overwrite: whether an existing local file may be replaced.
            callback: called with the number of bytes received since the last call.

        Raises:
            FileNotFoundError: no such object.
            FileExistsError: ``filename`` exists and ``overwrite`` is False.
        """
        raise NotImplementedError

    def get_object_size(self, name: str) -> int:
        """The size of the object ``name`` in bytes.

        Raises:
            FileNotFoundError: no such object.
        """
        raise NotImplementedError

    def get_uri(self, name: str) -> str:
        """A URI that names the object (for messages and links), e.g. ``s3://bucket/prefix/name``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release clients and connections. The default does nothing."""

    def is_transient_error(self, exc: BaseException) -> Optional[bool]:
        """Classify a backend error for retries: True (retry), False (fail at once), None (use the default rules)."""
        return None

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.bucket_uri!r})'


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
        raise ValueError(f'bucket_uri {uri!r}: unsupported scheme {scheme!r}; supported: '
                         f'{", ".join(s + "://" for s in SCHEMES)} or a local path '
                         '(or pass a custom object_store=)')
    if scheme == 'file':
        if rest.startswith('localhost/'):
            rest = rest[len('localhost'):]
        if not rest.startswith('/'):
            raise ValueError(f'bucket_uri {uri!r}: a file:// URI needs an absolute path (file:///abs/path)')
        return scheme, os.path.normpath(rest)
    if not rest or rest.startswith('/'):
        raise ValueError(f'bucket_uri {uri!r}: missing bucket name ({scheme}://bucket/prefix)')
    return scheme, rest


def get_store_class(scheme: str) -> type:
    """The :class:`ObjectStore` class registered for ``scheme``, imported on first use.

    Raises:
        ValueError: an unknown scheme.
        ImportError: the backend's optional dependency is missing (says what to install).
    """
    try:
        module_name, class_name, extra = _REGISTRY[scheme]
    except KeyError:
        raise ValueError(f'unsupported object store scheme {scheme!r}; supported: {list(SCHEMES)}') from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f'pip install "dist-logging[{extra}]"' if extra else 'reinstall dist-logging'
        raise ImportError(f'the {scheme}:// object store needs {exc.name or "a missing package"}: {hint}') from exc
    return getattr(module, class_name)


def store_from_uri(bucket_uri: str, backend_kwargs: Optional[Mapping[str, Any]] = None) -> ObjectStore:
    """Build the store for ``bucket_uri`` (``file://``, a local path, ``s3://``) with ``backend_kwargs``.

    Raises:
        ValueError: a bad URI or scheme.
        TypeError: ``backend_kwargs`` the backend does not take.
        ImportError: a missing optional dependency (with an install hint).
    """
    scheme, location = split_bucket_uri(bucket_uri)
    cls = get_store_class(scheme)
    return cls.from_location(location, **dict(backend_kwargs or {}))


def persistable_kwargs(backend_kwargs: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The part of ``backend_kwargs`` that may be written to disk: JSON scalars whose names do not look secret.

    Staging journals record it so ``drain`` can rebuild a store (e.g. its
    ``endpoint_url``); credentials come from the environment at drain time.
    """
    kept = {}
    for key, value in (backend_kwargs or {}).items():
        if _SECRET_KEY.search(str(key)):
            continue
        if value is None or isinstance(value, (str, int, float, bool)):
            kept[str(key)] = value
    return kept


def __getattr__(name: str) -> Any:
    # LocalObjectStore / S3ObjectStore as attributes of the package, imported lazily.
    if name == 'LocalObjectStore':
        return get_store_class('file')
    if name == 'S3ObjectStore':
        return get_store_class('s3')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
