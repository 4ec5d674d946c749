"""Helpers shared by destinations that write tables, images and parameters: safe names, JSON values, flattening."""

from __future__ import annotations

import json
import math
import numbers
import re
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from dist_logging._values import format_log_data_value

__all__ = ['safe_artifact_name', 'jsonable', 'flatten', 'markdown_table', 'table_json']

_UNSAFE = re.compile(r'[^A-Za-z0-9._\-/]+')


def safe_artifact_name(name: str) -> str:
    """``name`` as a relative path that stays where it is put: unsafe characters become ``_``,
    empty / ``.`` / ``..`` components are dropped (``'val/../x y'`` -> ``'val/x_y'``)."""
    parts = [_UNSAFE.sub('_', part) for part in str(name).replace('\\', '/').split('/')]
    parts = [part for part in parts if part not in ('', '.', '..')]
    return '/'.join(parts) or '_'


def jsonable(value: Any) -> Any:
    """A JSON-friendly version of a logged value: numbers stay numbers (0-d tensors and numpy
    scalars too), NaN/inf become strings, containers are converted recursively, anything else
    is formatted with :func:`~dist_logging.format_log_data_value`."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return jsonable(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, np.ndarray):
        return jsonable(value.item() if value.size == 1 else value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return format_log_data_value(value)


def flatten(data: Mapping[str, Any], sep: str = '/', prefix: str = '') -> dict[str, Any]:
    """Flatten nested mappings: ``{'opt': {'lr': 0.1}}`` -> ``{'opt/lr': 0.1}``. Lists are kept as values."""
    return dict(_flatten(data, sep, prefix))


def _flatten(data: Mapping[str, Any], sep: str, prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f'{prefix}{sep}{key}' if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, sep, name)
        else:
            yield name, value


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (pipes in cells escaped), as TensorBoard's text plugin renders it."""

    def cell(value: Any) -> str:
        return format_log_data_value(value).replace('|', '\\|').replace('\n', ' ')

    lines = ['| ' + ' | '.join(cell(c) for c in columns) + ' |', '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(cell(v) for v in row) + ' |' for row in rows]
    return '\n'.join(lines)


def table_json(columns: list[str], rows: list[list[Any]], ascii: bool = True) -> str:
    """A table as the compact JSON Composer's loggers print (pandas' ``orient='split'`` without
    the index): ``{"columns":["a","b"],"data":[[1,"x"]]}``, with ``/`` escaped as ``\\/`` as pandas does."""
    text = json.dumps(
        {'columns': [jsonable(c) for c in columns], 'data': [[jsonable(v) for v in row] for row in rows]},
        separators=(',', ':'),
        ensure_ascii=ascii,
    )
    return text.replace('/', '\\/')
