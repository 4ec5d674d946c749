"""MLFlowLogger against a real local MLflow tracking store (sqlite in a temp dir), read back with MlflowClient."""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import numpy as np
import pytest

pytest.importorskip('mlflow', reason='mlflow is not installed: pip install dist-logging[mlflow]')

from dist_logging import Logger  # noqa: E402
from dist_logging.destinations import MLFlowLogger  # noqa: E402

# Creating the sqlite schema takes seconds on a loaded machine: one store per module.
pytestmark = pytest.mark.timeout(300)


def test_runs_on_the_mlflow_version_asked_for():
    """tests/destinations/test_mlflow_lowest.py runs this module on the lowest MLflow the extra allows."""
    import mlflow

    expected = os.environ.get('DIST_LOGGING_EXPECT_MLFLOW')
    if expected is None:
        pytest.skip('the MLflow installed here is the one under test')
    assert mlflow.__version__ == expected


@pytest.fixture(scope='module')
def tracking_uri(tmp_path_factory):
    path = tmp_path_factory.mktemp('mlflow') / 'mlflow.db'
    return f'sqlite:///{path}'


@pytest.fixture
def client(tracking_uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _logger_kwargs(tracking_uri, tmp_path, **kwargs):
    return dict(
        tracking_uri=tracking_uri,
        experiment_name='dist-logging-tests',
        artifact_location=(tmp_path / 'artifacts').as_uri(),
        **kwargs,
    )


def test_params_metrics_batched_and_read_back(tracking_uri, tmp_path, client, monkeypatch):
    from mlflow.tracking import MlflowClient

    calls = []
    original = MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        calls.append((len(metrics), len(params)))
        return original(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(MlflowClient, 'log_batch', spy)
    destination = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, flush_interval=5))
    long_value = 'x' * 7000
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with Logger(destination, run_name='params-metrics') as logger:
            logger.log_hyperparameters(
                {
                    'lr': 0.1,
                    'opt': {'name': 'adam', 'betas': [0.9, 0.99]},
                    'long': long_value,
                    'long2': long_value,
                    'many': {f'p{i}': i for i in range(150)},
                }
            )
            for batch in range(1, 13):
                logger.log_metrics({'loss': 1.0 / batch, 'acc': batch / 100}, step=batch)
                logger.batch_end()
            logger.log_metrics({'final': 3.0})
    truncation = [w for w in caught if 'truncated' in str(w.message)]
    assert len(truncation) == 1 and 'long' in str(truncation[0].message)

    run = client.get_run(destination.run_id)
    assert run.info.status == 'FINISHED'
    assert run.info.run_name == 'params-metrics'
    params = run.data.params
    assert params['lr'] == '0.1' and params['opt/name'] == 'adam' and params['opt/betas'] == '[0.9, 0.99]'
    assert params['long'] == 'x' * 6000
    assert params['many/p149'] == '149' and len(params) == 5 + 150
    history = client.get_metric_history(destination.run_id, 'loss')
    assert sorted((m.step, m.value) for m in history) == [(s, pytest.approx(1.0 / s)) for s in range(1, 13)]
    assert [(m.step, m.value) for m in client.get_metric_history(destination.run_id, 'final')] == [(12, 3.0)]
    # params: 155 in chunks of <= 100; metrics: 25 values in 3 calls (batches 5, 10, close), not 25 calls
    assert [c for c in calls if c[1]] == [(0, 100), (0, 55)]
    assert [c[0] for c in calls if c[0]] == [10, 10, 5]


def test_tables_images_and_traces_as_artifacts(tracking_uri, tmp_path, client):
    destination = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, log_traces=True))
    image = (np.arange(4 * 5 * 3) % 256).astype(np.uint8).reshape(4, 5, 3)
    with Logger(destination, run_name='artifacts') as logger:
        logger.log_table(['name', 'score'], [['a', 1], ['b', np.float32(2.5)]], name='eval/results', step=7)
        logger.log_images(
            image,
            name='samples',
            channels_last=True,
            step=2,
            masks={'pred': np.eye(4, 5, dtype=np.int64)},
            mask_class_labels={1: 'edge'},
        )
        logger.log_traces({'algo': {'k': 1}})
    run_id = destination.run_id
    for folder in ('dl', 'dl2', 'dl3'):  # MLflow 2 downloads only into a folder that exists
        (tmp_path / folder).mkdir()
    table_path = client.download_artifacts(run_id, 'tables/eval/results/step000007.json', str(tmp_path / 'dl'))
    with open(table_path) as f:
        assert json.load(f) == {'columns': ['name', 'score'], 'data': [['a', 1], ['b', 2.5]]}
    names = sorted(a.path for a in client.list_artifacts(run_id, 'images/samples'))
    assert names == [
        'images/samples/step000002-0.png',
        'images/samples/step000002-0.pred.png',
        'images/samples/step000002.mask_class_labels.json',
    ]
    png = client.download_artifacts(run_id, 'images/samples/step000002-0.png', str(tmp_path / 'dl2'))
    import matplotlib.image

    assert np.array_equal((matplotlib.image.imread(png) * 255 + 0.5).astype(np.uint8), image)
    trace = client.download_artifacts(run_id, 'traces/algo.txt', str(tmp_path / 'dl3'))
    assert open(trace).read() == '{ k: 1 }'


def test_resumes_the_run_given_by_id_and_by_run_name(tracking_uri, tmp_path, client):
    first = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path))
    with Logger(first, run_name='resumable') as logger:
        logger.log_hyperparameters({'lr': 0.1})
        logger.log_metrics({'loss': 1.0}, step=1)
    # A restart of the same job: same Logger run name -> same MLflow run.
    again = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with Logger(again, run_name='resumable') as logger:
            logger.log_hyperparameters({'lr': 0.2, 'new': 1})  # a changed param is skipped with a warning
            logger.log_metrics({'loss': 0.5}, step=2)
    assert again.run_id == first.run_id
    assert any('already has params' in str(w.message) for w in caught)
    # An explicit run id wins, whatever the Logger's run name.
    by_id = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, run_id=first.run_id))
    with Logger(by_id, run_name='another-name') as logger:
        logger.log_metrics({'loss': 0.25}, step=3)
    assert by_id.run_id == first.run_id
    run = client.get_run(first.run_id)
    assert run.info.status == 'FINISHED'
    assert run.data.params == {'lr': '0.1', 'new': '1'}
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, 'loss')] == [
        (1, 1.0),
        (2, 0.5),
        (3, 0.25),
    ]
    # resume=False starts a new run
    fresh = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, resume=False))
    with Logger(fresh, run_name='resumable'):
        pass
    assert fresh.run_id != first.run_id


def test_background_failure_surfaces_at_close(tracking_uri, tmp_path, client):
    destination = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path))
    logger = Logger(destination, run_name='fails')
    client.delete_run(destination.run_id)  # every later write to this run is refused
    logger.log_metrics({'loss': 1.0}, step=1)
    with pytest.raises(RuntimeError, match='MLflow call'):
        logger.close()


def test_validation_and_install_hint(monkeypatch):
    with pytest.raises(ValueError, match='experiment_name'):
        MLFlowLogger(experiment_name='')
    with pytest.raises(ValueError, match='flush_interval'):
        MLFlowLogger(flush_interval=0)
    with pytest.raises(ValueError, match='param_separator'):
        MLFlowLogger(param_separator='-')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'mlflow' else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install dist-logging\[mlflow\]'):
        MLFlowLogger()


# ----------------------------------------------------------------- Composer's MLFlowLogger API
def test_composer_style_construction_run_name_and_tags(tracking_uri, tmp_path, client, monkeypatch):
    monkeypatch.setenv('MLFLOW_EXPERIMENT_NAME', 'composer-style-exp')
    destination = MLFlowLogger(
        tracking_uri=tracking_uri,
        artifact_location=(tmp_path / 'a').as_uri(),
        rank_zero_only=True,
        run_group='group-1',
        logging_buffer_seconds=5,
        log_system_metrics=False,
        model_registry_prefix='',
        model_registry_uri=None,
    )
    assert destination.experiment_name == 'composer-style-exp' and destination.ranks == 'zero'
    with Logger(destination, run_name='composer-run'):
        assert destination.run_name == 'composer-run'
        assert destination.tags['run_name'] == 'composer-run'
    run = client.get_run(destination.run_id)
    assert run.info.run_name == 'composer-run'
    assert run.data.tags['run_name'] == 'composer-run' and run.data.tags['run_group'] == 'group-1'
    assert client.get_experiment(run.info.experiment_id).name == 'composer-style-exp'
    # Every rank its own run, as Composer names them; $RUN_NAME is the run_name tag.
    monkeypatch.setenv('RUN_NAME', 'platform-run')
    per_rank = MLFlowLogger(
        tracking_uri=tracking_uri, run_name='my-run', rank_zero_only=False, artifact_location=(tmp_path / 'a').as_uri()
    )
    assert per_rank.ranks == 'all'
    with Logger(per_rank, run_name='composer-run'):
        pass
    assert per_rank.run_name == 'my-run-rank0' and per_rank.tags['run_name'] == 'platform-run'
    assert per_rank.run_id != destination.run_id
    with pytest.raises(ValueError, match="rank_zero_only=False means ranks='all'"):
        MLFlowLogger(rank_zero_only=False, ranks='zero')


def test_resumes_a_run_composer_created(tracking_uri, tmp_path, client):
    experiment_id = client.create_experiment('made-by-composer', artifact_location=(tmp_path / 'c').as_uri())
    composer_run = client.create_run(experiment_id, run_name='x', tags={'run_name': 'job-7'})
    destination = MLFlowLogger(
        tracking_uri=tracking_uri, experiment_name='made-by-composer', artifact_location=(tmp_path / 'c').as_uri()
    )
    with Logger(destination, run_name='job-7') as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
    assert destination.run_id == composer_run.info.run_id


def test_path_tracking_uri(tmp_path, monkeypatch):
    folder = tmp_path / 'mlruns'
    monkeypatch.delenv('MLFLOW_ALLOW_FILE_STORE', raising=False)
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE  # noqa: F401
    except ImportError:  # an MLflow without the switch (2.x) takes folders: nothing to refuse
        pass
    else:
        with pytest.raises(ValueError, match=r"is a folder.*MLFLOW_ALLOW_FILE_STORE=true.*sqlite:///"):
            MLFlowLogger(tracking_uri=folder)
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    destination = MLFlowLogger(tracking_uri=folder, experiment_name='path-uri')
    assert destination.tracking_uri == str(folder)
    with Logger(destination, run_name='p') as logger:
        logger.log_metrics({'loss': 0.5}, step=2)
    from mlflow.tracking import MlflowClient

    assert MlflowClient(str(folder)).get_run(destination.run_id).data.metrics == {'loss': 0.5}


def test_metric_filters_renames_duplicates_and_time_buffer(tracking_uri, tmp_path, client):
    destination = MLFlowLogger(
        **_logger_kwargs(tracking_uri, tmp_path),
        synchronous=True,
        flush_interval=1000,
        logging_buffer_seconds=None,
        ignore_metrics=['eval/*'],
        ignore_hyperparameters=['secret_*', 'opt/b*'],
        rename_metrics={'loss': 'just_loss'},
        log_duplicated_metric_every_n_steps=3,
    )
    with Logger(destination, run_name='filters') as logger:
        logger.log_hyperparameters({'lr': 1, 'secret_seed': 2, 'opt': {'beta': 0.9, 'eps': 1e-8}})
        for step in range(1, 8):
            logger.log_metrics({'loss': 1.0, 'eval/acc': 0.5, 'changing': float(step)}, step=step)
        assert client.get_metric_history(destination.run_id, 'changing') == []  # buffered: no time limit
        destination.logging_buffer_seconds = 1e-9  # now every call sends what is buffered
        logger.log_metrics({'changing': 8.0}, step=8)
        assert len(client.get_metric_history(destination.run_id, 'changing')) == 8
    run = client.get_run(destination.run_id)
    assert run.data.params == {'lr': '1', 'opt/eps': '1e-08'}
    assert 'eval/acc' not in run.data.metrics and 'loss' not in run.data.metrics
    # an unchanged value is sent again only once 3 steps have passed
    assert [m.step for m in client.get_metric_history(destination.run_id, 'just_loss')] == [1, 4, 7]


def test_register_model(tracking_uri, tmp_path, client):
    model_dir = tmp_path / 'model'
    model_dir.mkdir()
    (model_dir / 'weights.bin').write_bytes(b'w')
    destination = MLFlowLogger(
        tracking_uri=tracking_uri,
        model_registry_prefix='team',
        experiment_name='registry',
        artifact_location=(tmp_path / 'artifacts').as_uri(),
    )
    with Logger(destination, run_name='registry') as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
        client.log_artifacts(destination.run_id, str(model_dir), artifact_path='model')
        first = destination.register_model(f'runs:/{destination.run_id}/model', 'tiny', tags={'stage': 1})
        second = destination.register_model_with_run_id(str(model_dir), 'tiny')
    assert (first.name, str(first.version), str(second.version)) == ('team.tiny', '1', '2')
    stored = client.get_model_version('team.tiny', '1')
    assert stored.run_id == destination.run_id and stored.tags == {'stage': '1'}
    assert stored.source.endswith('/model') and second.run_id == destination.run_id
    with pytest.raises(ValueError, match='When registering to Unity Catalog'):
        MLFlowLogger(model_registry_uri='databricks-uc', model_registry_prefix='no_schema')


def test_register_model_on_an_excluded_rank_does_nothing(fake_rank):
    fake_rank(rank=1, world_size=2)
    assert MLFlowLogger(tracking_uri='sqlite:///unused.db').register_model('runs:/x/model', 'm') is None


def test_system_metrics_and_bfloat16_images(tracking_uri, tmp_path, client, monkeypatch):
    import time

    import torch

    monkeypatch.setenv('MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL', '0.05')
    monkeypatch.setenv('MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING', '1')
    destination = MLFlowLogger(
        tracking_uri=tracking_uri,
        log_system_metrics=True,
        experiment_name='system',
        artifact_location=(tmp_path / 'artifacts').as_uri(),
    )
    with Logger(destination, run_name='system') as logger:
        logger.log_images(torch.rand(2, 3, 4, 4, dtype=torch.bfloat16), name='bf16', step=1)
        monitor = destination._system_monitor
        deadline = time.monotonic() + 30
        while monitor._logging_step < 1 and time.monotonic() < deadline:  # one sample group recorded
            time.sleep(0.02)
    assert client.get_metric_history(destination.run_id, 'system/cpu_utilization_percentage')
    assert sorted(a.path for a in client.list_artifacts(destination.run_id, 'images/bf16')) == [
        'images/bf16/step000001-0.png',
        'images/bf16/step000001-1.png',
    ]


@pytest.mark.parametrize(
    'run_name, composer_run_name',
    [
        ("bob's run", "bob's run"),
        ('say "hi" twice', 'say "hi" twice'),
        ('quotes \'both\' "kinds"', 'team\\bob\'s "job"'),  # RUN_NAME (Composer's tag) may hold a backslash
    ],
)
def test_run_names_with_quotes_backslashes_and_spaces(
    tracking_uri, tmp_path, client, monkeypatch, run_name, composer_run_name
):
    """Values go into MLflow's search filters safely: a restart finds the run again (by our tag, and by
    Composer's), and a name that only starts like another one does not match it."""
    kwargs = {**_logger_kwargs(tracking_uri, tmp_path), 'experiment_name': f'quoted-{len(run_name)}'}
    decoy = MLFlowLogger(**kwargs)
    prefix = run_name.split("'")[0].split('"')[0]
    monkeypatch.setenv('RUN_NAME', composer_run_name.split('\\')[0].split("'")[0] + 'x')
    with Logger(decoy, run_name=prefix + 'x'):  # shares the searchable prefixes of both tags
        pass
    monkeypatch.setenv('RUN_NAME', composer_run_name)
    first = MLFlowLogger(**kwargs)
    with Logger(first, run_name=run_name) as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
    assert first.run_id != decoy.run_id
    again = MLFlowLogger(**kwargs)
    with Logger(again, run_name=run_name) as logger:
        logger.log_metrics({'loss': 0.5}, step=2)
    assert again.run_id == first.run_id
    run = client.get_run(first.run_id)
    assert run.info.run_name == run_name and run.data.tags['run_name'] == composer_run_name
    assert [m.value for m in client.get_metric_history(first.run_id, 'loss')] == [1.0, 0.5]

    # Only Composer's tag (a run Composer created for this job): found by it too.
    experiment_id = client.get_experiment_by_name(kwargs['experiment_name']).experiment_id
    composer_run = client.create_run(experiment_id, run_name='c', tags={'run_name': composer_run_name + '!'})
    monkeypatch.setenv('RUN_NAME', composer_run_name + '!')
    by_composer_tag = MLFlowLogger(**kwargs)
    with Logger(by_composer_tag, run_name='unrelated'):
        pass
    assert by_composer_tag.run_id == composer_run.info.run_id


def test_close_after_a_failed_init_raises_only_the_init_error(tracking_uri, tmp_path):
    destination = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, run_id='0123456789abcdef'))
    with pytest.warns(RuntimeWarning, match='not found'):
        logger = Logger(destination, run_name='failed-init')
    with pytest.raises(ValueError, match="run_id '0123456789abcdef' not found") as info:
        logger.close()
    assert not getattr(info.value, '__notes__', None)  # no second error from closing a run that never opened
    assert destination.client is None
    destination.close(None, None)  # and closing it directly is a no-op


def test_resumes_a_run_composer_created_in_its_default_experiment(tracking_uri, tmp_path, client, monkeypatch):
    """As Composer's MLFlowLogger creates one: in 'my-mlflow-experiment' (Composer's default), tagged run_name."""
    import mlflow

    monkeypatch.delenv('MLFLOW_EXPERIMENT_NAME', raising=False)
    monkeypatch.delenv('MLFLOW_EXPERIMENT_ID', raising=False)
    monkeypatch.setenv('MLFLOW_TRACKING_URI', tracking_uri)
    experiment = client.get_experiment_by_name('my-mlflow-experiment')
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment('my-mlflow-experiment', artifact_location=(tmp_path / 'composer').as_uri())
    )
    # Composer: MlflowClient.create_run(experiment_id, run_name=...), then mlflow.start_run(run_id, tags=...).
    created = client.create_run(experiment_id=experiment_id, run_name='composer-job-9')
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        with mlflow.start_run(run_id=created.info.run_id, tags={'run_name': 'composer-job-9'}):
            mlflow.log_metric('loss', 2.0, step=1)
    finally:
        mlflow.set_tracking_uri(previous)
    destination = MLFlowLogger(tracking_uri)  # no experiment_name=
    with Logger(destination, run_name='composer-job-9') as logger:
        logger.log_metrics({'loss': 1.0}, step=2)
    assert destination.run_id == created.info.run_id and destination.experiment_id == experiment_id
    assert [m.step for m in client.get_metric_history(created.info.run_id, 'loss')] == [1, 2]
    other = MLFlowLogger(tracking_uri, experiment_name='elsewhere')  # a named experiment: not looked for there
    with Logger(other, run_name='composer-job-9'):
        pass
    assert other.run_id != created.info.run_id


def test_default_experiment_is_composers_and_a_job_from_the_earlier_default_continues(
    tracking_uri, tmp_path, client, monkeypatch
):
    """No experiment named: new runs go to Composer's default, 'my-mlflow-experiment'; a job whose run an earlier
    dist_logging made in its former default, 'dist_logging', continues that run there."""
    monkeypatch.delenv('MLFLOW_EXPERIMENT_NAME', raising=False)
    monkeypatch.delenv('MLFLOW_EXPERIMENT_ID', raising=False)
    fresh = MLFlowLogger(tracking_uri)
    with Logger(fresh, run_name='new-job'):
        pass
    assert fresh.experiment_name == 'my-mlflow-experiment'
    assert client.get_experiment(fresh.experiment_id).name == 'my-mlflow-experiment'
    earlier_id = client.create_experiment('dist_logging', artifact_location=(tmp_path / 'earlier').as_uri())
    earlier = client.create_run(earlier_id, run_name='old-job', tags={'dist_logging.run_name': 'old-job'})
    continued = MLFlowLogger(tracking_uri)
    with Logger(continued, run_name='old-job') as logger:
        logger.log_metrics({'loss': 1.0}, step=5)
    assert (continued.run_id, continued.experiment_id) == (earlier.info.run_id, earlier_id)
    named = MLFlowLogger(tracking_uri, experiment_name='elsewhere')  # a named experiment: only there
    with Logger(named, run_name='old-job'):
        pass
    assert named.run_id != earlier.info.run_id


def test_state_dict_round_trip_continues_the_run(tracking_uri, tmp_path, client):
    import torch

    first = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, resume=False))
    assert first.state_dict() == {'run_id': None, 'experiment_id': None}
    with Logger(first, run_name='saved') as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
        saved = first.state_dict()
    path = tmp_path / 'state.pt'
    torch.save({'callbacks': {type(first).__qualname__: saved}}, path)  # as Composer's checkpoint holds it
    restored = MLFlowLogger(**_logger_kwargs(tracking_uri, tmp_path, resume=False))  # would otherwise start anew
    restored.load_state_dict(torch.load(path)['callbacks']['MLFlowLogger'])
    with Logger(restored, run_name='another-job') as logger:
        logger.log_metrics({'loss': 0.5}, step=2)
    assert restored.run_id == first.run_id and restored.state_dict() == saved
    assert [m.value for m in client.get_metric_history(first.run_id, 'loss')] == [1.0, 0.5]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['runid'\]"):
        restored.load_state_dict({'runid': 'x'})
    with pytest.raises(TypeError, match='expected a mapping'):
        restored.load_state_dict(['run_id'])
    restored.load_state_dict({})  # what Composer's own MLFlowLogger saves


class _Pages:
    """A fake MlflowClient whose search_runs hands out pages: ``tokens(n)`` is the token after page n."""

    def __init__(self, tokens, runs_on=None):
        self.tokens, self.runs_on, self.calls = tokens, runs_on or {}, []

    def search_runs(self, experiment_ids, filter_string, max_results, order_by, page_token):
        self.calls.append(page_token)
        n = len(self.calls)

        class Page(list):
            token = self.tokens(n)

        return Page(self.runs_on.get(n, []))


def _run(tag, value):
    from types import SimpleNamespace

    return SimpleNamespace(data=SimpleNamespace(tags={tag: value}))


def test_run_lookup_stops_on_a_repeated_or_endless_page_token():
    from unittest.mock import MagicMock

    from dist_logging.destinations._mlflow_runs import find_run_tagged

    # Composer's tests mock the client: every search returns the same object, token included.
    mocked = MagicMock()
    assert find_run_tagged(mocked, '0', 'run_name', 'x') is None
    assert mocked.search_runs.call_count == 2  # the second page repeats the first token: stop
    same = _Pages(lambda n: 'again')
    assert find_run_tagged(same, '0', 'run_name', 'x') is None and same.calls == [None, 'again']
    endless = _Pages(lambda n: f'page{n}')  # a new token every time: bounded
    assert find_run_tagged(endless, '0', 'run_name', 'x', max_pages=7) is None and len(endless.calls) == 7
    # Real paging still works: the run on the third page is found, the exact value compared.
    paged = _Pages(
        lambda n: f'page{n}' if n < 5 else '', {2: [_run('run_name', "bob's")], 3: [_run('run_name', "bob's run")]}
    )
    assert find_run_tagged(paged, '0', 'run_name', "bob's run").data.tags == {'run_name': "bob's run"}
    assert paged.calls == [None, 'page1', 'page2']
    assert find_run_tagged(_Pages(lambda n: ''), '0', 'run_name', 'x') is None
