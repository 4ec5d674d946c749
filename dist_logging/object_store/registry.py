"""The scheme registry: which backend serves a bucket URI (imported on first use), URI parsing, what of it persists.

Backends are found from a bucket URI's scheme through a lazy registry, so ``import dist_logging`` never
imports boto3; a missing optional dependency is an ``ImportError`` that says what to install.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, Mapping, Optional

from dist_logging.object_store.base import ObjectStore

__all__ = [
    'REGISTRY',
    'SCHEMES',
    'split_bucket_uri',
    'get_store_class',
    'store_from_uri',
    'persistable_uri',
    'persistable_kwargs',
]

# scheme -> (module, class name, pip extra or None)
REGISTRY: dict[str, tuple[str, str, Optional[str]]] = {
    'file': ('dist_logging.object_store.local', 'LocalObjectStore', None),
    's3': ('dist_logging.object_store.s3', 'S3ObjectStore', 's3'),
}
SCHEMES = tuple(REGISTRY)
_LAZY_EXTRA: dict[str, tuple[str, str, Optional[str]]] = {
    'fsspec': ('dist_logging.object_store.fsspec_store', 'FsspecObjectStore', 'fsspec')
}
# Any other scheme goes to FsspecObjectStore when fsspec knows it. Without fsspec installed these
# common ones are still recognized, so the error is an install hint rather than "unknown scheme".
_FSSPEC_COMMON = (
    'gs',
    'gcs',
    'az',
    'abfs',
    'abfss',
    'adl',
    'oci',
    'sftp',
    'ssh',
    'hf',
    'memory',
    'hdfs',
    'webhdfs',
    'ftp',
    'dbfs',
    'oss',
    'r2',
    'box',
    'dropbox',
    'gdrive',
    'lakefs',
    'wandb',
)
_NATIVE_SCHEME_HINT = 's3://, file://, a local path, or a scheme fsspec implements (gs://, az://, sftp://, ...)'

# Backend kwargs never written to staging journals (boto3's, and fsspec backends': adlfs's account_key /
# connection_string / sas_token, sftp's pkey / password, gcsfs's token, ...).
_SECRET_KEY = re.compile(
    r'secret|token|password|passwd|credential|access_key|session|key_id|account_key|'
    r'connection_string|private_key|pkey|^key$|sas',
    re.IGNORECASE,
)


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
    if scheme not in REGISTRY:
        if not _fsspec_knows(scheme):
            raise ValueError(
                f'bucket_uri {uri!r}: unsupported scheme {scheme!r}; supported: {_NATIVE_SCHEME_HINT} '
                '(or pass a custom object_store=)'
            )
        if not rest.strip('/') and scheme != 'memory':
            raise ValueError(f'bucket_uri {uri!r}: missing a location after {scheme}://')
        return scheme, rest
    if scheme == 'file':
        if rest.startswith('localhost/'):
            rest = rest[len('localhost') :]
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


def get_store_class(scheme: str) -> type[Any]:
    """The :class:`ObjectStore` class for ``scheme``, imported on first use.

    ``file`` and ``s3`` have native stores; any other scheme fsspec implements gets
    :class:`FsspecObjectStore`.

    Raises:
        ValueError: an unknown scheme.
        ImportError: the backend's optional dependency is missing (says what to install).
    """
    if scheme not in REGISTRY and _fsspec_knows(scheme):
        scheme = 'fsspec'
    try:
        module_name, class_name, extra = REGISTRY.get(scheme) or _LAZY_EXTRA[scheme]
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
    if scheme not in REGISTRY:
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
