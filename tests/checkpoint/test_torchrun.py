"""CheckpointWriter / CheckpointReader under real torchrun (gloo, CPU): save, restart, resume bit-exactly."""

from __future__ import annotations

import os

import pytest

from dist_logging.checkpoint import latest_checkpoint, list_checkpoints
from dist_logging.object_store import LocalObjectStore
from _launch import launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_two_ranks_save_restart_load_bit_exact(tmp_path):
    bucket = str(tmp_path / 'bucket')
    plan = {'root': str(tmp_path), 'bucket': bucket, 'steps': [1, 2, 3], 'keep_last': 2}
    first = launch(tmp_path, 2, plan, name='first')
    assert sorted(first) == [0, 1]
    assert all(out['latest'] is None and out['close_error'] is None for out in first.values())
    for out in first.values():  # both moments are measured for every save (commit on the coordinator)
        assert [t['id'] for t in out['timings']] == [f'run/ckpt/step{s}' for s in (1, 2, 3)]
        assert all(t['local_s'] > 0 and t['bytes'] > 0 for t in out['timings'])
    assert all(t['commit_s'] >= t['local_s'] for t in first[0]['timings'])
    assert list_checkpoints(bucket, 'run/ckpt') == ['run/ckpt/step2', 'run/ckpt/step3']  # keep_last=2
    names = [info.name for info in LocalObjectStore(bucket).list('run/ckpt/step3/')]
    shards = [n for n in names if n.endswith('.distcp')]
    assert len(shards) == 2 and {n.split('/')[-1][:4] for n in shards} == {'__0_', '__1_'}  # one per rank
    assert os.listdir(tmp_path / 'staging') == []  # every upload landed, every commit done: nothing left
    step3 = {info.name: info.size for info in LocalObjectStore(bucket).list('run/ckpt/step3/')}

    second = launch(tmp_path, 2, {**plan, 'steps': [4]}, name='second')
    for out in second.values():
        assert out['latest'] == 'run/ckpt/step3' and out['exact'] is True and out['loaded_step'] == 3
    # every file was downloaded once for the node: the marker and .metadata (needed by both ranks) once,
    # each rank's shard by the rank that reads it
    assert sum(out['downloaded_bytes'] for out in second.values()) == sum(step3.values())
    assert list_checkpoints(bucket, 'run/ckpt') == ['run/ckpt/step3', 'run/ckpt/step4']
    assert latest_checkpoint(bucket, 'run/ckpt') == 'run/ckpt/step4'
