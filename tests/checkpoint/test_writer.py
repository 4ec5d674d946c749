"""CheckpointWriter in one process (dcp without a process group): the save never waits for the upload,
failures name their objects, validation, the staging bound, the Logger metrics, S3."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_logging import Logger
from dist_logging.checkpoint import (
    CheckpointReader,
    CheckpointWriter,
    format_checkpoint_id,
    latest_checkpoint,
    list_checkpoints,
)
from dist_logging.destinations import InMemoryLogger, RemoteUploaderDownloader
from dist_logging.errors import UploadError
from _recording import RecordingStore
from s3_server import aws_credentials, s3_bucket, _moto_session  # noqa: F401 - fixtures

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings('ignore:torch.distributed is disabled')]


def state(step: int) -> dict:
    return {
        'model': {'w': torch.arange(1000, dtype=torch.float32) * step, 'b': torch.full((7, 3), float(step))},
        'step': step,
    }


def blank() -> dict:
    return {'model': {'w': torch.zeros(1000), 'b': torch.zeros(7, 3)}, 'step': -1}


def same(a: dict, b: dict) -> bool:
    return (
        torch.equal(a['model']['w'], b['model']['w'])
        and torch.equal(a['model']['b'], b['model']['b'])
        and a['step'] == b['step']
    )


def rank_error(exc: BaseException) -> str:
    """The text of what failed on the ranks (torch wraps each rank's error in a CheckpointException)."""
    failures = getattr(exc, 'failures', {}) or {}
    return str(exc) + ' '.join(str(f[0] if isinstance(f, tuple) else f) for f in failures.values())


def writer_for(tmp_path, store, **kwargs) -> CheckpointWriter:
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'), num_attempts=1)
    return CheckpointWriter(rud, **kwargs)


def test_save_returns_before_the_upload_and_commits_in_the_background(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='.distcp')  # shard uploads wait for the gate
    in_memory = InMemoryLogger()
    logger = Logger(in_memory)
    writer = writer_for(tmp_path, store, logger=logger)
    dcp.save(state(1), checkpoint_id='run/ck/step1', storage_writer=writer)  # returns with the upload blocked
    timing = writer.timings[-1]
    assert timing.local_s is not None and timing.bytes_written > 0 and timing.commit_s is None
    assert latest_checkpoint(store, 'run/ck') is None  # not committed: invisible
    assert not writer.wait_for_commits(0.2)
    store.gate.set()
    assert writer.wait_for_commits(30)
    assert latest_checkpoint(store, 'run/ck') == 'run/ck/step1'
    fut = dcp.async_save(state(2), checkpoint_id='run/ck/step2', storage_writer=writer)
    fut.result(30)
    writer.close()
    shards = {
        ck: len({o[1] for o in store.ops if o[0] == 'upload' and o[1].endswith('.distcp') and f'/{ck}/' in o[1]})
        for ck in ('step1', 'step2')
    }
    # files_per_rank=None: one file for dcp.save (the training thread waits for the write), several for
    # async_save (up to 4, as torch's size-and-type split allows), each queued as soon as it is written
    assert shards['step1'] == 1 and shards['step2'] > 1, shards
    assert [t.checkpoint_id for t in writer.timings] == ['run/ck/step1', 'run/ck/step2']
    assert all(t.commit_s is not None and t.commit_s >= t.local_s for t in writer.timings)
    assert len(in_memory.data['checkpoint/local_s']) == 2 and len(in_memory.data['checkpoint/commit_s']) == 2
    logger.close()
    got = blank()
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id=latest_checkpoint(store, 'run/ck'), storage_reader=reader)
    assert same(got, state(2))


def test_permanently_failing_shard_leaves_it_uncommitted_and_names_it(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store, commit_timeout=30)
    dcp.save(state(1), checkpoint_id='run/ck/step1', storage_writer=writer)
    assert writer.wait_for_commits(30)
    store.fail = 'step2/__0_'
    dcp.save(state(2), checkpoint_id='run/ck/step2', storage_writer=writer)
    with pytest.raises(UploadError) as raised:
        writer.close()
    failed = [name for name in raised.value.failures if name.startswith('run/ck/step2/__0_')]
    assert failed and 'denied' in str(raised.value)
    assert writer.timings[-1].error is not None
    assert latest_checkpoint(store, 'run/ck') == 'run/ck/step1'  # the failed one stays invisible
    assert list_checkpoints(store, 'run/ck') == ['run/ck/step1']


def test_staging_bound_makes_the_next_save_wait_only_when_full(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='.distcp')
    writer = writer_for(tmp_path, store, max_staged_bytes=10**9)
    dcp.save(state(1), checkpoint_id='r/s1', storage_writer=writer)
    dcp.save(state(2), checkpoint_id='r/s2', storage_writer=writer)  # room: no wait though nothing uploaded
    writer.max_staged_bytes = 1  # now the staged shards fill it
    done = threading.Event()

    def third():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            dcp.save(state(3), checkpoint_id='r/s3', storage_writer=writer)
        done.caught = caught
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not done.wait(0.5)  # waits for uploads while staging is full
    store.gate.set()
    assert done.wait(30)
    thread.join()
    assert any('max_staged_bytes' in str(w.message) for w in done.caught)
    writer.close()
    assert list_checkpoints(store, 'r') == ['r/s1', 'r/s2', 'r/s3']


def test_fsync_is_off_by_default_and_the_argument_or_environment_turns_it_on(tmp_path, monkeypatch):
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: (synced.append(fd), real_fsync(fd)))
    store = RecordingStore(str(tmp_path / 'bucket'))
    for name, kwargs, env, fsyncs in (
        ('off', {}, None, False),
        ('arg', {'sync_files': True}, None, True),
        ('env', {}, '1', True),
    ):
        if env is None:
            monkeypatch.delenv('DIST_LOGGING_UPLOAD_FSYNC', raising=False)
        else:
            monkeypatch.setenv('DIST_LOGGING_UPLOAD_FSYNC', env)
        synced.clear()
        writer = writer_for(tmp_path / name, store, **kwargs)
        assert writer.sync_files is fsyncs and writer.uploader.fsync is (env is not None)
        dcp.save(state(1), checkpoint_id=f'r/{name}', storage_writer=writer)
        writer.close()
        assert bool(synced) is fsyncs, (name, synced)
        owned = CheckpointWriter(str(tmp_path / name / 'b'), upload_staging_folder=str(tmp_path / name / 's'), **kwargs)
        assert owned.sync_files is fsyncs and owned.uploader.fsync is fsyncs
        owned.close()
    assert list_checkpoints(store, 'r') == ['r/off', 'r/arg', 'r/env']  # oldest first


def test_copies_and_bad_arguments_are_refused_clearly(tmp_path):
    import copy

    writer = CheckpointWriter(str(tmp_path / 'bucket'), upload_staging_folder=str(tmp_path / 'staging'))
    with pytest.raises(TypeError, match='cannot be copied'):  # a pickle is a process save; a copy is refused
        copy.deepcopy(writer)
    with pytest.raises(BaseException) as raised:  # CheckpointException is a BaseException
        dcp.save(state(1), storage_writer=writer)
    assert 'pass checkpoint_id=' in rank_error(raised.value)
    with pytest.raises(BaseException) as raised:  # CheckpointException is a BaseException
        dcp.save(state(1), checkpoint_id='/abs/step1', storage_writer=writer)
    assert 'absolute' in rank_error(raised.value)
    writer.close()
    with pytest.raises(ValueError, match='keep_last'):
        CheckpointWriter(str(tmp_path / 'b'), keep_last=0)
    with pytest.raises(ValueError, match='max_staged_bytes'):
        CheckpointWriter(str(tmp_path / 'b'), max_staged_bytes=0)
    with pytest.raises(ValueError, match='files_per_rank'):
        CheckpointWriter(str(tmp_path / 'b'), files_per_rank=0)
    with pytest.raises(TypeError, match='bucket'):
        CheckpointWriter(42)
    templated = RemoteUploaderDownloader(str(tmp_path / 'b'), file_path_format_string='{run_name}/{remote_file_name}')
    with pytest.raises(ValueError, match='remote_file_name'):
        CheckpointWriter(templated)
    with pytest.raises(ValueError, match='only apply to a bucket URI'):
        CheckpointWriter(RemoteUploaderDownloader(str(tmp_path / 'b')), backend_kwargs={'x': 1})
    with pytest.raises(ValueError, match='upload_priority.*only apply to a bucket URI'):
        CheckpointWriter(RemoteUploaderDownloader(str(tmp_path / 'b')), upload_priority='normal')
    with pytest.raises(ValueError, match="'loud'"):  # the uploader's own check names the bad value
        CheckpointWriter(str(tmp_path / 'b'), upload_priority='loud')


def test_format_checkpoint_id():
    assert (
        format_checkpoint_id('{run_name}/checkpoints/ep{epoch}-step{step:06d}', run_name='r1', step=100, epoch=2)
        == 'r1/checkpoints/ep2-step000100'
    )
    with pytest.raises(ValueError, match='every rank'):
        format_checkpoint_id('ck/rank{rank}/step{step}', run_name='r', step=1)
    with pytest.raises(ValueError, match='unknown placeholder'):
        format_checkpoint_id('ck/{stpe}', run_name='r', step=1)
    with pytest.raises(TypeError):
        format_checkpoint_id('ck/{step}', run_name='r', step='1')


def test_s3_save_latest_load(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    uri, kwargs = f's3://{bucket}/prefix', {'endpoint_url': endpoint}
    with CheckpointWriter(
        uri, backend_kwargs=kwargs, upload_staging_folder=str(tmp_path / 'staging'), keep_last=1
    ) as writer:
        for step in (1, 2):
            dcp.save(state(step), checkpoint_id=f'run/ck/step{step}', storage_writer=writer)
    assert list_checkpoints(uri, 'run/ck', backend_kwargs=kwargs) == ['run/ck/step2']
    latest = latest_checkpoint(uri, 'run/ck', backend_kwargs=kwargs)
    got = blank()
    with CheckpointReader(uri, backend_kwargs=kwargs) as reader:
        dcp.load(got, checkpoint_id=latest, storage_reader=reader)
    assert same(got, state(2))
    with pytest.raises(BaseException) as raised:  # CheckpointException is a BaseException
        with CheckpointReader(uri, backend_kwargs=kwargs) as reader:
            dcp.load(blank(), checkpoint_id='run/ck/step1', storage_reader=reader)  # deleted by retention
    assert 'not committed' in rank_error(raised.value)


def test_second_job_in_the_same_prefix_never_makes_latest_partial(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='__0_')
    store.gate.set()
    first = writer_for(tmp_path / 'a', store, keep_last=2)
    second = writer_for(tmp_path / 'b', store, keep_last=2)  # another job: its own staging, same bucket

    def latest_state():
        cid = latest_checkpoint(store, 'run/ck')
        got = blank()
        with CheckpointReader(store) as reader:
            dcp.load(got, checkpoint_id=cid, storage_reader=reader)
        return cid, got

    for step in (1, 2):
        dcp.save(state(step), checkpoint_id=f'run/ck/step{step}', storage_writer=first)
    assert first.wait_for_commits(30)
    store.gate.clear()  # the second job's shards of its rank 0 stay in flight
    other = state(2)
    other['model']['w'] = other['model']['w'] + 0.5
    dcp.save(other, checkpoint_id='run/ck/step2', storage_writer=second)  # the same id, other bytes
    cid, got = latest_state()
    assert cid == 'run/ck/step2' and same(got, state(2))  # the first job's step2, whole
    store.gate.set()
    assert second.wait_for_commits(30)
    cid, got = latest_state()
    assert cid == 'run/ck/step2' and same(got, other)  # now the second job's, whole
    dcp.save(state(3), checkpoint_id='run/ck/step3', storage_writer=first)
    first.close()
    second.close()
    cid, got = latest_state()
    assert cid == 'run/ck/step3' and same(got, state(3))
    assert list_checkpoints(store, 'run/ck') == ['run/ck/step2', 'run/ck/step3']


def test_hundreds_of_saves_keep_memory_and_staging_bounded(tmp_path):
    import collections
    import gc
    import tracemalloc

    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store, keep_last=2)
    writer.timings = collections.deque(maxlen=10)  # the bound (100 by default) reached early
    small = {'w': torch.arange(64.0)}

    def save(step):
        small['w'] += 1
        dcp.save(small, checkpoint_id=f'r/ck/step{step:04d}', storage_writer=writer)
        assert writer.wait_for_commits(30)
        store.ops.clear()  # the test's own record of requests

    def ours(snapshot):  # memory allocated by dist_logging's code (pytest keeps every log record)
        return sum(
            stat.size
            for stat in snapshot.filter_traces([tracemalloc.Filter(True, '*/dist_logging/*')]).statistics('filename')
        )

    for step in range(20):  # warm up
        save(step)
    # pytest keeps every log record of a test, and a record keeps its arguments (checkpoint ids) alive
    import logging

    logging.disable(logging.CRITICAL)
    gc.collect()
    tracemalloc.start()
    before = ours(tracemalloc.take_snapshot())
    for step in range(20, 170):
        save(step)
    gc.collect()
    grown = ours(tracemalloc.take_snapshot()) - before
    tracemalloc.stop()
    logging.disable(logging.NOTSET)
    writer.close()
    writer.uploader.shutdown()  # a shared uploader is its owner's to close
    assert grown < 20_000, f'dist_logging holds {grown} bytes more after 150 saves'
    assert list_checkpoints(store, 'r/ck') == ['r/ck/step0168', 'r/ck/step0169']
    assert len({info.name.split('/')[2] for info in store.list('r/ck/')}) == 2  # retention left no folder behind
    assert (
        sorted(
            str(p.relative_to(tmp_path)) for p in (tmp_path / 'staging').rglob('*') if '.dist_logging-' not in str(p)
        )
        == []
    )  # .dist_logging-<host>: machine state (commit scratch)


def _shard_inodes(writer) -> list[int]:
    """Wrap ``writer``'s hand-over to record the inode of each shard file it hands to the uploader."""
    import os

    seen: list[int] = []
    hand_over = writer._hand_over_file

    def record(results):
        for relative in {result.storage_data.relative_path for result in results}:
            seen.append(os.stat(os.path.join(str(writer.path), relative)).st_ino)
        return hand_over(results)

    writer._hand_over_file = record
    return seen


def _load(store, tmp_path, checkpoint_id, like):
    got = {k: torch.zeros_like(v) for k, v in like.items()}
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id=checkpoint_id, storage_reader=reader)
    return got


def test_a_landed_shard_file_is_written_over_by_the_next_save_and_cut_to_its_size(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store)
    inodes = _shard_inodes(writer)
    states = {
        'r/s1': {'w': torch.arange(50_000.0)},
        'r/s2': {'w': torch.arange(20_000.0) * 3},  # smaller: the spare is cut
        'r/s3': {'w': torch.arange(90_000.0) * 7},
    }  # larger: the spare grows
    for cid, sd in states.items():
        dcp.save(sd, checkpoint_id=cid, storage_writer=writer)
        assert writer.wait_for_commits(30)
        writer.uploader.wait_for_uploads(30)  # the staging link is gone once the upload landed
    assert len(inodes) == 3 and len(set(inodes)) == 1, inodes  # one file, written over twice
    spares = tmp_path / 'staging'
    assert len(writer._spare_pool.spares) == 1 and list(spares.rglob('spares/*'))
    writer.close()
    assert not list(spares.rglob('spares'))  # close deletes the spares
    for cid, sd in states.items():
        assert torch.equal(_load(store, tmp_path, cid, sd)['w'], sd['w']), cid


def test_a_spare_whose_upload_has_not_landed_is_never_written_over(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='/s1/')  # the first save's upload waits
    writer = writer_for(tmp_path, store)
    inodes = _shard_inodes(writer)
    first, second = {'w': torch.arange(30_000.0)}, {'w': -torch.arange(30_000.0)}
    dcp.save(first, checkpoint_id='r/s1', storage_writer=writer)
    dcp.save(second, checkpoint_id='r/s2', storage_writer=writer)  # s1's file is still staged: a new file
    store.gate.set()
    writer.close()
    assert len(set(inodes)) == 2
    assert torch.equal(_load(store, tmp_path, 'r/s1', first)['w'], first['w'])
    assert torch.equal(_load(store, tmp_path, 'r/s2', second)['w'], second['w'])


@pytest.mark.parametrize('kwargs', [{'recycle_files': False}, {'max_staged_bytes': 1}])  # the bound caps the spares
def test_recycling_off_writes_every_shard_into_a_new_file(tmp_path, kwargs):
    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store, **kwargs)
    for step in (1, 2):
        dcp.save({'w': torch.arange(10_000.0) * step}, checkpoint_id=f'r/s{step}', storage_writer=writer)
        assert writer.wait_for_commits(30)
    assert writer._spare_pool.spares == [] and not list((tmp_path / 'staging').rglob('spares'))
    writer.close()


def test_drain_deletes_the_local_writes_of_dead_writers_only(tmp_path):
    import os
    import subprocess

    from dist_logging.checkpoint.drain import finish_commits

    gone = subprocess.Popen(['true'])
    gone.wait()
    writes = tmp_path / 'staging' / 'checkpoint-writes' / 'rank3'
    dead, alive = writes / f'{gone.pid}-0badf00d', writes / f'{os.getpid()}-0000beef'
    for folder in (dead / 'spares', alive / 'spares'):
        folder.mkdir(parents=True)
        (folder / 'a1b2c3d4e5f6').write_bytes(b'x' * 100)
    finish_commits(str(tmp_path / 'staging'))
    assert not dead.exists() and (alive / 'spares' / 'a1b2c3d4e5f6').exists()


@pytest.mark.parametrize('mib_per_rank,files', [(1, 4), (256, 4), (512, 8), (520, 9), (4096, 16)])
def test_async_saves_write_one_file_per_64_mib_from_4_to_16(mib_per_rank, files):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    from dist_logging.checkpoint.writer import _async_files

    def tensor(name, numel):
        size = torch.Size([numel])
        return WriteItem(
            index=MetadataIndex(name),
            type=WriteItemType.TENSOR,
            tensor_data=TensorWriteData(
                chunk=ChunkStorageMetadata(torch.Size([0]), size),
                properties=TensorProperties(dtype=torch.float32),
                size=size,
            ),
        )

    quarter = mib_per_rank * 1024 * 1024 // 4 // 4  # float32 elements of a quarter of the bytes
    items = [tensor(f't{i}', quarter) for i in range(4)]
    items.append(WriteItem(index=MetadataIndex('step'), type=WriteItemType.BYTE_IO))  # no tensor data: not counted
    assert _async_files(SavePlan(items)) == files


def test_async_saves_stage_into_the_buffers_kept_from_the_previous_save(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store)
    staged = []
    stage = writer.stage
    writer.stage = lambda sd: staged.append(stage(sd)) or staged[-1]
    saves = {
        'r/s1': state(1),
        'r/s2': state(2),
        'r/s3': {'model': {'w': torch.arange(1200.0), 'b': torch.full((7, 3), 3.0)}, 'step': 3},
    }  # new shape
    for cid, sd in saves.items():
        dcp.async_save(sd, checkpoint_id=cid, storage_writer=writer).result(30)
    first, second, third = (s['model']['w'] for s in staged)
    assert second is first and third is not first  # the same buffers, until the layout changed
    assert [s['step'] for s in staged] == [1, 2, 3]  # plain values are the state's own, not the first save's
    writer.close()
    for cid, sd in saves.items():
        got = {'model': {'w': torch.zeros_like(sd['model']['w']), 'b': torch.zeros(7, 3)}, 'step': -1}
        with CheckpointReader(store) as reader:
            dcp.load(got, checkpoint_id=cid, storage_reader=reader)
        assert same(got, sd), cid


def test_staging_buffers_are_not_handed_out_while_the_previous_save_may_read_them(tmp_path):
    writer = writer_for(tmp_path, RecordingStore(str(tmp_path / 'bucket')))
    first = writer.stage(state(1))
    with pytest.warns(RuntimeWarning, match='still be reading its staged copy'):
        second = writer.stage(state(2))  # no save claimed the first copy yet: it may be about to run
    assert second['model']['w'] is not first['model']['w']
    saving, done = threading.Event(), threading.Event()

    def save_thread() -> None:  # what torch's executor thread does: reset claims the copy, then the write reads it
        writer._staging_buffers.claim()
        saving.set()
        done.wait(30)

    thread = threading.Thread(target=save_thread)
    thread.start()
    saving.wait(30)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        during = writer.stage(state(3))
    assert during['model']['w'] is not first['model']['w'] and torch.equal(first['model']['w'], state(1)['model']['w'])
    done.set()
    thread.join(30)
    after = writer.stage(state(4))  # the save's thread ended: the buffers are free again
    assert after['model']['w'] is first['model']['w'] and torch.equal(after['model']['w'], state(4)['model']['w'])
    writer.close()


def test_cache_staged_state_dict_false_stages_a_new_copy_every_save(tmp_path):
    writer = writer_for(tmp_path, RecordingStore(str(tmp_path / 'bucket')), cache_staged_state_dict=False)
    copies = [writer.stage(state(n)) for n in range(2)]
    assert copies[0]['model']['w'] is not copies[1]['model']['w']
    writer.close()


def test_staging_buffers_fall_back_to_pageable_memory_when_pinning_fails(tmp_path, monkeypatch):
    from dist_logging.checkpoint import _state_copy as _staging

    monkeypatch.setattr(_staging, '_accelerator_available', lambda: True)  # here pin_memory() raises: no device
    writer = writer_for(tmp_path, RecordingStore(str(tmp_path / 'bucket')))
    with pytest.warns(RuntimeWarning, match='could not pin the staging buffers'):
        first = writer.stage(state(1))
    writer._staging_buffers.claim()  # the save of that copy ran on this thread and is over
    second = writer.stage(state(2))
    assert second['model']['w'] is first['model']['w'] and torch.equal(second['model']['w'], state(2)['model']['w'])
    writer.close()
