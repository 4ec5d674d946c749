"""Redaction of secrets before any destination sees them.

Three rules, applied by the Logger to hyperparameters, traces and table cells:

* **By key name** (:func:`is_secret_key`): a key is split into words (on ``_ - .``, spaces,
  camelCase and digit boundaries) and names a credential when its words say so: password,
  passwd, pwd, passphrase, secret(s), credential(s), auth, cookie, an api/access/private/session/
  secret/client... ``key``, ``token`` standing alone or right after a word naming a service or
  authentication (``hf_token``, ``GITHUB_TOKEN``, ``access_token``), or ``token``/``key`` last after
  a service name or, in an environment-style name, after any non-vocabulary word (``KAGGLE_KEY``,
  ``MLFLOW_TRACKING_TOKEN``). ``token`` as a vocabulary or counted thing (``pad_token``,
  ``max_new_tokens``, ``tokenizer``) is not a credential, nor is a key naming where one is kept
  (``secretKeyRef``, ``hf_token_path``).
* **By structure** (:class:`Redactor`): the item after a credential-named flag in a list
  (``['--wandb-api-key', X]``) and the ``value`` of a ``{name: <credential name>, value: X}`` mapping.
* **By value** (:func:`redact_text`), whatever the key, in every string: gitleaks' format rules
  (kept as data in :mod:`dist_logging._gitleaks_formats`, with its keywords, entropy floors and
  allowlists) and a few of ours (:mod:`dist_logging._extra_formats`), a URL's user-info password,
  ``Authorization`` header values, ``--user name:password``, PEM private-key blocks, and
  credential-named pairs inside a string, written the way configs, shells and code write them.
  A bare 40-hex string (a git commit), a UUID and a reference such as ``${DB_PASSWORD}`` are not
  secrets by their value.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import re
import types
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Pattern, Sequence, Union

from dist_logging import _extra_formats, _gitleaks_formats

__all__ = ['DEFAULT_SECRET_PATTERN', 'REDACTED', 'Redactor', 'build_redactor', 'is_secret_key', 'key_words',
           'redact_text']

REDACTED = '***'

RedactOption = Union[bool, str, Pattern[str], Iterable[Union[str, Pattern[str]]], None]

# --------------------------------------------------------------------------- the key-name rule

#: Words (after splitting a key) that name a credential wherever they stand.
DEFAULT_SECRET_PATTERN = (r'^(?:\w*password\w*|\w*passwd\w*|pwd|passphrase|\w*secrets?\w*|\w*credentials?|creds'
                          r'|auth|oauth|\w+auth|authorization|authn|authz|cookies?)$')
_SECRET_WORD = re.compile(DEFAULT_SECRET_PATTERN)
# ``secret`` as part of a protocol's name (federated learning's secret sharing) names no credential.
_NOT_SECRET_AFTER = frozenset({'sharing', 'shares', 'share', 'santa'})

# ``<qualifier> key`` (and ``<qualifier>key`` written as one word) is a credential.
_KEY_QUALIFIERS = frozenset({
    'api', 'access', 'private', 'session', 'secret', 'client', 'signing', 'encryption', 'master', 'license',
    'subscription', 'account', 'storage', 'service', 'auth', 'ssh', 'deploy', 'admin', 'app', 'consumer',
    'application', 'integration', 'developer', 'dev', 'project', 'user', 'upload', 'write', 'read', 'personal',
})
_KEY_WORDS = frozenset({'key', 'keys'})

# ``token`` is a credential alone or right after one of these (``hf_token``, ``GITHUB_TOKEN``); never
# after a vocabulary word (``pad_token``, ``eos_token``, ``image_token``) and never as ``tokens``.
_TOKEN_SERVICES = frozenset({
    'access', 'api', 'auth', 'oauth', 'bearer', 'refresh', 'session', 'id', 'security', 'csrf', 'xsrf', 'jwt',
    'login', 'client', 'app', 'bot', 'service', 'deploy', 'webhook', 'personal', 'private', 'secret', 'master',
    'admin', 'root', 'read', 'write', 'upload', 'registry', 'hf', 'hub', 'huggingface', 'github', 'gh', 'gitlab',
    'bitbucket', 'git', 'wandb', 'comet', 'neptune', 'mlflow', 'databricks', 'kaggle', 'replicate', 'modal',
    'slack', 'discord', 'telegram', 'twilio', 'sentry', 'npm', 'pypi', 'docker', 'aws', 'azure', 'sas', 'gcp',
    'google', 'openai', 'anthropic', 'cohere', 'vault', 'okta', 'heroku', 'vercel', 'cloudflare', 'dropbox',
    'notion', 'jira', 'atlassian', 'ngrok',
})
# Services and products whose name before a credential word makes it a credential even when the
# word right before it is not one (``mlflow_tracking_token``, ``kaggle_key``, ``b2_application_key``).
_SERVICES = _TOKEN_SERVICES | frozenset({
    'b2', 'backblaze', 'stripe', 'sendgrid', 'mailgun', 'pinecone', 'weaviate', 'qdrant', 'groq', 'mistral',
    'together', 'fireworks', 'perplexity', 'deepseek', 'langchain', 'langsmith', 'tavily', 'serpapi', 'clearml',
    'dvc', 'lambda', 'runpod', 'vastai', 'coreweave', 'paperspace', 'sagemaker', 'vertex', 'bedrock', 'minio',
    'wasabi', 'oci', 'ibm', 'alibaba', 'tencent', 'digitalocean', 'linode', 'supabase', 'firebase', 'redis',
    'postgres', 'mysql', 'mongo', 'mongodb', 'snowflake', 'bigquery', 'elastic', 'opensearch', 'grafana',
    'datadog', 'newrelic', 'pagerduty', 'opsgenie', 'teams', 'mattermost', 'zulip', 'smtp', 'email', 'ftp',
    'sftp', 'ssh', 'gpg', 'pgp', 'nvidia', 'ngc', 'hf', 'xai', 'gemini', 'claude', 'azureml', 'aml', 'lightning',
})
# Words before ``token``/``key`` that make it a vocabulary or data key, never a credential, even in
# an environment-style name (``PAD_TOKEN``, ``SORT_KEY``).
_NOT_CREDENTIAL_BEFORE = frozenset({
    'pad', 'bos', 'eos', 'unk', 'sep', 'cls', 'mask', 'image', 'video', 'audio', 'start', 'end', 'begin', 'stop',
    'special', 'added', 'default', 'think', 'tool', 'placeholder', 'vision', 'boi', 'eoi', 'eot', 'pause', 'fim',
    'prefix', 'suffix', 'middle', 'system', 'user', 'assistant', 'chat', 'next', 'prev', 'last', 'first', 'max',
    'min', 'num', 'per', 'new', 'input', 'output', 'text', 'label', 'target', 'primary', 'foreign', 'sort',
    'partition', 'shard', 'sharding', 'cache', 'dict', 'hash', 'lookup', 'routing', 'group', 'join', 'index',
    'feature', 'column', 'field', 'metric', 'monitor', 'data', 'dataset', 'model', 'layer', 'state', 'config',
    'record', 'row', 'dedup', 'query', 'value', 'attention', 'attn', 'kv', 'rng', 'random', 'seed', 'lora',
    'hot', 'sample', 'batch', 'sequence', 'seq', 'sub', 'word', 'byte', 'char', 'cross', 'self', 'memory',
    'bucket', 'object', 'blob', 'log', 'event', 'message', 'map', 'item', 'entry', 'node', 'section', 'table',
    'topic', 'queue', 'stream', 'point', 'box', 'region', 'obj', 'frame', 'patch', 'im', 'img', 'vid', 'speech',
    'time', 'action', 'reward', 'answer', 'question', 'context', 'doc', 'document', 'page', 'turn', 'role',
})
# An earlier word that makes the whole name a vocabulary constant (LLaVA's ``DEFAULT_POINT_TOKEN``).
_VOCABULARY_CONTEXT = frozenset({'default', 'special', 'vocab', 'tokenizer', 'im', 'ignore'})
# A key ending in one of these names a reference to a credential (Kubernetes ``secretKeyRef``,
# ``secretName``, ``password_file``, ``token_path``), whose value is a name or a path.
_REFERENCE_WORDS = frozenset({'ref', 'refs', 'name', 'names', 'path', 'paths', 'file', 'files', 'arn', 'url', 'uri'})
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


def _environment_style(key: str) -> bool:
    """``KAGGLE_KEY``, ``MLFLOW_TRACKING_TOKEN``: upper case words joined by ``_`` (how credentials are passed)."""
    return key.isupper() and '_' in key and ' ' not in key


@functools.lru_cache(maxsize=16384)
def is_secret_key(key: str) -> bool:
    """Whether a key names a credential, by its words (the default rule; cached per key).

    Examples:
        ``password``, ``db_passwd``, ``client_secret``, ``AWS_SECRET_ACCESS_KEY``, ``api_key``, ``apiKey``,
        ``private_key``, ``token``, ``hf_token``, ``GITHUB_TOKEN``, ``refresh_token`` are credentials; so is
        ``token``/``key`` last after a service or product name (``MLFLOW_TRACKING_TOKEN``, ``kaggle_key``)
        and, in an environment-style name, after any word but a vocabulary or data word
        (``KAGGLE_KEY``, ``B2_APPLICATION_KEY``, ``ACME_TOKEN``).
        ``pad_token``, ``bos_token_id``, ``max_new_tokens``, ``tokenizer_name``, ``use_cls_token``,
        ``suppress_tokens``, ``added_tokens_decoder``, ``key``, ``image_key``, ``key_dim``,
        ``secret_sharing_rounds``, ``PAD_TOKEN`` are not.
    """
    words = key_words(key)
    if len(words) > 1 and words[-1] in _REFERENCE_WORDS:
        return False  # where a credential is kept (``secretKeyRef``, ``secret_name``, ``password_file``), not one
    previous = ''
    for index, word in enumerate(words):
        if _SECRET_WORD.match(word):
            if not (word in ('secret', 'secrets') and index + 1 < len(words) and words[index + 1] in _NOT_SECRET_AFTER):
                return True
        elif _compound_credential(word):
            return True
        if word in _KEY_WORDS and previous in _KEY_QUALIFIERS:
            return True
        if word == 'token' or (word in _KEY_WORDS and index == len(words) - 1):
            rest = words[index + 1:]
            if word == 'token' and not all(w.isdigit() or w in _TOKEN_SUFFIXES for w in rest):
                previous = word
                continue
            if word == 'token' and (index == 0 or previous in _TOKEN_SERVICES):
                return True
            if (index > 0 and previous not in _NOT_CREDENTIAL_BEFORE
                    and not any(w in _VOCABULARY_CONTEXT for w in words[:index])
                    and (_environment_style(key) or any(w in _SERVICES for w in words[:index]))):
                return True
        previous = word
    return False


# --------------------------------------------------------------------------- the value rule: formats


class _Format(NamedTuple):
    """One credential format: its regex, the entropy its secret must exceed, placeholders it allows."""

    order: int  # rules run in this order
    id: str
    regex: Pattern[str]
    entropy: float
    allow: tuple[Pattern[str], ...]
    group: Union[int, str]  # the part of a match that is the secret


def _entropy(text: str) -> float:
    """Shannon entropy in bits per character (gitleaks' measure)."""
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in collections.Counter(text).values())


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


def _load_formats() -> tuple[dict[str, tuple[_Format, ...]], Pattern[str], tuple[tuple[str, tuple[str, ...]], ...]]:
    by_keyword: dict[str, list[_Format]] = {}
    # Ours first: where both match (a Slack webhook), ours replaces only the secret part of the URL.
    for order, (rule_id, regex, keywords, entropy, allow) in enumerate(_extra_formats.RULES + _gitleaks_formats.RULES):
        compiled = re.compile(regex)
        group: Union[int, str] = 'secret' if 'secret' in compiled.groupindex else (1 if compiled.groups else 0)
        rule = _Format(order, rule_id, compiled, entropy, tuple(re.compile(a) for a in allow), group)
        for keyword in keywords:
            by_keyword.setdefault(keyword.lower(), []).append(rule)
    # The scan reports one keyword per position, the longest: let it also run the rules of the keywords
    # inside it (``sk_live`` also runs the rules of ``sk``, ``xoxe.xoxb-`` those of ``xoxb``).
    expanded = {keyword: tuple(dict.fromkeys(rule for other, rules in by_keyword.items()
                                             if other in keyword for rule in rules))
                for keyword in by_keyword}
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


def _any_of(fragments: Iterable[str]) -> Callable[[str], bool]:
    """``text -> any(f in text for f in fragments)`` as one chain of ``in`` tests (no loop, no generator):
    about a third of the loop's cost, and these tests run on nearly every log line."""
    fragments = tuple(fragments)
    if not fragments:
        return lambda text: False
    # The code is built from string literals only (``repr`` of each fragment), never from input.
    return eval('lambda text: ' + ' or '.join(f'{fragment!r} in text' for fragment in fragments))  # noqa: S307


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
_INNER_KEYWORDS = frozenset({'t3blbkfj', 'q~', 'hooks.slack.com', 'webhook.office.com', 'webhookb2',
                             'incomingwebhook', 'discord', 'sig=', 'sg.', 'gems.contribsys.com',
                             'enterprise.contribsys.com'})
# Shared parts of those keywords (a webhook host's ``.com``, ``webhook``, ``=``, Slack's ``xox``).
_INNER_GATES = ('.com', 'webhook', '=', 'xox')
_RULES_BY_KEYWORD, _KEYWORD_SCAN, _INNER = _load_formats()
_any_inner_gate = _any_of(gate for gate, _ in _INNER)

#: Where each rule list comes from (recorded in the docs).
FORMAT_SOURCES = (_gitleaks_formats.SOURCE, _extra_formats.SOURCE)

# Every format's secret holds a run of 18 or more of these characters, except the few with their own
# check below: one C-level translate and substring search tells a plain line holds none.
_RUN_TABLE = bytes(ord('a') if chr(b).isascii() and (chr(b).isalnum() or chr(b) in '_-') else ord(' ')
                   for b in range(256))
_RUN = b'a' * 18


def _run_map(text: str) -> bytes:
    """``text`` as bytes with every run character ``a`` and every other one a space."""
    return text.encode('utf-8', 'surrogatepass').translate(_RUN_TABLE)


def _found_keywords(text: str, run_map: bytes, lower: Optional[str] = None, start: Optional[int] = None) -> set[str]:
    """The keywords in ``text``: looked for by the scan only around runs (a keyword starts a run or
    ends at most 8 characters before it: ``dt0c01.<run>``), and by substring for the rest.

    ``lower`` is ``text.lower()`` and ``start`` is ``run_map.find(_RUN)`` when the caller has them already.
    """
    if lower is None:
        lower = text.lower()
    if len(run_map) != len(text):  # not ASCII: byte offsets are not character offsets
        found = _KEYWORD_SCAN.findall(' ' + lower)
    else:
        found = []
        start = run_map.find(_RUN) if start is None else start
        while start != -1:
            end = run_map.find(b' ', start)
            end = len(run_map) if end == -1 else end
            # The scan's first character is the one before the region (it must end the word before).
            if start > 8:
                found += _KEYWORD_SCAN.findall(lower, start - 9, end)
            else:
                found += _KEYWORD_SCAN.findall(' ' + lower[:end])
            start = run_map.find(_RUN, end)
    if _any_inner_gate(lower):
        for gate, keywords in _INNER:
            if gate in lower:
                found += [keyword for keyword in keywords if keyword in lower]
    return set(found)


def _apply_formats(text: str, found: set[str]) -> str:
    """Run the rules of the keywords ``found`` in ``text`` (gitleaks' keyword gate), each with its entropy and allowlist."""
    rules = sorted({rule for keyword in found for rule in _RULES_BY_KEYWORD[keyword]})
    for rule in rules:
        def replace(match: re.Match, rule: _Format = rule) -> str:
            secret = match.group(rule.group)
            if (not secret or REDACTED in secret or (rule.entropy and _entropy(secret) <= rule.entropy)
                    or any(allow.search(secret) for allow in rule.allow)):
                return match.group(0)
            start, end = match.span(rule.group)
            whole = match.group(0)
            return whole[:start - match.start()] + REDACTED + whole[end - match.start():]

        text = rule.regex.sub(replace, text)
    return text


# --------------------------------------------------------------------------- the value rule: shapes

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
    for head, value in (('url_head', 'url_password'), ('auth_head', 'auth_value'), ('scheme', 'credential'),
                        ('user_head', 'user_password')):
        if match.group(head) is not None:
            secret = match.group(value)
            if secret in _NOT_SECRET_VALUES or REDACTED in secret or _is_placeholder(secret):
                return match.group(0)
            if head == 'user_head' and secret.isdigit() and _FLAG_VALUE.split(match.group(head)[:-1])[-1].isdigit():
                return match.group(0)  # ``docker run -u 1000:1000``: a uid and gid
            return match.group(head) + REDACTED
    return match.group(0)


def _may_hold_shape(text: str) -> bool:
    """Cheap pre-check: False means no shape above can match (plain ``in`` tests, no regex)."""
    return ('://' in text or 'earer' in text or 'Basic' in text or 'UTHORIZATION' in text
            or 'uthorization' in text or ('-' in text and ('PRIVATE KEY' in text or '-u' in text)))


# A credential-named pair inside a string; each alternative is ``head<N>`` (holding ``name<N>``) then ``value<N>``:
# 1. ``name=value`` and the other assignment operators (``:=``, ``?=``, ``=>``), the name optionally
#    quoted or subscripted (``'secret_key' => ...``, ``os.environ["HF_TOKEN"] = ...``), or declared with
#    a string type (``var apiToken string = ...``);
# 2. ``'name': value`` / ``"name": value`` (a dict's repr or JSON inside a string);
# 3. ``name: value`` (YAML or a log line), the value running to the end of the line or to ``, ; } ]``;
# 4. ``--name value`` (a command line);
# 5. ``("NAME", "value")`` (``System.setProperty``, ``os.environ.setdefault``, ``getenv`` defaults);
# 6. ``<name>value</name>`` (XML: Maven settings, .NET config).
# The value never starts on the next line (``GITHUB_API_KEY=\nNEXT=`` is two empty values).
_QUOTED = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\''
# A value that is a template reference is read whole, so the reference check sees it whole.
_REFERENCE_TEXT = r'|\$\{\{[^}\n]*\}\}|\{\{[^}\n]*\}\}|\$\{[^}\s]*\}'
_ASSIGNMENT = re.compile(
    r'(?P<head1>(?<![A-Za-z0-9_.])(?P<name1>[A-Za-z_][A-Za-z0-9_.\-]*)'
    r'(?:[ \t]+(?:string|String|str|\[\]byte))?["\'\]]*[ \t]*(?::=|\?=|=>|=)(?![=>])[ \t]*)'
    r'(?P<value1>' + _QUOTED + _REFERENCE_TEXT + r'|[^\s&;,\'")\]}]+)'
    r'|(?P<head2>(?P<q2>["\'])(?P<name2>[A-Za-z_][A-Za-z0-9_.\- ]*)(?P=q2)\s*:\s*)'
    r'(?P<value2>' + _QUOTED + _REFERENCE_TEXT + r'|[^\s,}\]]+)'
    r'|(?P<head3>(?<![A-Za-z0-9_.\-"\'])(?P<name3>[A-Za-z_][A-Za-z0-9_.\-]*):[ \t]+)'
    r'(?P<value3>' + _QUOTED + _REFERENCE_TEXT + r'|[^\s,;}\]]+(?:[ \t]+[^\s,;}\]]+){0,7})'
    r'|(?P<head4>(?<!\S)--?(?P<name4>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]+)'
    r'(?P<value4>' + _QUOTED + r'|(?!-)[^\s]+)'
    r'|(?P<head5>\([ \t]*(?P<q5>["\'])(?P<name5>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q5)[ \t]*,[ \t]*)'
    r'(?P<value5>' + _QUOTED + r')'
    r'|(?P<head6><(?P<name6>[A-Za-z_][A-Za-z0-9_.\-:]*)(?:[ \t][^<>\n]*)?>)'
    r'(?P<value6>[^<>\n]+)(?=</(?P=name6)>)'
)
# ``name: value`` reads at most 8 words per match, so a name that is no credential costs a bounded
# look ahead (a line of many ``x: y`` stays linear); a credential's value takes the rest of the line.
_MORE_WORDS = re.compile(r'(?:[ \t]+[^\s,;}\]]+)*')
_GROUPS = tuple(('name' + n, 'value' + n, 'head' + n) for n in '123456')
# Values that hold no secret (JSON/YAML/Python literals, already redacted, empty).
_NOT_SECRET_VALUES = frozenset({REDACTED, '', '""', "''", 'null', 'None', 'none', 'true', 'false', 'True', 'False',
                                '~', '"***"', "'***'"})
# A reference to where the secret is, not the secret: ``$VAR``, ``${VAR}``, ``%VAR%``, ``{{ .Values.x }}``,
# ``${{ secrets.HF_TOKEN }}`` (gitleaks' global allowlist), quoted or not. ``${VAR:-default}`` is not one.
_REFERENCE_VALUE = re.compile(
    r'''(["']?)(?:\$(?:[A-Z_][A-Z0-9_]*|[a-z_][a-z0-9_]*)|\$\{(?:[A-Z_][A-Z0-9_]*|[a-z_][a-z0-9_]*)\}'''
    r'''|%(?:[A-Z_]+|[a-z_]+)%|\{\{[ \t]*[\w ().|]+[ \t]*\}\}'''
    r'''|\$\{\{[ \t]*(?:env|github|secrets|vars|inputs)(?:\.[A-Za-z]\w*)+[ \t]*\}\})\1''')


def _is_reference(value: str) -> bool:
    return ('$' in value or '%' in value or '{{' in value) and _REFERENCE_VALUE.fullmatch(value) is not None


def _is_placeholder(value: str) -> bool:
    """A header or ``--user`` value that is a template: a reference, ``$1``, ``$(command)``, ``${...}``,
    ``<token>``, ``[PASSWORD]``, ``{base64(...)}`` (gitleaks' curl rules skip these too)."""
    return value.startswith(('$(', '${', '<', '[', '{')) or _is_reference(value) or (
        value[:1] == '$' and value[1:].isdigit())


def _quoted_or_bare(value: str) -> str:
    if len(value) >= 2 and value[0] in '"\'' and value[-1] == value[0]:
        return value[0] + REDACTED + value[0]
    return REDACTED


# Every key the default rule calls a credential contains one of these (lower-cased) fragments.
# Most frequent in log lines first (``tokens/s``, ``key_dim``): the ``in`` chain stops at the first one found.
_CREDENTIAL_FRAGMENTS = ('token', 'key', 'auth', 'pass', 'secret', 'cred', 'pwd', 'cookie')
_any_credential_fragment = _any_of(_CREDENTIAL_FRAGMENTS)
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
            if (follows in ('=', ':', '?', ',', '>') or (text[start] == '-' and after > end)
                    or text.startswith(_TYPE_WORDS, after)) and is_secret(text[start:end]):
                return True
            index = lower.find(fragment, end)
    return False


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
        if value not in _NOT_SECRET_VALUES and REDACTED not in value and not _is_reference(value) and is_secret(name):
            parts.append(text[position:match.start()] + match.group(head_group) + _quoted_or_bare(value))
            position = match.end()
            if head_group == 'head3' and value[:1] not in '"\'':  # the rest of a long ``name: many words`` value
                position = _MORE_WORDS.match(text, position).end()
        else:
            parts.append(text[position:match.end(head_group)])
            position = match.end(head_group)
    parts.append(text[position:])
    return ''.join(parts)


def _redact_string(text: str, is_secret: Callable[[str], bool], any_name: bool = False) -> str:
    """``text`` with credentials replaced; the same object when nothing is found."""
    out = text
    if _may_hold_shape(out):
        out = _CREDENTIAL_SHAPES.sub(_shape_replacement, out)
    run_map = _run_map(out)
    lower = None
    # Every format's secret holds a run (``_RUN``) but for these few, which have their own check.
    start = run_map.find(_RUN)
    if start != -1 or 'xox' in out or 'Q~' in out or 'SG.' in out or 'sig=' in out:
        lower = out.lower()
        found = _found_keywords(out, run_map, lower, start)
        if found:
            out, lower = _apply_formats(out, found), None
    if _may_hold_pair(out, is_secret, any_name, lower):
        out = _redact_pairs(out, is_secret)
    return text if out == text else out


def redact_text(text: str) -> str:
    """Replace credential-shaped parts of free text with ``'***'`` (the value rule only).

    Replaces a URL's user-info password (``postgres://alice:***@db:5432/x``), every credential format
    of gitleaks' default rules (AWS, GCP, Azure, Hugging Face, OpenAI, Anthropic, Databricks, GitHub,
    GitLab, npm, PyPI, Stripe, Slack, Twilio, SendGrid, JWTs ... each exactly as tight as gitleaks has
    it: length, alphabet, entropy, allowed placeholders) plus a few it lacks (Discord and Slack
    webhook secrets, Azure SAS ``sig=``, Replicate, Groq, LangSmith, Neptune, OpenAI-compatible
    ``sk-`` keys), ``Authorization`` header values, ``--user name:password``, PEM private-key blocks
    (keeping their BEGIN/END lines), and the value of a pair whose name is a credential by
    :func:`is_secret_key`: ``name=value`` (also ``:=``, ``?=``, ``=>``), ``'name': 'value'``,
    ``name: value``, ``--name value``, ``("NAME", "value")`` and ``<name>value</name>``. Git commit
    hashes and UUIDs are kept. Strings without any credential marker or credential-named pair are
    answered by a few substring searches.

    Args:
        text: any string (a log message, a config value).

    Returns:
        The redacted string; ``text`` itself (the same object) when nothing was found.
    """
    return _redact_string(text, is_secret_key)


# --------------------------------------------------------------------------- applying both rules

# ``{name: WANDB_API_KEY, value: ...}`` (Kubernetes env, ECS task definitions, CloudFormation parameters).
_NAME_FIELDS = ('name', 'Name', 'NAME', 'key', 'Key', 'KEY')
_VALUE_FIELDS = ('value', 'Value', 'VALUE')
_FLAG = re.compile(r'--?[A-Za-z]')


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
        return [[self._conceal(cell) if secret else self._value(cell) for cell, secret in zip(row, secret_columns)]
                for row in rows]

    def _key(self, key: Any) -> Any:
        return _redact_string(key, self.is_secret_key, self._any_name) if type(key) is str else key

    def _mapping(self, data: Mapping[Any, Any]) -> dict[Any, Any]:
        named = self._named_value(data)
        out = {}
        for key, value in data.items():
            if (isinstance(key, str) and self.is_secret_key(key)) or (named is not None and key == named):
                out[self._key(key)] = self._conceal(value)
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
        for item in items:
            flag = type(item) is str and _FLAG.match(item) is not None
            if conceal_next and not flag:
                out.append(self._conceal(item))
                conceal_next = False
                continue
            out.append(self._value(item))
            conceal_next = flag and '=' not in item and self.is_secret_key(item.lstrip('-'))
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
            return self._sequence(value)
        if isinstance(value, tuple):
            return tuple(self._sequence(value))
        if isinstance(value, (set, frozenset)):
            return type(value)(self._value(v) for v in value)
        return value

    def _conceal(self, value: Any) -> Any:
        """The value of a credential-named key: every leaf replaced, the shape kept."""
        if value is None or isinstance(value, bool) or (isinstance(value, str) and (not value or _is_reference(value))):
            return value  # no secret in it, or only where the secret is kept (``${POSTGRES_PASSWORD}``)
        if isinstance(value, Mapping):
            return {self._key(k): self._conceal(v) for k, v in value.items()}
        fields = self._fields(value)
        if fields is not None:
            return {k: self._conceal(v) for k, v in fields.items()}
        if isinstance(value, (list, tuple)):
            return [self._conceal(v) for v in value] if isinstance(value, list) else tuple(
                self._conceal(v) for v in value)
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
