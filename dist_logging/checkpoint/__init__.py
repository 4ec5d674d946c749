"""Sharded checkpoints as one durable object: a ``torch.distributed.checkpoint`` writer and reader over the
upload path, with a commit rule, resume and retention (see ``docs/checkpoints.md``).

* :class:`CheckpointWriter`: a DCP ``StorageWriter``; shards go to local staging, then upload in
  the background; the coordinator commits the checkpoint once every shard landed.
* :class:`CheckpointReader`: a DCP ``StorageReader`` reading a committed checkpoint from the bucket.
* :func:`latest_checkpoint` / :func:`list_checkpoints`: committed checkpoints under a prefix.
* :func:`format_checkpoint_id`: checkpoint ids from a template (``{step}``, ``{epoch}``, ``{run_name}``).
* :func:`finish_commits`: what ``dist-logging drain`` runs to commit checkpoints a killed coordinator left.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    'CheckpointWriter',
    'CheckpointReader',
    'SaveTiming',
    'latest_checkpoint',
    'list_checkpoints',
    'format_checkpoint_id',
    'finish_commits',
    'apply_retention',
]

_LAZY = {
    'CheckpointWriter': 'dist_logging.checkpoint.writer',
    'SaveTiming': 'dist_logging.checkpoint.writer',
    'CheckpointReader': 'dist_logging.checkpoint.reader',
    'latest_checkpoint': 'dist_logging.checkpoint.latest',
    'list_checkpoints': 'dist_logging.checkpoint.latest',
    'format_checkpoint_id': 'dist_logging.checkpoint.ids',
    'finish_commits': 'dist_logging.checkpoint.drain',
    'apply_retention': 'dist_logging.checkpoint.retention',
}


def __getattr__(name: str) -> Any:
    # The writer and reader import torch.distributed.checkpoint; latest_checkpoint does not need it.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    import importlib

    if module in ('dist_logging.checkpoint.writer', 'dist_logging.checkpoint.reader'):
        _check_dcp()
    return getattr(importlib.import_module(module), name)


def _check_dcp() -> None:
    """Raise a clear ImportError where the installed torch's DCP lacks what the writer and reader build on
    (versioned metadata and ``StorageMeta``: torch 2.9 and later; tested with 2.13)."""
    import torch
    from torch.distributed.checkpoint import filesystem, metadata

    missing = [
        name
        for module, name in ((filesystem, 'CURRENT_DCP_VERSION'), (metadata, 'StorageMeta'))
        if not hasattr(module, name)
    ]
    if missing:
        raise ImportError(
            'dist_logging.checkpoint.{CheckpointWriter,CheckpointReader} need a newer torch '
            f'(2.9 or later; tested with 2.13): torch.distributed.checkpoint lacks {", ".join(missing)}; '
            f'this is torch {torch.__version__}'
        )
