"""The arguments torch's ``FileSystemWriter`` takes, as ``CheckpointWriter`` takes them; the bucket probe at
construction; the ``overwrite=False`` check. (The table of what each means here is in ``docs/checkpoints.md``.)"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Iterable, Optional, Sequence

from torch.distributed.checkpoint.filesystem import SerializationFormat

from dist_logging import _private_dirs
from dist_logging.checkpoint._layout import markers_by_checkpoint

__all__ = ['check_torch_options', 'probe_bucket', 'refuse_existing', 'PROBE_NAME']

log = logging.getLogger(__name__)
PROBE_NAME = '.dist_logging-write-probe'  # the one object the construction-time probe writes (and rewrites)


def check_torch_options(
    *,
    single_file_per_rank: Any,
    per_thread_copy_ahead: Any,
    overwrite: Any,
    extensions: Optional[Sequence[Any]],
    serialization_format: Any,
    thread_count: Any,
) -> None:
    """Refuse, naming the argument and why, what torch's ``FileSystemWriter`` arguments cannot mean here.

    Raises:
        ValueError: ``serialization_format=SAFETENSORS`` (torch's own ``FileSystemReader`` cannot read those
            shards back, nor can :class:`CheckpointReader`; torch's ``HuggingFaceStorageWriter`` writes them for
            Hugging Face readers), a non-positive ``thread_count``, a negative ``per_thread_copy_ahead``,
            non-bool ``overwrite``/``single_file_per_rank``, or an extension that is not one of torch's
            ``StreamTransformExtension``.
    """
    from torch.distributed.checkpoint._extension import StreamTransformExtension

    for label, value in (('overwrite', overwrite), ('single_file_per_rank', single_file_per_rank)):
        if not isinstance(value, bool):
            raise ValueError(f'CheckpointWriter: {label} must be True or False, got {value!r}')
    if isinstance(thread_count, bool) or not isinstance(thread_count, int) or thread_count < 1:
        raise ValueError(f'CheckpointWriter: thread_count must be a positive int, got {thread_count!r}')
    if (
        isinstance(per_thread_copy_ahead, bool)
        or not isinstance(per_thread_copy_ahead, int)
        or per_thread_copy_ahead < 0
    ):
        raise ValueError(
            f'CheckpointWriter: per_thread_copy_ahead must be an int >= 0 (bytes), got {per_thread_copy_ahead!r}'
        )
    if serialization_format != SerializationFormat.TORCH_SAVE:
        raise ValueError(
            f'CheckpointWriter: serialization_format={serialization_format!r} is not supported: only '
            "SerializationFormat.TORCH_SAVE shards can be read back by torch's FileSystemReader and by "
            "CheckpointReader (for safetensors, torch's HuggingFaceStorageWriter writes them for Hugging "
            'Face readers)'
        )
    for extension in extensions or ():
        if not isinstance(extension, StreamTransformExtension):
            raise ValueError(
                f'CheckpointWriter: _extensions must be torch StreamTransformExtension instances '
                f'(e.g. torch.distributed.checkpoint._extension.ZStandard()), got {extension!r}'
            )


def probe_bucket(store: Any, where: str) -> None:
    """One small request proving the bucket exists and takes writes with these credentials: a zero-byte
    ``PROBE_NAME`` object at the bucket URI's root, written again by every probe (never a second object).

    Raises:
        RuntimeError: naming the bucket and the store's error (the original is the cause).
    """
    from dist_logging.checkpoint.commit import retry

    # The empty file it uploads is an anonymous in-memory file (Linux): no name in any folder, shared or not;
    # elsewhere a file in this user's private folder.
    fd = os.memfd_create('dist_logging-probe') if hasattr(os, 'memfd_create') else None
    if fd is not None:
        path = f'/proc/self/fd/{fd}'
    else:
        path = os.path.join(_private_dirs.private_dir('probes'), f'{os.getpid()}-{uuid.uuid4().hex[:8]}')
        with open(path, 'xb'):
            pass
    try:
        retry(store, lambda: store.upload_object(PROBE_NAME, path, overwrite=True))
    except Exception as exc:  # noqa: BLE001 - re-raised with the bucket's name
        raise RuntimeError(
            f'CheckpointWriter: the bucket {where} cannot be written ({type(exc).__name__}: {exc}); '
            'no checkpoint could ever commit there. Check the URI, that the bucket exists, and the '
            'credentials (validate_bucket=False skips this check, e.g. for an offline start)'
        ) from exc
    finally:
        if fd is not None:
            os.close(fd)
        else:
            os.unlink(path)


def refuse_existing(store: Any, checkpoint_id: str, pending: Iterable[str], where: str) -> None:
    """``overwrite=False``: refuse a checkpoint id that is committed in the bucket (one listing of its folder)
    or waiting for its commit in this writer's staging (``pending``), before any shard is written.

    Raises:
        RuntimeError: torch's words (``Checkpoint already exists``), with the id and the bucket.
    """
    from dist_logging.checkpoint.commit import retry

    if checkpoint_id in set(pending):
        raise RuntimeError(
            f'Checkpoint already exists and self.overwrite=False: {checkpoint_id!r} was saved by this '
            f'job and is waiting for its commit in {where}'
        )
    listing = retry(store, lambda: store.list(f'{checkpoint_id}/'))
    if markers_by_checkpoint(listing).get(checkpoint_id):
        raise RuntimeError(
            f'Checkpoint already exists and self.overwrite=False: {checkpoint_id!r} is committed in {where}'
        )
