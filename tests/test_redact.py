"""The redaction rules on their own: the key splitter and classifier, the value formats (with
near-misses that must be kept), and the Redactor's handling of nested data and tables."""

from __future__ import annotations

import argparse
import dataclasses
import re
import types

import pytest

from dist_logging.redaction import REDACTED, build_redactor, is_secret_key, key_words, redact_text

# Real-looking credential shapes built at run time (never a real credential; nothing here is
# valid anywhere), so that secret scanners do not flag this file either.
ALNUM = 'aB3dE5gH7jK9mN2pQ4sT6vW8yZ1cF0xL'
AWS_ID = 'AKIA' + 'Q3EXAMPLE7KD2MZP'
AWS_TEMP_ID = 'ASIA' + 'Y7EXAMPLE4FJ2RXT'  # base32: no 0, 1, 8, 9
HF = 'hf_' + ''.join(c for c in ALNUM if c.isalpha()) + 'ZqWbcdefghij'  # 34 letters
OPENAI = 'sk-' + ALNUM + 'T3BlbkFJ' + ALNUM[:12]
OPENAI_PROJECT = 'sk-proj-' + ALNUM + '_' + ALNUM[::-1] + '-x9'
GITHUB = {prefix: prefix + ALNUM + 'abcd' for prefix in ('ghp_', 'gho_', 'ghs_', 'ghu_', 'ghr_')}
GITHUB_PAT = 'github_pat_11ABCDEFG0' + ALNUM[:12] + '_' + ALNUM + ALNUM[:27]  # 82 after the prefix
SLACK = 'xoxb-' + '2417365' + '0912' + '-' + '4827361' + '09187-' + ALNUM[:24]
PEM = (
    '-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA' + ALNUM + '\n' + ALNUM[::-1] + '==\n'
    '-----END RSA PRIVATE KEY-----'
)
GIT_SHA = '01c7f73d771dfac7d292323805ebc428287df4f9'
UUID = '9b2f6c1e-4a7d-4e3b-8c5a-1f0e2d3c4b5a'


# --------------------------------------------------------------------------- splitting keys


@pytest.mark.parametrize(
    'key, words',
    [
        ('AWS_SECRET_ACCESS_KEY', ('aws', 'secret', 'access', 'key')),
        ('hfToken2', ('hf', 'token', '2')),
        ('APIKey', ('api', 'key')),
        ('OAuthToken', ('o', 'auth', 'token')),
        ('max-new-tokens', ('max', 'new', 'tokens')),
        ('model.tokenizer.name', ('model', 'tokenizer', 'name')),
        ('db password', ('db', 'password')),
        ('fp16_opt_level', ('fp', '16', 'opt', 'level')),
        ('', ()),
    ],
)
def test_key_words(key, words):
    assert key_words(key) == words


# --------------------------------------------------------------------------- classifying keys

CREDENTIAL_KEYS = [
    # passwords and secrets
    'password',
    'Password',
    'PASSWD',
    'db_password',
    'dbPassword',
    'mysql_passwd',
    'pwd',
    'DB_PWD',
    'passphrase',
    'ssh_key_passphrase',
    'secret',
    'secrets',
    'client_secret',
    'clientSecret',
    'aws_secret_access_key',
    'AWS_SECRET_ACCESS_KEY',
    'secret_key',
    'jwt_secret',
    'secret_sauce_ratio',
    'webhook_secret',
    # credentials, auth, cookies
    'credential',
    'credentials',
    'gcp_credentials',
    'GOOGLE_APPLICATION_CREDENTIALS',
    'creds',
    'auth',
    'basic_auth',
    'oauth',
    'proxy_authorization',
    'Authorization',
    'session_cookie',
    'cookies',
    # keys
    'api_key',
    'apiKey',
    'APIKey',
    'apikey',
    'WANDB_API_KEY',
    'OPENAI_API_KEY',
    'api_keys',
    'access_key',
    'access_key_id',
    'aws_access_key_id',
    'accessKey',
    'private_key',
    'privateKey',
    'ssh_private_key',
    'session_key',
    'encryption_key',
    'signing_key',
    'license_key',
    'account_key',
    'AccountKey',
    'subscription_key',
    'master_key',
    # token as a credential
    'token',
    'Token',
    'TOKEN',
    'token2',
    'hf_token',
    'HF_TOKEN',
    'hub_token',
    'hubToken',
    'auth_token',
    'authToken',
    'authtoken',
    'access_token',
    'accessToken',
    'api_token',
    'bearer_token',
    'refresh_token',
    'session_token',
    'aws_session_token',
    'AWS_SESSION_TOKEN',
    'GITHUB_TOKEN',
    'github_token',
    'GH_TOKEN',
    'wandb_token',
    'slack_token',
    'slack_bot_token',
    'discord_bot_token',
    'HUGGING_FACE_HUB_TOKEN',
    'HUGGINGFACE_TOKEN',
    'push_to_hub_token',
    'id_token',
    'csrf_token',
    'security_token',
    'sas_token',
    'personal_access_token',
    'client_token',
    'hf_token_value',
    'use_auth_token',
    'hf_use_auth_token',
]

ORDINARY_KEYS = [
    # vocabulary tokens and their ids
    'pad_token',
    'bos_token',
    'eos_token',
    'unk_token',
    'sep_token',
    'cls_token',
    'mask_token',
    'image_token',
    'pad_token_id',
    'bos_token_id',
    'eos_token_id',
    'decoder_start_token_id',
    'forced_bos_token_id',
    'no_timestamps_token_id',
    'prev_sot_token_id',
    'additional_special_tokens',
    'added_tokens_decoder',
    'added_tokens_overrides',
    'special_tokens',
    'add_bos_token',
    'add_eos_token',
    'use_cls_token',
    'spaces_between_special_tokens',
    'token_type_ids',
    'token_id',
    'tokens',
    # counted tokens
    'max_tokens',
    'max_new_tokens',
    'min_new_tokens',
    'num_tokens',
    'num_memory_tokens',
    'tokens_per_batch',
    'tokens_per_second',
    'include_tokens_per_second',
    'include_num_input_tokens_seen',
    'suppress_tokens',
    'begin_suppress_tokens',
    'accumulate_train_batch_on_tokens',
    'n_expert_per_token',
    'eval_max_new_tokens',
    'no_seqlen_plus_one_input_tokens',
    # tokenizers
    'tokenizer',
    'tokenizer_name',
    'tokenizer_class',
    'tokenizer_path',
    'tokenizer_type',
    'tokenizer_config',
    'tokenizer_use_fast',
    'TOKENIZERS_PARALLELISM',
    'clean_up_tokenization_spaces',
    'tokenize_chinese_chars',
    # ordinary keys that contain credential-ish letters
    'author',
    'authors',
    'keyword',
    'key',
    'keys',
    'image_key',
    'text_key',
    'lora_key',
    'num_key_value_heads',
    'apply_query_key_layer_scaling',
    'memory_keys',
    'load_ignore_keys',
    'hub_private_repo',
    'passes',
    'num_passes',
    'bypass',
    'compass',
    'd_kv',
    'keep_latest_k',
    'session_id',
    'wandb_project',
    'wandb_entity',
    'hub_model_id',
    'hub_strategy',
    'access_log',
    'private_repo',
    'token_dropout',
    'hf_token_path',
    'tokenizer_file',
]


def test_credential_keys():
    missed = [key for key in CREDENTIAL_KEYS if not is_secret_key(key)]
    assert not missed, f'credential keys not redacted: {missed}'


def test_ordinary_keys():
    redacted = [key for key in ORDINARY_KEYS if is_secret_key(key)]
    assert not redacted, f'ordinary keys redacted: {redacted}'


def test_extra_pattern_extends_the_word_rule():
    redactor = build_redactor(r'^wandb_')
    assert redactor.is_secret_key('wandb_entity') and redactor.is_secret_key('WANDB_ENTITY')
    assert redactor.is_secret_key('hf_token') and not redactor.is_secret_key('pad_token')
    both = build_redactor([r'^wandb_', re.compile(r'entity$')])
    assert both.is_secret_key('team_entity') and both.is_secret_key('wandb_x') and not both.is_secret_key('team')
    # the old substring rule can be asked for explicitly
    assert build_redactor('token').is_secret_key('pad_token')


@pytest.mark.parametrize('bad, error', [('(unclosed', ValueError), (3, TypeError), ([b'x'], TypeError)])
def test_bad_redact_option_is_named(bad, error):
    with pytest.raises(error, match=re.escape(repr(bad if not isinstance(bad, list) else bad[0]))):
        build_redactor(bad)


# --------------------------------------------------------------------------- the value rule

REPLACED = [
    # URL user-info passwords: the password goes, the rest of the URL stays
    ('postgres://alice:s3cr3t@db:5432/x', 'postgres://alice:***@db:5432/x'),
    ('mysql+pymysql://svc:p%40ss@10.0.0.3/db?charset=utf8', 'mysql+pymysql://svc:***@10.0.0.3/db?charset=utf8'),
    ('redis://:only-a-password@cache:6379/0', 'redis://:***@cache:6379/0'),
    ('amqp://u:unencoded@sign@mq/vhost', 'amqp://u:***@mq/vhost'),
    (f'https://user:{GITHUB["ghp_"]}@github.com/o/r.git', 'https://user:***@github.com/o/r.git'),
    (
        'pip install --index-url https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.example.com/simple pkg',
        'pip install --index-url https://__token__:***@pypi.example.com/simple pkg',
    ),
    ('mongodb://admin:pw1@h1:27017,h2:27017/db', 'mongodb://admin:***@h1:27017,h2:27017/db'),
    # token formats, whole or inside text
    (AWS_ID, REDACTED),
    (AWS_TEMP_ID, REDACTED),
    (f'key id {AWS_ID} in us-east-1', 'key id *** in us-east-1'),
    (HF, REDACTED),
    (f'HF_TOKEN={HF}', 'HF_TOKEN=***'),
    (OPENAI, REDACTED),
    (OPENAI_PROJECT, REDACTED),
    *[(token, REDACTED) for token in GITHUB.values()],
    (GITHUB_PAT, REDACTED),
    (f'https://{GITHUB["ghp_"]}@github.com/o/r.git', 'https://***@github.com/o/r.git'),
    (SLACK, REDACTED),
    ('xoxp-' + '283316862324-298911817009-298923149681-' + ALNUM, REDACTED),
    (PEM, '-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----'),
    ('-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA', '-----BEGIN OPENSSH PRIVATE KEY-----***'),
    ('AIza' + ALNUM + 'aaa', REDACTED),
    ('eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U', REDACTED),
    ('Authorization: Bearer ' + ALNUM, 'Authorization: Bearer ***'),
    # name=value and 'name': 'value' pairs whose name is a credential
    ('https://api.example.com/v1/x?api_key=abc123&page=2', 'https://api.example.com/v1/x?api_key=***&page=2'),
    ('Server=tcp:db;User Id=sa;Password=Pa55w0rd;Encrypt=true', 'Server=tcp:db;User Id=sa;Password=***;Encrypt=true'),
    (
        'DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bXlrZXk=;EndpointSuffix=core.windows.net',
        'DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net',
    ),
    ("train(lr=0.1, password='hunter2')", "train(lr=0.1, password='***')"),
    ("config {'hf_token': 'abc', 'lr': 0.1}", "config {'hf_token': '***', 'lr': 0.1}"),
    ('{"client_secret": "abc", "max_new_tokens": 5}', '{"client_secret": "***", "max_new_tokens": 5}'),
    ('--hub_token=abc --max_steps=10', '--hub_token=*** --max_steps=10'),
    ('train.py --hf-token abc --password "two words" --lr 0.1', 'train.py --hf-token *** --password "***" --lr 0.1'),
    ('password: hunter2 accepted', 'password: ***'),
    ('db:\n  host: h\n  password: "x y"\n  port: 5432\n', 'db:\n  host: h\n  password: "***"\n  port: 5432\n'),
    ('{ db: { host: h, password: x }, lr: 1 }', '{ db: { host: h, password: *** }, lr: 1 }'),
    ('{"api_key": null, "password": 12345}', '{"api_key": null, "password": ***}'),
    # an OpenAI-style key that drew no digit (one 48-character key in about 1,400; seen in CI)
    ('as sk-yRXHrWRzNGUdzpBKXKZTFhZHKpFSZbyijTuYUYeYGiwWgBwE', 'as ***'),
]

KEPT = [
    'https://bob@host/path',
    'git@github.com:org/repo.git',
    'ssh://git@github.com/org/repo.git',
    'https://host:8080/path?email=a@b.com',
    'https://huggingface.co/meta-llama/Llama-2-7b-hf',
    's3://my-bucket/checkpoints/{run_name}',
    'alice@example.com',
    '/Users/alice@example.com/llama2-sft',
    GIT_SHA,
    GIT_SHA.upper(),
    UUID,
    UUID.replace('-', ''),
    'AKIA' + 'SHORT12',
    'AKIA' + 'Q3EXAMPLE7KD2MZP' + 'X',
    'aAKIA' + 'Q3EXAMPLE7KD2MZP',  # wrong length / glued
    'hf_transfer',
    'hf_' + 'a' * 20,
    'sk-' + 'a1B2' * 4,
    'sk-learn-compatible-estimator-pipeline',
    'sk-ThisIsAVeryLongIdentifierNameForTestingPurposes',
    'sk-HTTPServerConfigurationForTheLongRunningJobs',
    'risk-' + ALNUM,
    'task-' + ALNUM,
    'ghp_short',
    'xoxb-123',
    'xoxz-' + ALNUM,
    '-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----',
    '-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----',
    'max_new_tokens=128 pad_token=<pad>',
    'tokenizer=EleutherAI/gpt-neox-20b',
    'password=',
    "password=''",
    'expandable_segments:True',
    'torchrun --nnodes=2 --rdzv-endpoint=10.0.0.12:29500 train.py',
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% endif %}",
    'Bearer',
    'the bearer of bad news',
    'Basic block',
    '',
    'plain text without anything',
    '{% if token == eos %}',
    'Loading tokenizer: gpt2',
    'pad_token: <pad>',
    '--max-new-tokens 128',
    'key: value',
    'api_key: null',
    'password=None',
    'hub_token: ~',
    'step 1200 loss=1.2345 lr=3e-4 tokens/s=51234',
    '12:30:05 INFO tokens: 4096, keys: 12',
]


def test_value_formats_are_replaced():
    wrong = [(text, redact_text(text), expected) for text, expected in REPLACED if redact_text(text) != expected]
    assert not wrong, 'logged -> got (expected):\n' + '\n'.join(f'{t!r} -> {g!r} ({e!r})' for t, g, e in wrong)


def test_near_misses_are_kept_as_the_same_object():
    changed = [(text, redact_text(text)) for text in KEPT if redact_text(text) is not text]
    assert not changed, f'near-misses changed: {changed}'


def test_redacting_twice_changes_nothing_more():
    for text, _ in REPLACED:
        once = redact_text(text)
        assert redact_text(once) == once


# --------------------------------------------------------------------------- the Redactor on data


@dataclasses.dataclass
class Hub:
    repo: str = 'org/model'
    token: str = HF


def test_nested_data_keys_and_values():
    redactor = build_redactor(True)
    data = {
        'tokenizer': {'name': 'EleutherAI/gpt-neox-20b', 'pad_token': '<|pad|>', 'kwargs': {'model_max_length': 2048}},
        'max_new_tokens': 128,
        'hub_token': HF,
        'hub': Hub(),
        'args': argparse.Namespace(api_key='k', lr=0.1),
        'ns': types.SimpleNamespace(client_secret={'a': 1}),
        'index_urls': ['https://pypi.org/simple', 'https://u:pw123@pypi.internal/simple'],
        'pair': ('postgres://a:b@h/db', 3),
        'tags': {'x', AWS_ID},
        'credentials': {'key_id': 'AKIDX', 'nested': [1, 'two', None, True], 'empty': ''},
        'use_auth_token': True,
        'access_token': None,
        'revision': GIT_SHA,
        'run_id': UUID,
        'https://u:pw@h': 'url as a key',
    }
    before = repr(data)
    got = redactor(data)
    assert repr(data) == before  # the caller's objects are untouched
    assert got['tokenizer'] == data['tokenizer'] and got['max_new_tokens'] == 128
    assert got['hub_token'] == REDACTED and got['hub'] == {'repo': 'org/model', 'token': REDACTED}
    assert got['args'] == {'api_key': REDACTED, 'lr': 0.1} and got['ns'] == {'client_secret': {'a': REDACTED}}
    assert got['index_urls'] == ['https://pypi.org/simple', 'https://u:***@pypi.internal/simple']
    assert got['pair'] == ('postgres://a:***@h/db', 3) and got['tags'] == {'x', REDACTED}
    # a credential-named mapping keeps its shape; None, booleans and '' hold no secret and stay
    assert got['credentials'] == {'key_id': REDACTED, 'nested': [REDACTED, REDACTED, None, True], 'empty': ''}
    assert got['use_auth_token'] is True and got['access_token'] is None
    assert got['revision'] == GIT_SHA and got['run_id'] == UUID
    assert got['https://u:***@h'] == 'url as a key'


def test_unchanged_strings_are_the_callers_objects():
    text = 'a long ordinary value ' * 10
    assert build_redactor(True)({'x': text})['x'] is text


def test_extra_pattern_also_names_pairs_inside_strings():
    redactor = build_redactor(r'^wandb_')
    assert redactor({'cmd': 'run --wandb_entity=team --lr=1'}) == {'cmd': 'run --wandb_entity=*** --lr=1'}
    assert redact_text('run --wandb_entity=team') == 'run --wandb_entity=team'


def test_tables():
    redactor = build_redactor(True)
    rows = [['gpt2', 'hf_token_here', f'https://x:{HF}@h/p', 1.5], ['bert', 'other', 'plain', None]]
    got = redactor.table(['model', 'api_key', 'url', 'loss'], rows)
    assert got == [['gpt2', REDACTED, 'https://x:***@h/p', 1.5], ['bert', REDACTED, 'plain', None]]
    assert rows[0][1] == 'hf_token_here'  # untouched
    off = build_redactor(False)
    assert off.table(['api_key'], [['v']]) == [['v']] and off({'password': HF}) == {'password': HF}
    assert off.text(HF) == HF


def test_key_classification_is_cached():
    redactor = build_redactor(r'^x_')
    config = {f'layer_{i}': {'pad_token_id': 0, 'hf_token': 't'} for i in range(200)}
    got = redactor(config)
    assert got['layer_7'] == {'pad_token_id': 0, 'hf_token': REDACTED}
    assert len(redactor._cache) < 210  # one entry per distinct key, not per occurrence


# --------------------------------------------------------------------------- issue 23: scanners' formats, shapes


@pytest.mark.parametrize(
    'key',
    [
        'KAGGLE_KEY',
        'B2_APPLICATION_KEY',
        'MLFLOW_TRACKING_TOKEN',
        'mlflow_tracking_token',
        'kaggle_key',
        'ACME_API_KEY',
        'ACME_SECRET_KEY',
        'ACME_ACCESS_TOKEN',
        'STRIPE_KEY',
        'COMET_API_KEY',
        'NEPTUNE_API_TOKEN',
        'DATABRICKS_TOKEN',
        'apiToken',
        'X_TOKEN',
        'GITHUB_API_KEY',
    ],
)
def test_service_names_before_credential_words(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    'key',
    [
        'key_dim',
        'keyword',
        'passkey_retrieval_length',
        'secret_sharing_rounds',
        'max_tokens',
        'token_budget',
        'signature_name',
        'sig_figs',
        'PAD_TOKEN',
        'EOS_TOKEN',
        'SORT_KEY',
        'image_key',
        'text_key',
        'key',
        'num_key_value_heads',
        'access_token_url',
        'tokenizer',
        'DEFAULT_IMAGE_TOKEN',
        'DEFAULT_POINT_TOKEN',
        'DEFAULT_IM_START_TOKEN',
        'S3_BUCKET_KEY',
        'PARTITION_KEY',
    ],
)
def test_ml_words_stay_ordinary(key):
    assert not is_secret_key(key)


def test_auth_required_true_is_kept():
    assert redact_text('auth_required: true') == 'auth_required: true'
    assert build_redactor(True)({'auth_required': True}) == {'auth_required': True}


def test_every_scanner_format_is_replaced_in_every_context():
    from credential_samples import samples, webhook_urls

    for name, value in samples().items():
        for text in (
            value,
            f'x {value} y',
            f'"{value}"',
            f'k={value}&n=1',
            f'f({value})',
            f'{value}\n',
            f'clé {value} ü',
        ):  # non-ASCII text takes the whole-line keyword scan
            if name == 'azure_ad_client_secret' and '&' in text:
                continue  # gitleaks' own right-hand delimiters for this rule; a ?k=...& query is not one
            assert value not in redact_text(text), (name, text)
    for name, (url, secret) in webhook_urls().items():
        got = redact_text(url)
        assert secret not in got and got == url.replace(secret, REDACTED), name  # host and path stay


CODE_PAIRS = [
    ('token := "{v}"', 'token := "***"'),
    ('API_KEY ?= {v}', 'API_KEY ?= ***'),
    ("'secret_key' => '{v}'", "'secret_key' => '***'"),
    ('var apiToken string = "{v}"', 'var apiToken string = "***"'),
    ('System.setProperty("X_TOKEN", "{v}");', 'System.setProperty("X_TOKEN", "***");'),
    ('os.environ["HF_TOKEN"] = "{v}"', 'os.environ["HF_TOKEN"] = "***"'),
    ('<apiToken>{v}</apiToken>', '<apiToken>***</apiToken>'),
    ('curl --user alice:{v} https://h/x', 'curl --user alice:*** https://h/x'),
    ('curl -u alice:{v} https://h/x', 'curl -u alice:*** https://h/x'),
    ('curl -H "Authorization: Token {v}" https://h', 'curl -H "Authorization: Token ***" https://h'),
    ('export WANDB_API_KEY={v} && python train.py', 'export WANDB_API_KEY=*** && python train.py'),
    ('KAGGLE_KEY={v}', 'KAGGLE_KEY=***'),
]


@pytest.mark.parametrize('template, expected', CODE_PAIRS)
def test_pairs_written_the_way_code_writes_them(template, expected):
    from credential_samples import hex40

    value = hex40()
    assert redact_text(template.format(v=value)) == expected


KEPT_23 = [
    'GITHUB_API_KEY=\nDYNATRACE_API_KEY=',
    'snowflake.password=\njdbc.snowflake.url=',
    'xoxb-12345-abcd234',
    'xoxb-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx',
    'sk-ant-api03-abc123xyz',
    'sk-ant-...abc123xyz',
    '- (id)hf_requiredCharacteristicTypesForDisplayMetadata;',
    'hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    'secret_sharing_rounds: 3',
    'key_dim=64 keyword=foo',
    "access_token_url='https://github.com/login/oauth/access_token'",
    'max_tokens: 4096, token_budget: 100000',
    'signature_name: serving_default',
    'sig_figs=3',
    GIT_SHA,
    UUID,
    'a == b',
    'x => y',
    'if (token == null)',
    'Saving checkpoint to /data/checkpoints/llama2_7b_sft_lora_r16/ep3-ba1200-rank0.pt',
    'model.layers.0.self_attn.q_proj.weight',
    'https://hooks.slack.com/services/T000/B000/XXXX',
]


def test_issue_23_decoys_are_kept_as_the_same_object():
    changed = [(text, redact_text(text)) for text in KEPT_23 if redact_text(text) is not text]
    assert not changed, f'decoys changed: {changed}'


def test_structural_pairs_in_lists_and_mappings():
    from credential_samples import hex40

    keys = [hex40() for _ in range(6)]
    data = {
        'argv': ['train.py', '--wandb-api-key', keys[0], '--run-name', 'token', '--lr', '0.1', '--hf_token', keys[1]],
        'argv_eq': ['--hub-token=' + keys[2], '--max-tokens=128'],
        'env': [
            {'name': 'WANDB_API_KEY', 'value': keys[3]},
            {'name': 'NCCL_DEBUG', 'value': 'INFO'},
            {'name': 'HF_TOKEN', 'valueFrom': {'secretKeyRef': {'name': 'hf', 'key': 'token'}}},
        ],
        'ecs': [{'Name': 'KAGGLE_KEY', 'Value': keys[4]}],
        'docker': ['WANDB_API_KEY=' + keys[5], 'OMP_NUM_THREADS=8'],
        'values_are_not_names': ['token', 'password', 'abc'],
        'flag_then_flag': ('--password', '--verbose'),
    }
    got = build_redactor(True)(data)
    assert got['argv'] == [
        'train.py',
        '--wandb-api-key',
        REDACTED,
        '--run-name',
        'token',
        '--lr',
        '0.1',
        '--hf_token',
        REDACTED,
    ]
    assert got['argv_eq'] == ['--hub-token=***', '--max-tokens=128']
    assert got['env'] == [
        {'name': 'WANDB_API_KEY', 'value': REDACTED},
        {'name': 'NCCL_DEBUG', 'value': 'INFO'},
        data['env'][2],
    ]
    assert got['ecs'] == [{'Name': 'KAGGLE_KEY', 'Value': REDACTED}]
    assert got['docker'] == ['WANDB_API_KEY=***', 'OMP_NUM_THREADS=8']
    assert got['values_are_not_names'] == ['token', 'password', 'abc']
    assert got['flag_then_flag'] == ('--password', '--verbose')
    assert not any(key in repr(got) for key in keys)


def test_references_to_where_a_secret_is_are_kept():
    refs = {
        'POSTGRES_PASSWORD': '${POSTGRES_PASSWORD}',
        'HF_TOKEN': '${{ secrets.HF_TOKEN }}',
        'api_key': '$API_KEY',
        'token': '{{ .Values.hubToken }}',
        'password': '%DB_PASSWORD%',
    }
    assert build_redactor(True)(refs) == refs
    for text in ('password=${DB_PASSWORD} user=x', 'HF_TOKEN: ${{ secrets.HF_TOKEN }}', '{"password": "${X}"}'):
        assert redact_text(text) is text
    # a default after the reference is a value, and may be the secret itself
    assert build_redactor(True)({'password': '${X:-hunter2}'}) == {'password': REDACTED}
    assert redact_text('password: ${X:-hunter2}, a: 1') == 'password: ***, a: 1'


def _internals():
    """The redaction package's private modules as one namespace (the scan tests check its internals)."""
    import types

    from dist_logging.redaction import _common, _formats, _text

    return types.SimpleNamespace(**{**vars(_common), **vars(_formats), **vars(_text)})


#: gitleaks' own false-positive examples (cmd/generate/config/rules/*.go at b58d3f10) for the rules we
#: take: placeholders and look-alikes that its rules do not report, so neither do we.
GITLEAKS_FALSE_POSITIVES = [
    'xoxb-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx',
    'xoxb-xxx',
    'xoxb-12345-abcd234',
    'xoxb-xoxb-my-bot-token',
    'xoxe.xoxp-1-SlackAppConfigurationAccessTokenHere',
    'xoxe-1-xxx',
    'xoxb-Slack_BOT_TOKEN',
    'xoxb-abcdef-abcdef',
    'https://indieweb.org/images/3/35/2018-250-xoxo-indieweb-1.jpg',
    '- (id)hf_requiredCharacteristicTypesForDisplayMetadata;',
    '                            _kHMSymptomhf_generatedByHomeAppForDebuggingPurposesKey,',
    '    #define OSCHF_DebugGetExpectedAverageCrystalAmplitude NOROM_OSCHF_DebugGetExpectedAverageCrystalAmplitude',
    'hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    "const api_org_controller = require('../../controllers/api/index').organizations;",
    'api_org_96726c78_4ae3_402f_b08b_7a78c6903d2a.xml',
    'ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    'gho_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    'github_pat_xxxxxxxxxxxxxxxxxxxxxx_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    'glpat-XXXXXXXXXXX-XXXXXXXX',
    'glptt-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
    'GR1348941XXXXXXXXXXXXXXXXXXXX',
    'key = AKIAXXXXXXXXXXXXXXXX',
    'TODAYINASIAASACKOFRICEFELLOVER',
    'discord=000000000000000000',
    '   curl -sL --user "$1:$2" "$3" > "$4"',
    'curl --user neo4j:[PASSWORD] http://[IP]:7474/db/data/',
    'curl -u "${_username}:${_password}"',
    'curl -k -X POST -I -u "SRVC_JENKINS:${APPID}"',
    "curl -sw '%{http_code}' -X POST --user '$USERNAME:$PASSWORD' $GItHUB_API_URL/$GIT_COMMIT --data",
    'curl -XGET -i -u "${{ env.ELK_ID }}:${{ build.env.ELK_PASS }}"',
    'curl -X POST --user "$(cat ./login.txt):$(cat ./password.txt)"',
]


def test_gitleaks_false_positives_are_kept():
    changed = [(text, redact_text(text)) for text in GITLEAKS_FALSE_POSITIVES if redact_text(text) != text]
    assert not changed, f'changed: {changed}'


def test_uid_gid_after_user_flags_is_kept():
    for text in ('docker run -u 1000:1000 img', 'docker run --user=1000:1000 img', 'docker run --user "0:0" img'):
        assert redact_text(text) is text
    assert redact_text('curl -u 1000:s3cret https://h') == 'curl -u 1000:*** https://h'


def test_every_rule_keyword_is_found_where_a_secret_would_follow():
    """The keyword scan (word starts around runs, substrings, Slack prefixes) reaches every rule's keywords."""
    _redact = _internals()

    missed = []
    for keyword, rules in _redact._RULES_BY_KEYWORD.items():
        text = f'value: {keyword}' + 'Ab3' * 10  # the keyword, then a run as a secret's body would make
        found = _redact.found_keywords(text, _redact.map_runs(text))
        if not any(rule in _redact._RULES_BY_KEYWORD[f] for f in found for rule in rules):
            missed.append(keyword)
    assert not missed, f'keywords never found: {missed}'
    assert len(_redact._RULES_BY_KEYWORD) > 120


def _reference_keywords(text: str) -> set[str]:
    """The keyword gate written plainly: at every word start (no letter or digit before it) in a run
    region (a run of 18+ ``[A-Za-z0-9_-]`` and the 8 characters before it; the whole text when it is
    not ASCII) the longest word-start keyword there; every substring keyword anywhere."""
    _redact = _internals()

    lower = text.lower()
    inner = {keyword for _, keywords in _redact._INNER for keyword in keywords}
    starts = sorted((k for k in _redact._RULES_BY_KEYWORD if k not in inner), key=len, reverse=True)
    if text.isascii():
        regions = [(max(0, m.start() - 8), m.end()) for m in re.finditer(r'[A-Za-z0-9_-]{18,}', text)]
    else:
        regions = [(0, len(text))]
    found = {keyword for keyword in inner if keyword in lower}
    for begin, end in regions:
        for position in range(begin, end):
            if position and (lower[position - 1].isascii() and lower[position - 1].isalnum()):
                continue
            for keyword in starts:
                if lower.startswith(keyword, position) and position + len(keyword) <= end:
                    found.add(keyword)
                    break
    return found


def test_keyword_scan_finds_what_the_plain_definition_finds():
    """The fast scan (separator-first regex, substring gates) reports exactly the plain definition's keywords."""
    import random

    _redact = _internals()

    rng = random.Random(23)
    keywords = list(_redact._RULES_BY_KEYWORD)
    pieces = keywords + [
        '_',
        '-',
        '.',
        '/',
        ' ',
        '=',
        '~',
        ':',
        'é',
        'Q~',
        'SG.',
        'x',
        '7',
        'llama2_7b_sft_lora_r16',
        'AbCdEfGhIjKlMnOpQrStUv',
        '0123456789abcdef0123',
        'hooks.slack.com/',
        '.com',
    ]
    mismatches = []
    for _ in range(800):
        text = ''.join(
            rng.choice(pieces) if rng.random() < 0.6 else rng.choice(keywords).upper()
            for _ in range(rng.randint(1, 12))
        )
        found = _redact.found_keywords(text, _redact.map_runs(text))
        expected = _reference_keywords(text)
        if found != expected:
            mismatches.append((text, sorted(found), sorted(expected)))
    assert not mismatches, mismatches[:5]


def test_microsoft_teams_webhook_secret_is_replaced_whole():
    """gitleaks' Teams rule would replace only its first capture group (5 characters of a UUID); ours takes the path."""
    import uuid

    ids = [str(uuid.uuid4()) for _ in range(3)]
    secret = uuid.uuid4().hex
    url = f'https://contoso.webhook.office.com/webhookb2/{ids[0]}@{ids[1]}/IncomingWebhook/{secret}/{ids[2]}'
    for text in (f'notify: {url}', f'notify {url}/V2Ab3_kQ9-zz done', f'{{"teams_url": "{url}"}}'):
        out = redact_text(text)
        assert 'https://contoso.webhook.office.com/webhookb2/***' in out, out
        assert not any(part in out for part in ids + [secret]), out


def test_in_chains_equal_their_loops():
    """The generated ``in`` chains (inner-keyword gates, credential fragments) answer as ``any`` over their lists."""
    import random

    _redact = _internals()

    gates = [gate for gate, _ in _redact._INNER]
    rng = random.Random(2323)
    pieces = gates + list(_redact._CREDENTIAL_FRAGMENTS) + ['a', '.', 'co', 'm', '~', 'Q', 'x', 'o', ' ', '_', '=']
    for _ in range(2000):
        text = ''.join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        assert _redact._any_inner_gate(text) == any(gate in text for gate in gates), text
        assert _redact._any_credential_fragment(text) == any(f in text for f in _redact._CREDENTIAL_FRAGMENTS), text
    assert _redact.any_of(())('anything') is False


# --------------------------------------------------------------------------- issue 35
# Concrete values shaped like gitleaks' own true positives (cmd/generate/config/rules/*.go), drawn once.
ISSUE_35_CREDENTIAL_NAMED = [
    ('asanaToken=z9lkxw5skvp16r80utfkh9hmh79o6gmp', 'asanaToken=***'),
    ('confluent_TOKEN = "u8qoka3iqh1slgif"', 'confluent_TOKEN = "***"'),
    ('codecov_token: gs6kmm93hnj1ffqzvr60m8lo0xfqter4', 'codecov_token: ***'),
    ('hubspotToken=cb709239-e821-504a-3738-abedb076a0b9', 'hubspotToken=***'),
    ('bittrex_token: cpi68lwqbrk4b0038jvuhr2qu2civsuc', 'bittrex_token: ***'),
    (
        '{"config.ini": "ASANA_TOKEN=1234567890123456\\nBACKUP_ENABLED=true"}',
        '{"config.ini": "ASANA_TOKEN=***\\nBACKUP_ENABLED=true"}',
    ),
    ('string adobeToken = "f5d504bcc6834ca915206358defe8061";', 'string adobeToken = "***";'),
    (
        "krakenToken = 'xbx3+=2210derv_st/pa=4j1ggzndsa7emftpqsv9y74wvl/ouk6klu7j-f1w0yt0xqufzhkq1q/x2-02jtc'",
        "krakenToken = '***'",
    ),
    (
        'authressToken="sc_1m71mqlqp6.44i6.acc_r37f5ypiu5.6y_78wfuh5rascjfkr5tnktyga-227-jpam0eyxf"',
        'authressToken="***"',
    ),
    ('planetScale_token: pscale_pw_k2=9.xq_0vh3-mzt8=r1a.bc4w7yde5=gfs6', 'planetScale_token: ***'),
    ('sumoToken="suUrKthWqVykTK"', 'sumoToken="***"'),  # letters alone, drawn at random
]
# ML settings under token- and key-ending names, and other values the value rule must leave alone.
ISSUE_35_KEPT = [
    'pad_token: "<pad>"',
    'eos_token: "</s>"',
    'bos_token: <|begin_of_text|>',
    'cls_token: [CLS]',
    'pad_token: <|finetune_right_pad_id|>',
    'bos_token_id: 1',
    'max_new_tokens: 512',
    'pad_token=50256',
    'tokenizer: meta-llama/Llama-3.1-8B',
    'pad_token: eos_token',
    'key: encoder.layer.11.output',
    'key = jetbrains.mps.v8_elimination',
    'schemaKey = "DOC_Vector_5_32"',
    'hf_token_path: /data/hf/token2024',
    'cache_key: 5f0c3a9e8b7d4c2e9a1f3e6d2b8c7a40',
    'sort_key=created_at_2024',
    'run_id: ' + UUID,
    'dataset_id=' + UUID,
    'revision: ' + GIT_SHA,
    'output_key: checkpoints/llama2_7b/ep3-ba1200',
    'tokens/s=51234 loss=1.2345',
    'api_token: ${API_TOKEN}',
    'tokenizer_token: PreTrainedTokenizerFast',
    'pad_token: EndOfTextToken',
    'eos_token: abcdefghijklmnop',
    'manifest_key: hf://datasets/c4?split=train2',
    'ckpt_key: C:\\runs\\llama2_7b\\ep3',
    'url: https://huggingface.co/meta-llama/Llama-3.1-8B',
]


@pytest.mark.parametrize('text, expected', ISSUE_35_CREDENTIAL_NAMED)
def test_credential_named_keys_are_decided_by_their_value(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize('text', ISSUE_35_KEPT)
def test_ml_values_under_credential_ending_keys_are_kept(text):
    assert redact_text(text) is text


def test_value_decided_keys_in_mappings_and_argv():
    config = {
        'asanaToken': 'z9lkxw5skvp16r80utfkh9hmh79o6gmp',
        'codecov_token': 'gs6kmm93hnj1ffqzvr60m8lo0xfqter4',
        'pad_token': '<pad>',
        'eos_token': '</s>',
        'bos_token_id': 1,
        'max_new_tokens': 512,
        'tokenizer': 'meta-llama/Llama-3.1-8B',
        'unk_token': '<unk>',
        'pad_token_str': '[PAD]',
        'argv': [
            '--asana-token',
            'z9lkxw5skvp16r80utfkh9hmh79o6gmp',
            '--pad-token',
            '<pad>',
            '--max-new-tokens',
            '512',
        ],
    }
    got = build_redactor(True)(config)
    assert got == {
        **config,
        'asanaToken': REDACTED,
        'codecov_token': REDACTED,
        'argv': ['--asana-token', REDACTED, '--pad-token', '<pad>', '--max-new-tokens', '512'],
    }
    rows = [['a', 'gs6kmm93hnj1ffqzvr60m8lo0xfqter4', '<pad>'], ['b', '', '</s>']]
    assert build_redactor(True).table(['name', 'codecov_token', 'pad_token'], rows) == [
        ['a', REDACTED, '<pad>'],
        ['b', '', '</s>'],
    ]


ISSUE_35_PAIR_SYNTAXES = [
    ('<atlassianToken>\n    jq5y8df9ad8f7a6s5d4f\n</atlassianToken>', '<atlassianToken>\n    ***\n</atlassianToken>'),
    ('<atlassianToken>jq5y8df9ad8f7a6s5d4f</atlassianToken>', '<atlassianToken>***</atlassianToken>'),
    ('adafruitToken := "a78xq9fb5hdvxdewymrpgb54j0imu71_"', 'adafruitToken := "***"'),
    ('adafruitToken := `a78xq9fb5hdvxdewymrpgb54j0imu71_`', 'adafruitToken := `***`'),
    ('  "adafruitToken" => "a78xq9fb5hdvxdewymrpgb54j0imu71_"', '  "adafruitToken" => "***"'),
    ('$adafruitToken .= "a78xq9fb5hdvxdewymrpgb54j0imu71_"', '$adafruitToken .= "***"'),
    ('adafruit_TOKEN ?= "a78xq9fb5hdvxdewymrpgb54j0imu71_"', 'adafruit_TOKEN ?= "***"'),
    ('adafruit_TOKEN ::= "a78xq9fb5hdvxdewymrpgb54j0imu71_"', 'adafruit_TOKEN ::= "***"'),
    ('adafruit_TOKEN :::= "a78xq9fb5hdvxdewymrpgb54j0imu71_"', 'adafruit_TOKEN :::= "***"'),
    (
        'System.setProperty("ADAFRUIT_TOKEN", "a78xq9fb5hdvxdewymrpgb54j0imu71_")',
        'System.setProperty("ADAFRUIT_TOKEN", "***")',
    ),
    ('<add key="Password" value="CleartextPassword1" />', '<add key="Password" value="***" />'),
    ('<entry name="asanaToken" value="z9lkxw5skvp16r80utfkh9hmh79o6gmp" />', '<entry name="asanaToken" value="***" />'),
    (
        'curl -H "X-Octopus-ApiKey: 3a16750d-d363-41a4-8ebd-035408f7730f" https://h',
        'curl -H "X-Octopus-ApiKey: ***" https://h',
    ),
    ("curl --header 'Token: 3fea6af1349166ea' -d x=1", "curl --header 'Token: ***' -d x=1"),
]


@pytest.mark.parametrize('text, expected', ISSUE_35_PAIR_SYNTAXES)
def test_pair_syntaxes_of_issue_35(text, expected):
    assert redact_text(text) == expected


def test_pair_syntaxes_keep_special_tokens_and_go_code():
    for text in (
        '<pad_token>\n  <pad>\n</pad_token>',
        '<eos_token></s></eos_token>',
        'padToken := "<pad>"',
        'maxTokens := 512',
        'x := `multi word string`',
        '"eosToken" => "</s>"',
        '<add key="pad_token" value="&lt;pad&gt;" />',
        '<add key="Environment" value="prod" />',
        '<param name="max_tokens" value="512"/>',
        'curl -H "Accept: application/json" -H "X-Request-Id: 42" u',
        'curl -H "X-Api-Key: $API_KEY" u',
        'curl -H "Authorization: Bearer <Openverse API token>" u',
        'curl -H "Authorization: Bearer $(gcloud auth print-access-token)" u',
        'curl -H "Token: <token>" u',
    ):
        assert redact_text(text) is text, text


def test_base64_wrapped_jwts_are_redacted():
    import base64

    from credential_samples import samples

    jwt = samples()['jwt']
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for strip in (False, True):
            wrapped = encode(jwt.encode()).decode()
            wrapped = wrapped.rstrip('=') if strip else wrapped
            assert wrapped.startswith('ZXlK')
            assert redact_text(f'auth_blob: {wrapped}') == 'auth_blob: ***'
            assert build_redactor(True)({'blob': wrapped}) == {'blob': REDACTED}
    assert redact_text('ZXlKaGJHY2lPaUpJVXpJMU5pSjk') == 'ZXlKaGJHY2lPaUpJVXpJMU5pSjk'  # too short to be one


def test_vendor_prefixes_with_unusual_alphabets():
    fly = 'fm2_+WRqIWs46X8HCTgRvl49PlxiKetpt4Tb+LYBo36ERsCyS7bNk5x8WAVQJipcGrlyWVutjcglShgALpawSf/EgBiOabTOSKnwc8iGg==='
    pscale = 'pscale_pw_k2=9.xq_0vh3-mzt8=r1a.bc4w7yde5=gfs6'
    for text in (f'flyToken="{fly}"', f'fly_token: {fly}', f'planetscale_password: {pscale}', f'dsn: {pscale}'):
        out = redact_text(text)
        assert fly not in out and pscale not in out, out
    # the same prefixes without a secret's length, and base64 that is not a JWT, are kept
    for text in ('dsn: pscale_pw_short', 'fm2_abc', 'fio-u-config', 'blob: ' + 'SGVsbG8sIHRoaXMgaXMgYSBsb25nIGJh' * 2):
        assert redact_text(text) is text, text


def test_regressions_of_the_last_wave_are_redacted():
    """A Hugging Face token with digits under an innocent key; AWS's documentation key (no allow-listed words)."""
    hub = 'hf_' + 'aB3dE5fG7hJ9kL2mN4pQ6rS8tU1vW3xY5zA7'[:34]
    got = build_redactor(True)({'hub': hub, 'storage': {'key_id': 'AKIA' + 'IOSFODNN7EXAMPLE'}})
    assert got == {'hub': REDACTED, 'storage': {'key_id': REDACTED}}
    mixed = 'aB3dE5fG7hJ9kL2mN4pQ6rS8tU1vW3xY5zA7cD9'
    assert redact_text('hf_' + mixed[:30]) == REDACTED  # 30 letters and digits
    assert redact_text(f'push to hf_{mixed} now') == f'push to {REDACTED} now'
    for kept in ('hf_' + mixed[:28], 'hf_' + 'abcdefghij' * 4, 'xhf_' + mixed, 'hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'):
        assert redact_text(kept) is kept, kept  # short, letters only (gitleaks' own rule decides), glued, placeholder


GO_RULE_SOURCE = '''package rules

var extra = []string{
	`acme: "lit3ral-secret-value-0001"`, // gitleaks:allow
}

func AcmeToken() *config.Rule {
	r := config.Rule{
		RuleID:      "acme-token",
		Regex:       utils.GenerateSemiGenericRegex([]string{"acme"}, utils.AlphaNumeric("32"), true),
	}
	var (
		secret = secrets.NewSecret(utils.Hex("8") + `\\.` + utils.AlphaNumeric("4,6"))
	)
	tps := utils.GenerateSampleSecrets("acme", secrets.NewSecret(`acme_[a-zA-Z0-9+/]{20}={0,2}`))
	tps = append(tps, extra...)
	tps = append(tps,
		fmt.Sprintf("ACME_KEY=%s", secret),
		`"acme" => "`+secret+`"`,
	)
	fps := []string{"acme_xxxxxxxxxxxxxxxxxxxx"}
	return utils.Validate(r, tps, fps)
}
'''


def test_gitleaks_example_reader_evaluates_rule_sources():
    """benchmarks/tools/gitleaks_examples.py: the Go subset gitleaks' rule files write their examples in."""
    import pathlib
    import random
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / 'benchmarks' / 'tools'))
    import gitleaks_examples

    (rule,) = gitleaks_examples.rule_examples(GO_RULE_SOURCE, gitleaks_examples._Generator(random.Random(1)))
    assert rule.rule == 'acme-token' and rule.skipped == []
    positives = [e for e in rule.examples if e.positive]
    templated = [e for e in positives if e.syntax != 'literal']
    assert len(templated) == len(gitleaks_examples.SAMPLE_TEMPLATES) and len(positives) == len(templated) + 3
    secret = templated[0].secret
    assert re.fullmatch(r'acme_[a-zA-Z0-9+/]{20}={0,2}', secret)
    assert {e.syntax: e.text for e in templated}['go - backticks'] == f'acmeToken := `{secret}`'
    literal = [e.text for e in positives if e.syntax == 'literal']
    assert literal[0] == 'acme: "lit3ral-secret-value-0001"'
    assert re.fullmatch(r'ACME_KEY=[a-f0-9]{8}\.[a-z0-9]{4,6}', literal[1]) and literal[2].startswith('"acme" => "')
    assert [e.text for e in rule.examples if not e.positive] == ['acme_xxxxxxxxxxxxxxxxxxxx']


def test_which_keys_are_decided_by_their_value():
    from dist_logging.redaction._keys import names_credential_by_value

    for key in (
        'asanaToken',
        'confluent_TOKEN',
        'codecov_token',
        'ACCESSTOKEN',
        'secretkey',
        'bittrex_key',
        'hubspot_api_key_2',
        'mySecretString',
        'db_pass',
        'KEY',
        'pad_token',
    ):
        assert names_credential_by_value(key), key
    for key in (
        'passkey',
        'monkey',
        'bypass',
        'torch_compat',
        'sort_key',
        'cache_key',
        'max_new_tokens',
        'bos_token_id',
        'tokenizer',
        'token_path',
        'hf_token_file',
        'key_dim',
        'tokens',
    ):
        assert not names_credential_by_value(key), key


def test_kubernetes_secret_manifests_are_concealed():
    """``kind: Secret``: every value under ``data``/``stringData`` is a secret, whatever its key."""
    manifest = {
        'apiVersion': 'v1',
        'kind': 'Secret',
        'metadata': {'name': 'hf-credentials'},
        'type': 'Opaque',
        'data': {'extra': 'YWRtaW46cGFzc3dvcmQ=', '.dockercfg': 'eyJhdXRocyI6e30K'},
        'stringData': {'config.yaml': 'user: admin'},
    }
    got = build_redactor(True)({'manifests': [manifest]})['manifests'][0]
    assert got == {
        **manifest,
        'data': {'extra': REDACTED, '.dockercfg': REDACTED},
        'stringData': {'config.yaml': REDACTED},
    }
    config_map = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'data': {'extra': 'lr=3e-4'}}
    assert build_redactor(True)(config_map) == config_map


def test_gitleaks_true_positives_are_redacted_at_least_95_percent():
    """Issue 35's target on gitleaks' own rule examples: at least 95 % of the true positives redacted, and the
    two causes the issue names fixed. The corpus is frozen in ``tests/data`` (each example drawn once from
    gitleaks' rule files at the pinned commit by ``benchmarks/tools/gitleaks_coverage.py --freeze``, with the
    secret its rule captures), so the suite needs no gitleaks checkout."""
    import collections
    import gzip
    import json
    import pathlib

    path = pathlib.Path(__file__).parent / 'data' / 'gitleaks_true_positives.jsonl.gz'
    with gzip.open(path, 'rt', encoding='utf-8') as handle:
        header = json.loads(next(handle))
        examples = [json.loads(line) for line in handle]
    assert header['gitleaks_commit'].startswith('b58d3f10') and len(examples) > 6000
    redact = build_redactor(True)
    missed = collections.Counter()
    for example in examples:
        if example['secret'] in redact({'example': example['text']})['example']:
            missed[example['cause']] += 1
    assert sum(missed.values()) <= 0.05 * len(examples), missed
    assert missed['credential-named key'] <= 20 and missed['pair syntax'] <= 20, missed
