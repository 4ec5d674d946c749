"""The redaction rules as they were before issue 23 (the baseline of benchmarks/redaction_cost.py).

A frozen copy of dist_logging/_redact.py at 76b9bdb; not used by the package.


Two rules, applied by the Logger to hyperparameters, traces and table cells:

* **By key name** (:func:`is_secret_key`): a key is split into words (on ``_ - .``, spaces,
  camelCase and digit boundaries) and names a credential when its words say so: password,
  passwd, pwd, passphrase, secret(s), credential(s), auth, cookie, an api/access/private/session/
  secret/client... ``key``, or ``token`` standing alone or right after a word naming a service or
  authentication (``hf_token``, ``GITHUB_TOKEN``, ``access_token``). ``token`` as a vocabulary or
  counted thing (``pad_token``, ``max_new_tokens``, ``tokenizer``) is not a credential.
* **By value** (:func:`redact_text`), whatever the key, in every string: a URL's user-info
  password, well-known credential formats (AWS key ids, Hugging Face, OpenAI-style, GitHub, Slack,
  Google API keys, JWTs, ``Bearer`` tokens, PEM private-key blocks) and ``name=value``,
  ``'name': 'value'``, ``name: value`` and ``--name value`` pairs inside a string whose name is a
  credential by the key rule.
  A bare 40-hex string (a git commit) and a UUID are not secrets by their value.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import types
from typing import Any, Callable, Iterable, Mapping, Optional, Pattern, Sequence, Union

__all__ = [
    'DEFAULT_SECRET_PATTERN',
    'REDACTED',
    'Redactor',
    'build_redactor',
    'is_secret_key',
    'key_words',
    'redact_text',
]

REDACTED = '***'

RedactOption = Union[bool, str, Pattern[str], Iterable[Union[str, Pattern[str]]], None]

# --------------------------------------------------------------------------- the key-name rule

#: Words (after splitting a key) that name a credential wherever they stand.
DEFAULT_SECRET_PATTERN = (
    r'^(?:\w*password\w*|\w*passwd\w*|pwd|passphrase|\w*secrets?\w*|\w*credentials?|creds'
    r'|auth|oauth|\w+auth|authorization|authn|authz|cookies?)$'
)
_SECRET_WORD = re.compile(DEFAULT_SECRET_PATTERN)

# ``<qualifier> key`` (and ``<qualifier>key`` written as one word) is a credential.
_KEY_QUALIFIERS = frozenset(
    {
        'api',
        'access',
        'private',
        'session',
        'secret',
        'client',
        'signing',
        'encryption',
        'master',
        'license',
        'subscription',
        'account',
        'storage',
        'service',
        'auth',
        'ssh',
        'deploy',
        'admin',
        'app',
        'consumer',
    }
)
_KEY_WORDS = frozenset({'key', 'keys'})

# ``token`` is a credential alone or right after one of these (``hf_token``, ``GITHUB_TOKEN``); never
# after a vocabulary word (``pad_token``, ``eos_token``, ``image_token``) and never as ``tokens``.
_TOKEN_SERVICES = frozenset(
    {
        'access',
        'api',
        'auth',
        'oauth',
        'bearer',
        'refresh',
        'session',
        'id',
        'security',
        'csrf',
        'xsrf',
        'jwt',
        'login',
        'client',
        'app',
        'bot',
        'service',
        'deploy',
        'webhook',
        'personal',
        'private',
        'secret',
        'master',
        'admin',
        'root',
        'read',
        'write',
        'upload',
        'registry',
        'hf',
        'hub',
        'huggingface',
        'github',
        'gh',
        'gitlab',
        'bitbucket',
        'git',
        'wandb',
        'comet',
        'neptune',
        'mlflow',
        'databricks',
        'kaggle',
        'replicate',
        'modal',
        'slack',
        'discord',
        'telegram',
        'twilio',
        'sentry',
        'npm',
        'pypi',
        'docker',
        'aws',
        'azure',
        'sas',
        'gcp',
        'google',
        'openai',
        'anthropic',
        'cohere',
        'vault',
        'okta',
        'heroku',
        'vercel',
        'cloudflare',
        'dropbox',
        'notion',
        'jira',
        'atlassian',
        'ngrok',
    }
)
# Words allowed after the credential ``token`` (``hf_token_value``, ``token2``).
_TOKEN_SUFFIXES = frozenset({'value', 'str', 'string', 'raw', 'b64', 'base64'})

_WORD = re.compile(r'[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+')


def key_words(key: str) -> tuple[str, ...]:
    """The lower-case words of a key: split on ``_ - .``, spaces, camelCase and digits.

    ``'AWS_SECRET_ACCESS_KEY'`` -> ``('aws', 'secret', 'access', 'key')``,
    ``'hfToken2'`` -> ``('hf', 'token', '2')``, ``'APIKey'`` -> ``('api', 'key')``.
    """
    return tuple(word.lower() for word in _WORD.findall(key))


def _compound_credential(word: str) -> bool:
    """A credential written as one word: ``apikey``, ``accesskey``, ``authtoken``, ``hftoken``."""
    if word.endswith('token') and word[:-5] in _TOKEN_SERVICES:
        return True
    if word.endswith('keys') and word[:-4] in _KEY_QUALIFIERS:
        return True
    return word.endswith('key') and word[:-3] in _KEY_QUALIFIERS


@functools.lru_cache(maxsize=16384)
def is_secret_key(key: str) -> bool:
    """Whether a key names a credential, by its words (the default rule; cached per key).

    Examples:
        ``password``, ``db_passwd``, ``client_secret``, ``AWS_SECRET_ACCESS_KEY``, ``api_key``, ``apiKey``,
        ``private_key``, ``token``, ``hf_token``, ``GITHUB_TOKEN``, ``refresh_token`` are credentials;
        ``pad_token``, ``bos_token_id``, ``max_new_tokens``, ``tokenizer_name``, ``use_cls_token``,
        ``suppress_tokens``, ``added_tokens_decoder``, ``key``, ``image_key`` are not.
    """
    words = key_words(key)
    previous = ''
    for index, word in enumerate(words):
        if _SECRET_WORD.match(word) or _compound_credential(word):
            return True
        if word in _KEY_WORDS and previous in _KEY_QUALIFIERS:
            return True
        if word == 'token' and (index == 0 or previous in _TOKEN_SERVICES):
            rest = words[index + 1 :]
            if all(w.isdigit() or w in _TOKEN_SUFFIXES for w in rest):
                return True
        previous = word
    return False


# --------------------------------------------------------------------------- the value rule

_ALNUM_BEFORE = r'(?<![A-Za-z0-9])'
_CREDENTIAL_FORMATS = re.compile(
    # PEM private-key blocks (a block cut short is redacted to the end of the string)
    r'(?P<pem_begin>-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)(?s:.*?)'
    r'(?P<pem_end>-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)'
    # scheme://user:PASSWORD@host (the password runs to the last '@' of the authority)
    r'|(?P<url_head>' + _ALNUM_BEFORE + r'[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#]*:)(?P<url_password>[^\s/?#]+)(?=@)'
    # AWS access key ids
    r'|' + _ALNUM_BEFORE + r'(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])'
    # Hugging Face
    r'|' + _ALNUM_BEFORE + r'hf_[A-Za-z0-9]{30,}'
    # OpenAI-style (sk-..., sk-proj-..., sk-ant-...)
    r'|(?P<sk>' + _ALNUM_BEFORE + r'sk-[A-Za-z0-9_\-]{20,})'
    # GitHub
    r'|' + _ALNUM_BEFORE + r'(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})'
    # Slack
    r'|' + _ALNUM_BEFORE + r'xox[abprs]-[A-Za-z0-9\-]{10,}'
    # Google API keys
    r'|' + _ALNUM_BEFORE + r'AIza[0-9A-Za-z_\-]{35}'
    # JSON Web Tokens
    r'|' + _ALNUM_BEFORE + r'eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*'
    # HTTP Authorization values
    r'|(?P<scheme>\b[Bb]earer\s+|\bBasic\s+)(?P<credential>[A-Za-z0-9._~+/=\-]{16,})'
)
# ``sk-`` followed by lower-case words and hyphens only reads as prose (``sk-learn-compatible-...``).
_WORDY = re.compile(r'[a-z]+(?:[-_][a-z]+)+')

# A credential-named pair inside a string; each alternative is ``head<N>`` (holding ``name<N>``) then ``value<N>``:
# 1. ``name=value`` (query strings, connection strings, ``--flag=value``, env assignments, keyword arguments);
# 2. ``'name': value`` / ``"name": value`` (a dict's repr or JSON inside a string);
# 3. ``name: value`` (YAML or a log line), the value running to the end of the line or to ``, ; } ]``;
# 4. ``--name value`` (a command line).
_QUOTED = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\''
_ASSIGNMENT = re.compile(
    r'(?P<head1>(?<![A-Za-z0-9_.])(?P<name1>[A-Za-z_][A-Za-z0-9_.\-]*)\s*=(?!=)\s*)'
    r'(?P<value1>' + _QUOTED + r'|[^\s&;,\'")\]}]+)'
    r'|(?P<head2>(?P<q2>["\'])(?P<name2>[A-Za-z_][A-Za-z0-9_.\- ]*)(?P=q2)\s*:\s*)'
    r'(?P<value2>' + _QUOTED + r'|[^\s,}\]]+)'
    r'|(?P<head3>(?<![A-Za-z0-9_.\-"\'])(?P<name3>[A-Za-z_][A-Za-z0-9_.\-]*):[ \t]+)'
    r'(?P<value3>' + _QUOTED + r'|[^\s,;}\]]+(?:[ \t]+[^\s,;}\]]+)*)'
    r'|(?P<head4>(?<!\S)--?(?P<name4>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]+)'
    r'(?P<value4>' + _QUOTED + r'|(?!-)[^\s]+)'
)
# Values that hold no secret (JSON/YAML/Python literals, already redacted, empty).
_NOT_SECRET_VALUES = frozenset(
    {REDACTED, '', '""', "''", 'null', 'None', 'none', 'true', 'false', 'True', 'False', '~', '"***"', "'***'"}
)


def _format_replacement(match: re.Match) -> str:
    if match.group('pem_begin') is not None:
        end = match.group('pem_end')
        return f'{match.group("pem_begin")}{REDACTED}{end}'
    if match.group('url_head') is not None:
        return match.group('url_head') + REDACTED
    if match.group('sk') is not None:
        body = match.group('sk')[3:]
        return match.group(0) if _WORDY.fullmatch(body) else REDACTED
    if match.group('scheme') is not None:
        return match.group('scheme') + REDACTED
    return REDACTED


def _quoted_or_bare(value: str) -> str:
    if len(value) >= 2 and value[0] in '"\'' and value[-1] == value[0]:
        return value[0] + REDACTED + value[0]
    return REDACTED


def _may_hold_format(text: str) -> bool:
    """Cheap pre-check: False means no credential format can match (plain ``in`` tests, no regex)."""
    return (
        '://' in text
        or 'AKIA' in text
        or 'ASIA' in text
        or 'AIza' in text
        or 'eyJ' in text
        or 'earer' in text
        or 'Basic' in text
        or ('_' in text and ('hf_' in text or 'gh' in text or 'github_pat_' in text))
        or ('-' in text and ('sk-' in text or 'xox' in text or 'PRIVATE KEY' in text))
    )


# Every key the default rule calls a credential contains one of these (lower-cased) fragments.
_CREDENTIAL_FRAGMENTS = ('pass', 'pwd', 'secret', 'cred', 'auth', 'cookie', 'key', 'token')
_NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-')


def _may_hold_pair(text: str, is_secret: Callable[[str], bool], any_name: bool) -> bool:
    """Cheap pre-check for a pair (``name=value``, ``name: value``, ``--name value``) with a credential name.

    Without a user pattern only names around a credential fragment are looked at (no regex), so a
    line like ``loss=1.2 tokens/s=5000`` costs a few string searches.
    """
    if not ('=' in text or ':' in text or '-' in text):
        return False
    if any_name:  # a user pattern may match any name
        return True
    lower = text.lower()
    size = len(text)
    for fragment in _CREDENTIAL_FRAGMENTS:
        index = lower.find(fragment)
        while index != -1:
            start, end = index, index + len(fragment)
            while start > 0 and text[start - 1] in _NAME_CHARS:
                start -= 1
            while end < size and text[end] in _NAME_CHARS:
                end += 1
            after = end + 1 if end < size and text[end] in '"\'' else end
            while after < size and text[after] in ' \t':
                after += 1
            follows = text[after] if after < size else ''
            if (follows in ('=', ':') or (text[start] == '-' and after > end)) and is_secret(text[start:end]):
                return True
            index = lower.find(fragment, end)
    return False


def _redact_string(text: str, is_secret: Callable[[str], bool], any_name: bool = False) -> str:
    """``text`` with credentials replaced; the same object when nothing is found."""
    out = text
    if _may_hold_format(out):
        out = _CREDENTIAL_FORMATS.sub(_format_replacement, out)
    if _may_hold_pair(out, is_secret, any_name):

        def assignment(match: re.Match) -> str:
            for n in ('1', '2', '3', '4'):
                name = match.group('name' + n)
                if name is not None:
                    value = match.group('value' + n)
                    if value in _NOT_SECRET_VALUES or REDACTED in value or not is_secret(name):
                        return match.group(0)  # nothing there, or the value rule already took the secret
                    return match.group('head' + n) + _quoted_or_bare(value)
            return match.group(0)

        out = _ASSIGNMENT.sub(assignment, out)
    return text if out == text else out


def redact_text(text: str) -> str:
    """Replace credential-shaped parts of free text with ``'***'`` (the value rule only).

    Replaces a URL's user-info password (``postgres://alice:***@db:5432/x``), AWS access key ids,
    Hugging Face / OpenAI-style / GitHub / Slack / Google API tokens, JWTs, ``Bearer``/``Basic``
    credentials, PEM private-key blocks (keeping their BEGIN/END lines), and the value of a pair
    whose name is a credential by :func:`is_secret_key`: ``name=value`` (``?api_key=...``,
    ``Password=...;``), ``'name': 'value'`` (a dict's repr, JSON), ``name: value`` (YAML, log lines)
    and ``--name value`` (command lines). Git commit hashes and UUIDs are kept. Strings without
    any credential marker or credential-named pair are answered by a few substring searches.

    Args:
        text: any string (a log message, a config value).

    Returns:
        The redacted string; ``text`` itself (the same object) when nothing was found.
    """
    return _redact_string(text, is_secret_key)


# --------------------------------------------------------------------------- applying both rules


class Redactor:
    """Applies the key-name and value rules to nested data (mappings, lists, tuples, sets).

    The value of a credential-named key is replaced by ``'***'``: a string or number becomes
    ``'***'``; a mapping or list keeps its shape with every leaf replaced; ``None``, booleans and
    empty strings are kept (they hold no secret and say whether one is set). Every other string is
    passed through the value rule. Nested dataclass instances and ``argparse.Namespace`` /
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
        return _redact_string(text, self.is_secret_key, self._any_name)

    def table(self, columns: Sequence[str], rows: list[list[Any]]) -> list[list[Any]]:
        """Table rows with credential-named columns concealed and every cell through the value rule."""
        if not self.enabled:
            return rows
        secret_columns = [self.is_secret_key(column) for column in columns]
        return [
            [self._conceal(cell) if secret else self._value(cell) for cell, secret in zip(row, secret_columns)]
            for row in rows
        ]

    def _key(self, key: Any) -> Any:
        return _redact_string(key, self.is_secret_key, self._any_name) if type(key) is str else key

    def _mapping(self, data: Mapping[Any, Any]) -> dict[Any, Any]:
        out = {}
        for key, value in data.items():
            if isinstance(key, str) and self.is_secret_key(key):
                out[self._key(key)] = self._conceal(value)
            else:
                out[self._key(key)] = self._value(value)
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
            return _redact_string(value, self.is_secret_key, self._any_name)
        if kind in (int, float, bool) or value is None:
            return value
        if isinstance(value, Mapping):
            return self._mapping(value)
        if isinstance(value, str):
            return _redact_string(value, self.is_secret_key, self._any_name)
        fields = self._fields(value)
        if fields is not None:
            return self._mapping(fields)
        if isinstance(value, list):
            return [self._value(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._value(v) for v in value)
        if isinstance(value, (set, frozenset)):
            return type(value)(self._value(v) for v in value)
        return value

    def _conceal(self, value: Any) -> Any:
        """The value of a credential-named key: every leaf replaced, the shape kept."""
        if value is None or isinstance(value, bool) or (isinstance(value, str) and not value):
            return value
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
