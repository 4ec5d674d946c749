"""The upload machinery behind :class:`~dist_logging.destinations.RemoteUploaderDownloader`.

* :mod:`~dist_logging.upload.snapshot`: the file as it is at the call (reflink, in-kernel copy, hard link).
* :mod:`~dist_logging.upload.journal`: the per-rank append-only record of queued/done uploads.
* :mod:`~dist_logging.upload.staging`: a rank's staging folder (lock, journal, snapshots).
* :mod:`~dist_logging.upload.retry`: :class:`RetryPolicy` and transient/permanent errors.
* :mod:`~dist_logging.upload.workers`: per-name ordering over threads or processes.
* :mod:`~dist_logging.upload.drain`: uploading what a staging folder holds, without a training job.

Like :mod:`dist_logging.object_store`, these modules do not import torch (worker
processes import them); submodules are imported on use.
"""
