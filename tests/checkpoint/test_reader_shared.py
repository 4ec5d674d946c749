"""CheckpointReader's node sharing: ranks of a node that read the same items share one download in shared memory.

Replicated and mixed states on 2 and 4 ranks load bit-exact with each replicated byte read from the bucket once
per node; an owner that fails, stalls or is killed leaves its node-mates to read its items themselves; nothing of
ours stays in /dev/shm after the job, and what a killed owner left is swept by the next reader.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Optional

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter
from dist_logging.checkpoint.reader import sweep_shared_memory
from dist_logging.object_store import LocalObjectStore
from s3_server import aws_credentials, s3_bucket, _moto_session  # noqa: F401 - fixtures
from torchrun_helper import REPO_ROOT, free_port, read_rank_outputs, run_torchrun, write_script

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings('ignore:torch.distributed is disabled')]
MiB = 1024 * 1024
SHM = pathlib.Path('/dev/shm')

# Every rank saves (the replicated tensors are written once, by DCP's dedup) then loads, sharing and not.
SCENARIO = '''
    import datetime, json, logging, os, time, torch, torch.distributed as tdist, torch.distributed.checkpoint as dcp
    from dist_logging.checkpoint import CheckpointReader, CheckpointWriter
    import dist_logging.checkpoint.reader as reader_module
    from torchrun_helper import dump_rank_output

    tdist.init_process_group('gloo', timeout=datetime.timedelta(seconds=40))
    rank, world = tdist.get_rank(), tdist.get_world_size()
    root, mode, fault = os.environ['ROOT'], os.environ['MODE'], os.environ.get('FAULT', '')
    uri, kwargs = os.environ.get('URI') or root + '/bucket', json.loads(os.environ.get('KWARGS') or 'null')
    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger('dist_logging').addHandler(Keep(logging.WARNING))

    def state(r):
        g = torch.Generator().manual_seed(7)
        sd = {'emb': torch.randn(700_000, generator=g), 'bias': torch.randn(1000, generator=g),
              'ids': torch.arange(300_000, dtype=torch.int64), 'half': torch.randn(5, 7, generator=g).half(),
              'step': 11}
        if mode == 'mixed':
            mine = torch.Generator().manual_seed(100 + r)
            sd |= {f'r{r}.w': torch.randn(200_000, generator=mine),
                   f'r{r}.b': torch.randint(0, 9, (77,), generator=mine)}
        return sd

    def blank(sd):
        return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for k, v in sd.items()}

    def exact(got, want):
        return all(torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v for k, v in want.items())

    if not os.environ.get('SKIP_SAVE'):
        writer = CheckpointWriter(uri, upload_staging_folder=f'{root}/staging/r{rank}', run_name='t',
                                  **({'backend_kwargs': kwargs} if kwargs else {}))
        dcp.save(state(rank), checkpoint_id='run/step1', storage_writer=writer)
        writer.close()
        tdist.barrier()
    if fault and rank == 1:
        original = reader_module.SharedLoad._fill

        def broken(self, segments):
            if fault == 'fail':
                raise RuntimeError('injected: the owner fails before publishing')
            if fault == 'stall':
                time.sleep(6)  # its node-mates give up after their timeout and read its items themselves
            if fault == 'kill':
                os.kill(os.getpid(), 9)  # its segments stay, empty, named by its pid
            return original(self, segments)

        def full(*args):
            raise OSError(28, 'No space left on device (injected)')

        reader_module.SharedLoad._fill = broken
        if fault == 'nospace':  # /dev/shm full: its segments cannot be made
            os.posix_fallocate = full
    got = blank(state(rank))
    reader = CheckpointReader(uri, backend_kwargs=kwargs, max_in_flight=3, part_bytes=1024 * 1024,
                              share_node_reads=True, timeout=float(os.environ.get('TIMEOUT', '60')))  # never closed
    error = None
    try:
        dcp.load(got, checkpoint_id='run/step1', storage_reader=reader)
    except BaseException as exc:  # an owner that failed fails its load, and so dcp.load on every rank
        # (torch's CheckpointException is a BaseException; the tensors are loaded, 'step' is not set)
        error = repr(exc)[:2000]
    tensors = all(torch.equal(got[k], v) for k, v in state(rank).items() if isinstance(v, torch.Tensor))
    out = {'exact': exact(got, state(rank)), 'tensors': tensors, 'read': reader.downloaded_bytes,
           'shared': reader.shared_bytes, 'direct': reader.direct_bytes, 'pid': os.getpid(), 'error': error,
           'warnings': warnings}
    if fault == 'kill':
        dump_rank_output(out)
        os._exit(0)  # its peer is gone: no collective would return
    tdist.barrier()
    out['left'] = sorted(n for n in os.listdir('/dev/shm') if n.startswith('dist_logging-ckpt-') and
                         f'-{os.getpid()}-' in n)
    plain = blank(state(rank))
    unshared = CheckpointReader(uri, backend_kwargs=kwargs, max_in_flight=3, part_bytes=1024 * 1024,
                                share_node_reads=False)
    dcp.load(plain, checkpoint_id='run/step1', storage_reader=unshared)
    out |= {'exact_unshared': exact(plain, state(rank)), 'read_unshared': unshared.downloaded_bytes}
    dump_rank_output(out)
    tdist.barrier()
    tdist.destroy_process_group()
'''


def ours(pids) -> list[str]:
    """Our segments in /dev/shm owned by any of ``pids``."""
    return sorted(
        name
        for name in os.listdir(SHM)
        if name.startswith('dist_logging-ckpt-') and any(f'-{pid}-' in name for pid in pids)
    )


def sizes(root: pathlib.Path, s3: Optional[tuple[str, str]] = None) -> tuple[int, int]:
    """The checkpoint's shard bytes, and its metadata plus commit marker bytes (local bucket, or S3)."""
    if s3 is None:
        folder = root / 'bucket/run/step1'
        found = {p.name: p.stat().st_size for p in folder.iterdir()}
    else:
        import boto3

        client = boto3.client('s3', endpoint_url=s3[0])
        listing = client.list_objects_v2(Bucket=s3[1], Prefix='run/step1/')['Contents']
        found = {item['Key'].rsplit('/', 1)[1]: int(item['Size']) for item in listing}
    shards = sum(size for name, size in found.items() if name.endswith('.distcp'))
    other = found['.metadata'] + next(size for name, size in found.items() if name.startswith('.committed-'))
    return shards, other


def launch(
    tmp_path: pathlib.Path,
    world: int,
    mode: str,
    fault: str = '',
    timeout: str = '60',
    s3: Optional[tuple[str, str]] = None,
) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = write_script(tmp_path, SCENARIO)
    env = {'ROOT': str(tmp_path), 'MODE': mode, 'FAULT': fault, 'TIMEOUT': timeout}
    if s3 is not None:
        env |= {'URI': f's3://{s3[1]}', 'KWARGS': json.dumps({'endpoint_url': s3[0]})}
    run_torchrun(script, world, tmp_path / 'out', env=env, timeout=100)
    out = read_rank_outputs(tmp_path / 'out')
    assert sorted(out) == list(range(world)), out
    return out


@pytest.mark.parametrize('world, kind', [(2, 'local'), (4, 'local'), (2, 's3')])
def test_a_replicated_state_is_read_once_per_node_and_loads_bit_exact(tmp_path, world, kind, request):
    s3 = request.getfixturevalue('s3_bucket') if kind == 's3' else None
    out = launch(tmp_path, world, 'replicated', s3=s3)
    assert all(o['exact'] and o['exact_unshared'] and o['error'] is None for o in out.values()), out
    shards, other = sizes(tmp_path, s3)
    # Shared: the node read each saved byte once (every rank reads the metadata and the marker itself); a chunk
    # may be read twice where two segments meet (here: one segment per file, none meet).
    assert sum(o['read'] for o in out.values()) == shards + world * other
    # Not shared: every rank reads the whole checkpoint.
    assert all(o['read_unshared'] == shards + other for o in out.values())
    # Every rank but an item's owner took it from shared memory: (world - 1) copies of the items, spread over ranks.
    assert sum(o['shared'] for o in out.values()) == (world - 1) * shards
    assert all(o['left'] == [] for o in out.values()), out  # unlinked by the last reader, during the load
    assert ours(o['pid'] for o in out.values()) == []
    assert sum(o['direct'] for o in out.values()) > world * 4 * 900_000  # plain tensors copied straight in


def test_a_mixed_state_shares_the_replicated_items_and_reads_the_rest_per_rank(tmp_path):
    out = launch(tmp_path, 2, 'mixed')
    assert all(o['exact'] and o['exact_unshared'] and o['error'] is None for o in out.values()), out
    shards, other = sizes(tmp_path)
    per_rank = {r: o['read'] - other for r, o in out.items()}
    # Each rank reads its own tensors, the node reads the replicated ones once: less than every rank reading all
    # it needs, at least every saved byte once (the chunks around per-rank items may come twice).
    assert shards <= sum(per_rank.values()) < sum(o['read_unshared'] - other for o in out.values())
    assert sum(o['shared'] for o in out.values()) > 0, out
    assert ours(o['pid'] for o in out.values()) == []


def test_an_owner_that_fails_leaves_its_node_mates_to_read_its_items(tmp_path):
    failed = launch(tmp_path / 'fail', 2, 'replicated', fault='fail')
    # The owner's own load fails (and with it dcp.load everywhere); its node-mate read its items itself.
    assert 'injected' in (failed[1]['error'] or ''), failed
    assert failed[0]['tensors'] and failed[1]['exact_unshared'] and failed[0]['exact_unshared'], failed
    shards, other = sizes(tmp_path / 'fail')
    assert failed[0]['read'] == shards + other  # everything, from the bucket
    assert ours(o['pid'] for o in failed.values()) == []


def test_an_owner_that_stalls_is_given_up_on_after_the_timeout(tmp_path):
    # A stalled owner: its node-mate gives up after its timeout (2 s), reads the items itself, the load succeeds.
    stalled = launch(tmp_path / 'stall', 2, 'replicated', fault='stall', timeout='2')
    assert all(o['exact'] and o['error'] is None for o in stalled.values()), stalled
    assert any('sent nothing for 2 s' in w for w in stalled[0]['warnings']), stalled[0]
    assert ours(o['pid'] for o in stalled.values()) == []


def test_an_owner_without_room_in_dev_shm_tells_its_node_mates_at_once(tmp_path):
    out = launch(tmp_path, 2, 'replicated', fault='nospace', timeout='90')
    assert all(o['exact'] and o['error'] is None for o in out.values()), out
    assert any('no segment of' in w for w in out[1]['warnings']), out[1]
    assert not any('sent nothing' in w for w in out[0]['warnings']), out[0]  # told by a marker, not a timeout
    shards, other = sizes(tmp_path)
    assert out[0]['read'] == shards + other  # its own segments' items, and those its node-mate could not share
    assert ours(o['pid'] for o in out.values()) == []  # the markers went with their owner's reader, at its exit


def test_a_killed_owner_is_read_around_and_its_segments_are_swept_by_the_next_reader(tmp_path):
    # Plain processes (torchrun would stop the survivor when its peer dies): rank 1 owns half the state and
    # kills itself before publishing; rank 0 sees it gone, reads its items, and loads bit-exact.
    script = write_script(tmp_path, SCENARIO)
    port = free_port()
    base = dict(os.environ, ROOT=str(tmp_path), MODE='replicated', FAULT='kill', TIMEOUT='60', OUT_DIR=str(tmp_path))
    base['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / 'tests'), base.get('PYTHONPATH', '')])
    base.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), WORLD_SIZE='2', OMP_NUM_THREADS='1')
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for r in range(2)
    ]
    deadline = time.monotonic() + 90
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)  # poll() reaps the killed rank at once (a zombie is not a live owner either)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[1].returncode == -9, procs[1].stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    assert procs[0].returncode == 0, procs[0].stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    out = read_rank_outputs(tmp_path)
    assert out[0]['tensors'] and any('is gone' in w for w in out[0]['warnings']), out
    shards, other = sizes(tmp_path)
    assert out[0]['read'] == shards + other  # its own half, shared with nobody, and the dead owner's half
    left = [name for name in os.listdir(SHM) if name.startswith('dist_logging-ckpt-')]
    assert ours([procs[1].pid]), left  # the killed owner's (empty) segments stayed
    CheckpointReader(str(tmp_path / 'bucket'))  # the next reader of the node
    assert ours([procs[0].pid, procs[1].pid]) == []
    assert sweep_shared_memory() == []


def test_sharing_is_on_by_default_for_a_remote_store_and_can_be_turned_off(tmp_path, s3_bucket):
    for bad in ('yes', 1):
        with pytest.raises(ValueError, match='share_node_reads'):
            CheckpointReader(str(tmp_path / 'bucket'), share_node_reads=bad)  # type: ignore[arg-type]
    endpoint, bucket = s3_bucket
    assert CheckpointReader(f's3://{bucket}', backend_kwargs={'endpoint_url': endpoint}).share_node_reads
    assert not CheckpointReader(
        f's3://{bucket}', backend_kwargs={'endpoint_url': endpoint}, share_node_reads=False
    ).share_node_reads
    assert not CheckpointReader(
        f's3://{bucket}', backend_kwargs={'endpoint_url': endpoint}, node_cache=True
    ).share_node_reads  # the node cache shares whole files already
    # a local bucket: the ranks' reads of one file share the node's page cache already (unless asked for)
    assert not CheckpointReader(str(tmp_path / 'bucket')).share_node_reads
    assert CheckpointReader(str(tmp_path / 'bucket'), share_node_reads=True).share_node_reads
    store = LocalObjectStore(str(tmp_path / 'bucket'))

    writer = CheckpointWriter(str(tmp_path / 'bucket'), upload_staging_folder=str(tmp_path / 'staging'), run_name='t')
    sd = {'w': torch.randn(300_000), 'step': 3}
    dcp.save(sd, checkpoint_id='run/step3', storage_writer=writer)
    writer.close()
    got = {'w': torch.zeros(300_000), 'step': -1}
    with CheckpointReader(store, share_node_reads=False) as reader:  # one process: nothing to share anyway
        dcp.load(got, checkpoint_id='run/step3', storage_reader=reader)
        assert reader.shared_bytes == 0
    assert torch.equal(got['w'], sd['w']) and got['step'] == 3
