"""Secrets never reach any destination: credentials in a nested config (dicts, lists, a dataclass,
an argparse.Namespace), logged as hyperparameters and as traces, are replaced by '***' before
FileLogger (text and JSON Lines), TensorBoard (event files read back), MLflow (a sqlite tracking store
read back with MlflowClient, plus its artifacts) and the console see them. Every byte written under the
test's folder, and stdout/stderr, are searched for the secret values. ``backend_kwargs`` credentials
never reach the upload journal either.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import io
import json
import pathlib
import uuid
import warnings
from typing import Optional

import pytest

from dist_logging import Logger
from dist_logging.destinations import ConsoleLogger, FileLogger, InMemoryLogger, RemoteUploaderDownloader
from dist_logging.upload.retry import RetryPolicy
from torchrun_helper import free_port

pytestmark = pytest.mark.timeout(300)

SECRETS = {
    name: f'{name}-{uuid.uuid4().hex}'
    for name in ('password', 'passwd', 'secret', 'token', 'api_key', 'access_key', 'credential', 'dc', 'ns', 'extra')
}


@dataclasses.dataclass
class DatabaseConfig:
    host: str = 'db.internal'
    password: str = SECRETS['dc']


def nested_config() -> dict:
    return {
        'lr': 3e-4,
        'db': {'host': 'h', 'Password': SECRETS['password'], 'replica': {'PASSWD': SECRETS['passwd']}},
        'aws': {'AWS_SECRET_ACCESS_KEY': SECRETS['secret'], 'region': 'us-east-1'},
        'hub': [{'name': 'hf', 'HF_TOKEN': SECRETS['token']}, {'name': 'wandb', 'WANDB_API_KEY': SECRETS['api_key']}],
        's3': {'access_key_id': SECRETS['access_key']},
        'gcp': {'credentials': SECRETS['credential']},
        'database': DatabaseConfig(),
        'args': argparse.Namespace(batch_size=32, service_token=SECRETS['ns']),
        'wandb_entity': SECRETS['extra'],  # only secret with the extended pattern below
    }


def _all_bytes(folder: pathlib.Path) -> bytes:
    chunks = []
    for path in folder.rglob('*'):
        if path.is_file():
            chunks.append(path.read_bytes())
    return b'\n'.join(chunks)


def _assert_no_secret(blob: bytes, where: str, secrets: Optional[dict[str, str]] = None) -> None:
    for name, value in (SECRETS if secrets is None else secrets).items():
        assert value.encode() not in blob, f'the {name} secret reached {where}'


@pytest.fixture(scope='module')
def mlflow_db(tmp_path_factory) -> pathlib.Path:
    """One MLflow sqlite store for the module (creating one runs its migrations: seconds); one experiment per test."""
    return tmp_path_factory.mktemp('mlflow') / 'mlflow.db'


class Destinations:
    """Every kind of destination a secret could reach, writing under one folder, plus what they printed.

    ``run(log)`` builds a Logger over them (with ``redact=``), calls ``log(logger)``, closes it, and
    keeps the console text, the warnings and stdout/stderr for :meth:`assert_nowhere`.
    """

    def __init__(self, tmp_path: pathlib.Path, capsys, mlflow_db: pathlib.Path, *, upload: bool = False):
        pytest.importorskip('tensorboard')
        pytest.importorskip('mlflow')
        from dist_logging.destinations import MLFlowLogger, TensorboardLogger

        self.root, self.capsys = tmp_path, capsys
        self.console = io.StringIO()
        self.memory = InMemoryLogger()
        self.mlflow_db, self.experiment = mlflow_db, f'redaction-{tmp_path.name}'
        self.tracking = f'sqlite:///{mlflow_db}'
        self.destinations = [
            self.memory,
            ConsoleLogger(stream=self.console, log_traces=True),
            ConsoleLogger(log_traces=True),  # the real stdout
            FileLogger(str(tmp_path / 'logs' / 'log.txt'), log_traces=True),
            FileLogger(str(tmp_path / 'logs' / 'log.jsonl'), format='jsonl', log_traces=True),
            TensorboardLogger(log_dir=str(tmp_path / 'tb')),
            MLFlowLogger(
                tracking_uri=self.tracking,
                experiment_name=self.experiment,
                log_traces=True,
                synchronous=True,
                artifact_location=(tmp_path / 'artifacts').as_uri(),
            ),
        ]
        if upload:  # the files above also go through upload staging (snapshots + journal) to a bucket
            self.destinations.append(
                RemoteUploaderDownloader(f'file://{tmp_path}/bucket', upload_staging_folder=str(tmp_path / 'staging'))
            )
        self.caught: list = []

    def run(self, log, redact=True) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            with Logger(self.destinations, run_name='redact', redact=redact) as logger:
                log(logger)
        self.caught = list(caught)

    def mlflow_params(self) -> dict:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking)
        run = client.search_runs([client.get_experiment_by_name(self.experiment).experiment_id])[0]
        return run.data.params

    def tensorboard_text(self) -> bytes:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(self.root / 'tb'), size_guidance={'tensors': 0})
        acc.Reload()
        return b''.join(
            event.tensor_proto.SerializeToString() for tag in acc.Tags()['tensors'] for event in acc.Tensors(tag)
        )

    def assert_nowhere(self, secrets: dict[str, str]) -> None:
        """No secret in MLflow's params, TensorBoard's text, any file written, the console, stdout/stderr, warnings."""
        for value in self.mlflow_params().values():
            _assert_no_secret(value.encode(), 'MLflow params', secrets)
        _assert_no_secret(self.tensorboard_text(), 'TensorBoard text', secrets)
        _assert_no_secret(_all_bytes(self.root), f'a file under {self.root}', secrets)
        _assert_no_secret(self.mlflow_db.read_bytes(), 'the MLflow store', secrets)
        _assert_no_secret(self.console.getvalue().encode(), 'the console', secrets)
        out = self.capsys.readouterr()
        _assert_no_secret((out.out + out.err).encode(), 'stdout/stderr', secrets)
        _assert_no_secret(' '.join(str(w.message) for w in self.caught).encode(), 'warnings', secrets)


def test_nested_credentials_never_reach_any_destination(tmp_path, capsys, mlflow_db):
    where = Destinations(tmp_path, capsys, mlflow_db)

    def log(logger):
        logger.log_hyperparameters(nested_config())
        logger.log_hyperparameters(nested_config(), check_consistency=True)
        logger.log_traces({'startup': {'config': nested_config()}, 'api_token': SECRETS['token']})
        logger.log_metrics({'loss': 0.5}, step=1)
        logger.batch_end()

    where.run(log, redact=r'^wandb_')

    # what the destinations got: every secret replaced by '***', the rest intact
    got = where.memory.hyperparameters
    assert got['db'] == {'host': 'h', 'Password': '***', 'replica': {'PASSWD': '***'}}
    assert got['aws'] == {'AWS_SECRET_ACCESS_KEY': '***', 'region': 'us-east-1'}
    assert got['hub'] == [{'name': 'hf', 'HF_TOKEN': '***'}, {'name': 'wandb', 'WANDB_API_KEY': '***'}]
    assert got['database'] == {'host': 'db.internal', 'password': '***'}
    assert got['args'] == {'batch_size': 32, 'service_token': '***'}
    assert got['s3'] == {'access_key_id': '***'} and got['gcp'] == {'credentials': '***'}
    assert got['wandb_entity'] == '***' and got['lr'] == 3e-4

    params = where.mlflow_params()  # MLflow, read back from its store
    assert params['db/Password'] == '***' and params['database/password'] == '***' and params['lr'] == '0.0003'
    assert b'***' in where.tensorboard_text()  # TensorBoard, read back from its event files
    # and nowhere at all: every file written (logs, event files, the sqlite store, artifacts), the console
    where.assert_nowhere(SECRETS)
    assert '***' in where.console.getvalue() and b'***' in (tmp_path / 'logs' / 'log.jsonl').read_bytes()


def test_redaction_can_be_turned_off(tmp_path):
    memory = InMemoryLogger()
    Logger(memory, run_name='r', redact=False).log_hyperparameters({'db': {'password': 'plain'}})
    assert memory.hyperparameters == {'db': {'password': 'plain'}}


def test_backend_credentials_never_reach_the_staging_journal(tmp_path):
    secret = f'aws-secret-{uuid.uuid4().hex}'
    session = f'aws-session-{uuid.uuid4().hex}'
    # nothing listens on this port: the upload fails and stays in staging with its journal record
    rud = RemoteUploaderDownloader(
        's3://bucket/prefix',
        upload_staging_folder=str(tmp_path / 'staging'),
        backend_kwargs={
            'endpoint_url': f'http://127.0.0.1:{free_port()}',
            'aws_access_key_id': 'AKIDEXAMPLE',
            'aws_secret_access_key': secret,
            'aws_session_token': session,
            'client_config': {'retries': {'total_max_attempts': 1}, 'connect_timeout': 1},
        },
    )
    rud.retry_policy = RetryPolicy(num_attempts=1)
    logger = Logger(rud, run_name='creds')
    (tmp_path / 'f').write_bytes(b'data')
    logger.upload_file('f', tmp_path / 'f')
    with pytest.raises(Exception):
        logger.close()
    journal = (tmp_path / 'staging' / 'rank0' / 'journal.jsonl').read_text()
    assert 'endpoint_url' in journal  # the journal is there and records the non-secret kwargs
    blob = _all_bytes(tmp_path / 'staging')
    for value in (secret, session, 'AKIDEXAMPLE'):
        assert value.encode() not in blob


# --------------------------------------------------------------------------- real configs, real credentials

CORPUS = pathlib.Path(__file__).resolve().parent.parent / 'data' / 'redaction_configs'

#: The only leaves of the corpus that may change, per file: credential-named keys with a value.
#: (``use_auth_token: true``, ``hf_use_auth_token: true`` and ``access_token: null`` are credential-named
#: too, but a boolean or None holds no secret and arrives unchanged.)
CREDENTIAL_LEAVES = {
    'hf_training_arguments_wandb_config.json': {'hub_token.value', 'push_to_hub_token.value'},
    'launch_environment.yaml': {'env.HF_TOKEN', 'env.WANDB_API_KEY'},
}


def _load(path: pathlib.Path) -> dict:
    import tomllib

    import yaml

    if path.suffix == '.json':
        return json.loads(path.read_text())
    if path.suffix == '.toml':
        return tomllib.loads(path.read_text())
    return yaml.load(path.read_text(), Loader=getattr(yaml, 'CSafeLoader', yaml.SafeLoader))


def _leaves(data, prefix: str = '') -> dict:
    """Dotted path -> leaf, through mappings, lists and tuples."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        return {prefix: data}
    out = {}
    for key, value in items:
        out.update(_leaves(value, f'{prefix}.{key}' if prefix else str(key)))
    return out or {prefix: data}


CORPUS_FILES = sorted(p for p in CORPUS.iterdir() if p.suffix in ('.json', '.yaml', '.toml'))


def test_corpus_is_large_enough():
    assert len(CORPUS_FILES) >= 34 and set(CREDENTIAL_LEAVES) <= {p.name for p in CORPUS_FILES}
    assert sum(len(_leaves(_load(p))) for p in CORPUS_FILES) >= 2500


@pytest.mark.parametrize('path', CORPUS_FILES, ids=lambda p: p.name)
def test_real_configs_arrive_unchanged_but_for_their_credentials(path):
    config = _load(path)
    memory = InMemoryLogger()
    with Logger(memory, run_name='corpus') as logger:
        logger.log_hyperparameters(config)
        logger.log_traces({'config': config})
    sent, got = _leaves(config), _leaves(memory.hyperparameters)
    assert set(got) == set(sent)
    changed = {key for key in sent if got[key] != sent[key] or type(got[key]) is not type(sent[key])}
    assert changed == CREDENTIAL_LEAVES.get(path.name, set())
    assert all(got[key] == '***' for key in changed)
    assert _leaves(memory.traces['config'][0]) == got  # traces take the same rule
    assert _load(path) == config  # the caller's config is untouched


#: The only lines of the corpus files that change when each line is logged as text (a config pasted into a
#: log message): the lines of the credential leaves above.
CREDENTIAL_LINES = {
    ('hf_training_arguments_wandb_config.json', 779),
    ('hf_training_arguments_wandb_config.json', 825),
    ('launch_environment.yaml', 7),
    ('launch_environment.yaml', 11),
}


def test_real_config_lines_logged_as_text_change_only_on_credential_lines():
    """The value rule on every line of every corpus file (3,200 lines of YAML, JSON and TOML syntax)."""
    from dist_logging.redaction import redact_text

    changed = {
        (path.name, number)
        for path in CORPUS_FILES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if redact_text(line) != line
    }
    assert changed == CREDENTIAL_LINES


#: Hugging Face tokens are ``hf_`` + 34 letters (gitleaks' rule): no digits.
LETTERS = 'abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ'


def _token(
    prefix: str, length: int, alphabet: str = 'abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789'
) -> str:
    import random

    rng = random.Random(uuid.uuid4().int)
    return prefix + ''.join(rng.choice(alphabet) for _ in range(length))


def planted_config() -> tuple[dict, dict[str, str], dict[str, object]]:
    """An LLM training config with credentials planted under obvious and under innocent names.

    Returns:
        (config, secrets by name, the leaves that must change -> what they must become).
    """
    s = {
        'password': f'pw-{uuid.uuid4().hex}',
        'client_secret': f'cs-{uuid.uuid4().hex}',
        'aws_secret': _token('', 40),
        'hf_token_named': _token('hf_', 34, LETTERS),
        'github_named': _token('ghp_', 36),
        'private_key_named': _token('MIIEpAIBAAKCAQEA', 48),
        # credentials whose key names say nothing
        'db_url_password': f'dbpw{uuid.uuid4().hex[:12]}',
        'repo_ghp': _token('ghp_', 36),
        'index_password': f'ix{uuid.uuid4().hex[:10]}',
        'aws_key_id': _token('AKIA', 16, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567'),
        'aws_temp_key_id': _token('ASIA', 16, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567'),
        'hub_hf': _token('hf_', 34, LETTERS),
        'openai_sk': _token('sk-', 48),
        'openai_project': _token('sk-proj-', 60) + '_' + _token('', 20),
        'github_pat': _token('github_pat_', 22) + '_' + _token('', 59),
        'ghs': _token('ghs_', 36),
        'slack': 'xoxb-' + _token('', 12, '0123456789') + '-' + _token('', 13, '0123456789') + '-' + _token('', 24),
        'pem_body': _token('MIIEvQIBADANBgkqhkiG9w0BAQEFAASC', 64),
        'query_api_key': _token('', 32),
        'conn_password': f'Cn{uuid.uuid4().hex[:14]}',
        # issue 35: an hf_ token with digits (gitleaks' rule takes letters only), a service-named token
        'hub_hf_digits': _token('hf_', 33) + '7',
        'codecov': _token('', 31, 'abcdefghijkmnopqrstuvwxyz') + '4',
    }
    pem = f'-----BEGIN PRIVATE KEY-----\n{s["pem_body"]}\n-----END PRIVATE KEY-----\n'
    config = {
        # ordinary LLM hyperparameters, token-named and otherwise
        'model': {
            'name': 'meta-llama/Llama-2-7b-hf',
            'revision': '01c7f73d771dfac7d292323805ebc428287df4f9',
            'pad_token_id': 0,
            'bos_token_id': 1,
            'eos_token_id': 2,
            'vocab_size': 32000,
        },
        'tokenizer': {
            'name': 'meta-llama/Llama-2-7b-hf',
            'pad_token': '<unk>',
            'eos_token': '</s>',
            'add_bos_token': True,
            'added_tokens_decoder': {'0': {'content': '<unk>', 'special': True}},
        },
        'generation': {'max_new_tokens': 256, 'suppress_tokens': [1, 2, 7], 'top_p': 0.9, 'temperature': 0.6},
        'train': {
            'max_tokens': 2_000_000_000,
            'tokens_per_batch': 524288,
            'num_memory_tokens': 0,
            'include_tokens_per_second': True,
            'lr': 3e-4,
            'betas': [0.9, 0.95],
            'run_id': '9b2f6c1e-4a7d-4e3b-8c5a-1f0e2d3c4b5a',
        },
        'env': {'TOKENIZERS_PARALLELISM': 'false', 'NCCL_DEBUG': 'WARN', 'HF_HOME': '/data/hf'},
        'save_folder': 's3://bucket/checkpoints/{run_name}',
        'repo_url_public': 'https://github.com/org/repo.git',
        'ssh_remote': 'git@github.com:org/repo.git',
        'wandb_host': 'https://bob@wandb.internal',
        # credentials under obvious names
        'db': {'host': 'db.internal', 'password': s['password']},
        'identity_provider': {'client_id': 'my-app', 'client_secret': s['client_secret']},
        'aws': {
            'region': 'us-east-1',
            'aws_secret_access_key': s['aws_secret'],
            'key_id': s['aws_key_id'],
        },  # innocent name, AKIA format
        'HF_TOKEN': s['hf_token_named'],
        'GITHUB_TOKEN': s['github_named'],
        'private_key': s['private_key_named'],
        # credentials under innocent names
        'db_url': f'postgres://alice:{s["db_url_password"]}@db:5432/x',
        'repo': f'https://user:{s["repo_ghp"]}@github.com/o/r.git',
        'pip': {'index_urls': ['https://pypi.org/simple', f'https://build:{s["index_password"]}@pypi.internal/simple']},
        'sts': {'id': s['aws_temp_key_id']},
        'hub': {'repo_id': 'org/model', 'id': s['hub_hf'], 'mirror': s['hub_hf_digits']},
        'storage': {'bucket': 'ckpt', 'key_id': 'AKIA' + 'IOSFODNN7EXAMPLE'},  # AWS's documentation key: redacted too
        'openai': {'model': 'gpt-4o', 'value': s['openai_sk'], 'fallback': [s['openai_project']]},
        'ci': {'github': s['github_pat'], 'app': (s['ghs'], 'installation-42'), 'codecov_token': s['codecov']},
        'notify': {'slack': s['slack']},
        'deploy': {'pem': pem},
        'endpoint': f'https://api.example.com/v1/complete?model=x&api_key={s["query_api_key"]}',
        'mssql': f'Server=tcp:db,1433;Database=runs;User Id=sa;Password={s["conn_password"]};Encrypt=true',
    }
    changes = {
        'db.password': '***',
        'identity_provider.client_secret': '***',
        'aws.aws_secret_access_key': '***',
        'aws.key_id': '***',
        'HF_TOKEN': '***',
        'GITHUB_TOKEN': '***',
        'private_key': '***',
        'db_url': 'postgres://alice:***@db:5432/x',
        'repo': 'https://user:***@github.com/o/r.git',
        'pip.index_urls.1': 'https://build:***@pypi.internal/simple',
        'sts.id': '***',
        'hub.id': '***',
        'hub.mirror': '***',
        'storage.key_id': '***',
        'ci.codecov_token': '***',
        'openai.value': '***',
        'openai.fallback.0': '***',
        'ci.github': '***',
        'ci.app.0': '***',
        'notify.slack': '***',
        'deploy.pem': '-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----\n',
        'endpoint': 'https://api.example.com/v1/complete?model=x&api_key=***',
        'mssql': 'Server=tcp:db,1433;Database=runs;User Id=sa;Password=***;Encrypt=true',
    }
    return config, s, changes


def test_planted_credentials_reach_no_destination_and_everything_else_arrives(tmp_path, capsys, mlflow_db):
    config, secrets, changes = planted_config()
    before = copy.deepcopy(config)
    where = Destinations(tmp_path, capsys, mlflow_db, upload=True)
    cells = [
        ['db_url', config['db_url']],
        ['hub', config['hub']['id']],
        ['pem', config['deploy']['pem']],
        ['notes', 'lr=3e-4 max_new_tokens=256'],
    ]

    def log(logger):
        logger.log_hyperparameters(config)
        logger.log_traces({'planted': config, 'message': f'connecting to {config["db_url"]} as {secrets["openai_sk"]}'})
        logger.log_table(['name', 'value'], cells, name='settings')
        logger.log_table(['user', 'api_key'], [['alice', secrets['password']]], name='keys')
        logger.log_metrics({'loss': 0.5}, step=1)
        logger.batch_end()

    where.run(log)

    sent, got = _leaves(config), _leaves(where.memory.hyperparameters)
    assert set(got) == set(sent)
    for key, value in sent.items():  # every non-secret leaf arrives unchanged, every secret leaf as expected
        assert got[key] == changes.get(key, value), key
    assert _leaves(where.memory.traces['planted'][0]) == got
    assert where.memory.traces['message'][0] == 'connecting to postgres://alice:***@db:5432/x as ***'
    assert where.memory.tables['settings'][0][2] == [
        ['db_url', 'postgres://alice:***@db:5432/x'],
        ['hub', '***'],
        ['pem', changes['deploy.pem']],
        ['notes', 'lr=3e-4 max_new_tokens=256'],
    ]
    assert where.memory.tables['keys'][0][2] == [['alice', '***']]  # a credential-named column
    assert config == before  # the caller's objects are never modified
    where.assert_nowhere(secrets)
    assert any((tmp_path / 'bucket').rglob('log.txt'))  # the logs went through upload staging too


# --------------------------------------------------------------------------- issue 23: every shape a scanner knows


def planted_shapes() -> tuple[dict, list[str], dict[str, object], list[str]]:
    """Freshly generated credentials in every format and structural shape of issue 23, next to decoys.

    Returns:
        (config, the secret strings, the decoy leaves that must arrive unchanged (dotted path -> value),
        log lines that mix both).
    """
    from credential_samples import hex40, samples, webhook_urls

    formats = samples()
    hooks = webhook_urls()
    wandb, kaggle, b2, mlflow = hex40(), hex40(), hex40(), 'dapi' + hex40()[:32]
    argv_key, env_key, docker_key, ecs_key = hex40(), hex40(), hex40(), hex40()
    code = {n: hex40() for n in ('go', 'make', 'php', 'govar', 'java', 'xml', 'curl', 'header', 'shell')}
    config = {
        'formats': {name: f'value {value} here' for name, value in formats.items()},
        'webhooks': {name: url for name, (url, _) in hooks.items()},
        'env': {
            'KAGGLE_KEY': kaggle,
            'B2_APPLICATION_KEY': b2,
            'MLFLOW_TRACKING_TOKEN': mlflow,
            'MLFLOW_TRACKING_URI': 'databricks',
            'KAGGLE_USERNAME': 'alice',
        },
        'argv': ['train.py', '--wandb-api-key', argv_key, '--run-name', 'token', '--max-tokens', '128'],
        'k8s_env': [
            {'name': 'WANDB_API_KEY', 'value': env_key},
            {'name': 'NCCL_DEBUG', 'value': 'INFO'},
            {'name': 'HF_TOKEN', 'valueFrom': {'secretKeyRef': {'name': 'hf-secret', 'key': 'token'}}},
        ],
        'ecs_env': [{'Name': 'WANDB_API_KEY', 'Value': ecs_key}],
        'docker_env': ['WANDB_API_KEY=' + docker_key, 'OMP_NUM_THREADS=8'],
        'shell': f'export WANDB_API_KEY={wandb} && torchrun --nproc-per-node=8 train.py',
        'code': [
            f'token := "{code["go"]}"',
            f'API_KEY ?= {code["make"]}',
            f"'secret_key' => '{code['php']}'",
            f'var apiToken string = "{code["govar"]}"',
            f'System.setProperty("X_TOKEN", "{code["java"]}");',
            f'<apiToken>{code["xml"]}</apiToken>',
            f'curl --user alice:{code["curl"]} https://h/x',
            f'curl -H "Authorization: Token {code["header"]}" https://h/x',
            f'GITHUB_API_KEY={code["shell"]}\nDYNATRACE_API_KEY=\n',
        ],
        # decoys: ordinary ML settings and placeholders that no scanner reports
        'decoys': {
            'key_dim': 64,
            'keyword': 'attention',
            'passkey_retrieval_length': 4096,
            'secret_sharing_rounds': 3,
            'max_tokens': 4096,
            'token_budget': 100000,
            'signature_name': 'serving_default',
            'sig_figs': 3,
            'auth_required': True,
            'revision': '01c7f73d771dfac7d292323805ebc428287df4f9',
            'run_id': '9b2f6c1e-4a7d-4e3b-8c5a-1f0e2d3c4b5a',
            'slack_placeholder': 'xoxb-12345-abcd234',
            'anthropic_placeholder': 'sk-ant-api03-abc123xyz',
            'objc': '- (id)hf_requiredCharacteristicTypesForDisplayMetadata;',
            'empty_env': 'GITHUB_API_KEY=\nDYNATRACE_API_KEY=',
            'argv_values': ['--run-name', 'token', '--tokenizer', 'gpt2'],
        },
    }
    secrets = [
        *formats.values(),
        *(secret for _, secret in hooks.values()),
        wandb,
        kaggle,
        b2,
        mlflow,
        argv_key,
        env_key,
        docker_key,
        ecs_key,
        *code.values(),
    ]
    decoys = {key: value for key, value in _leaves(config).items() if key.startswith('decoys.')}
    decoys.update(
        {
            'env.MLFLOW_TRACKING_URI': 'databricks',
            'env.KAGGLE_USERNAME': 'alice',
            'argv.3': '--run-name',
            'argv.4': 'token',
            'argv.6': '128',
            'k8s_env.1.value': 'INFO',
            'k8s_env.2.valueFrom.secretKeyRef.name': 'hf-secret',
            'docker_env.1': 'OMP_NUM_THREADS=8',
        }
    )
    lines = [
        f'step 10 loss=1.25 uploading with {formats["huggingface"]} to {hooks["slack_webhook"][0]}',
        f'env KAGGLE_KEY={kaggle} MLFLOW_TRACKING_TOKEN={mlflow}',
        f'posting to {hooks["discord_webhook"][0]}',
        *config['code'],
    ]
    return config, secrets, decoys, lines


def test_every_scanner_shape_reaches_no_destination_and_decoys_arrive(tmp_path, capsys, mlflow_db):
    import logging

    from dist_logging import setup_logging
    from dist_logging.logging_setup import teardown_logging

    config, secrets, decoys, lines = planted_shapes()
    where = Destinations(tmp_path, capsys, mlflow_db, upload=True)
    setup_logging(file=str(tmp_path / 'pylogs' / 'python-rank{rank}.log'), run_name='shapes')
    try:

        def log(logger):
            logger.log_hyperparameters(config)
            logger.log_traces({'shapes': config, 'lines': lines})
            logger.log_table(['line'], [[line] for line in lines], name='lines')
            for line in lines:
                logging.getLogger('train').warning(line)
            logger.log_metrics({'loss': 0.5}, step=1)
            logger.batch_end()

        where.run(log)
    finally:
        teardown_logging()
    got = _leaves(where.memory.hyperparameters)
    changed = {key: got[key] for key, value in decoys.items() if got[key] != value}
    assert not changed, f'decoys changed: {changed}'
    python_logs = b''.join(p.read_bytes() for p in (tmp_path / 'pylogs').iterdir())
    assert b'uploading with' in python_logs  # the Python log file was written (and is searched below)
    where.assert_nowhere({f'planted {i}': value for i, value in enumerate(secrets)})
