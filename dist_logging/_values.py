"""Checking and converting the values users log (metric scalars, free-form data)."""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

import numpy as np
import torch

__all__ = ['format_log_data_value', 'metric_scalar', 'check_metric_key', 'check_table', 'json_safe']


def format_log_data_value(value: Any) -> str:
    """Recursively format a log value as a string.

    Strings are returned as they are; numbers with ``repr`` precision (floats of
    integral value keep their ``.0``); 0-d/1-element tensors and numpy scalars as
    their number; larger tensors and arrays as nested lists; mappings as
    ``{ key: value, ... }``; other sequences as ``[a, b, ...]``; anything else
    with ``str()``. Never raises for an unknown type.
    """
    if value is None:
        return 'None'
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Number) and not isinstance(value, np.ndarray):
        if isinstance(value, np.generic):
            value = value.item()
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return format_log_data_value(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, np.ndarray):
        return format_log_data_value(value.item() if value.size == 1 else value.tolist())
    if isinstance(value, Mapping):
        return '{ ' + ', '.join(f'{k}: {format_log_data_value(v)}' for k, v in value.items()) + ' }'
    if isinstance(value, (list, tuple, set, frozenset)):
        return '[' + ', '.join(format_log_data_value(v) for v in value) + ']'
    return str(value)


def json_safe(value: Any) -> Any:
    """``value`` with every mapping key that JSON cannot hold (tuples, objects...) turned into its
    :func:`format_log_data_value` text, so ``json.dumps(..., default=format_log_data_value)`` never fails.
    """
    if isinstance(value, Mapping):
        return {
            k if isinstance(k, (str, int, float, bool)) or k is None else format_log_data_value(k): json_safe(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def check_metric_key(key: Any) -> str:
    """Return ``key`` if it is a non-empty string.

    Raises:
        TypeError: the key is not a string (names its type and value).
        ValueError: the key is empty.
    """
    if type(key) is not str:
        if not isinstance(key, str):
            raise TypeError(f'metric names must be str, got {type(key).__name__} {key!r}')
    if not key:
        raise ValueError('metric names must not be empty')
    return key


def check_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], name: Any) -> tuple[list, list]:
    """The table's columns and rows as lists, checked.

    Raises:
        TypeError: a name that is not a non-empty string, or columns that are not strings.
        ValueError: a row whose length differs from the number of columns (names the row).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f'table name must be a non-empty str, got {name!r}')
    columns = list(columns)
    for column in columns:
        if not isinstance(column, str):
            raise TypeError(f'table {name!r}: column names must be str, got {column!r}')
    rows = [list(row) for row in rows]
    for index, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f'table {name!r}: row {index} has {len(row)} values for {len(columns)} columns')
    return columns, rows


def metric_scalar(key: str, value: Any) -> float | int:
    """Convert one metric value to a Python number.

    Accepts Python numbers (``bool`` as 0/1), numpy scalars, 0-d or 1-element numpy
    arrays and tensors (on any device). NaN and inf pass through unchanged.

    Raises:
        TypeError: a value that is not numeric (a string, a list, ...), naming the key.
        ValueError: an array or tensor with more than one element, naming the key.
    """
    kind = type(value)
    if kind is float or kind is int:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f'metric {key!r}: a tensor of shape {tuple(value.shape)} is not a scalar; '
                'log a 0-d or 1-element tensor (e.g. loss.mean())'
            )
        if value.is_complex():
            raise TypeError(f'metric {key!r}: complex tensors are not supported')
        return value.item()
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f'metric {key!r}: an array of shape {value.shape} is not a scalar')
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f'metric {key!r}: value {value!r} of type {type(value).__name__} is not a number')
