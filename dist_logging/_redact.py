"""Redaction of secrets in hyperparameters and traces before any destination sees them."""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
from typing import Any, Iterable, Mapping, Optional, Pattern, Union

__all__ = ['DEFAULT_SECRET_PATTERN', 'REDACTED', 'build_redactor', 'Redactor']

DEFAULT_SECRET_PATTERN = r'password|passwd|secret|token|api_key|apikey|access_key|credential'
REDACTED = '***'

RedactOption = Union[bool, str, Pattern[str], Iterable[Union[str, Pattern[str]]], None]


class Redactor:
    """Replaces the values of secret-looking keys with ``'***'``, in nested mappings and lists too.

    Nested dataclass instances and ``argparse.Namespace``/``SimpleNamespace`` objects are
    turned into (redacted) dicts of their fields, so their secrets cannot leak through their repr.
    """

    def __init__(self, pattern: Optional[Pattern[str]]):
        self.pattern = pattern

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of ``data`` (the input is never modified)."""
        if self.pattern is None:
            return dict(data)
        return self._mapping(data)

    def _mapping(self, data: Mapping[Any, Any]) -> dict[Any, Any]:
        out = {}
        for key, value in data.items():
            if isinstance(key, str) and self.pattern.search(key):  # type: ignore[union-attr]
                out[key] = REDACTED
            else:
                out[key] = self._value(value)
        return out

    def _value(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return self._mapping(value)
        # Config objects (dataclasses, argparse/SimpleNamespace) would reach destinations as their
        # repr, secrets included: log them as the mappings they are, redacted.
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._mapping({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
        if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):
            return self._mapping(vars(value))
        if isinstance(value, (list, tuple)):
            return type(value)(self._value(v) for v in value) if isinstance(value, list) else tuple(self._value(v) for v in value)
        return value


def build_redactor(redact: RedactOption = True) -> Redactor:
    """Build the Logger's redactor from its ``redact=`` option.

    Args:
        redact: ``True``/``None`` (the default pattern), ``False`` (no redaction), or a
            regex string / compiled pattern / iterable of them, which *extends* the default.

    Raises:
        ValueError: a pattern that does not compile (names it).
        TypeError: any other kind of value.
    """
    if redact is False:
        return Redactor(None)
    parts = [DEFAULT_SECRET_PATTERN]
    if redact is True or redact is None:
        pass
    elif isinstance(redact, (str, re.Pattern)):
        parts.append(redact.pattern if isinstance(redact, re.Pattern) else redact)
    elif isinstance(redact, Iterable):
        for item in redact:
            if not isinstance(item, (str, re.Pattern)):
                raise TypeError(f'redact patterns must be str or re.Pattern, got {item!r}')
            parts.append(item.pattern if isinstance(item, re.Pattern) else item)
    else:
        raise TypeError(f'redact must be a bool, a regex string or a list of them, got {redact!r}')
    for part in parts:
        try:
            re.compile(part)
        except re.error as exc:
            raise ValueError(f'redact pattern {part!r} is not a valid regular expression: {exc}') from None
    return Redactor(re.compile('|'.join(f'(?:{p})' for p in parts), re.IGNORECASE))
