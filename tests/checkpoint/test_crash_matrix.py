"""The crash matrix under real torchrun (gloo, CPU): SIGKILL at each point of a save, then restart (or
`dist-logging drain`): latest_checkpoint is always a committed checkpoint that dcp.load reads bit-exactly.

The launches are chained to keep the suite short: each launch first resumes from the latest committed
checkpoint (checking it bit-exactly against the state saved at that step), then saves on (re-saving the
id a crash left uncommitted, over its leftovers) and dies at the next kill point. Consecutive launches
with nothing to do between them run as the attempts of one torchrun job with ``--max_restarts``: torchrun
restarts the killed worker group, which resumes from the bucket as a new job would, and the next attempt's
resume checks what the killed one left (the latest committed checkpoint, exactly), as the test process
did between separate launches; torchrun starts once per chain segment, not once per launch. A local
bucket is drained between the commit kill and the next launch, so its chains are two jobs (write, local,
upload, commit as one; retention, and for L6 the clean run, as the other), S3 chains one job of five
attempts. What each chain covers:

2 ranks, local bucket (keep_last=2):
  L1 every rank killed in the middle of writing a shard file (step 2)            -> latest step1
  L2 one rank (1) killed after its first shard file was queued, before the second -> latest step2
  L3 every rank killed with shard uploads in flight (step 4)                      -> latest step3 or step4
  L4 the coordinator killed after every shard landed, before the commit (step 5);
     `dist-logging drain` then finishes the commit                                -> latest step5
  L5 the coordinator killed during retention's deletion (after the marker of step5 went)
                                                                                  -> latest step7; step5 invisible
  L6 a clean run: resumes step7 (each file fetched once for the node), saves step8 (dcp.save), step9
     (dcp.async_save); both moments timed on every save; staging left empty
Seven more chains (test_crash_matrix_chain): 2 ranks on S3 (moto), 4 ranks on a local bucket and on S3,
  each twice, and 2 ranks on a local bucket once more. Each runs the same five launches (write at step 2,
  local 3, upload 4, commit 5, retention 7); who is killed at each point is given by CHAINS: chain A and
  chain B of a (ranks, bucket) pair are complements, so every (point, every rank / one rank) cell runs
  with 2 and with 4 ranks, on a local bucket and on S3: all 40 cells of the matrix. After the commit
  kill a local bucket is drained; on S3 the next job's coordinator commits step5 itself. Then the test
  process loads step7 (resharded to one process) and checks it bit-exactly.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_logging.checkpoint import CheckpointReader, latest_checkpoint, list_checkpoints
from dist_logging.object_store import LocalObjectStore, store_from_uri
from _launch import launch_attempts
from _states import full_state, zeros_like_state
from s3_server import aws_credentials, s3_bucket, _moto_session  # noqa: F401 - fixtures
from torchrun_helper import REPO_ROOT

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings('ignore:torch.distributed is disabled'),
]


def step_of(cid):
    return int(cid.rsplit('step', 1)[1])


def check_resumed(outputs, world, allowed):
    """Every rank found the same committed latest checkpoint, one of ``allowed``, and read it bit-exactly."""
    assert sorted(outputs) == list(range(world)), outputs
    latest = {out['latest'] for out in outputs.values()}
    assert len(latest) == 1, latest
    cid = latest.pop()
    assert cid is not None and step_of(cid) in allowed, (cid, allowed)
    assert all(out['exact'] is True and out['loaded_step'] == step_of(cid) for out in outputs.values())
    return cid


def drain_cli(staging):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, '-m', 'dist_logging', 'drain', str(staging), '--no-progress'],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_crash_matrix_two_ranks_local_bucket(tmp_path):
    bucket = str(tmp_path / 'bucket')
    # rank 0 waits for each commit before the next save, so what a kill can lose is exactly the save it hits
    base = {'root': str(tmp_path), 'bucket': bucket, 'keep_last': 2, 'wait_commits': True}

    def kill(point, step, ranks='all'):
        return {'point': point, 'step': step, 'ranks': ranks}

    # one job, four attempts: each attempt's resume sees exactly what the killed attempt before it left
    outs = launch_attempts(
        tmp_path,
        2,
        [
            {**base, 'steps': [1, 2], 'kill': kill('write', 2)},
            {**base, 'steps': [2, 3], 'kill': kill('local', 3, [1])},
            {**base, 'steps': [3, 4], 'kill': kill('upload', 4)},
            {**base, 'steps': [4, 5], 'kill': kill('commit', 5, [0])},
        ],
    )
    check_resumed(outs[1], 2, {1})  # the write kill lost step2
    check_resumed(outs[2], 2, {2})  # the kill after the local write of step3 came after step2's commit
    check_resumed(outs[3], 2, {3})  # step4's shards did not all land
    assert latest_checkpoint(bucket, 'run/ckpt') in ('run/ckpt/step4',)  # every shard of 5 landed, not committed
    drained = drain_cli(tmp_path / 'staging')
    assert 'committed checkpoint run/ckpt/step5' in drained.stdout, drained.stdout + drained.stderr
    assert latest_checkpoint(bucket, 'run/ckpt') == 'run/ckpt/step5'  # drain finished the commit

    # one job, two attempts: killed during retention, then a clean run; the clean attempt's rank 0 lists the
    # bucket before resuming (what the test process listed between the two launches)
    retention, out = launch_attempts(
        tmp_path,
        2,
        [
            {**base, 'steps': [6, 7], 'kill': kill('retention', 7, [0])},
            {**base, 'steps': [8, 9], 'report_bucket': True},
        ],
        name='final',
    )
    check_resumed(retention, 2, {5})
    assert out[0]['latest'] == 'run/ckpt/step7'
    assert out[0]['listed'] == ['run/ckpt/step6', 'run/ckpt/step7']  # step5 half-deleted: invisible

    step7 = out[0]['latest_sizes']
    assert sorted(step7) and all(name.startswith('run/ckpt/step7/') for name in step7), step7
    check_resumed(out, 2, {7})
    # ranged reads into memory: each rank reads the marker and the .metadata, and the chunks of the shards its
    # plan needs (every shard byte is needed by some rank; small files are read whole by each rank needing them)
    small = sum(size for name, size in step7.items() if not name.endswith('.distcp'))
    read = sum(o['downloaded_bytes'] for o in out.values())
    assert sum(step7.values()) + small <= read <= 2 * sum(step7.values()), (read, step7)
    assert all(o['close_error'] is None for o in out.values())
    for o in out.values():  # both moments are measured for every save (the commit on the coordinator)
        assert [t['id'] for t in o['timings']] == ['run/ckpt/step8', 'run/ckpt/step9']
        assert all(t['local_s'] > 0 and t['bytes'] > 0 for t in o['timings'])
    assert all(t['commit_s'] >= t['local_s'] for t in out[0]['timings'])
    assert list_checkpoints(bucket, 'run/ckpt') == ['run/ckpt/step8', 'run/ckpt/step9']
    shards = [i.name for i in LocalObjectStore(bucket).list('run/ckpt/step9/') if i.name.endswith('.distcp')]
    per_rank = collections.Counter(n.split('/')[-1][:4] for n in shards)
    assert per_rank == {'__0_': 2, '__1_': 2}  # the scenario's files_per_rank=2
    # every upload landed, every commit done (.dist_logging-<host>: the job's machine state, e.g. commit scratch)
    assert [e for e in os.listdir(tmp_path / 'staging') if not e.startswith('.dist_logging-')] == []


# Who is killed at each point, per chain. Chains A and B of each (ranks, bucket) are complements:
# together they run every (point, every-rank/one-rank) cell with 2 and with 4 ranks, on a local bucket and
# on S3. "one" kills the coordinator (0) mid-write and before the commit and during retention (only it
# commits and deletes), the last rank after its local write, rank world // 2 mid-upload.
POINTS = ('write', 'local', 'upload', 'commit', 'retention')
CHAIN_A = {  # (ranks, bucket): who at write, local, upload, commit, retention
    (2, 'local'): ('all', 'one', 'all', 'one', 'one'),  # test_crash_matrix_two_ranks_local_bucket
    (2, 's3'): ('one', 'all', 'one', 'all', 'all'),
    (4, 'local'): ('one', 'all', 'one', 'all', 'all'),
    (4, 's3'): ('all', 'one', 'all', 'one', 'one'),
}
CHAINS = {
    **{(*key, 'A'): who for key, who in CHAIN_A.items()},
    **{(*key, 'B'): tuple('one' if w == 'all' else 'all' for w in who) for key, who in CHAIN_A.items()},
}
CHAIN_PARAMS = [key for key in sorted(CHAINS) if key != (2, 'local', 'A')]


@pytest.mark.parametrize('world, kind, variant', CHAIN_PARAMS, ids=[f'{w}-{k}-{v}' for w, k, v in CHAIN_PARAMS])
def test_crash_matrix_chain(tmp_path, world, kind, variant, request):
    """One launch per kill point, each resuming bit-exactly from the latest; S3 chains recover the
    uncommitted checkpoint by restarting the job, local ones by `dist-logging drain`."""
    if kind == 's3':
        endpoint, name = request.getfixturevalue('s3_bucket')
        bucket, kwargs = f's3://{name}/jobs', {'endpoint_url': endpoint}
    else:
        bucket, kwargs = str(tmp_path / 'bucket'), None
    base = {'root': str(tmp_path), 'bucket': bucket, 'backend_kwargs': kwargs, 'keep_last': 2, 'wait_commits': True}
    one_rank = {'write': [0], 'local': [world - 1], 'upload': [world // 2], 'commit': [0], 'retention': [0]}
    who = dict(zip(POINTS, CHAINS[(world, kind, variant)]))

    def kill(point, step):
        return {'point': point, 'step': step, 'ranks': 'all' if who[point] == 'all' else one_rank[point]}

    def latest():
        return latest_checkpoint(bucket, 'run/ckpt', backend_kwargs=kwargs)

    plans = [
        {**base, 'steps': [1, 2], 'kill': kill('write', 2)},
        {**base, 'steps': [2, 3], 'kill': kill('local', 3)},
        {**base, 'steps': [3, 4], 'kill': kill('upload', 4)},
        {**base, 'steps': [4, 5], 'kill': kill('commit', 5)},
        {**base, 'steps': [6, 7], 'kill': kill('retention', 7)},
    ]
    # local: one job up to the commit kill, the drain, then the retention launch; S3: one job of five attempts
    outs = launch_attempts(tmp_path, world, plans[:4] if kind == 'local' else plans)
    check_resumed(outs[1], world, {1})  # the write kill lost step2
    check_resumed(outs[2], world, {2})  # the local kill came after step2's commit
    check_resumed(outs[3], world, {3})  # the killed rank's shard of step4 never got out
    if kind == 'local':
        assert latest() == 'run/ckpt/step4'  # every shard of step5 landed, the commit did not happen
        drained = drain_cli(tmp_path / 'staging')
        assert 'committed checkpoint run/ckpt/step5' in drained.stdout, drained.stdout + drained.stderr
        assert latest() == 'run/ckpt/step5'
        (out,) = launch_attempts(tmp_path, world, plans[4:], name='retention')
        check_resumed(out, world, {5})
    else:
        # every shard of step5 landed, the commit did not happen (the retention attempt resumed from step4);
        # the restarted coordinator commits step5 from its intent before step6's commit
        check_resumed(outs[4], world, {4})
    assert latest() == 'run/ckpt/step7'
    assert list_checkpoints(bucket, 'run/ckpt', backend_kwargs=kwargs) == ['run/ckpt/step6', 'run/ckpt/step7']
    # retention deletes committed checkpoints only, oldest first: step4 is gone and step5 is the half-deleted
    # one, so step5 was committed (by drain, or on S3 by the restarted coordinator)
    store = store_from_uri(bucket, kwargs)
    assert list(store.list('run/ckpt/step4/')) == []
    assert list(store.list('run/ckpt/step5/')) != []

    # No further launch: the test process loads the latest checkpoint, resharded from the job's ranks into
    # one process's whole tensors, and compares every tensor with the state saved at that step.
    got = zeros_like_state(world)
    with CheckpointReader(bucket, backend_kwargs=kwargs) as reader:
        dcp.load(got, checkpoint_id='run/ckpt/step7', storage_reader=reader)
    want = full_state(world, 7)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    shards = [i.name for i in store.list('run/ckpt/step7/') if i.name.endswith('.distcp')]
    per_rank = collections.Counter(n.split('/')[-1][:4] for n in shards)
    assert per_rank == {f'__{r}_': 2 for r in range(world)}  # the scenario's files_per_rank=2
