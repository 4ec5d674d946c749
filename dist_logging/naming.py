"""Names made from templates: ``format_name_with_dist`` and friends, validated up front."""

from __future__ import annotations

import functools
import string
from typing import Any, Iterable

from dist_logging import dist

# One definition of a safe object name, shared with the (torch-free) object stores.
from dist_logging.object_store import check_object_name as validate_object_name

__all__ = [
    'DIST_PLACEHOLDERS',
    'TIME_PLACEHOLDERS',
    'format_name_with_dist',
    'format_name_with_dist_and_time',
    'template_placeholders',
    'validate_template',
    'check_rank_distinct',
    'validate_object_name',
]

DIST_PLACEHOLDERS = ('run_name', 'rank', 'local_rank', 'world_size', 'local_world_size', 'node_rank', 'attempt')
TIME_PLACEHOLDERS = (
    'epoch',
    'batch',
    'batch_in_epoch',
    'sample',
    'sample_in_epoch',
    'token',
    'token_in_epoch',
    'total_wct',
    'epoch_wct',
    'batch_wct',
)


def template_placeholders(format_str: str) -> set[str]:
    """The placeholder names used in ``format_str``.

    Raises:
        TypeError: ``format_str`` is not a string.
        ValueError: Unbalanced braces, or a positional placeholder (``{}``/``{0}``).
    """
    if not isinstance(format_str, str):
        raise TypeError(f'name template must be a str, got {type(format_str).__name__}: {format_str!r}')
    return set(_parse_placeholders(format_str))


@functools.lru_cache(maxsize=256)
def _parse_placeholders(format_str: str) -> frozenset[str]:
    # Cached: the same templates are formatted at every upload and flush.
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(format_str))
    except ValueError as exc:
        raise ValueError(f'invalid name template {format_str!r}: {exc}') from None
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        root = field.split('.', 1)[0].split('[', 1)[0]
        if root == '' or root.isdigit():
            raise ValueError(
                f'name template {format_str!r} has a positional placeholder {{{field}}}; use a name such as {{rank}}'
            )
        names.add(root)
        if spec and '{' in spec:
            names |= template_placeholders(spec)
    return frozenset(names)


def validate_template(format_str: str, allowed: Iterable[str]) -> set[str]:
    """Check that ``format_str`` uses only ``allowed`` placeholders; return the ones it uses.

    Raises:
        ValueError: an unknown placeholder (named, with the allowed list), or bad braces.
    """
    used = template_placeholders(format_str)
    unknown = sorted(used.difference(allowed))
    if unknown:
        raise ValueError(
            f'name template {format_str!r} uses unknown placeholder(s) {", ".join("{" + u + "}" for u in unknown)}; '
            f'allowed: {", ".join("{" + a + "}" for a in sorted(allowed))}'
        )
    return used


def _dist_values(run_name: str) -> dict[str, Any]:
    return {
        'run_name': run_name,
        'rank': dist.get_global_rank(),
        'local_rank': dist.get_local_rank(),
        'world_size': dist.get_world_size(),
        'local_world_size': dist.get_local_world_size(),
        'node_rank': dist.get_node_rank(),
        'attempt': dist.get_attempt(),
    }


def _format(format_str: str, values: dict[str, Any]) -> str:
    validate_template(format_str, values)
    try:
        name = format_str.format(**values)
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        raise ValueError(f'could not format name template {format_str!r}: {exc}') from None
    if not name:
        raise ValueError(f'name template {format_str!r} formats to an empty name')
    return name


def format_name_with_dist(format_str: str, run_name: str, **extra: Any) -> str:
    """Fill a name template with the run name and this process's rank facts.

    Placeholders: ``{run_name}``, ``{rank}``, ``{local_rank}``, ``{world_size}``,
    ``{local_world_size}``, ``{node_rank}``, ``{attempt}`` (``'0'``, then the torchrun restart or
    SLURM requeue count: text, see :func:`dist_logging.dist.get_attempt`) and any keyword in ``extra``. Format
    specs work (``'{rank:03d}'``).

    Example:
        >>> format_name_with_dist('{run_name}/logs-rank{rank}.txt', 'run1')  # on rank 0
        'run1/logs-rank0.txt'

    Raises:
        ValueError: An unknown placeholder (named, with the allowed ones), unbalanced
            braces, or a template that formats to an empty name.
    """
    values = _dist_values(run_name)
    values.update(extra)
    return _format(format_str, values)


def format_name_with_dist_and_time(format_str: str, run_name: str, timestamp: Any, **extra: Any) -> str:
    """Like :func:`format_name_with_dist`, also with the fields of a :class:`~dist_logging.Timestamp`.

    Adds ``{epoch}``, ``{batch}``, ``{batch_in_epoch}``, ``{sample}``, ``{sample_in_epoch}``,
    ``{token}``, ``{token_in_epoch}``, ``{total_wct}``, ``{epoch_wct}``, ``{batch_wct}``.

    Raises:
        ValueError: as :func:`format_name_with_dist`.
    """
    values = _dist_values(run_name)
    values.update({field: getattr(timestamp, field) for field in TIME_PLACEHOLDERS})
    values.update(extra)
    return _format(format_str, values)


def check_rank_distinct(template: str, ranks: str, what: str) -> None:
    """Refuse a per-rank output template that would make two processes write one name.

    ``ranks='all'`` needs ``{rank}`` (or both ``{node_rank}`` and ``{local_rank}``) when the
    world has more than one rank; ``ranks='local_zero'`` needs ``{rank}`` or
    ``{node_rank}`` when there is more than one node. ``ranks='zero'`` is always fine.

    Raises:
        ValueError: naming the template and the placeholder it lacks.
    """
    used = template_placeholders(template)
    if ranks == 'all' and dist.get_world_size() > 1:
        if 'rank' not in used and not {'node_rank', 'local_rank'} <= used:
            raise ValueError(
                f"{what} template {template!r} is used with ranks='all' in a world of {dist.get_world_size()} "
                "ranks but cannot tell ranks apart: add {rank} (or {node_rank} and {local_rank})"
            )
    elif ranks == 'local_zero' and dist.get_num_nodes() > 1:
        if 'rank' not in used and 'node_rank' not in used:
            raise ValueError(
                f"{what} template {template!r} is used with ranks='local_zero' on {dist.get_num_nodes()} nodes "
                "but cannot tell nodes apart: add {node_rank} (or {rank})"
            )
