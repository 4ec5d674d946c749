"""The key-name rule: whether a key (``hf_token``, ``AWS_SECRET_ACCESS_KEY``) names a credential, by its words.

A key is split into words (on ``_ - .``, spaces, camelCase and digit boundaries) and names a
credential when its words say so; ``token`` as a vocabulary or counted thing (``pad_token``,
``max_new_tokens``, ``tokenizer``) is not a credential, nor is a key naming where one is kept
(``secretKeyRef``, ``hf_token_path``).
"""

from __future__ import annotations

import functools
import re

from dist_logging.redaction._common import shannon_entropy

#: Words (after splitting a key) that name a credential wherever they stand.
DEFAULT_SECRET_PATTERN = (
    r'^(?:\w*password\w*|\w*passwd\w*|pwd|passphrase|\w*secrets?\w*|\w*credentials?|creds'
    r'|auth|oauth|\w+auth|authorization|authn|authz|cookies?)$'
)
_SECRET_WORD = re.compile(DEFAULT_SECRET_PATTERN)
# ``secret`` as part of a protocol's name (federated learning's secret sharing) names no credential.
_NOT_SECRET_AFTER = frozenset({'sharing', 'shares', 'share', 'santa'})

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
        'application',
        'integration',
        'developer',
        'dev',
        'project',
        'user',
        'upload',
        'write',
        'read',
        'personal',
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
# Services and products whose name before a credential word makes it a credential even when the
# word right before it is not one (``mlflow_tracking_token``, ``kaggle_key``, ``b2_application_key``).
_SERVICES = _TOKEN_SERVICES | frozenset(
    {
        'b2',
        'backblaze',
        'stripe',
        'sendgrid',
        'mailgun',
        'pinecone',
        'weaviate',
        'qdrant',
        'groq',
        'mistral',
        'together',
        'fireworks',
        'perplexity',
        'deepseek',
        'langchain',
        'langsmith',
        'tavily',
        'serpapi',
        'clearml',
        'dvc',
        'lambda',
        'runpod',
        'vastai',
        'coreweave',
        'paperspace',
        'sagemaker',
        'vertex',
        'bedrock',
        'minio',
        'wasabi',
        'oci',
        'ibm',
        'alibaba',
        'tencent',
        'digitalocean',
        'linode',
        'supabase',
        'firebase',
        'redis',
        'postgres',
        'mysql',
        'mongo',
        'mongodb',
        'snowflake',
        'bigquery',
        'elastic',
        'opensearch',
        'grafana',
        'datadog',
        'newrelic',
        'pagerduty',
        'opsgenie',
        'teams',
        'mattermost',
        'zulip',
        'smtp',
        'email',
        'ftp',
        'sftp',
        'ssh',
        'gpg',
        'pgp',
        'nvidia',
        'ngc',
        'hf',
        'xai',
        'gemini',
        'claude',
        'azureml',
        'aml',
        'lightning',
    }
)
# Words before ``token``/``key`` that make it a vocabulary or data key, never a credential, even in
# an environment-style name (``PAD_TOKEN``, ``SORT_KEY``).
_NOT_CREDENTIAL_BEFORE = frozenset(
    {
        'pad',
        'bos',
        'eos',
        'unk',
        'sep',
        'cls',
        'mask',
        'image',
        'video',
        'audio',
        'start',
        'end',
        'begin',
        'stop',
        'special',
        'added',
        'default',
        'think',
        'tool',
        'placeholder',
        'vision',
        'boi',
        'eoi',
        'eot',
        'pause',
        'fim',
        'prefix',
        'suffix',
        'middle',
        'system',
        'user',
        'assistant',
        'chat',
        'next',
        'prev',
        'last',
        'first',
        'max',
        'min',
        'num',
        'per',
        'new',
        'input',
        'output',
        'text',
        'label',
        'target',
        'primary',
        'foreign',
        'sort',
        'partition',
        'shard',
        'sharding',
        'cache',
        'dict',
        'hash',
        'lookup',
        'routing',
        'group',
        'join',
        'index',
        'feature',
        'column',
        'field',
        'metric',
        'monitor',
        'data',
        'dataset',
        'model',
        'layer',
        'state',
        'config',
        'record',
        'row',
        'dedup',
        'query',
        'value',
        'attention',
        'attn',
        'kv',
        'rng',
        'random',
        'seed',
        'lora',
        'hot',
        'sample',
        'batch',
        'sequence',
        'seq',
        'sub',
        'word',
        'byte',
        'char',
        'cross',
        'self',
        'memory',
        'bucket',
        'object',
        'blob',
        'log',
        'event',
        'message',
        'map',
        'item',
        'entry',
        'node',
        'section',
        'table',
        'topic',
        'queue',
        'stream',
        'point',
        'box',
        'region',
        'obj',
        'frame',
        'patch',
        'im',
        'img',
        'vid',
        'speech',
        'time',
        'action',
        'reward',
        'answer',
        'question',
        'context',
        'doc',
        'document',
        'page',
        'turn',
        'role',
    }
)
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
            rest = words[index + 1 :]
            if word == 'token' and not all(w.isdigit() or w in _TOKEN_SUFFIXES for w in rest):
                previous = word
                continue
            if word == 'token' and (index == 0 or previous in _TOKEN_SERVICES):
                return True
            if (
                index > 0
                and previous not in _NOT_CREDENTIAL_BEFORE
                and not any(w in _VOCABULARY_CONTEXT for w in words[:index])
                and (_environment_style(key) or any(w in _SERVICES for w in words[:index]))
            ):
                return True
        previous = word
    return False


# --------------------------------------------------------------------------- keys decided by their value

# A key whose last word is one of these may hold a credential (``asanaToken``, ``confluent_TOKEN``,
# ``codecov_token``, ``bittrex_key``) or a vocabulary entry (``pad_token: "<pad>"``): the value decides,
# as gitleaks' generic rule decides by its keyword list and entropy floor.
# (Each holds a fragment of ``_text._CREDENTIAL_FRAGMENTS``, which the pair pre-check looks for.)
_CREDENTIAL_LAST = (
    'token',
    'key',
    'secret',
    'password',
    'passwd',
    'pwd',
    'pass',
    'auth',
    'credential',
    'credentials',
    'creds',
    'apikey',
)
# A last word written as one (``apitoken``, ``ACCESSTOKEN``, ``secretkey``); not any word ending in ``key``
# or ``pass`` (``passkey``, ``monkey``, ``bypass``, ``compat``).
_CREDENTIAL_ENDINGS = (
    'token',
    'secret',
    'password',
    'passwd',
    'apikey',
    'accesskey',
    'secretkey',
    'privatekey',
    'authkey',
)
# Characters no credential of this kind holds but vocabulary entries do (``<pad>``, ``</s>``, ``[PAD]``,
# ``<|endoftext|>``, XML-escaped ``&lt;pad&gt;``), nor a value of several words or a list.
_NOT_CREDENTIAL_CHARS = frozenset('<>[]{}()|&;,"\'` \t\r\n$')
# Words joined by ``. _ -``, each up to 15 letters, letters then digits (``v8``, ``layer11``) or digits: a
# name (a run of more letters is not a word: ``hnbhnqaqvtktztycjofsmsfbzswfxbo4``).
_IDENTIFIER = re.compile(r'(?:[A-Za-z]{1,15}[0-9]*|[0-9]+)(?:[._\-](?:[A-Za-z]{1,15}[0-9]*|[0-9]+))*')
_BASE64_WITH_SLASH = re.compile(r'[A-Za-z0-9+/]+={0,3}')


@functools.lru_cache(maxsize=16384)
def names_credential_by_value(key: str) -> bool:
    """Whether a key ends in a credential word (``token``, ``key``, ``secret``, ``password``, ``auth``...),
    so that its value decides (:func:`credential_value`); cached per key.

    ``asanaToken``, ``confluent_TOKEN``, ``codecov_token``, ``pad_token``, ``hubspot_api_key_2`` do;
    ``max_new_tokens``, ``bos_token_id``, ``tokenizer``, ``token_path``, ``sort_key``, ``cache_key`` (a data
    word before ``key``) do not.
    """
    words = key_words(key)
    while len(words) > 1 and (words[-1].isdigit() or words[-1] in _TOKEN_SUFFIXES):
        words = words[:-1]  # ``hf_token_value``, ``token2``, ``mySecretString``
    if not words:
        return False
    last = words[-1]
    if last not in _CREDENTIAL_LAST and not last.endswith(_CREDENTIAL_ENDINGS):
        return False
    if last.endswith(('key', 'keys')) and len(words) > 1 and words[-2] in _NOT_CREDENTIAL_BEFORE:
        return False  # ``sort_key``, ``cache_key``, ``primary_key``: a column or a hash, named as data
    return True


def _random_letters(value: str) -> bool:
    """Letters alone read as a credential only when drawn at random: 12 or more, both cases, split at case
    changes into pieces of under 3 letters on average (``suUrKthWqVykTK``: su Ur Kth Wq Vyk TK), where a
    camel-case name splits into words (``PreTrainedTokenizerFast``: Pre Trained Tokenizer Fast)."""
    if len(value) < 12 or value.islower() or value.isupper():
        return False
    words = _WORD.findall(value)
    return len(value) < 3 * len(words) and shannon_entropy(value) >= 3.0


def credential_value(value: str) -> bool:
    """Whether a string under a credential-ending key (:func:`names_credential_by_value`) reads as a credential.

    Decided by the value alone: one word of 8 to 1,000 characters (no spaces, no
    ``< > [ ] { } ( ) | & ; ,`` or quotes, so no special-token string such as ``<pad>``, ``</s>``,
    ``[PAD]``); not a URL or a Windows path; not a path (a value with ``/`` counts only when it holds
    ``+`` or ``=`` or is base64 of both cases and digits); not a number shorter than 12 digits
    (``50256``; 16 digits is a client id); with a digit or a character outside letters and ``_ . -``
    (gitleaks' generic rule allows values of letters and ``_ . -`` alone; letters alone count when
    they read as drawn at random: both cases, no camel-case words); not a dotted or snake-case name
    whose words are letters, letters then digits, or numbers; and a Shannon entropy of at least 3 bits
    per character (2.5 below 12 characters), so ``aaaaaaaa1`` or ``1.0.0-rc1`` are not.
    """
    size = len(value)
    if size < 8 or size > 1000 or not _NOT_CREDENTIAL_CHARS.isdisjoint(value):
        return False
    if value.isdigit():
        return size >= 12
    if '://' in value or (value[1:3] == ':\\' and value[0].isalpha()):
        return False  # a URL (its password and query secrets are the shapes' and pairs' job), a Windows path
    if (
        '/' in value
        and '+' not in value
        and '=' not in value
        and not (
            _BASE64_WITH_SLASH.fullmatch(value)
            and any(c.isupper() for c in value)
            and any(c.islower() for c in value)
            and any(c.isdigit() for c in value)
        )
    ):
        return False  # a path (``data/train_v2``), unless base64 says otherwise (``+``, ``=``, mixed case)
    if value.isascii() and value.isalpha():
        return _random_letters(value)
    if value.replace('_', '').replace('.', '').replace('-', '').isalpha() or _IDENTIFIER.fullmatch(value):
        return False  # words and names (``jetbrains.mps.v8_elimination``, ``encoder.layer.11.output``)
    return shannon_entropy(value) >= (3.0 if size >= 12 else 2.5)
