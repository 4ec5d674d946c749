"""CometMLLogger against a real offline Comet experiment, read back from the archive it writes.

An offline experiment ends by writing ``<offline_directory>/<experiment key>.zip``: an
``experiment.json`` (workspace, project, start/stop times) and ``messages.json``, one JSON
message per line (``{"type": "metric_msg" | "parameter_msg" | "log_other" | "file_upload",
"payload": {...}}``) with the uploaded files next to it — what ``comet upload`` sends later.
The run itself happens in a subprocess (tests/destinations/cometml_scenario.py): importing
comet_ml installs process-wide hooks that must not leak into this test worker.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

if importlib.util.find_spec('comet_ml') is None:
    pytest.skip('comet_ml is not installed (pip install dist-logging[comet])', allow_module_level=True)

from dist_logging.config import build_destinations, load_config  # noqa: E402
from dist_logging.destinations import CometMLLogger  # noqa: E402

pytestmark = pytest.mark.timeout(200)

SCENARIO = os.path.join(os.path.dirname(__file__), 'cometml_scenario.py')


def test_constructor_validates_and_maps_rank_zero_only():
    assert CometMLLogger().ranks == 'zero'
    assert CometMLLogger(rank_zero_only=False).ranks == 'all'
    assert CometMLLogger(ranks='local_zero').ranks == 'local_zero'
    with pytest.raises(ValueError, match="contradicts ranks='zero'"):
        CometMLLogger(rank_zero_only=False, ranks='zero')
    with pytest.raises(ValueError, match='project_name must be a non-empty string'):
        CometMLLogger(project_name='')
    with pytest.raises(ValueError, match=r"workspace='a' contradicts exp_kwargs\['workspace'\]='b'"):
        CometMLLogger(workspace='a', exp_kwargs={'workspace': 'b'})
    with pytest.raises(TypeError, match='exp_kwargs must be a mapping'):
        CometMLLogger(exp_kwargs=['log_code'])
    with pytest.raises(ValueError, match='nope'):
        CometMLLogger(name='{run_name}-{nope}')
    with pytest.raises(ValueError, match='online=True contradicts'):
        CometMLLogger(online=True, exp_kwargs={'offline_directory': 'x'})
    destination = CometMLLogger('ws', 'proj', log_code=True)  # Composer's positional order
    assert destination.exp_kwargs == {'workspace': 'ws', 'project_name': 'proj', 'log_code': True, 'log_graph': False}
    assert destination.online is True and CometMLLogger(online=False).online is False
    assert CometMLLogger(exp_kwargs={'offline_directory': 'runs'}).online is False
    assert not destination.can_upload_files()
    destination.post_close()  # nothing to end: a no-op, as in Composer


def test_used_without_a_logger_on_an_excluded_rank_opens_nothing(fake_rank):
    fake_rank(rank=1, world_size=2)
    destination = CometMLLogger(online=False)  # ranks='zero': a first call here opens no experiment
    with pytest.raises(RuntimeError, match='not open'):
        destination.log_metrics({'loss': 1.0})
    assert destination.experiment is None and 'comet_ml' not in sys.modules


def test_experiment_names(fake_rank):
    assert CometMLLogger().experiment_name('job') == 'job'
    assert CometMLLogger(name='{run_name}-x').experiment_name('job') == 'job-x'
    fake_rank(rank=3, world_size=4)
    assert CometMLLogger(rank_zero_only=False).experiment_name('job') == 'job-rank3'  # Composer's suffix
    assert CometMLLogger(rank_zero_only=False, name='{run_name}-r{rank}').experiment_name('job') == 'job-r3'


def test_ranks_other_than_zero_open_no_experiment_by_default(fake_rank):
    from dist_logging import Logger

    fake_rank(rank=1, world_size=2)
    destination = CometMLLogger(online=False)
    with Logger(destination, run_name='quiet') as logger:
        logger.log_metrics({'loss': 1.0})
        logger.log_hyperparameters({'lr': 1})
    assert destination.experiment is None and 'comet_ml' not in sys.modules


def test_config_type_cometml_builds_it():
    config = load_config(
        {'destinations': [{'type': 'cometml', 'project_name': 'p', 'rank_zero_only': False, 'online': False}]}
    )
    (destination,) = build_destinations(config)
    assert isinstance(destination, CometMLLogger)
    assert (destination.exp_kwargs['project_name'], destination.ranks, destination.online) == ('p', 'all', False)
    with pytest.raises(ValueError, match=r'destinations\[0\]\.projct_name: unknown key'):
        load_config({'destinations': [{'type': 'cometml', 'projct_name': 'p'}]})


def test_offline_experiment_round_trip(tmp_path):
    offline_dir, scratch = tmp_path / 'comet', tmp_path / 'tmp'
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith('COMET_')}
    env.update(
        COMET_DISABLE_AUTO_LOGGING='1',
        TMPDIR=str(scratch),
        HOME=str(tmp_path),
        COMET_CONFIG=str(tmp_path / '.comet.config'),
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    done = subprocess.run(
        [sys.executable, SCENARIO, str(offline_dir)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150
    )  # comet_ml's import alone takes seconds on a busy machine
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report['returned_in']['log_metrics'] < 5  # returned while the worker was held (a bound, not a benchmark)

    (alone,) = os.listdir(f'{offline_dir}-alone')  # used without a Logger: opened at its first call
    assert alone == f'{report["alone_key"]}.zip' and report['alone_refused_after_close']
    (archive,) = os.listdir(offline_dir)
    assert archive == f'{report["experiment_key"]}.zip'
    with zipfile.ZipFile(offline_dir / archive) as z:
        experiment = json.loads(z.read('experiment.json'))
        messages = [json.loads(line) for line in z.read('messages.json').decode().splitlines() if line.strip()]
        files = {name: z.read(name) for name in z.namelist()}
    assert (experiment['workspace'], experiment['project_name']) == ('ws', 'proj')
    assert experiment['stop_time'] is not None  # ended
    for name, data in files.items():  # credentials in hyperparameters, table cells and traces stored nowhere
        assert b'do-not-store' not in data, name

    others = {m['payload']['key']: m['payload']['value'] for m in messages if m['type'] == 'log_other'}
    assert others['Name'] == 'round-trip-exp' and others['Created from'] == 'dist_logging'
    assert others['traces/note'] == 'hello'
    params = {
        m['payload']['param']['paramName']: m['payload']['param']['paramValue']
        for m in messages
        if m['type'] == 'parameter_msg' and m['payload']['param']['source'] == 'manual'
    }
    assert params == {'lr': 0.1, 'optim|momentum': 0.9, 'api_key': '***'}
    metrics = [
        (m['payload']['metric']['metricName'], m['payload']['metric']['step'], m['payload']['metric']['metricValue'])
        for m in messages
        if m['type'] == 'metric_msg' and m['payload']['metric']['metricName'] != 'process duration'
    ]
    # (Comet may order the keys of one log_metrics call its own way.)
    assert sorted(metrics, key=lambda m: (m[1], m[0])) == [
        ('loss', 1, 1.0),
        ('acc', 2, 0.75),
        ('loss', 2, 0.5),
        ('loss', 3, 0.25),
        ('traces/algo/Event.INIT', 3, 1.0),
    ]

    uploads = {
        m['payload']['additional_params'].get('fileName') or m['payload']['additional_params']['figName']: m['payload']
        for m in messages
        if m['type'] == 'file_upload'
    }
    table = uploads['samples.json']
    assert table['additional_params']['step'] == 2
    assert json.loads(files[table['file_path']]) == {
        'columns': ['prompt', 'generation'],
        'data': [['p0', 'g0'], ['p1', 2]],
    }
    assert set(uploads) == {
        'samples.json',
        'creds.json',
        'inputs_0',
        'inputs_0 + pred mask overlaid',
        'pred_0 mask',
        'line_0',
    }
    from PIL import Image

    image = uploads['inputs_0']
    assert image['upload_type'] == 'visualization' and image['additional_params']['step'] == 2
    pixels = np.asarray(Image.open(io.BytesIO(files[image['file_path']])))
    assert np.array_equal(pixels, np.array(report['image'], dtype=np.uint8))
    # A 1-D image is one row of grey pixels (as Comet draws the 1-D array Composer's logger hands it).
    line = np.asarray(Image.open(io.BytesIO(files[uploads['line_0']['file_path']])))
    assert line.tolist() == [[0, 85, 170, 255]]

    # state_dict / load_state_dict: the experiment key; the restored destination continued that experiment.
    assert report['saved'] == {'experiment_key': report['experiment_key']}
    assert report['restored_key'] == report['experiment_key']
    assert report['restored_type'] == 'ExistingOfflineExperiment'
    (resumed,) = os.listdir(str(offline_dir) + '-resumed')
    with zipfile.ZipFile(os.path.join(str(offline_dir) + '-resumed', resumed)) as z:
        resumed_messages = [json.loads(line) for line in z.read('messages.json').decode().splitlines() if line.strip()]
    assert ('loss', 4, 0.125) in [
        (m['payload']['metric']['metricName'], m['payload']['metric']['step'], m['payload']['metric']['metricValue'])
        for m in resumed_messages
        if m['type'] == 'metric_msg'
    ]
    assert not os.listdir(scratch)  # Comet's temporary copies are gone
