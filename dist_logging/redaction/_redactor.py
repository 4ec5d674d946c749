"""Applying the key-name and value rules to nested data: :class:`Redactor` and :func:`build_redactor`."""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
from typing import Any, Iterable, Mapping, Optional, Pattern, Sequence, Union

from dist_logging.redaction._common import REDACTED, is_reference
from dist_logging.redaction._keys import credential_value, is_secret_key, names_credential_by_value
from dist_logging.redaction._text import redact_string


def _by_value(key: str, value: str) -> bool:
    """A value under a credential-ending key (``asana_token``) that reads as a credential (not ``<pad>``)."""
    return names_credential_by_value(key) and credential_value(value)


RedactOption = Union[bool, str, Pattern[str], Iterable[Union[str, Pattern[str]]], None]

# ``{name: WANDB_API_KEY, value: ...}`` (Kubernetes env, ECS task definitions, CloudFormation parameters).
_NAME_FIELDS = ('name', 'Name', 'NAME', 'key', 'Key', 'KEY')
_VALUE_FIELDS = ('value', 'Value', 'VALUE')
_FLAG = re.compile(r'--?[A-Za-z]')
_SECRET_MANIFEST_FIELDS = ('data', 'stringData')


class Redactor:
    """Applies the key-name and value rules to nested data (mappings, lists, tuples, sets).

    The value of a credential-named key is replaced by ``'***'``: a string or number becomes
    ``'***'``; a mapping or list keeps its shape with every leaf replaced; ``None``, booleans and
    empty strings are kept (they hold no secret and say whether one is set). So is the value of a
    credential-ending key that reads as a credential (``{'codecov_token': '<random>'}``), the item
    after a credential-named flag, the ``value`` of a ``{name: <credential name>, value: ...}``
    mapping, and everything under ``data``/``stringData`` of a Kubernetes ``kind: Secret`` manifest.
    Every other string is passed through the value rule. Nested dataclass instances and ``argparse.Namespace`` /
    ``SimpleNamespace`` objects become (redacted) dicts of their fields, so their secrets cannot
    leak through their repr. The input is never modified.

    Args:
        extra: a compiled regex searched in every key on top of the default word rule, or None.
        enabled: False turns all redaction off (``redact=False``).
    """

    def __init__(self, extra: Optional[Pattern[str]] = None, *, enabled: bool = True):
        self.extra = extra
        self.enabled = enabled
        self._any_name = extra is not None
        self._cache: dict[str, bool] = {}

    @property
    def pattern(self) -> Optional[Pattern[str]]:
        """The user's extra key pattern (None when there is none)."""
        return self.extra

    def is_secret_key(self, key: str) -> bool:
        """The default word rule, or the user's extra pattern (cached per key)."""
        hit = self._cache.get(key)
        if hit is None:
            hit = is_secret_key(key) or (self.extra is not None and self.extra.search(key) is not None)
            if len(self._cache) > 65536:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of ``data`` (the input is never modified)."""
        if not self.enabled:
            return dict(data)
        return self._mapping(data)

    def text(self, text: str) -> str:
        """The value rule on one string (with this redactor's key rule for ``name=value`` pairs)."""
        if not self.enabled:
            return text
        return redact_string(text, self.is_secret_key, self._any_name)

    def table(self, columns: Sequence[str], rows: list[list[Any]]) -> list[list[Any]]:
        """Table rows with credential-named columns concealed and every cell through the value rule (a cell
        under a credential-ending column such as ``codecov_token`` also by its value)."""
        if not self.enabled:
            return rows
        secret_columns = [self.is_secret_key(column) for column in columns]
        return [
            [
                self._conceal(cell) if secret else self._cell(column, cell)
                for cell, secret, column in zip(row, secret_columns, columns)
            ]
            for row in rows
        ]

    def _cell(self, column: Any, cell: Any) -> Any:
        """A cell of a column not named as a credential: by value, and by the column name's last word."""
        if type(cell) is str and type(column) is str and _by_value(column, cell):
            return REDACTED  # an ``asana_token`` column of random strings
        return self._value(cell)

    def _key(self, key: Any) -> Any:
        return redact_string(key, self.is_secret_key, self._any_name) if type(key) is str else key

    def _mapping(self, data: Mapping[Any, Any]) -> dict[Any, Any]:
        named = self._named_value(data)
        # A Kubernetes Secret manifest: every value under ``data``/``stringData`` is a secret, whatever its key.
        secret_manifest = isinstance(data.get('kind'), str) and data['kind'].lower() == 'secret'
        out = {}
        for key, value in data.items():
            if (
                (isinstance(key, str) and self.is_secret_key(key))
                or (named is not None and key == named)
                or (secret_manifest and key in _SECRET_MANIFEST_FIELDS)
            ):
                out[self._key(key)] = self._conceal(value)
            elif type(value) is str and type(key) is str and _by_value(key, value):
                out[self._key(key)] = REDACTED
            else:
                out[self._key(key)] = self._value(value)
        return out

    def _named_value(self, data: Mapping[Any, Any]) -> Optional[str]:
        """The value field of a ``{name: <credential name>, value: ...}`` mapping (a Kubernetes env entry), or None."""
        for value_field in _VALUE_FIELDS:
            if value_field in data:
                for name_field in _NAME_FIELDS:
                    name = data.get(name_field)
                    if isinstance(name, str) and self.is_secret_key(name):
                        return value_field
                return None
        return None

    def _sequence(self, items: Sequence[Any]) -> list[Any]:
        """Items of a list or tuple; the item after a credential-named flag (``['--hf-token', X]``) concealed.

        Only an item that reads as a flag (``-x``/``--name``, no ``=``) is taken as a name: the value
        after it is never one, whatever it says (``['--run-name', 'token']``).
        """
        out = []
        conceal_next = False
        name = ''
        for item in items:
            flag = type(item) is str and _FLAG.match(item) is not None
            if conceal_next and not flag:
                out.append(self._conceal(item))
                conceal_next = False
                continue
            if name and not flag and type(item) is str and _by_value(name, item):
                out.append(REDACTED)  # ``['--asana-token', '<random>']``: a credential by its value
                name = ''
                continue
            out.append(self._value(item))
            name = item.lstrip('-') if flag and '=' not in item else ''
            conceal_next = bool(name) and self.is_secret_key(name)
        return out

    @staticmethod
    def _fields(value: Any) -> Optional[dict[str, Any]]:
        # Config objects (dataclasses, argparse/SimpleNamespace) would reach destinations as their
        # repr, secrets included: log them as the mappings they are, redacted.
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):
            return vars(value)
        return None

    def _value(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return redact_string(value, self.is_secret_key, self._any_name)
        if kind in (int, float, bool) or value is None:
            return value
        if isinstance(value, Mapping):
            return self._mapping(value)
        if isinstance(value, str):
            return redact_string(value, self.is_secret_key, self._any_name)
        fields = self._fields(value)
        if fields is not None:
            return self._mapping(fields)
        if isinstance(value, list):
            return self._sequence(value)
        if isinstance(value, tuple):
            return tuple(self._sequence(value))
        if isinstance(value, (set, frozenset)):
            return type(value)(self._value(v) for v in value)
        return value

    def _conceal(self, value: Any) -> Any:
        """The value of a credential-named key: every leaf replaced, the shape kept."""
        if value is None or isinstance(value, bool) or (isinstance(value, str) and (not value or is_reference(value))):
            return value  # no secret in it, or only where the secret is kept (``${POSTGRES_PASSWORD}``)
        if isinstance(value, Mapping):
            return {self._key(k): self._conceal(v) for k, v in value.items()}
        fields = self._fields(value)
        if fields is not None:
            return {k: self._conceal(v) for k, v in fields.items()}
        if isinstance(value, (list, tuple)):
            return (
                [self._conceal(v) for v in value] if isinstance(value, list) else tuple(self._conceal(v) for v in value)
            )
        return REDACTED


def build_redactor(redact: RedactOption = True) -> Redactor:
    """Build the Logger's redactor from its ``redact=`` option.

    Args:
        redact: ``True``/``None`` (the default rules), ``False`` (no redaction), or a regex
            string / compiled pattern / iterable of them, searched case-insensitively in every
            key *on top of* the default rules (``redact=r'^wandb_'``).

    Raises:
        ValueError: a pattern that does not compile (names it).
        TypeError: any other kind of value.
    """
    if redact is False:
        return Redactor(None, enabled=False)
    parts: list[str] = []
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
    extra = re.compile('|'.join(f'(?:{p})' for p in parts), re.IGNORECASE) if parts else None
    return Redactor(extra)
