"""WandBLogger against real offline W&B runs, read back from the runs' own transaction logs."""

from __future__ import annotations

import json
import os
import struct
import threading

import numpy as np
import pytest

pytest.importorskip('wandb')

from wandb_reader import (
    BLOCK_SIZE,
    FILE_HEADER,
    RunLog,
    WandbLogError,
    find_run_file,  # noqa: E402
    iter_chunks_payloads,
    write_log,
)

from dist_logging import Logger, format_log_data_value  # noqa: E402
from dist_logging.config import build_destinations, load_config  # noqa: E402
from dist_logging.destinations import WandBLogger  # noqa: E402
from dist_logging.destinations.wandb import STEP_METRIC  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope='module')
def wandb_env(tmp_path_factory):
    """Offline W&B confined to a temp folder: no network, no git/code capture, no system stats."""
    import wandb

    wandb.teardown()  # wandb keeps the settings it read from the environment in a singleton: start afresh
    root = tmp_path_factory.mktemp('wandb')
    had_service = 'WANDB_SERVICE' in os.environ
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            'WANDB_MODE': 'offline',
            'WANDB_DIR': str(root),
            'WANDB_DATA_DIR': str(root / 'data'),
            'WANDB_CACHE_DIR': str(root / 'cache'),
            'WANDB_CONFIG_DIR': str(root / 'config'),
            'WANDB_ARTIFACT_DIR': str(root / 'artifacts'),
            'WANDB_SILENT': 'true',
            'WANDB_DISABLE_GIT': 'true',
            'WANDB_DISABLE_CODE': 'true',
            'WANDB_CONSOLE': 'off',
            'WANDB__DISABLE_STATS': 'true',
            'WANDB__DISABLE_META': 'true',
            'WANDB__SAVE_REQUIREMENTS': 'false',
            'WANDB_INIT_TIMEOUT': '60',
        }.items():
            mp.setenv(name, value)
        for name in (
            'WANDB_API_KEY',
            'WANDB_PROJECT',
            'WANDB_ENTITY',
            'WANDB_RUN_ID',
            'WANDB_RESUME',
            'WANDB_NAME',
            'WANDB_RUN_GROUP',
            'WANDB_TAGS',
        ):
            mp.delenv(name, raising=False)
        yield root
        wandb.teardown()  # stops the wandb service process this module started
    if not had_service:
        os.environ.pop('WANDB_SERVICE', None)


def run_log(destination: WandBLogger) -> RunLog:
    """The finished run's records (the run folder is the parent of its ``files`` folder).

    ``run.finish()`` returns once the service has the run's last record, but the service
    closes (flushes) the run's file afterwards, on its own; shutting the service down
    waits for that. The next ``wandb.init`` starts a new one.
    """
    import wandb

    wandb.teardown()
    return RunLog(find_run_file(os.path.dirname(destination.run_dir), destination.run.id))


# ---------------------------------------------------------------------------- the reader itself
def test_reader_reassembles_records_spanning_blocks_and_checks_crcs():
    payloads = [b'a' * 10, os.urandom(BLOCK_SIZE + 5000), b'', os.urandom(3 * BLOCK_SIZE), b'z' * 200]
    # A record that leaves 3 bytes of its block: too few for a chunk header, so they are padding.
    payloads.insert(1, b'p' * (BLOCK_SIZE - 17 - 7 - 3))
    data = write_log(payloads)
    assert data[:6] == FILE_HEADER and data[6] == 0
    assert list(iter_chunks_payloads(data)) == payloads
    kinds = []
    body = data[7:]
    for block_start in range(0, len(body), BLOCK_SIZE):
        block = body[block_start : block_start + BLOCK_SIZE]
        offset = 0
        while len(block) - offset >= 7:
            _, length, kind = struct.unpack_from('<IHB', block, offset)
            kinds.append(kind)
            offset += 7 + length
        if block_start == 0:
            assert block[offset:] == b'\0' * 3  # the padded tail
    assert kinds.count(2) == 2 and kinds.count(4) == 2 and kinds.count(3) >= 2  # two records span blocks

    corrupt = bytearray(data)
    corrupt[7 + BLOCK_SIZE + 100] ^= 0xFF  # inside the middle of the record that spans blocks
    with pytest.raises(WandbLogError, match='CRC mismatch'):
        list(iter_chunks_payloads(bytes(corrupt)))
    with pytest.raises(WandbLogError, match='not a W&B transaction log'):
        list(iter_chunks_payloads(b'LevelDB' + data[7:]))
    with pytest.raises(WandbLogError, match='ends inside a split record'):
        list(iter_chunks_payloads(data[: 7 + 2 * BLOCK_SIZE]))


# ---------------------------------------------------------------------------- construction
def test_constructor_validates_and_maps_rank_zero_only():
    assert WandBLogger().ranks == 'zero'
    assert WandBLogger(rank_zero_only=False).ranks == 'all'
    assert WandBLogger(ranks='local_zero').ranks == 'local_zero'  # ranks= wins over the default
    with pytest.raises(ValueError, match="rank_zero_only=False .* contradicts ranks='zero'"):
        WandBLogger(rank_zero_only=False, ranks='zero')
    with pytest.raises(ValueError, match='unknown ranks policy'):
        WandBLogger(ranks='everyone')
    with pytest.raises(ValueError, match='project must be a non-empty string'):
        WandBLogger(project='')
    with pytest.raises(TypeError, match='tags must be a list'):
        WandBLogger(tags='baseline')
    with pytest.raises(TypeError, match='init_kwargs must be a mapping'):
        WandBLogger(init_kwargs=['mode'])
    with pytest.raises(ValueError, match=r"project='a' contradicts init_kwargs\['project'\]='b'"):
        WandBLogger(project='a', init_kwargs={'project': 'b'})
    with pytest.raises(ValueError, match='nope'):
        WandBLogger(name='{run_name}-{nope}')
    assert WandBLogger(project='a', init_kwargs={'project': 'a', 'mode': 'offline'}).init_kwargs == {
        'project': 'a',
        'mode': 'offline',
    }


def test_per_rank_names_and_groups(fake_rank):
    fake_rank(rank=3, world_size=4)
    assert WandBLogger().run_name_and_group('job') == ('job', None)
    assert WandBLogger(ranks='all').run_name_and_group('job') == ('job-rank3', 'job')
    assert WandBLogger(rank_zero_only=False, name='n', group='g-{run_name}').run_name_and_group('job') == (
        'n-rank3',
        'g-job',
    )
    assert WandBLogger(ranks='all', name='{run_name}-r{rank}').run_name_and_group('job') == ('job-r3', 'job-r3')
    with pytest.warns(UserWarning, match='logs on rank zero only'):
        WandBLogger(log_artifacts=True)


def test_config_type_wandb_builds_it():
    config = load_config(
        {
            'destinations': [
                {
                    'type': 'wandb',
                    'project': 'p',
                    'rank_zero_only': False,
                    'log_artifacts': True,
                    'init_kwargs': {'mode': 'offline'},
                }
            ]
        }
    )
    (destination,) = build_destinations(config)
    assert isinstance(destination, WandBLogger)
    assert (destination.project, destination.ranks, destination.log_artifacts) == ('p', 'all', True)
    with pytest.raises(ValueError, match=r'destinations\[0\]\.projct: unknown key'):
        load_config({'destinations': [{'type': 'wandb', 'projct': 'p'}]})


def test_takes_files_only_with_log_artifacts(wandb_env):
    from dist_logging.destinations import InMemoryLogger

    plain = Logger([InMemoryLogger(), WandBLogger(init_kwargs={'mode': 'disabled'})], run_name='files')
    with plain:
        assert not plain.has_file_upload_destination()
    with Logger(WandBLogger(log_artifacts=True, init_kwargs={'mode': 'disabled'}), run_name='files') as logger:
        assert logger.has_file_upload_destination()


def test_not_open_is_a_clear_error(tmp_path):
    destination = WandBLogger()
    with pytest.raises(RuntimeError, match='not open'):
        destination.log_metrics({'loss': 1.0})
    destination.post_close()  # nothing to finish: a no-op, as in Composer
    with pytest.raises(ValueError, match='needs entity and project'):
        destination.download_file('ckpt.pt', str(tmp_path / 'x'))


def test_ranks_other_than_zero_open_no_run_by_default(fake_rank, wandb_env):
    fake_rank(rank=1, world_size=2)
    destination = WandBLogger(project='p')
    with Logger(destination, run_name='quiet') as logger:
        logger.log_metrics({'loss': 1.0})
        logger.log_hyperparameters({'lr': 1})
    assert destination.run is None


# ---------------------------------------------------------------------------- one real run, read back
def test_run_round_trip(tmp_path, wandb_env):
    destination = WandBLogger(project='dl', tags=['baseline'], log_artifacts=True)
    checkpoint = tmp_path / 'model.pt'
    checkpoint.write_bytes(b'first version')
    rng = np.random.default_rng(0)
    with Logger(destination, run_name='round-trip') as logger:
        assert destination.run is not None and destination.run_url is None  # offline: no URL
        logger.log_hyperparameters(
            {'lr': 0.1, 'optim': {'momentum': 0.9}, 'api_key': 'sk-do-not-store', 'model': object}
        )
        logger.log_metrics({'loss': 1.0}, step=1)
        logger.log_metrics({'loss': 0.5, 'acc': 0.75}, step=2)
        logger.log_metrics({'lr': 0.01}, step=2)  # same step: the same row
        with pytest.warns(RuntimeWarning, match='step 1 is before the last step'):
            logger.log_metrics({'late': 3.0}, step=1)  # backwards: kept, in a new row
        logger.log_table(['prompt', 'generation'], [['p0', 'g0'], ['p1', 2]], name='samples', step=4)
        logger.log_table(['service', 'password'], [['db', 'hunter2-do-not-store']], name='creds', step=4)
        images = rng.random((2, 3, 5, 6), dtype=np.float32)
        masks = {'pred': rng.integers(0, 3, (2, 5, 6))}
        logger.log_images(
            images, name='seg', step=5, masks=masks, mask_class_labels={0: 'bg', 1: 'cat', 2: 'dog'}, use_table=False
        )
        logger.log_images(images[0], name='single', step=5)  # Logger's default use_table=True: a table of images
        destination.log_images(images[0], name='direct', step=5)  # the destination's default, as Composer's: False
        with pytest.raises(ValueError, match="mask 'big' has class id 300"):  # checked at the call
            destination.log_images(images, name='seg', masks={'big': np.full((2, 5, 6), 300)})
        for one_row in (rng.random(32), np.zeros((1, 1, 8), np.float32)):  # 1-D, and a grey image 1 x 8 (CHW)
            with pytest.raises(ValueError, match='W&B cannot draw a grey image 1 x'):  # as Composer's, at the call
                destination.log_images(one_row)
        logger.batch_end()
        logger.batch_end()
        logger.log_traces({'algo/Event.INIT': True, 'info': {'a': 1}, 'client_secret': 'trace-do-not-store'})

        # Hold the background thread: the calls below must return without waiting for wandb.
        gate = threading.Event()
        destination._worker.submit(lambda: gate.wait(30))
        logger.log_metrics({'loss': 0.25}, step=6)
        frame = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
        logger.log_images(frame, name='frame', channels_last=True, step=6, use_table=False)
        frame[:] = 0  # the caller reuses its buffer before wandb got to it: the logged image is unchanged
        with pytest.warns(UserWarning, match="'ckpts/ep0.pt' is stored as 'ckpts.ep0.pt'"):
            logger.upload_file('ckpts/ep0.pt', checkpoint)
        checkpoint.write_bytes(b'changed after the call')  # the snapshot keeps what was handed over
        notes = tmp_path / 'notes.txt'
        notes.write_text('kept as is')
        logger.upload_file('notes.txt', notes, copy=False)  # the caller promises not to change it: a hard link
        with pytest.raises(ValueError, match='W&B allows 128'):
            logger.upload_file('x' * 129, checkpoint)
        assert not gate.is_set()
        gate.set()
    assert destination.run_dir is not None
    log = run_log(destination)
    raw = open(log.path, 'rb').read()

    assert log.run.display_name == 'round-trip' and log.run.project == 'dl' and list(log.run.tags) == ['baseline']
    assert log.run.run_group == ''
    # Hyperparameters: in the config, redacted before they reached the destination.
    assert log.config['lr'] == 0.1 and log.config['optim'] == {'momentum': 0.9}
    assert log.config['api_key'] == '***' and b'sk-do-not-store' not in raw
    for folder, _, names in os.walk(wandb_env):  # nothing W&B wrote anywhere holds a secret
        for file_name in names:
            with open(os.path.join(folder, file_name), 'rb') as f:
                data = f.read()
            assert b'do-not-store' not in data, os.path.join(folder, file_name)
    assert isinstance(log.config['model'], str) and 'object' in log.config['model']

    rows = {row['_step']: row for row in log.history}
    assert rows[1]['loss'] == 1.0 and rows[1][STEP_METRIC] == 1
    assert (rows[2]['loss'], rows[2]['acc'], rows[2]['lr'], rows[2][STEP_METRIC]) == (0.5, 0.75, 0.01, 2)
    assert rows[3]['late'] == 3.0 and rows[3][STEP_METRIC] == 1  # the late row, plotted at step 1
    assert [m.step_metric for m in log.metrics if m.glob_name == '*'] == [STEP_METRIC]

    files = destination.run_dir
    table = rows[4]
    assert table['samples/_type'] == 'table-file' and table[STEP_METRIC] == 4
    with open(os.path.join(files, table['samples/path'])) as f:
        saved = json.load(f)
    assert saved['columns'] == ['prompt', 'generation'] and saved['data'] == [['p0', 'g0'], ['p1', 2]]

    images_row = rows[5]
    assert images_row['seg/_type'] == 'images/separated' and images_row['seg/count'] == 2
    assert images_row['single Table/_type'] == 'table-file'
    assert images_row['direct/_type'] == 'images/separated' and 'direct Table/_type' not in images_row
    pngs = sorted(p for p in os.listdir(os.path.join(files, 'media', 'images')) if p.startswith('seg'))
    mask_pngs = sorted(os.listdir(os.path.join(files, 'media', 'images', 'mask')))
    assert len(pngs) == 2 and len(mask_pngs) == 2  # one mask per image of 'seg'
    # A table of images is stored as a run_table artifact holding the table and its images.
    (image_table,) = [a for a in log.artifacts if a.type == 'run_table' and 'singleTable' in a.name]
    contents = {entry.path: entry.local_path for entry in image_table.manifest.contents}
    (table_json,) = [path for path in contents if path.endswith('.table.json')]
    with open(contents[table_json]) as f:
        saved = json.load(f)
    assert saved['columns'] == ['single'] and len(saved['data']) == 1
    cell = saved['data'][0][0]
    assert cell['_type'] == 'image-file' and (cell['width'], cell['height']) == (6, 5)
    with open(contents[cell['path']], 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    labels = log.config['_wandb']['mask/class_labels']
    assert {'0': 'bg', '1': 'cat', '2': 'dog'} in [entry['value'] for entry in labels.values()]

    # Traces go at the batch count (2), behind the explicit steps above: a row of their own, then step 6.
    assert rows[6]['traces/algo/Event.INIT'] is True and rows[6][STEP_METRIC] == 2
    assert rows[6]['traces/info'] == format_log_data_value({'a': 1})
    assert rows[7]['loss'] == 0.25 and rows[7][STEP_METRIC] == 6

    from PIL import Image

    (frame_png,) = [p for p in os.listdir(os.path.join(files, 'media', 'images')) if p.startswith('frame')]
    with Image.open(os.path.join(files, 'media', 'images', frame_png)) as image:
        assert np.array_equal(np.asarray(image.convert('RGB')), np.arange(48, dtype=np.uint8).reshape(4, 4, 3))

    # The artifact: one per upload, its file snapshotted into wandb's staging folder with the bytes handed over.
    (artifact,) = [a for a in log.artifacts if a.type == 'model']
    assert artifact.name == 'ckpts.ep0.pt' and sorted(artifact.aliases) == ['ep0-ba2', 'latest']
    assert json.loads(artifact.metadata)['timestamp/batch'] == 2
    (entry,) = artifact.manifest.contents
    assert entry.path == 'ep0.pt' and entry.size == len(b'first version')
    staging = os.path.join(wandb_env, 'data', 'artifacts', 'staging')
    assert os.path.dirname(entry.local_path) == staging
    with open(entry.local_path, 'rb') as f:
        assert f.read() == b'first version'

    (linked,) = [a for a in log.artifacts if a.type == 'txt']
    assert linked.name == 'notes.txt' and linked.manifest.contents[0].path == 'notes.txt'
    assert os.path.dirname(linked.manifest.contents[0].local_path) == staging
    assert os.path.samefile(linked.manifest.contents[0].local_path, notes)

    assert log.exit is not None and log.exit.exit_code == 0  # close() finished the run
    assert log.kinds[-1] == 'exit'
    with pytest.raises(RuntimeError, match='not open'):
        destination.log_metrics({'loss': 1.0})


def test_every_rank_its_own_run_in_one_group_and_failed_exit(fake_rank, wandb_env):
    fake_rank(rank=1, world_size=2)
    destination = WandBLogger(project='dl', rank_zero_only=False)
    with pytest.raises(KeyError):
        with Logger(destination, run_name='job') as logger:
            logger.log_metrics({'loss': 1.0})  # the Logger gives the batch count (0) as the step
            logger.log_metrics({'acc': 0.5})  # same step: the same row
            logger.batch_end()
            logger.log_metrics({'loss': 3.0})
            with pytest.warns(RuntimeWarning, match=r"\['loss'\] logged again at batch 1 without step="):
                destination.log_metrics({'loss': 4.0})  # called directly without a step: a row of its own
            logger.log_metrics({'loss': 5.0}, step=7)
            logger.log_hyperparameters({'lr': 0.5})  # rank 1: hyperparameters come from rank zero only
            raise KeyError('training failed')
    log = run_log(destination)
    assert (log.run.display_name, log.run.run_group) == ('job-rank1', 'job')
    rows = [row for row in log.history if 'loss' in row]
    assert [(row['loss'], row[STEP_METRIC], row['_step']) for row in rows] == [
        (1.0, 0, 0),
        (3.0, 1, 1),
        (4.0, 1, 2),
        (5.0, 7, 7),
    ]
    assert rows[0]['acc'] == 0.5
    assert 'lr' not in log.config
    assert log.exit.exit_code == 1  # finished as failed: an exception was propagating through close()


def test_background_failure_surfaces_at_the_next_call_and_at_close(wandb_env):
    destination = WandBLogger(project='dl')
    logger = Logger(destination, run_name='failing')

    def fail(message):
        raise OSError(message)

    destination._worker.submit(lambda: fail('disk gone'))
    _wait_idle(destination)
    with pytest.raises(RuntimeError, match='1 background call.*OSError: disk gone'):
        destination.log_metrics({'loss': 1.0}, step=1)  # the next call
    destination.log_metrics({'loss': 2.0}, step=2)  # reported once; logging goes on
    destination._worker.submit(lambda: fail('disk gone again'))
    with pytest.raises(RuntimeError, match='OSError: disk gone again'):
        logger.close()  # raised at close, which still finished the run
    log = run_log(destination)
    assert [row['loss'] for row in log.history if 'loss' in row] == [2.0] and log.exit is not None


def _wait_idle(destination: WandBLogger) -> None:
    done = threading.Event()
    destination._worker.submit(done.set)
    assert done.wait(30)


def test_download_file(tmp_path, monkeypatch):
    import wandb

    requested = []

    class FakeArtifact:
        def download(self, root):
            with open(os.path.join(root, 'ep0.pt'), 'wb') as f:
                f.write(b'weights')

    def fake_artifact(api, path):
        requested.append(path)
        if 'missing' in path:
            raise wandb.errors.CommError('not found')
        return FakeArtifact()

    monkeypatch.setattr(wandb.Api, '__init__', lambda self, *a, **k: None)
    monkeypatch.setattr(wandb.Api, 'artifact', fake_artifact)
    destination = WandBLogger(entity='team', project='dl')
    target = tmp_path / 'ckpt.pt'
    destination.download_file('ckpts/ep0.pt', str(target))
    assert target.read_bytes() == b'weights' and requested == ['team/dl/ckpts.ep0.pt:latest']
    with pytest.raises(FileExistsError):
        destination.download_file('ckpts/ep0.pt', str(target))
    target.write_bytes(b'old')
    destination.download_file('ckpts/ep0.pt:v3', str(target), overwrite=True)
    assert target.read_bytes() == b'weights' and requested[-1] == 'team/dl/ckpts.ep0.pt:v3'
    with pytest.raises(FileNotFoundError, match='not found'):
        destination.download_file('missing', str(tmp_path / 'y'))
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']  # no temp folders left behind


def test_disabled_mode_takes_every_call_and_stores_nothing(tmp_path, wandb_env):
    destination = WandBLogger(project='dl', log_artifacts=True, init_kwargs={'mode': 'disabled'})
    checkpoint = tmp_path / 'model.pt'
    checkpoint.write_bytes(b'weights')
    staging = wandb_env / 'data' / 'artifacts' / 'staging'
    before = set(os.listdir(staging)) if staging.exists() else set()
    with Logger(destination, run_name='off') as logger:
        assert destination.run.disabled
        logger.log_hyperparameters({'lr': 0.1})
        logger.log_metrics({'loss': 1.0})
        logger.log_table(['a'], [[1]])
        logger.log_images(np.zeros((1, 3, 4, 4), np.float32), masks={'m': np.zeros((1, 4, 4), np.int64)})
        logger.log_traces({'t': 1})
        logger.upload_file('model.pt', checkpoint)
        with pytest.raises(FileNotFoundError):
            destination.upload_file(logger.state, 'gone.pt', str(tmp_path / 'gone.pt'))
    assert (set(os.listdir(staging)) if staging.exists() else set()) == before  # no snapshot left behind


def test_state_dict_continues_the_run(wandb_env, tmp_path):
    """Saved the Composer way (torch.save of state_dict()), loaded into a new WandBLogger before the Logger
    opens it: the new run has the saved id (wandb.init(id=..., resume='allow'))."""
    import torch

    first = WandBLogger(project='dl')
    assert first.state_dict() == {'run_id': None, 'entity': None, 'project': 'dl'}
    with Logger(first, run_name='saved') as logger:
        logger.log_metrics({'loss': 1.0}, step=1)
    saved = first.state_dict()
    assert saved['run_id'] == first.run.id and saved['project'] == 'dl'
    torch.save({'callbacks': {'WandBLogger': saved}}, tmp_path / 'ckpt.pt')
    run_log(first)

    restored = WandBLogger()  # no project given: the saved one is used
    restored.load_state_dict(torch.load(tmp_path / 'ckpt.pt')['callbacks']['WandBLogger'])
    assert restored.init_kwargs['id'] == first.run.id and restored.init_kwargs['resume'] == 'allow'
    with Logger(restored, run_name='resumed') as logger:
        logger.log_metrics({'loss': 0.5}, step=2)
    assert restored.run.id == first.run.id and restored.state_dict()['run_id'] == first.run.id
    assert restored.run.project == 'dl'
    run_log(restored)
    with pytest.raises(ValueError, match="contradicts init_kwargs\\['id'\\]='other'"):
        WandBLogger(init_kwargs={'id': 'other'}).load_state_dict({'run_id': 'x'})
    WandBLogger().load_state_dict({})  # what Composer's own WandBLogger saves


def test_resume_records_the_superseded_range_on_the_run_with_a_warning(wandb_env):
    """An open W&B run cannot drop rows: after Logger.load_state_dict the range is in the run summary, and a
    warning says so; the resumed steps are logged again (new rows, their own trainer/global_step)."""
    destination = WandBLogger(project='dl')
    with Logger(destination, run_name='resumed-wandb') as logger:
        saved = None
        for _ in range(27):
            logger.batch_end()
            logger.log_metrics({'loss': float(logger.state.timestamp.batch)})
            if logger.state.timestamp.batch == 20:
                saved = logger.state_dict()
        logger.load_state_dict(saved)
        with pytest.warns(
            RuntimeWarning,
            match=r'resumed at step 20: the rows of steps >= 21 logged before wandb '
            r'step 28 are superseded',
        ):
            for _ in range(5):
                logger.batch_end()
                logger.log_metrics({'loss': 1000.0 + logger.state.timestamp.batch})
    log = run_log(destination)
    record = log.summary['dist_logging/resume/wandb_step_28']
    assert (record['step'], record['superseded_from'], record['before_wandb_step'], record['resume']) == (20, 21, 28, 1)
    steps = [row[STEP_METRIC] for row in log.history if 'loss' in row]
    assert steps == list(range(1, 28)) + list(range(21, 26))
