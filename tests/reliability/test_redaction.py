"""Secrets never reach any destination: credentials in a nested config (dicts, lists, a dataclass,
an argparse.Namespace), logged as hyperparameters and as traces, are replaced by '***' before
FileLogger (text and JSON Lines), TensorBoard (event files read back), MLflow (a sqlite tracking store
read back with MlflowClient, plus its artifacts) and the console see them. Every byte written under the
test's folder, and stdout/stderr, are searched for the secret values. ``backend_kwargs`` credentials
never reach the upload journal either.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import pathlib
import uuid
import warnings

import pytest

from dist_logging import Logger
from dist_logging.destinations import ConsoleLogger, FileLogger, InMemoryLogger, RemoteUploaderDownloader
from dist_logging.upload.retry import RetryPolicy
from torchrun_helper import free_port

pytestmark = pytest.mark.timeout(300)

SECRETS = {name: f'{name}-{uuid.uuid4().hex}' for name in
           ('password', 'passwd', 'secret', 'token', 'api_key', 'access_key', 'credential', 'dc', 'ns', 'extra')}


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


def _assert_no_secret(blob: bytes, where: str) -> None:
    for name, value in SECRETS.items():
        assert value.encode() not in blob, f'the {name} secret reached {where}'


def test_nested_credentials_never_reach_any_destination(tmp_path, capsys):
    pytest.importorskip('tensorboard')
    pytest.importorskip('mlflow')
    from mlflow.tracking import MlflowClient

    from dist_logging.destinations import MLFlowLogger, TensorboardLogger

    console = io.StringIO()
    memory = InMemoryLogger()
    tracking = f'sqlite:///{tmp_path}/mlflow.db'
    destinations = [
        memory,
        ConsoleLogger(stream=console, log_traces=True),
        ConsoleLogger(log_traces=True),  # the real stdout
        FileLogger(str(tmp_path / 'logs' / 'log.txt'), log_traces=True),
        FileLogger(str(tmp_path / 'logs' / 'log.jsonl'), format='jsonl', log_traces=True),
        TensorboardLogger(log_dir=str(tmp_path / 'tb')),
        MLFlowLogger(tracking_uri=tracking, experiment_name='redaction', log_traces=True, synchronous=True,
                     artifact_location=(tmp_path / 'artifacts').as_uri()),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with Logger(destinations, run_name='redact', redact=r'^wandb_') as logger:
            logger.log_hyperparameters(nested_config())
            logger.log_hyperparameters(nested_config(), check_consistency=True)
            logger.log_traces({'startup': {'config': nested_config()}, 'api_token': SECRETS['token']})
            logger.log_metrics({'loss': 0.5}, step=1)
            logger.batch_end()

    # what the destinations got: every secret replaced by '***', the rest intact
    got = memory.hyperparameters
    assert got['db'] == {'host': 'h', 'Password': '***', 'replica': {'PASSWD': '***'}}
    assert got['aws'] == {'AWS_SECRET_ACCESS_KEY': '***', 'region': 'us-east-1'}
    assert got['hub'] == [{'name': 'hf', 'HF_TOKEN': '***'}, {'name': 'wandb', 'WANDB_API_KEY': '***'}]
    assert got['database'] == {'host': 'db.internal', 'password': '***'}
    assert got['args'] == {'batch_size': 32, 'service_token': '***'}
    assert got['s3'] == {'access_key_id': '***'} and got['gcp'] == {'credentials': '***'}
    assert got['wandb_entity'] == '***' and got['lr'] == 3e-4

    # MLflow, read back from its store
    client = MlflowClient(tracking_uri=tracking)
    run = client.search_runs([client.get_experiment_by_name('redaction').experiment_id])[0]
    params = run.data.params
    assert params['db/Password'] == '***' and params['database/password'] == '***' and params['lr'] == '0.0003'
    for value in params.values():
        _assert_no_secret(value.encode(), 'MLflow params')

    # TensorBoard, read back from its event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / 'tb'), size_guidance={'tensors': 0})
    acc.Reload()
    texts = b''.join(event.tensor_proto.SerializeToString() for tag in acc.Tags()['tensors']
                     for event in acc.Tensors(tag))
    assert b'***' in texts
    _assert_no_secret(texts, 'TensorBoard text')

    # and nowhere at all: every file written (logs, event files, the sqlite store, artifacts), the console
    _assert_no_secret(_all_bytes(tmp_path), f'a file under {tmp_path}')
    _assert_no_secret(console.getvalue().encode(), 'the console')
    out = capsys.readouterr()
    _assert_no_secret((out.out + out.err).encode(), 'stdout/stderr')
    _assert_no_secret(' '.join(str(w.message) for w in caught).encode(), 'warnings')
    assert '***' in console.getvalue() and b'***' in (tmp_path / 'logs' / 'log.jsonl').read_bytes()


def test_redaction_can_be_turned_off(tmp_path):
    memory = InMemoryLogger()
    Logger(memory, run_name='r', redact=False).log_hyperparameters({'db': {'password': 'plain'}})
    assert memory.hyperparameters == {'db': {'password': 'plain'}}


def test_backend_credentials_never_reach_the_staging_journal(tmp_path):
    secret = f'aws-secret-{uuid.uuid4().hex}'
    session = f'aws-session-{uuid.uuid4().hex}'
    # nothing listens on this port: the upload fails and stays in staging with its journal record
    rud = RemoteUploaderDownloader(
        's3://bucket/prefix', upload_staging_folder=str(tmp_path / 'staging'),
        backend_kwargs={'endpoint_url': f'http://127.0.0.1:{free_port()}', 'aws_access_key_id': 'AKIDEXAMPLE',
                        'aws_secret_access_key': secret, 'aws_session_token': session,
                        'client_config': {'retries': {'total_max_attempts': 1}, 'connect_timeout': 1}})
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
