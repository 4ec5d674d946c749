"""The value rule's formats: credentials recognisable by their own shape (gitleaks' rules and ours).

The rules are data (:mod:`._gitleaks_formats`, generated; :mod:`._extra_formats`, hand-kept); this
module compiles them once, finds the keywords that gate them (gitleaks' keyword gate, kept exact but
looked for only around runs of 18 or more ``[A-Za-z0-9_-]``) and applies the gated rules with their
entropy floors and allowlists.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Optional, Pattern, Union

from dist_logging.redaction import _extra_formats, _gitleaks_formats
from dist_logging.redaction._common import REDACTED, any_of, shannon_entropy


class _Format(NamedTuple):
    """One credential format: its regex, the entropy its secret must exceed, placeholders it allows."""

    order: int  # rules run in this order
    id: str
    regex: Pattern[str]
    entropy: float
    allow: tuple[Pattern[str], ...]
    group: Union[int, str]  # the part of a match that is the secret


def _keyword_regex(words: Iterable[str]) -> str:
    """One regex finding any of ``words`` (a trie, so a position costs one test per distinct next character)."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[''] = True

    def emit(node: dict) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ''
        body = branches[0] if len(branches) == 1 else '(?:' + '|'.join(branches) + ')'
        if '' in node:
            return ('(?:' + body + ')?') if len(branches) == 1 else body + '?'
        return body

    return '(' + emit(trie) + ')'


# Allowlists of a word or of documented keys (AWS's ``...EXAMPLE``, GCP's sample keys) exist to cut noise
# in code review; a value going to a tracker is redacted whatever word it holds (a dummy costs nothing
# there, a real key let through costs a rotation). Shape-only allowlists (vault's ``s.`` + letters) stay.
_ALLOWLISTS_DROPPED = frozenset({'aws-access-token', 'gcp-api-key'})


def _load_formats() -> tuple[dict[str, tuple[_Format, ...]], Pattern[str], tuple[tuple[str, tuple[str, ...]], ...]]:
    by_keyword: dict[str, list[_Format]] = {}
    # Ours first: where both match (a Slack webhook), ours replaces only the secret part of the URL.
    for order, (rule_id, regex, keywords, entropy, allow) in enumerate(_extra_formats.RULES + _gitleaks_formats.RULES):
        compiled = re.compile(regex)
        # The secret: a ``secret`` group, else the first group when it is unnamed; a rule with named
        # groups only (``jwt-base64``'s header names) names parts of its secret, which is the whole match.
        unnamed = compiled.groups > len(compiled.groupindex)
        group: Union[int, str] = 'secret' if 'secret' in compiled.groupindex else (1 if unnamed else 0)
        if rule_id in _ALLOWLISTS_DROPPED:
            allow = ()
        rule = _Format(order, rule_id, compiled, entropy, tuple(re.compile(a) for a in allow), group)
        for keyword in keywords:
            by_keyword.setdefault(keyword.lower(), []).append(rule)
    # The scan reports one keyword per position, the longest: let it also run the rules of the keywords
    # inside it (``sk_live`` also runs the rules of ``sk``, ``xoxe.xoxb-`` those of ``xoxb``).
    expanded = {
        keyword: tuple(dict.fromkeys(rule for other, rules in by_keyword.items() if other in keyword for rule in rules))
        for keyword in by_keyword
    }
    # Keywords are looked for where a word starts (the scan then tests few positions); the few that
    # sit inside a word (``...T3BlbkFJ...``, ``abc8Q~``, ``..._mmk``) are looked for by substring.
    inner = tuple(sorted(k for k in by_keyword if not k[0].isalnum() or k in _INNER_KEYWORDS or k.startswith('xox')))
    starts = [k for k in by_keyword if k not in inner]
    # ``[^a-z0-9]`` first (not a look-behind): re's search then skips in C to the next character that
    # may end a word, and tries the keywords only there: an ordinary 22-letter path component with 4
    # ``_`` costs 5 tries, not 30. The look-ahead consumes only that character, so keywords that touch
    # (``ghp_sk...``) are all found. A region that starts the text is scanned with a space before it.
    trie = _keyword_regex(starts)
    return expanded, re.compile('[^a-z0-9](?=' + trie + ')'), _inner_gates(inner)


def _inner_gates(inner: Iterable[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The substring keywords grouped under a shorter substring each of them contains: when a gate is
    absent from a line, none of its keywords can be there (one search instead of one per keyword)."""
    groups: dict[str, list[str]] = {}
    for keyword in inner:
        gate = next((g for g in _INNER_GATES if g in keyword), keyword)
        groups.setdefault(gate, []).append(keyword)
    return tuple((gate, tuple(keywords)) for gate, keywords in sorted(groups.items()))


# Keywords inside a word, or far from the secret's run (a webhook URL's host), or before a short
# secret (``SG.``): looked for by substring.
_INNER_KEYWORDS = frozenset(
    {
        't3blbkfj',
        'q~',
        'hooks.slack.com',
        'webhook.office.com',
        'webhookb2',
        'incomingwebhook',
        'discord',
        'sig=',
        'sg.',
        'gems.contribsys.com',
        'enterprise.contribsys.com',
        # secrets whose alphabet breaks the run (``= . + /``): PlanetScale, Fly.io,
        # Frame.io, Authress (``sc_<id>.<id>.acc_...``)
        'pscale_tkn_',
        'pscale_pw_',
        'pscale_oauth_',
        'fm1',
        'fm2_',
        'fio-u-',
        'sc_',
        'ext_',
        'scauth_',
        'authress_',
    }
)
# Shared parts of those keywords (a webhook host's ``.com``, ``webhook``, ``=``, Slack's ``xox``, ``pscale_``).
_INNER_GATES = ('.com', 'webhook', '=', 'xox', 'pscale_')
# Substrings of the secrets that hold no run of 18 (see ``RUN`` below), tested on every string: Slack's
# short tokens, Azure's ``Q~``, SendGrid's ``SG.``, Azure SAS ``sig=``, and the alphabets above.
may_hold_runless_secret = any_of(('xox', 'Q~', 'SG.', 'sig=', 'pscale_', 'fm1', 'fm2_', 'fio-u-', '.acc'))
_RULES_BY_KEYWORD, _KEYWORD_SCAN, _INNER = _load_formats()
_any_inner_gate = any_of(gate for gate, _ in _INNER)

#: Where each rule list comes from (recorded in the docs).
FORMAT_SOURCES = (_gitleaks_formats.SOURCE, _extra_formats.SOURCE)

# Every format's secret holds a run of 18 or more of these characters, except the few with their own
# check below: one C-level translate and substring search tells a plain line holds none.
_RUN_TABLE = bytes(
    ord('a') if chr(b).isascii() and (chr(b).isalnum() or chr(b) in '_-') else ord(' ') for b in range(256)
)
RUN = b'a' * 18


def map_runs(text: str) -> bytes:
    """``text`` as bytes with every run character ``a`` and every other one a space."""
    return text.encode('utf-8', 'surrogatepass').translate(_RUN_TABLE)


def found_keywords(text: str, run_map: bytes, lower: Optional[str] = None, start: Optional[int] = None) -> set[str]:
    """The keywords in ``text``: looked for by the scan only around runs (a keyword starts a run or
    ends at most 8 characters before it: ``dt0c01.<run>``), and by substring for the rest.

    ``lower`` is ``text.lower()`` and ``start`` is ``run_map.find(RUN)`` when the caller has them already.
    """
    if lower is None:
        lower = text.lower()
    if len(run_map) != len(text):  # not ASCII: byte offsets are not character offsets
        found = _KEYWORD_SCAN.findall(' ' + lower)
    else:
        found = []
        start = run_map.find(RUN) if start is None else start
        while start != -1:
            end = run_map.find(b' ', start)
            end = len(run_map) if end == -1 else end
            # The scan's first character is the one before the region (it must end the word before).
            if start > 8:
                found += _KEYWORD_SCAN.findall(lower, start - 9, end)
            else:
                found += _KEYWORD_SCAN.findall(' ' + lower[:end])
            start = run_map.find(RUN, end)
    if _any_inner_gate(lower):
        for gate, keywords in _INNER:
            if gate in lower:
                found += [keyword for keyword in keywords if keyword in lower]
    return set(found)


def apply_formats(text: str, found: set[str]) -> str:
    """Run the rules of the keywords ``found`` in ``text`` (gitleaks' keyword gate), each with entropy and allowlist."""
    rules = sorted({rule for keyword in found for rule in _RULES_BY_KEYWORD[keyword]})
    for rule in rules:

        def replace(match: re.Match, rule: _Format = rule) -> str:
            secret = match.group(rule.group)
            if (
                not secret
                or REDACTED in secret
                or (rule.entropy and shannon_entropy(secret) <= rule.entropy)
                or any(allow.search(secret) for allow in rule.allow)
            ):
                return match.group(0)
            start, end = match.span(rule.group)
            whole = match.group(0)
            return whole[: start - match.start()] + REDACTED + whole[end - match.start() :]

        text = rule.regex.sub(replace, text)
    return text
