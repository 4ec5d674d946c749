"""Local folders the checkpoint code uses, all derived from the upload staging helpers (one place)."""

from __future__ import annotations

import os
import uuid
from typing import Optional

__all__ = ['scratch_folder', 'default_cache_folder']


def _run_base(run_name: Optional[str]) -> str:
    # <system temp>/dist_logging-<user>/<run>: the folder default_staging_folder() puts 'staging' in,
    # checked private (owned by this user, not a symlink) as the uploader checks it.
    from dist_logging.destinations.remote import _check_private_base, default_staging_folder

    staging = default_staging_folder(run_name or 'standalone')
    _check_private_base(os.path.dirname(os.path.dirname(staging)))
    return os.path.dirname(staging)


def scratch_folder(run_name: Optional[str] = None) -> str:
    """A new private folder for small temporary files (markers being read or written). The caller removes it."""
    path = os.path.join(_run_base(run_name), 'checkpoint-scratch', uuid.uuid4().hex[:16])
    os.makedirs(path, mode=0o700)
    return path


def default_cache_folder(run_name: Optional[str] = None) -> str:
    """Where :class:`CheckpointReader` keeps downloaded files, shared by the ranks of a node."""
    path = os.path.join(_run_base(run_name), 'checkpoint-cache')
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
