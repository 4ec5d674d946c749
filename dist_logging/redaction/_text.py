"""The value rule on one string: credential shapes (PEM blocks, URL passwords, ``Authorization``
values, ``--user name:password``), the formats of :mod:`._formats`, and credential-named pairs written
the way configs, shells and code write them (``name=value``, ``name: value``, ``--name value``,
``("NAME", "value")``, ``<name>value</name>`` ...).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from dist_logging.redaction._common import (
    REDACTED,
    any_of,
    is_placeholder,
    is_reference,
    NOT_SECRET_VALUES,
    quoted_or_bare,
)
from dist_logging.redaction._formats import RUN, apply_formats, found_keywords, map_runs, may_hold_runless_secret
from dist_logging.redaction._keys import credential_value, is_secret_key, names_credential_by_value

_ALNUM_BEFORE = r'(?<![A-Za-z0-9])'
_CREDENTIAL_SHAPES = re.compile(
    # PEM private-key blocks (a block cut short is redacted to the end of the string)
    r'(?P<pem_begin>-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)(?s:.*?)'
    r'(?P<pem_end>-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)'
    # scheme://user:PASSWORD@host (the password runs to the last '@' of the authority)
    r'|(?P<url_head>' + _ALNUM_BEFORE + r'[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#]*:)(?P<url_password>[^\s/?#]+)(?=@)'
    # an HTTP Authorization header's value, whatever its scheme (``-H "Authorization: Token ..."``)
    r'|(?P<auth_head>(?i:\b(?:proxy-)?authorization)["\']?[ \t]*[:=][ \t]*["\']?'
    r'(?:(?:Bearer|Basic|Token|Api-Token|Bot|Digest|SSWS|Splunk|token|bearer)[ \t]+)?)'
    r'(?P<auth_value>[^\s"\',;]+)'
    # HTTP Authorization values elsewhere
    r'|(?P<scheme>\b[Bb]earer\s+|\bBasic\s+)(?P<credential>[A-Za-z0-9._~+/=\-]{16,})'
    # curl/wget/httpie ``--user name:password`` (the name stays)
    r'|(?P<user_head>(?<!\S)(?:-u|--user|--http-user)(?:[ \t]+|=)["\']?[^\s:"\']*:)(?P<user_password>[^\s"\']+)'
)


_FLAG_VALUE = re.compile(r'[\s="\']+')


def _shape_replacement(match: re.Match) -> str:
    if match.group('pem_begin') is not None:
        return f'{match.group("pem_begin")}{REDACTED}{match.group("pem_end")}'
    for head, value in (
        ('url_head', 'url_password'),
        ('auth_head', 'auth_value'),
        ('scheme', 'credential'),
        ('user_head', 'user_password'),
    ):
        if match.group(head) is not None:
            secret = match.group(value)
            if secret in NOT_SECRET_VALUES or REDACTED in secret or is_placeholder(secret):
                return match.group(0)
            if head == 'user_head' and secret.isdigit() and _FLAG_VALUE.split(match.group(head)[:-1])[-1].isdigit():
                return match.group(0)  # ``docker run -u 1000:1000``: a uid and gid
            return match.group(head) + REDACTED
    return match.group(0)


def _may_hold_shape(text: str) -> bool:
    """Cheap pre-check: False means no shape above can match (plain ``in`` tests, no regex)."""
    return (
        '://' in text
        or 'earer' in text
        or 'Basic' in text
        or 'UTHORIZATION' in text
        or 'uthorization' in text
        or ('-' in text and ('PRIVATE KEY' in text or '-u' in text))
    )


# A credential-named pair inside a string; each alternative is ``head<N>`` (holding ``name<N>``) then ``value<N>``:
# 1. ``name=value`` and the other assignment operators (``:=``, ``?=``, ``=>``), the name optionally
#    quoted or subscripted (``'secret_key' => ...``, ``os.environ["HF_TOKEN"] = ...``), or declared with
#    a string type (``var apiToken string = ...``); Make's ``::=``/``:::=``, PHP's ``.=``; Go's backtick strings;
# 2. ``'name': value`` / ``"name": value`` (a dict's repr or JSON inside a string);
# 3. ``name: value`` (YAML or a log line), the value running to the end of the line or to ``, ; } ]``;
# 4. ``--name value`` (a command line);
# 5. ``("NAME", "value")`` (``System.setProperty``, ``os.environ.setdefault``, ``getenv`` defaults);
# 6. ``<name>value</name>`` (XML: Maven settings, .NET config), also with the value on a line of its own;
# 7. ``key="NAME" value="..."`` / ``name="NAME" value="..."`` (XML attributes: .NET appSettings, NuGet, Ant),
#    tried first (``key="..."`` alone would read as pair 1);
# 8. ``-H "Name: value"`` / ``--header 'Name: value'`` (curl, httpie, wget headers: ``X-Api-Key``, ``Token``),
#    tried before pair 4 (``--header`` alone would read as a flag).
# A bare value ends at an escaped line end (``"A_TOKEN=<v>\\nNEXT=1"`` inside a JSON string), as gitleaks' rules end.
# The value never starts on the next line (``GITHUB_API_KEY=\nNEXT=`` is two empty values).
_QUOTED = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`\n]*`'
# A value that is a template reference is read whole, so the reference check sees it whole.
_REFERENCE_TEXT = r'|\$\{\{[^}\n]*\}\}|\{\{[^}\n]*\}\}|\$\{[^}\s]*\}'
# A bare value of pair 1: up to a space or ``& ; , ' " ` ) ] }``, and up to an escaped line end (unrolled: a
# group per character would cost 2.4x on a ``KAGGLE_KEY=...`` line).
_BARE_CHAR = r'[^\s&;,\'"`)\]}\\]'
_BARE1 = _BARE_CHAR + r'+(?:\\(?![nr])' + _BARE_CHAR + r'*)*|(?:\\(?![nr])' + _BARE_CHAR + r'*)+'
_ASSIGNMENT = re.compile(
    r'(?P<head7>(?<![A-Za-z0-9_])(?:key|name)[ \t]*=[ \t]*(?P<q7>["\'])(?P<name7>[A-Za-z_][A-Za-z0-9_.\-:]*)(?P=q7)'
    r'[ \t]+value[ \t]*=[ \t]*)(?P<value7>' + _QUOTED + r')'
    r'|(?P<head8>(?<!\S)(?:-H|--header)(?:[ \t]+|=)(?P<q8>["\'])(?P<name8>[A-Za-z][A-Za-z0-9_\-]*):[ \t]*)'
    r'(?P<value8>[^"\'\n]+?)(?=(?P=q8))'
    r'|'
    r'(?P<head1>(?<![A-Za-z0-9_.])(?P<name1>[A-Za-z_][A-Za-z0-9_.\-]*)'
    r'(?:[ \t]+(?:string|String|str|\[\]byte))?["\'\]]*[ \t]*(?::{1,3}=|\?=|=>|\.=|=)(?![=>])[ \t]*)'
    r'(?P<value1>' + _QUOTED + _REFERENCE_TEXT + r'|' + _BARE1 + r')'
    r'|(?P<head2>(?P<q2>["\'])(?P<name2>[A-Za-z_][A-Za-z0-9_.\- ]*)(?P=q2)\s*:\s*)'
    r'(?P<value2>' + _QUOTED + _REFERENCE_TEXT + r'|[^\s,}\]]+)'
    r'|(?P<head3>(?<![A-Za-z0-9_.\-"\'])(?P<name3>[A-Za-z_][A-Za-z0-9_.\-]*):[ \t]+)'
    r'(?P<value3>' + _QUOTED + _REFERENCE_TEXT + r'|[^\s,;}\]]+(?:[ \t]+[^\s,;}\]]+){0,7})'
    r'|(?P<head4>(?<!\S)--?(?P<name4>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]+)'
    r'(?P<value4>' + _QUOTED + r'|(?!-)[^\s]+)'
    r'|(?P<head5>\([ \t]*(?P<q5>["\'])(?P<name5>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q5)[ \t]*,[ \t]*)'
    r'(?P<value5>' + _QUOTED + r')'
    r'|(?P<head6><(?P<name6>[A-Za-z_][A-Za-z0-9_.\-:]*)(?:[ \t][^<>\n]*)?>(?:[ \t]*\r?\n)?[ \t]*)'
    r'(?P<value6>[^<>\n]+?)(?=[ \t]*(?:\r?\n[ \t]*)?</(?P=name6)>)'
)
# ``name: value`` reads at most 8 words per match, so a name that is no credential costs a bounded
# look ahead (a line of many ``x: y`` stays linear); a credential's value takes the rest of the line.
_MORE_WORDS = re.compile(r'(?:[ \t]+[^\s,;}\]]+)*')
_GROUPS = tuple(('name' + n, 'value' + n, 'head' + n) for n in '12345678')

# Every key the default rule calls a credential contains one of these (lower-cased) fragments.
# Most frequent in log lines first (``tokens/s``, ``key_dim``): the ``in`` chain stops at the first one found.
_CREDENTIAL_FRAGMENTS = ('token', 'key', 'auth', 'pass', 'secret', 'cred', 'pwd', 'cookie')
_any_credential_fragment = any_of(_CREDENTIAL_FRAGMENTS)
_NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-')
_TYPE_WORDS = ('string', 'String', 'str', '[]byte')


def _may_hold_pair(text: str, is_secret: Callable[[str], bool], any_name: bool, lower: Optional[str] = None) -> bool:
    """Cheap pre-check for a pair (``name=value``, ``name: value``, ``--name value``...) with a credential name.

    Without a user pattern only names around a credential fragment are looked at (no regex), so a
    line like ``loss=1.2 tokens/s=5000`` costs a few string searches.
    """
    if not ('=' in text or ':' in text or '-' in text or ',' in text or '<' in text):
        return False
    if any_name:  # a user pattern may match any name
        return True
    if lower is None:
        lower = text.lower()
    if not _any_credential_fragment(lower):
        return False
    size = len(text)
    for fragment in _CREDENTIAL_FRAGMENTS:
        index = lower.find(fragment)
        while index != -1:
            start, end = index, index + len(fragment)
            while start > 0 and text[start - 1] in _NAME_CHARS:
                start -= 1
            while end < size and text[end] in _NAME_CHARS:
                end += 1
            after = end
            while after < size and text[after] in '"\']':
                after += 1
            while after < size and text[after] in ' \t':
                after += 1
            follows = text[after] if after < size else ''
            if (
                follows in ('=', ':', '?', ',', '>', '.')
                or (text[start] == '-' and after > end)
                or text.startswith(_TYPE_WORDS, after)
                or text.startswith('value', after)
            ) and (is_secret(text[start:end]) or names_credential_by_value(text[start:end])):
                return True
            index = lower.find(fragment, end)
    return False


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] in '"\'`' and value[-1] == value[0]:
        return value[1:-1]
    return value


def _redact_pairs(text: str, is_secret: Callable[[str], bool]) -> str:
    """Replace the values of credential-named pairs.

    A pair whose name is no credential gives up only its name and operator, so its value is read
    again (``train: env KAGGLE_KEY=...``: the log line's ``train:`` does not hide the pair after it).
    """
    parts = []
    position = 0
    while True:
        match = _ASSIGNMENT.search(text, position)
        if match is None:
            break
        for name_group, value_group, head_group in _GROUPS:
            name = match.group(name_group)
            if name is not None:
                break
        value = match.group(value_group)
        if value in NOT_SECRET_VALUES or REDACTED in value or is_reference(value):
            pass
        elif head_group == 'head8' and (is_placeholder(value) or name.lower().endswith('authorization')):
            pass  # a header template (``<token>``, ``$(cmd)``); ``Authorization`` values are the shapes' job
        elif is_secret(name):
            parts.append(text[position : match.start()] + match.group(head_group) + quoted_or_bare(value))
            position = match.end()
            if head_group == 'head3' and value[:1] not in '"\'`':  # the rest of a long ``name: many words`` value
                more = _MORE_WORDS.match(text, position)
                assert more is not None  # the pattern matches the empty string: it always matches
                position = more.end()
            continue
        elif names_credential_by_value(name):
            # ``name: value`` reads up to 8 words; a credential decided by its value is the first one.
            word = value if value[:1] in '"\'`' else value.split(None, 1)[0]
            if credential_value(_unquoted(word)):
                parts.append(text[position : match.start()] + match.group(head_group) + quoted_or_bare(word))
                position = match.start(value_group) + len(word)
                continue
        parts.append(text[position : match.end(head_group)])
        position = match.end(head_group)
    parts.append(text[position:])
    return ''.join(parts)


def redact_string(text: str, is_secret: Callable[[str], bool], any_name: bool = False) -> str:
    """``text`` with credentials replaced; the same object when nothing is found."""
    out = text
    if _may_hold_shape(out):
        out = _CREDENTIAL_SHAPES.sub(_shape_replacement, out)
    run_map = map_runs(out)
    lower = None
    # Every format's secret holds a run (``RUN``) but for these few, which have their own check.
    start = run_map.find(RUN)
    if start != -1 or may_hold_runless_secret(out):
        lower = out.lower()
        found = found_keywords(out, run_map, lower, start)
        if found:
            out, lower = apply_formats(out, found), None
    if _may_hold_pair(out, is_secret, any_name, lower):
        out = _redact_pairs(out, is_secret)
    return text if out == text else out


def redact_text(text: str) -> str:
    """Replace credential-shaped parts of free text with ``'***'`` (the value rule only).

    Replaces a URL's user-info password (``postgres://alice:***@db:5432/x``), every credential format
    of gitleaks' default rules (AWS, GCP, Azure, Hugging Face, OpenAI, Anthropic, Databricks, GitHub,
    GitLab, npm, PyPI, Stripe, Slack, Twilio, SendGrid, JWTs and base64-wrapped JWTs ... each as
    tight as gitleaks has it: length, alphabet, entropy; no word allowlists such as ``...EXAMPLE``)
    plus a few it lacks (Discord and Slack webhook secrets, Azure SAS ``sig=``, Replicate, Groq,
    LangSmith, Neptune, ``hf_`` + 30 or more letters and digits, OpenAI-compatible ``sk-`` keys),
    ``Authorization`` header values, ``--user name:password``, PEM private-key blocks (keeping their
    BEGIN/END lines), and the value of a pair whose name is a credential by :func:`is_secret_key`, or
    ends in a credential word (``asanaToken``, ``codecov_token``) and whose value reads as a credential
    (``_keys.credential_value``: not ``<pad>``, a path, a name or a short number): ``name=value``
    (also ``:=``, ``::=``, ``?=``, ``=>``, ``.=``, Go backtick strings), ``'name': 'value'``,
    ``name: value``, ``--name value``, ``("NAME", "value")``, ``<name>value</name>`` (the value on a
    line of its own too) and ``key="NAME" value="..."``. Git commit hashes and UUIDs are kept.
    Strings without any credential marker or credential-named pair are answered by a few substring
    searches.

    Args:
        text: any string (a log message, a config value).

    Returns:
        The redacted string; ``text`` itself (the same object) when nothing was found.
    """
    return redact_string(text, is_secret_key)
