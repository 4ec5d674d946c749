"""Config-driven set-up: YAML/dict -> Logger, key-path errors at load, ${ENV} interpolation, the files in configs/."""

from __future__ import annotations

import pathlib

import pytest

from dist_logging import Logger
from dist_logging.config import (
    DESTINATION_TYPES,
    build_destinations,
    interpolate_env,
    load_config,
    register_destination,
)
from dist_logging.destinations import ConsoleLogger, FileLogger, InMemoryLogger

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'
pytestmark = pytest.mark.timeout(120)


def _has_remote() -> bool:
    try:
        import dist_logging.destinations.remote  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------- errors at load
@pytest.mark.parametrize(
    'config, message',
    [
        (
            {'destinations': [{'type': 'console'}, {'type': 'file'}, {'type': 'console', 'rankz': 'zero'}]},
            r"^destinations\[2\]\.rankz: unknown key; did you mean 'ranks'\?$",
        ),
        (
            {'destinations': [{'type': 'tensorbord'}]},
            r"destinations\[0\]\.type: unknown destination type 'tensorbord'; "
            r"did you mean 'tensorboard'\? known types: "
            r'cometml, console, file, in_memory, mlflow, neptune, remote, tensorboard',
        ),
        ({'destinations': [{'type': 'nope'}]}, r"unknown destination type 'nope'; known types: cometml, console, file"),
        ({'run_nme': 'x'}, r"^run_nme: unknown key; did you mean 'run_name'\?$"),
        ({'destinations': {'type': 'console'}}, r'^destinations: expected a list'),
        ({'destinations': [{'log_interval': 3}]}, r"^destinations\[0\]: missing key 'type'"),
        ({'destinations': [42]}, r"^destinations\[0\]: expected a mapping with a 'type' key"),
        (
            {'destinations': [{'type': 'console', 'ranks': 'everyone'}]},
            r"destinations\[0\]\.ranks: unknown ranks policy",
        ),
        ({'upload': {'bucket_uri': 'magic://b/p'}}, r"^upload\.bucket_uri: .*unsupported scheme 'magic'"),
        (
            {'upload': {'bucket_uri': 'buckets/x', 'num_atempts': 3}},
            r"^upload\.num_atempts: unknown key; did you mean 'num_attempts'",
        ),
        (
            {'destinations': [{'type': 'file', 'filename': '${NOT_SET_ANYWHERE_XYZ}/log.txt'}]},
            r'^destinations\[0\]\.filename: environment variable NOT_SET_ANYWHERE_XYZ is not set',
        ),
    ],
)
def test_bad_configs_fail_at_load_with_the_key_path(config, message):
    if 'upload' in config and not _has_remote():
        pytest.skip('dist_logging.destinations.remote is not there yet')
    with pytest.raises(ValueError, match=message):
        load_config(config)


def test_bad_values_fail_at_build_with_the_key_path(tmp_path):
    config = load_config({'destinations': [{'type': 'console'}, {'type': 'file', 'format': 'yaml'}]})
    with pytest.raises(ValueError, match=r"^destinations\[1\] \(file\): FileLogger: unknown format 'yaml'"):
        build_destinations(config)
    with pytest.raises(ValueError, match=r'destinations\[0\] \(console\): .*log_interval'):
        Logger.from_config({'destinations': [{'type': 'console', 'log_interval': 0}]})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_config(tmp_path / 'nope.yaml')
    bad = tmp_path / 'bad.yaml'
    bad.write_text('destinations: [\n')
    with pytest.raises(ValueError, match='not valid YAML'):
        load_config(bad)
    top = tmp_path / 'list.yaml'
    top.write_text('- console\n')
    with pytest.raises(ValueError, match='mapping at the top level'):
        load_config(top)


def test_missing_required_key_of_a_custom_class():
    with pytest.raises(ValueError, match=r"^destinations\[0\]\.needed: missing required key"):
        load_config({'destinations': [{'type': f'{__name__}:NeedsArgument'}]})


# ---------------------------------------------------------------------------- building
class NeedsArgument(InMemoryLogger):
    def __init__(self, needed, ranks='zero'):
        super().__init__(ranks=ranks)
        self.needed = needed


def test_from_config_builds_the_logger(tmp_path):
    logger = Logger.from_config(
        {
            'run_name': 'cfg',
            'auto_flush': False,
            'destinations': [
                'in_memory',
                {'type': 'console', 'log_interval': 5, 'ranks': 'all'},
                {'type': 'file', 'filename': str(tmp_path / '{run_name}-{rank}.txt'), 'flush_interval': 1},
                {'type': f'{__name__}:NeedsArgument', 'needed': 3},
            ],
        }
    )
    try:
        assert logger.run_name == 'cfg' and logger.auto_flush is False
        memory, console, file, custom = logger.destinations
        assert isinstance(memory, InMemoryLogger) and isinstance(console, ConsoleLogger)
        assert console.log_interval == 5 and console.ranks == 'all'
        assert isinstance(file, FileLogger) and custom.needed == 3
        logger.log_metrics({'loss': 1.0}, step=1)
        assert memory.data['loss'] == [(1, 1.0)]
    finally:
        logger.close()
    assert 'loss: 1.0' in (tmp_path / 'cfg-0.txt').read_text()


def test_overrides_win_and_unknown_overrides_fail():
    logger = Logger.from_config({'run_name': 'a', 'destinations': ['in_memory']}, run_name='b')
    assert logger.run_name == 'b'
    logger.close()
    with pytest.raises(TypeError, match="unknown override 'run'"):
        Logger.from_config({'destinations': []}, run='x')


def test_register_destination(monkeypatch):
    monkeypatch.setitem(DESTINATION_TYPES, 'placeholder', DESTINATION_TYPES['in_memory'])
    register_destination('needs', NeedsArgument)
    try:
        (spec,) = load_config({'destinations': [{'type': 'needs', 'needed': 1}]}).destinations
        assert spec.cls is NeedsArgument
    finally:
        DESTINATION_TYPES.pop('needs')


# ---------------------------------------------------------------------------- ${ENV}
def test_env_interpolation():
    env = {'A': 'x', 'EMPTY': '', 'N': '12', 'T': 'true'}
    assert interpolate_env('p/${A}/q', environ=env) == 'p/x/q'
    assert interpolate_env('${MISSING:-d}', environ=env) == 'd'
    assert interpolate_env('${EMPTY:-d}', environ=env) == 'd'  # ':-' also replaces an empty value
    assert interpolate_env('${EMPTY-d}', environ=env) is None  # '-' only an unset one; whole empty -> null
    assert interpolate_env('${N}', environ=env) == 12  # a whole reference is a YAML scalar
    assert interpolate_env('${T}', environ=env) is True
    assert interpolate_env('n=${N}', environ=env) == 'n=12'  # embedded: stays a string
    assert interpolate_env('${MISSING:-}', environ=env) is None
    assert interpolate_env('$${A} and {run_name}', environ=env) == '${A} and {run_name}'
    assert interpolate_env({'k': ['${A}', 3]}, environ=env) == {'k': ['x', 3]}
    with pytest.raises(ValueError, match=r'^up\.k\[0\]: environment variable MISSING is not set'):
        interpolate_env({'k': ['${MISSING}']}, 'up', environ=env)


# ---------------------------------------------------------------------------- configs/
def test_every_shipped_config_is_tested():
    assert {p.name for p in CONFIGS.glob('*.yaml')} >= {'rank_zero.yaml', 'per_rank.yaml', 's3.yaml', 'mlflow.yaml'}


@pytest.mark.parametrize('name', sorted(p.name for p in CONFIGS.glob('*.yaml')))
def test_shipped_configs_load(name, monkeypatch):
    if name in ('per_rank.yaml', 's3.yaml') and not _has_remote():
        pytest.skip('dist_logging.destinations.remote is not there yet')
    config = load_config(CONFIGS / name)
    assert config.destinations


def test_rank_zero_yaml_runs(tmp_path, monkeypatch):
    pytest.importorskip('tensorboard')
    monkeypatch.chdir(tmp_path)
    with Logger.from_config(CONFIGS / 'rank_zero.yaml', run_name='rz') as logger:
        assert [type(d).__name__ for d in logger.destinations] == ['ConsoleLogger', 'TensorboardLogger']
        assert all(d.ranks == 'zero' for d in logger.destinations)
        logger.log_metrics({'loss': 1.0}, step=1)
    assert list((tmp_path / 'runs' / 'rz' / 'tensorboard').glob('events.out.tfevents.*'))


def test_s3_yaml_takes_bucket_and_endpoint_from_the_environment(monkeypatch):
    if not _has_remote():
        pytest.skip('dist_logging.destinations.remote is not there yet')
    monkeypatch.setenv('DIST_LOGGING_S3_URI', 's3://team-bucket/exp1')
    monkeypatch.setenv('AWS_ENDPOINT_URL', 'http://127.0.0.1:9000')
    upload = load_config(CONFIGS / 's3.yaml').destinations[-1]
    assert upload.type == 'remote' and upload.path == 'upload'
    assert upload.kwargs['bucket_uri'] == 's3://team-bucket/exp1'
    assert upload.kwargs['backend_kwargs'] == {'endpoint_url': 'http://127.0.0.1:9000'}
    assert ('boto3', 's3') in upload.packages
    monkeypatch.delenv('AWS_ENDPOINT_URL')
    monkeypatch.delenv('DIST_LOGGING_S3_URI')
    upload = load_config(CONFIGS / 's3.yaml').destinations[-1]
    assert upload.kwargs['backend_kwargs'] == {'endpoint_url': None}
    assert upload.kwargs['bucket_uri'] == 's3://my-bucket/dist-logging'


def test_per_rank_yaml_uploads_to_a_local_bucket(tmp_path, monkeypatch):
    if not _has_remote():
        pytest.skip('dist_logging.destinations.remote is not there yet')
    pytest.importorskip('tensorboard')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('DIST_LOGGING_BUCKET', str(tmp_path / 'bucket'))
    monkeypatch.setenv('DIST_LOGGING_STAGING', str(tmp_path / 'staging'))
    with Logger.from_config(CONFIGS / 'per_rank.yaml', run_name='pr') as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
        logger.epoch_end()  # flush -> upload
    uploaded = tmp_path / 'bucket' / 'pr' / 'logs' / 'rank0.jsonl'
    assert uploaded.read_bytes() == (tmp_path / 'runs' / 'pr' / 'logs' / 'rank0.jsonl').read_bytes()
    assert list((tmp_path / 'bucket' / 'pr' / 'tensorboard').glob('events.out.tfevents.*'))


def test_mlflow_yaml_runs(tmp_path, monkeypatch):
    pytest.importorskip('mlflow')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    monkeypatch.delenv('MLFLOW_RUN_ID', raising=False)
    from mlflow.tracking import MlflowClient

    with Logger.from_config(CONFIGS / 'mlflow.yaml', run_name='ml') as logger:
        destination = logger.destinations[1]
        logger.log_hyperparameters({'lr': 0.5})
        logger.log_metrics({'loss': 2.0}, step=4)
    run = MlflowClient(tracking_uri='sqlite:///mlflow.db').get_run(destination.run_id)
    assert run.data.params == {'lr': '0.5'} and run.data.metrics == {'loss': 2.0}
