"""What torch's FileSystemWriter takes, as CheckpointWriter takes it (issue 34): overwrite=False, stream
transforms (compressed shards commit, resume and load), torch's other arguments or a ValueError saying why;
the bucket checked at construction; a failed save leaves nothing; files_per_rank by kind of save."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultSavePlanner
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.filesystem import SerializationFormat
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint, writer as writer_module
from dist_logging.object_store.local import LocalObjectStore
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def _writer(tmp_path, **kwargs) -> CheckpointWriter:
    return CheckpointWriter(str(tmp_path / 'bucket'), upload_staging_folder=str(tmp_path / 'st'), **kwargs)


def _load(tmp_path, cid: str, like: dict) -> dict:
    with CheckpointReader(str(tmp_path / 'bucket')) as reader:
        dcp.load(like, checkpoint_id=cid, storage_reader=reader, no_dist=True)
    return like


def _objects(tmp_path) -> list[str]:
    return sorted(info.name for info in LocalObjectStore(str(tmp_path / 'bucket')).list(''))


def _local_files(tmp_path) -> list[str]:
    """Every file left under the staging folder's checkpoint-writes/ (shards of saves not handed over)."""
    root = tmp_path / 'st' / 'checkpoint-writes'
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


def test_overwrite_false_refuses_a_committed_id_naming_it_before_any_shard_is_written(tmp_path):
    with _writer(tmp_path) as writer:
        dcp.save({'t': torch.ones(4)}, checkpoint_id='run/step1', storage_writer=writer, no_dist=True)
    before = _objects(tmp_path)
    with _writer(tmp_path, overwrite=False) as writer:
        with pytest.raises(CheckpointException, match=r"Checkpoint already exists.*'run/step1' is committed in"):
            dcp.save({'t': torch.zeros(4)}, checkpoint_id='run/step1', storage_writer=writer, no_dist=True)
        # a new id is fine with overwrite=False
        dcp.save({'t': torch.zeros(4)}, checkpoint_id='run/step2', storage_writer=writer, no_dist=True)
        writer.wait_for_commits()
        # an id waiting for its commit in this writer counts as existing too
        assert writer.uploader.wait_for_uploads(30)
        with pytest.raises(CheckpointException, match='Checkpoint already exists'):
            dcp.save({'t': torch.zeros(4)}, checkpoint_id='run/step2', storage_writer=writer, no_dist=True)
    assert [n for n in _objects(tmp_path) if n.startswith('run/step1/')] == [
        n for n in before if n.startswith('run/step1/')
    ]
    assert _local_files(tmp_path) == []
    assert torch.equal(_load(tmp_path, 'run/step1', {'t': torch.zeros(4)})['t'], torch.ones(4))


def test_compressed_shards_commit_resume_and_load(tmp_path):
    pytest.importorskip('zstandard')
    state = {'zeros': torch.zeros(1 << 16), 'ramp': torch.arange(1 << 14, dtype=torch.float32)}
    with _writer(tmp_path, _extensions=[ZStandard()]) as writer:
        dcp.save(state, checkpoint_id='run/z', storage_writer=writer, no_dist=True)
    with _writer(tmp_path) as writer:
        dcp.save(state, checkpoint_id='run/plain', storage_writer=writer, no_dist=True)
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    sizes = {info.name.split('/')[1]: info.size for info in store.list('run/') if info.name.endswith('.distcp')}
    assert sizes['z'] * 4 < sizes['plain']  # compressed (zeros to nearly nothing; the ramp about 2:1)
    got = _load(tmp_path, 'run/z', {'zeros': torch.ones(1 << 16), 'ramp': torch.zeros(1 << 14)})
    assert torch.equal(got['zeros'], state['zeros']) and torch.equal(got['ramp'], state['ramp'])

    # resume: a coordinator that dies after handing the save over (uploads queued, commit intent written)
    # leaves a compressed checkpoint the next writer on the same staging folder commits
    writer = _writer(tmp_path, _extensions=[ZStandard()])
    original = writer_module.Committer.submit
    writer_module.Committer.submit = lambda self, intent, **kw: None  # the committer never sees it
    try:
        dcp.save(state, checkpoint_id='run/z2', storage_writer=writer, no_dist=True)
    finally:
        writer_module.Committer.submit = original
    writer.close()
    assert latest_checkpoint(str(tmp_path / 'bucket'), 'run') != 'run/z2'
    with _writer(tmp_path) as again:
        dcp.save({'x': torch.ones(1)}, checkpoint_id='other/a', storage_writer=again, no_dist=True)
    assert latest_checkpoint(str(tmp_path / 'bucket'), 'run') == 'run/z2'
    got = _load(tmp_path, 'run/z2', {'zeros': torch.ones(1 << 16), 'ramp': torch.zeros(1 << 14)})
    assert torch.equal(got['ramp'], state['ramp'])


def test_torch_arguments_are_taken_or_refused_saying_why(tmp_path):
    with _writer(
        tmp_path, single_file_per_rank=False, per_thread_copy_ahead=0, sync_files=True, thread_count=2
    ) as writer:
        assert (writer.single_file_per_rank, writer.per_thread_copy_ahead, writer.thread_count) == (False, 0, 2)
        dcp.save(
            {'a': torch.ones(3), 'b': torch.ones(5), 'c': torch.ones(7)},
            checkpoint_id='run/each',
            storage_writer=writer,
            no_dist=True,
        )
    assert len([n for n in _objects(tmp_path) if n.endswith('.distcp')]) == 3  # one file per item, as torch
    with pytest.raises(ValueError, match='SAFETENSORS.*FileSystemReader'):
        _writer(tmp_path, serialization_format=SerializationFormat.SAFETENSORS)
    with pytest.raises(ValueError, match='_extensions must be torch StreamTransformExtension'):
        _writer(tmp_path, _extensions=['zstd'])
    with pytest.raises(ValueError, match='overwrite must be True or False'):
        _writer(tmp_path, overwrite='no')


def test_a_bucket_that_cannot_be_written_fails_at_construction_naming_it(s3_bucket, tmp_path):
    endpoint, _ = s3_bucket
    with pytest.raises(RuntimeError, match=r"bucket s3://no-such-bucket-x1/ckpt cannot be written \(.*NoSuchBucket"):
        CheckpointWriter(
            's3://no-such-bucket-x1/ckpt',
            backend_kwargs={'endpoint_url': endpoint},
            upload_staging_folder=str(tmp_path / 'st1'),
        )
    writer = CheckpointWriter(
        's3://no-such-bucket-x1/ckpt',
        backend_kwargs={'endpoint_url': endpoint},
        upload_staging_folder=str(tmp_path / 'st2'),
        validate_bucket=False,
    )  # offline start
    writer.close()


class _FailingPlanner(DefaultSavePlanner):
    def create_local_plan(self):
        raise RuntimeError('planning failed')


@pytest.mark.parametrize('where', ['planning', 'writing', 'finish'])
def test_a_failed_save_leaves_nothing(tmp_path, where, monkeypatch):
    state, planner = {'t': torch.randn(1000)}, None
    if where == 'planning':
        planner = _FailingPlanner()
    elif where == 'writing':
        state['bad'] = lambda: 0  # torch cannot pickle it: the shard file is half written when it fails
    else:

        def failing_write_intent(*args, **kwargs):
            raise OSError(28, 'No space left on device (injected)')

        monkeypatch.setattr(writer_module, 'write_intent', failing_write_intent)
    with _writer(tmp_path, keep_last=1) as writer:
        with pytest.raises(CheckpointException):
            dcp.save(state, checkpoint_id='run/step1', storage_writer=writer, planner=planner, no_dist=True)
        if where == 'writing':
            assert _local_files(tmp_path) == []  # removed when the save failed, not only at close
    assert _local_files(tmp_path) == []
    intents = tmp_path / 'st' / 'checkpoint-commits'
    assert not (intents.exists() and os.listdir(intents))
    assert latest_checkpoint(str(tmp_path / 'bucket'), 'run') is None


def test_files_per_rank_follows_the_kind_of_save_not_the_thread(tmp_path):
    state = {f't{i}': torch.randn(64) for i in range(8)}

    def shard_files(cid):
        return len([n for n in _objects(tmp_path) if n.startswith(cid + '/') and n.endswith('.distcp')])

    with _writer(tmp_path) as writer:
        worker = threading.Thread(
            target=lambda: dcp.save(state, checkpoint_id='run/blocking', storage_writer=writer, no_dist=True)
        )
        worker.start()
        worker.join(60)
        future = dcp.async_save(
            state,
            checkpoint_id='run/async',
            storage_writer=writer,
            async_checkpointer_type=AsyncCheckpointerType.THREAD,
        )
        future.result(60)
    assert shard_files('run/blocking') == 1  # dcp.save from another thread: still one file
    assert shard_files('run/async') == writer_module.ASYNC_FILES_PER_RANK  # async_save's thread: the split
