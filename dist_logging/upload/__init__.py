"""Uploads: :class:`Uploader`, the one public port every producer of files goes through, and its machinery.

* :class:`Uploader` (:mod:`~dist_logging.upload.uploader`): enqueue a file by link or by copy
  under an object name; landed/failed callbacks; staged bytes and the staging bound; wait,
  shutdown, and the drain of a dead process's staging. :class:`~dist_logging.destinations.RemoteUploaderDownloader`
  and :class:`~dist_logging.checkpoint.CheckpointWriter` are both built on it.
* :mod:`~dist_logging._files`: the file as it is at the call (reflink, in-kernel copy, hard link).
* :mod:`~dist_logging.upload.journal`: the per-rank append-only record of queued/done uploads.
* :mod:`~dist_logging.upload.staging`: the staging folder layout; a rank's folder (lock, journal, snapshots).
* :mod:`~dist_logging.upload.retry`: :class:`RetryPolicy` and transient/permanent errors.
* :mod:`~dist_logging.upload.workers`: per-name ordering over threads or processes.
* :mod:`~dist_logging.upload.drain`: uploading what a staging folder holds, without a training job.

Like :mod:`dist_logging.object_store`, these modules do not import torch at import time (worker
processes import them); submodules are imported on use, :class:`Uploader` included.
"""

from __future__ import annotations

from typing import Any

__all__ = ['Uploader']


def __getattr__(name: str) -> Any:
    if name == 'Uploader':
        from dist_logging.upload.uploader import Uploader

        return Uploader
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
