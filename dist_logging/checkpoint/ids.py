"""Checkpoint ids from a template: ``'{run_name}/checkpoints/ep{epoch}-step{step}'``."""

from __future__ import annotations

from typing import Any

from dist_logging.checkpoint._layout import check_checkpoint_id
from dist_logging.naming import format_name_with_dist, template_placeholders

__all__ = ['format_checkpoint_id']

# Every rank must name the same checkpoint: placeholders that differ between ranks are refused.
_PER_RANK = ('rank', 'local_rank', 'node_rank')


def format_checkpoint_id(template: str, *, run_name: str, step: int, epoch: int = 0, **extra: Any) -> str:
    """Fill a checkpoint id template with ``{step}``, ``{epoch}``, ``{run_name}``, ``{world_size}``,
    ``{local_world_size}`` and any keyword in ``extra``.

    Example:
        >>> format_checkpoint_id('{run_name}/checkpoints/step{step:06d}', run_name='r1', step=100)
        'r1/checkpoints/step000100'

    Raises:
        ValueError: an unknown placeholder, a per-rank one (``{rank}``, ``{local_rank}``,
            ``{node_rank}``: every rank must name the same checkpoint), bad braces, or a result
            that is no valid checkpoint id (empty, absolute, ``..``).
        TypeError: ``step``/``epoch`` not integers.
    """
    for label, value in (('step', step), ('epoch', epoch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f'format_checkpoint_id: {label} must be an int, got {value!r}')
    per_rank = sorted(template_placeholders(template) & set(_PER_RANK))
    if per_rank:
        raise ValueError(
            f'checkpoint id template {template!r} uses {per_rank}: every rank must name the same '
            'checkpoint (the shard files are per rank already)'
        )
    return check_checkpoint_id(format_name_with_dist(template, run_name, step=step, epoch=epoch, **extra))
