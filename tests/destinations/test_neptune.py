"""NeptuneLogger against real offline Neptune runs, read back from the run's own operation log.

Neptune 1.x in ``mode='offline'`` writes each run under ``.neptune/offline/run__<id>__...``
in the working directory: ``metadata.json`` and ``data-<n>.log``, one JSON operation per
line (``{"obj": {"type": "AssignFloat", "path": [...], ...}, "version": n, "at": t}``) —
what ``neptune sync`` later replays against the server.
"""

from __future__ import annotations

import base64
import glob
import importlib.util
import io
import json
import os
import socket
import threading

import numpy as np
import pytest

# find_spec, not importorskip: every xdist worker collects this module, and importing neptune takes seconds.
if importlib.util.find_spec('neptune') is None:
    pytest.skip('neptune is not installed (pip install dist-logging[neptune])', allow_module_level=True)

from dist_logging import Logger  # noqa: E402
from dist_logging.config import build_destinations, load_config  # noqa: E402
from dist_logging.destinations import NeptuneLogger  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# Neptune's own capture threads (stdout, hardware, traceback hooks, git) are off in the runs here.
QUIET = dict(
    capture_stdout=False,
    capture_stderr=False,
    capture_hardware_metrics=False,
    capture_traceback=False,
    source_files=[],
    git_ref=False,
    dependencies=None,
)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Offline Neptune in a temp working directory, with every outbound connection refused."""

    def refuse(address, *args, **kwargs):
        raise OSError(f'test: no network (tried {address!r})')

    monkeypatch.setattr(socket, 'create_connection', refuse)
    monkeypatch.setattr(socket, 'getaddrinfo', refuse)
    for name in ('NEPTUNE_API_TOKEN', 'NEPTUNE_PROJECT', 'NEPTUNE_CUSTOM_RUN_ID'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('NEPTUNE_MODE', 'offline')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def read_run(root) -> tuple[dict, list[dict]]:
    """The one offline run under ``root``: its metadata and its operations in order."""
    folders = glob.glob(os.path.join(root, ".neptune", "offline", "run__*"))
    assert len(folders) == 1, folders
    (folder,) = folders
    with open(os.path.join(folder, 'metadata.json')) as f:
        metadata = json.load(f)
    operations = []
    for log in sorted(glob.glob(os.path.join(folder, 'data-*.log'))):
        with open(log) as f:
            operations += [json.loads(line) for line in f if line.strip()]
    operations.sort(key=lambda op: op['version'])
    return metadata, [op['obj'] for op in operations]


def field(operations, *path):
    return [op for op in operations if tuple(op['path']) == path]


def test_constructor_validates_and_maps_rank_zero_only():
    assert NeptuneLogger().ranks == 'zero'
    assert NeptuneLogger(rank_zero_only=False).ranks == 'all'
    assert NeptuneLogger(ranks='local_zero').ranks == 'local_zero'
    with pytest.raises(ValueError, match="contradicts ranks='zero'"):
        NeptuneLogger(rank_zero_only=False, ranks='zero')
    with pytest.raises(ValueError, match='base_namespace cannot be empty'):
        NeptuneLogger(base_namespace='')
    with pytest.raises(ValueError, match="unknown mode 'offlin'"):
        NeptuneLogger(mode='offlin')
    with pytest.raises(TypeError, match='upload_checkpoints must be a bool'):
        NeptuneLogger(upload_checkpoints='yes')
    with pytest.raises(TypeError, match='project must be a str'):
        NeptuneLogger(project=3)
    with pytest.raises(TypeError):
        NeptuneLogger('ws/proj')  # keyword-only, as Composer's
    assert 'tok' not in repr(NeptuneLogger(api_token='tok'))
    assert not NeptuneLogger().can_upload_files()


def test_used_without_a_logger_its_first_call_opens_the_run(offline, monkeypatch):
    """As Composer's (whose run exists from first use): code that calls the hooks or reads ``neptune_run`` of a
    NeptuneLogger no Logger opened gets a run, named from the environment. A batch of images is one extend;
    a float image outside [0, 1] warns."""
    from dist_logging._images import FLOAT_RANGE_WARNING

    monkeypatch.setenv('DIST_LOGGING_RUN_NAME', 'alone')
    destination = NeptuneLogger(**QUIET)
    assert destination._base_namespace == 'training'  # Composer's private name, read by code written for it
    assert destination.neptune_run is destination.neptune_run  # opened once, by the first access
    destination.log_metrics({'loss': 1.0}, step=1)
    destination.log_images(
        np.random.default_rng(0).random((3, 4, 5, 1), dtype=np.float32), name='batch', channels_last=True, step=1
    )
    with pytest.warns(UserWarning, match=r'not in the expected range of \[0\.0, 1\.0\] or \[0, 255\]') as caught:
        destination.log_images(np.ones((4, 4)) * 300, name='raw', step=1)  # clipped to white, with a warning
    assert str(caught[0].message) == FLOAT_RANGE_WARNING
    destination.post_close()
    metadata, operations = read_run(offline)
    assert field(operations, 'sys', 'name')[0]['value'] == 'alone'
    batch = field(operations, 'training', 'batch')  # Neptune writes a file series one value per operation
    assert {op['type'] for op in batch} == {'LogImages'}
    assert [v['value']['name'] for op in batch for v in op['values']] == ['batch'] * 3
    (raw,) = field(operations, 'training', 'raw')
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(raw['values'][0]['value']['data']))))
    assert pixels.min() == 255
    with pytest.raises(RuntimeError, match='not open'):  # closed: a later call does not reopen it
        destination.log_metrics({'loss': 2.0})


def test_ranks_other_than_zero_open_no_run_by_default(fake_rank):
    fake_rank(rank=1, world_size=2)
    destination = NeptuneLogger(mode='offline')
    with Logger(destination, run_name='quiet') as logger:
        logger.log_metrics({'loss': 1.0})
        logger.log_hyperparameters({'lr': 1})
    assert destination._neptune_run is None
    with pytest.raises(RuntimeError, match='not open'):
        destination.neptune_run


def test_config_type_neptune_builds_it():
    config = load_config(
        {
            'destinations': [
                {
                    'type': 'neptune',
                    'project': 'ws/p',
                    'mode': 'offline',
                    'upload_checkpoints': True,
                    'rank_zero_only': False,
                }
            ]
        }
    )
    (destination,) = build_destinations(config)
    assert isinstance(destination, NeptuneLogger)
    assert (destination.project, destination.mode, destination.ranks) == ('ws/p', 'offline', 'all')
    assert destination.can_upload_files()


def test_offline_run_round_trip(offline):
    destination = NeptuneLogger(project='ws/proj', upload_checkpoints=True, **QUIET)
    checkpoint = offline / 'ep0-ba2.pt'
    checkpoint.write_bytes(b'first version')
    rng = np.random.default_rng(0)
    with Logger(destination, run_name='round-trip') as logger:
        logger.log_hyperparameters(
            {'lr': 0.1, 'optim': {'momentum': 0.9, 'betas': [0.9, 0.99]}, 'api_key': 'sk-do-not-store'}
        )
        logger.log_metrics({'loss': 1.0}, step=1)
        logger.log_metrics({'loss': 0.5, 'acc': 0.75}, step=2)
        logger.log_metrics({'loss': 0.4}, step=2)  # same step: the later value wins
        with pytest.warns(RuntimeWarning, match="metric 'loss' at step 1 is before step 2"):
            logger.log_metrics({'loss': 9.0}, step=1)
        logger.log_table(['prompt', 'generation'], [['p0', 'g0'], ['p1', 2]], name='samples', step=2)
        image = rng.random((3, 5, 6), dtype=np.float32)
        logger.log_images(image, name='inputs', step=2, masks={'pred': rng.integers(0, 3, (5, 6))})
        logger.log_traces({'algo/Event.INIT': True, 'client_secret': 'trace-do-not-store'})
        logger.log_table(['service', 'password'], [['db', 'hunter2-do-not-store']], name='creds', step=2)

        # Hold the background thread: the calls below must return without waiting for Neptune.
        gate, held = threading.Event(), []
        destination._worker.submit(lambda: held.append(gate.wait(30)))  # False if a call below waited for it
        logger.log_metrics({'loss': 0.25}, step=3)
        logger.upload_file('checkpoints/ep0-ba2.pt', checkpoint)
        checkpoint.write_bytes(b'changed after the call')  # the upload keeps the bytes of the call
        with pytest.raises(FileExistsError, match='checkpoints/ep0-ba2.pt'):
            logger.upload_file('checkpoints/ep0-ba2.pt', checkpoint)
        logger.upload_file('checkpoints/ep0-ba2.pt', checkpoint, overwrite=True)
        (offline / 'latest.symlink').write_text('x')
        logger.upload_file('checkpoints/latest.symlink', offline / 'latest.symlink')  # skipped, as Composer
        gate.set()
    assert held == [True] and destination.neptune_run.get_state() == 'stopped'
    assert not glob.glob(os.path.join(offline, 'tmp*')) and destination._snapshot_dir is None

    metadata, operations = read_run(offline)
    assert metadata['mode'] == 'offline'
    assert field(operations, 'sys', 'name')[0]['value'] == 'round-trip'
    assert field(operations, 'training', 'rank')[0]['value'] == 0
    # Hyperparameters: redacted by the Logger; a list stored as its text.
    assert field(operations, 'training', 'hyperparameters', 'lr')[0]['value'] == 0.1
    assert field(operations, 'training', 'hyperparameters', 'optim', 'momentum')[0]['value'] == 0.9
    assert field(operations, 'training', 'hyperparameters', 'optim', 'betas')[0]['value'] == '[0.9, 0.99]'
    assert field(operations, 'training', 'hyperparameters', 'api_key')[0]['value'] == '***'
    for folder, _, names in os.walk(offline / '.neptune'):  # credentials stored in no file Neptune wrote
        for name in names:
            with open(os.path.join(folder, name), 'rb') as f:
                assert b'do-not-store' not in f.read(), os.path.join(folder, name)
    # Metrics: float series with their steps; the later value at step 2 kept, the backwards one dropped.
    loss = [(v['step'], v['value']) for op in field(operations, 'training', 'metrics', 'loss') for v in op['values']]
    assert loss == [(1, 1.0), (2, 0.4), (3, 0.25)]
    acc = [(v['step'], v['value']) for op in field(operations, 'training', 'metrics', 'acc') for v in op['values']]
    assert acc == [(2, 0.75)]
    assert {op['type'] for op in field(operations, 'training', 'metrics', 'loss')} == {'LogFloats'}
    # Traces, table, images.
    assert field(operations, 'training', 'traces', 'algo', 'Event.INIT')[0]['value'] is True
    (table,) = field(operations, 'training', 'tables', 'samples')
    assert table['type'] == 'UploadFile' and table['ext'] == 'json'
    with open(
        os.path.join(
            os.path.dirname(glob.glob(str(offline / '.neptune/offline/run__*/metadata.json'))[0]),
            'upload_path',
            table['tmp_file_name'],
        )
    ) as f:
        assert json.loads(f.read()) == {'columns': ['prompt', 'generation'], 'data': [['p0', 'g0'], ['p1', 2]]}
    (images,) = field(operations, 'training', 'inputs')
    assert images['type'] == 'LogImages'
    (entry,) = images['values']
    assert entry['value']['name'] == 'inputs' and entry['value']['description'] == 'step 2'
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(entry['value']['data']))))
    expected = (np.clip(np.moveaxis(image, 0, -1), 0, 1) * 255 + 0.5).astype(np.uint8)
    assert pixels.shape == (5, 6, 3) and np.abs(pixels.astype(int) - expected).max() <= 1
    assert field(operations, 'training', 'inputs + pred mask overlaid')[0]['type'] == 'LogImages'
    # Files: the bytes at the call, then the overwrite; the .symlink skipped.
    uploads = field(operations, 'training', 'checkpoints', 'ep0-ba2.pt')
    assert [op['type'] for op in uploads] == ['UploadFile', 'UploadFile']
    folder = os.path.dirname(glob.glob(str(offline / '.neptune/offline/run__*/metadata.json'))[0])
    contents = []
    for op in uploads:
        with open(os.path.join(folder, 'upload_path', op['tmp_file_name']), 'rb') as f:
            contents.append(f.read())
    assert contents == [b'first version', b'changed after the call'] and uploads[0]['ext'] == 'pt'
    assert not field(operations, 'training', 'checkpoints', 'latest.symlink')


def test_per_rank_run_and_background_failure(offline, fake_rank):
    fake_rank(rank=1, world_size=2)
    destination = NeptuneLogger(rank_zero_only=False, **QUIET)
    logger = Logger(destination, run_name='job')
    logger.log_metrics({'loss': 1.0}, step=1)
    logger.log_metrics({'loss/part': 2.0}, step=2)  # 'loss' is a series, not a namespace: Neptune refuses
    with pytest.raises(RuntimeError, match='NeptuneLogger: 1 background call'):
        logger.close()
    _, operations = read_run(offline)
    assert field(operations, 'sys', 'name')[0]['value'] == 'job'  # as Composer's: the rank is in training/rank
    assert field(operations, 'training', 'rank')[0]['value'] == 1


def test_debug_mode_reads_back_through_neptune_and_downloads_at_once(offline, tmp_path):
    """Composer's own checks, through Neptune's API in its in-memory 'debug' mode (mode= wins over NEPTUNE_MODE)."""
    source = tmp_path / 'artifact.txt'
    source.write_text('hello from Neptune!')
    destination = NeptuneLogger(
        project='test_project',
        api_token='test_token',
        rank_zero_only=False,
        mode='debug',
        upload_checkpoints=True,
        **QUIET,
    )
    with Logger(destination, run_name='dummy-run-name') as logger:
        run = destination.neptune_run
        assert run['sys/name'].fetch() == 'dummy-run-name' and destination.base_handler['rank'].fetch() == 0
        logger.log_hyperparameters({'num_nodes': 1})
        logger.upload_file('test-artifact', source)
        destination.download_file('test-artifact', str(tmp_path / 'back'))  # waits for the queued upload
        assert (tmp_path / 'back').read_text() == 'hello from Neptune!'
        assert destination.base_handler['hyperparameters/num_nodes'].fetch() == 1
        # A point waits for a later step of its key, or for its batch to end.
        logger.log_metrics({'eval/acc': 0.5})  # step = the batch count, 0
        destination._drain()
        assert not run.exists('training/metrics/eval/acc')
        logger.batch_end()
        destination._drain()
        assert destination.base_handler['metrics/eval/acc'].fetch_last() == 0.5
        logger.log_metrics({'eval/acc': 0.75})  # step 1: waits again
        destination._drain()
        assert destination.base_handler['metrics/eval/acc'].fetch_last() == 0.5
        with pytest.raises(FileExistsError, match='back'):
            destination.download_file('test-artifact', str(tmp_path / 'back'))
        with pytest.raises(FileNotFoundError, match='training/missing'):
            destination.download_file('missing', str(tmp_path / 'missing'))
