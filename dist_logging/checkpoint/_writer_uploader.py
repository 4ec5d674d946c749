"""The checkpoint writer's Uploader: built from a URI with the options that only apply then, or shared.

The one place the writer's URI-only options live (``UPLOADER_OPTIONS``: the :class:`Uploader`'s own
constructor arguments), so the writer's own parameters are about what a checkpoint needs.
"""

from __future__ import annotations

import os
from typing import Any

from dist_logging.object_store import ObjectStore
from dist_logging.upload.uploader import Uploader

__all__ = ['UPLOADER_OPTIONS', 'uploader_for']

# The keyword arguments that build the Uploader from a URI (its constructor's), and only then apply.
UPLOADER_OPTIONS = (
    'backend_kwargs',
    'upload_staging_folder',
    'run_name',
    'num_concurrent_uploads',
    'num_attempts',
    'use_procs',
    'upload_priority',
)


def uploader_for(bucket: Any, options: dict, *, sync_files: bool) -> tuple[Uploader, bool]:
    """The writer's uploader and whether the writer owns it (built from a URI) or shares it.

    ``bucket`` is a URI (an Uploader is built from it with ``options``, fsyncing with ``sync_files``),
    an :class:`Uploader`, or a destination exposing its Uploader as ``uploader`` (a
    ``RemoteUploaderDownloader``, whose object names must be the plain ``'{remote_file_name}'``).

    Raises:
        ValueError: options given with an uploader; a destination with a name template; a bad option
            (as :class:`Uploader` raises).
        TypeError: an unknown option, a ``bucket`` of another type, or a store without ``list``/``delete``.
    """
    unknown = sorted(set(options) - set(UPLOADER_OPTIONS))
    if unknown:
        raise TypeError(f'CheckpointWriter() got an unexpected keyword argument {unknown[0]!r}')
    if isinstance(bucket, (str, os.PathLike)):
        uploader, owned = Uploader(os.fspath(bucket), fsync=sync_files or None, **options), True
    else:
        candidate = bucket if isinstance(bucket, Uploader) else getattr(bucket, 'uploader', None)
        if not isinstance(candidate, Uploader):
            raise TypeError(
                f'CheckpointWriter: bucket must be a URI, an Uploader or a RemoteUploaderDownloader, '
                f'got {type(bucket).__name__}'
            )
        uploader = candidate
        if options:
            raise ValueError(
                f'CheckpointWriter: {sorted(options)} only apply to a bucket URI; configure the '
                f'{type(bucket).__name__} instead'
            )
        template = getattr(bucket, 'file_path_format_string', '{remote_file_name}')
        if template != '{remote_file_name}':
            raise ValueError(
                f'CheckpointWriter: the uploader names objects with {template!r}; checkpoints need the '
                "plain '{remote_file_name}' (put the prefix in the checkpoint id or the bucket URI)"
            )
        owned = False
    store = uploader.object_store
    for method in ('list', 'delete'):
        if not callable(getattr(type(store), method, None)) or getattr(type(store), method) is getattr(
            ObjectStore, method
        ):
            raise TypeError(
                f'CheckpointWriter: {store!r} has no {method}(); checkpoints need a store with '
                'list and delete (every dist_logging.object_store store has them)'
            )
    return uploader, owned
