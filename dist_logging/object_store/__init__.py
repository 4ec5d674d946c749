"""Object stores: a small :class:`ObjectStore` protocol, its backends, and a lazy registry.

The protocol is in :mod:`.base` (a backend implements upload, download, ranged read, size, URI, list and, for the
checkpoint code, delete), the scheme registry and URI parsing in :mod:`.registry`; the upload machinery
(snapshots, journal, retries, workers) is built above them and knows nothing about any one backend.
Builtin exceptions carry the meaning: ``FileNotFoundError`` for a missing object, ``FileExistsError``
for a refused overwrite.

Backends are found from a bucket URI's scheme through a lazy registry, so
``import dist_logging`` never imports boto3; a missing optional dependency is an
``ImportError`` that says what to install.

This package imports neither torch nor the rest of ``dist_logging``: upload
worker processes import it without paying for torch.
"""

from __future__ import annotations

from typing import Any

from dist_logging.object_store.base import (
    LazyClient,
    ObjectInfo,
    ObjectStore,
    ObjectStoreTransientError,
    check_object_name,
    check_prefix,
    download_target,
    supports_overwrite,
)
from dist_logging.object_store.registry import (
    REGISTRY,
    SCHEMES,
    get_store_class,
    persistable_kwargs,
    persistable_uri,
    split_bucket_uri,
    store_from_uri,
)

#: The scheme registry (also under its earlier name).
_REGISTRY = REGISTRY

__all__ = [
    'ObjectStore',
    'ObjectInfo',
    'ObjectStoreTransientError',
    'LazyClient',
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
    'persistable_uri',
    'persistable_kwargs',
]


def __getattr__(name: str) -> Any:
    # LocalObjectStore / S3ObjectStore as attributes of the package, imported lazily.
    if name == 'LocalObjectStore':
        return get_store_class('file')
    if name == 'S3ObjectStore':
        return get_store_class('s3')
    if name == 'FsspecObjectStore':
        return get_store_class('fsspec')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
