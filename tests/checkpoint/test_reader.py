"""CheckpointReader's ranged loads: straight into memory, every byte verified, nothing left on local disk.

Loads that never call ``close()`` (as torch's docs use readers) in processes that exit; a node cache only on
request, swept after a killed loader; two loads in a row; partial loads reading only the chunks that cover
them; checkpoints committed before chunk checksums existed; 2- and 4-rank loads bit-exact; memory bounded.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter
from dist_logging.checkpoint.commit import ChecksumMismatch
from dist_logging.checkpoint.reader import sweep_cache
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store import LocalObjectStore, S3ObjectStore
from s3_server import aws_credentials, s3_bucket, _moto_session  # noqa: F401 - fixtures
from torchrun_helper import REPO_ROOT, read_rank_outputs, run_torchrun, write_script

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings('ignore:torch.distributed is disabled')]
MiB = 1024 * 1024


def state(seed: int, sizes=(3 * MiB // 4, 1000, 7)) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {f'w{i}': torch.randn(n, generator=generator) for i, n in enumerate(sizes)} | {'step': seed}


def blank(like: dict) -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for k, v in like.items()}


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def save(tmp_path: pathlib.Path, store, sd: dict, cid: str) -> None:
    staging = tmp_path / f'staging-{cid.replace("/", "-")}'  # a folder per save: each uploader holds its own
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(staging), num_attempts=1)
    writer = CheckpointWriter(rud)
    dcp.save(sd, checkpoint_id=cid, storage_writer=writer)
    writer.close()


def files_under(*roots: pathlib.Path) -> list[str]:
    return sorted(os.path.join(folder, name) for root in roots for folder, _, names in os.walk(root) for name in names)


def marker_path(bucket: pathlib.Path, cid: str) -> pathlib.Path:
    return next((bucket / cid).glob('.committed-*.json'))


def run_python(tmp_path: pathlib.Path, source: str, env: dict, name: str = 'load.py') -> subprocess.CompletedProcess:
    script = write_script(tmp_path, source, name)
    full = dict(os.environ, **env)
    full['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / 'tests'), full.get('PYTHONPATH', '')])
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=120)


LOAD_WITHOUT_CLOSE = '''
    import json, os, sys, torch, torch.distributed.checkpoint as dcp
    from dist_logging.checkpoint import CheckpointReader
    spec = json.loads(os.environ['LOAD_SPEC'])
    got = {k: torch.zeros(n) for k, n in spec['sizes'].items()} | {'step': -1}
    reader = CheckpointReader(spec['uri'], backend_kwargs=spec.get('kwargs'),
                              node_cache=spec.get('node_cache', False), cache_folder=spec.get('cache'))
    dcp.load(got, checkpoint_id=spec['cid'], storage_reader=reader)  # never closed; alive until the exit
    print(json.dumps({'sums': {k: float(v.double().sum()) for k, v in got.items() if k != 'step'},
                      'step': got['step']}))
    sys.stdout.flush()
    if spec.get('kill'):
        os.kill(os.getpid(), 9)  # no finalizer, no exit hook runs
'''


@pytest.mark.parametrize('kind', ['local', 's3'])
def test_a_process_that_loads_without_close_and_exits_leaves_nothing_on_local_disk(kind, tmp_path, request):
    sd = state(3)
    if kind == 'local':
        store, uri, kwargs = LocalObjectStore(str(tmp_path / 'bucket')), str(tmp_path / 'bucket'), None
    else:
        endpoint, bucket = request.getfixturevalue('s3_bucket')
        store, uri, kwargs = S3ObjectStore(bucket, endpoint_url=endpoint), f's3://{bucket}', {'endpoint_url': endpoint}
    save(tmp_path, store, sd, 'run/step3')
    state_dir, temp_dir = tmp_path / 'state', tmp_path / 'tmp'
    state_dir.mkdir(mode=0o700)
    temp_dir.mkdir()
    spec = {
        'cid': 'run/step3',
        'uri': uri,
        'kwargs': kwargs,
        'sizes': {k: v.numel() for k, v in sd.items() if k != 'step'},
    }
    done = run_python(
        tmp_path,
        LOAD_WITHOUT_CLOSE,
        {'LOAD_SPEC': json.dumps(spec), 'DIST_LOGGING_TMPDIR': str(state_dir), 'TMPDIR': str(temp_dir)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out['step'] == 3 and out['sums'] == {k: float(v.double().sum()) for k, v in sd.items() if k != 'step'}
    assert files_under(state_dir, temp_dir) == []  # nothing during (no cache asked for), nothing after


def test_a_killed_node_cache_loader_is_swept_by_the_next_and_a_collected_one_leaves_nothing(tmp_path):
    sd = state(4)
    bucket = tmp_path / 'bucket'
    save(tmp_path, LocalObjectStore(str(bucket)), sd, 'run/step4')
    cache = tmp_path / 'cache'
    spec = {
        'cid': 'run/step4',
        'uri': str(bucket),
        'node_cache': True,
        'cache': str(cache),
        'kill': True,
        'sizes': {k: v.numel() for k, v in sd.items() if k != 'step'},
    }
    done = run_python(tmp_path, LOAD_WITHOUT_CLOSE, {'LOAD_SPEC': json.dumps(spec)})
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert any(name.endswith('.distcp') for name in files_under(cache))  # the killed loader's cache stayed
    reader = CheckpointReader(str(bucket), node_cache=True, cache_folder=cache)  # the next reader of the node
    assert files_under(cache) == []
    got = blank(sd)
    dcp.load(got, checkpoint_id='run/step4', storage_reader=reader)
    assert equal(got, sd) and any(name.endswith('.distcp') for name in files_under(cache))
    del reader  # never closed: garbage-collected (CPython frees it at once)
    import gc

    gc.collect()
    assert files_under(cache) == []
    assert sweep_cache(cache) == []


def test_two_loads_in_a_row_in_one_process_and_a_reused_reader(tmp_path):
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    first, second = state(1), state(2)
    save(tmp_path, store, first, 'run/step1')
    save(tmp_path, store, second, 'run/step2')
    reader = CheckpointReader(store, max_in_flight=2, part_bytes=MiB)
    for cid, sd in (('run/step1', first), ('run/step2', second), ('run/step1', first)):
        got = blank(sd)
        dcp.load(got, checkpoint_id=cid, storage_reader=reader)
        assert equal(got, sd), cid
    got = blank(second)
    dcp.load(got, checkpoint_id='run/step2', storage_reader=CheckpointReader(store))  # a second reader
    assert equal(got, second)
    reader.close()
    reader.close()  # idempotent


def test_a_partial_load_reads_only_the_chunks_that_cover_its_items(tmp_path):
    sd = state(5, sizes=(2 * MiB, 2 * MiB, 1000))  # 8 + 8 MiB + a small one
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    save(tmp_path, store, sd, 'run/step5')
    total = sum(info.size for info in store.list('run/step5/'))
    got = {'w2': torch.zeros(1000)}
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id='run/step5', storage_reader=reader)
        assert reader.downloaded_bytes < 2.5 * MiB < total  # the chunk(s) around w2, the marker and .metadata
    assert torch.equal(got['w2'], sd['w2'])


def test_a_checkpoint_without_chunk_checksums_is_verified_whole_and_a_flipped_byte_fails_naming_it(tmp_path):
    sd = state(6)
    bucket = tmp_path / 'bucket'
    store = LocalObjectStore(str(bucket))
    save(tmp_path, store, sd, 'run/step6')
    marker = marker_path(bucket, 'run/step6')
    record = json.loads(marker.read_text())
    assert set(record['chunk_checksums']) == {n for n in record['files'] if n.endswith('.distcp')}
    del record['chunk_checksums']  # as committed before chunk checksums existed
    marker.write_text(json.dumps(record))
    got = blank(sd)
    dcp.load(got, checkpoint_id='run/step6', storage_reader=CheckpointReader(store, part_bytes=MiB))
    assert equal(got, sd)
    shard = next((bucket / 'run/step6').glob('*.distcp'))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    got = blank(sd)
    with pytest.raises(BaseException) as info:  # DCP's CheckpointException wraps the rank's error
        dcp.load(got, checkpoint_id='run/step6', storage_reader=CheckpointReader(store, part_bytes=MiB))
    assert 'ChecksumMismatch' in str(info.value) and shard.name in str(info.value)
    assert not any(torch.count_nonzero(got[k]) for k in got if k != 'step')  # nothing of the file was loaded


def test_a_flipped_byte_in_a_chunked_shard_fails_naming_the_object_and_chunk(tmp_path):
    sd = state(7)
    bucket = tmp_path / 'bucket'
    store = LocalObjectStore(str(bucket))
    save(tmp_path, store, sd, 'run/step7')
    shard = next((bucket / 'run/step7').glob('*.distcp'))
    data = bytearray(shard.read_bytes())
    data[MiB + 5] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(BaseException) as info:
        dcp.load(blank(sd), checkpoint_id='run/step7', storage_reader=CheckpointReader(store))
    assert 'ChecksumMismatch' in str(info.value) and shard.name in str(info.value) and 'chunk 1' in str(info.value)
    assert isinstance(ChecksumMismatch('a', 'b', 'c'), ValueError)


def test_a_flipped_byte_in_the_metadata_read_beside_the_marker_fails_naming_it(tmp_path):
    sd = state(8)
    bucket = tmp_path / 'bucket'
    store = LocalObjectStore(str(bucket))
    save(tmp_path, store, sd, 'run/step8')
    metadata = bucket / 'run/step8/.metadata'
    data = bytearray(metadata.read_bytes())
    data[len(data) // 2] ^= 1  # same size: only its CRC32C tells
    metadata.write_bytes(bytes(data))
    with pytest.raises(BaseException) as info:  # DCP wraps the reader's error
        dcp.load(blank(sd), checkpoint_id='run/step8', storage_reader=CheckpointReader(store))
    assert 'run/step8/.metadata: checksum' in str(info.value) and 'not loaded' in str(info.value)
    metadata.write_bytes(bytes(data[:-1]))  # another size: refused by the listing before anything is read
    with pytest.raises(BaseException) as info:
        dcp.load(blank(sd), checkpoint_id='run/step8', storage_reader=CheckpointReader(store))
    assert 'files are missing now' in str(info.value) and '.metadata' in str(info.value), info.value


@pytest.mark.parametrize('bad', [{'max_in_flight': 0}, {'part_bytes': 1000}, {'timeout': 0}, {'max_in_flight': True}])
def test_bad_settings_are_refused_naming_them(tmp_path, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        CheckpointReader(str(tmp_path / 'bucket'), **bad)


RANKS_SCENARIO = '''
    import json, os, torch, torch.distributed as tdist, torch.distributed.checkpoint as dcp
    from dist_logging.checkpoint import CheckpointReader, CheckpointWriter
    from torchrun_helper import dump_rank_output
    tdist.init_process_group('gloo')
    rank, world = tdist.get_rank(), tdist.get_world_size()
    root = os.environ['ROOT']

    def state(r):
        g = torch.Generator().manual_seed(100 + r)
        return {f'r{r}.a': torch.randn(300_000, generator=g), f'r{r}.b': torch.randint(0, 9, (77,), generator=g),
                'shared': torch.arange(250_000, dtype=torch.float64)}

    writer = CheckpointWriter(root + '/bucket', upload_staging_folder=f'{root}/staging/r{rank}', run_name='t')
    dcp.save(state(rank), checkpoint_id='run/step1', storage_writer=writer)
    writer.close()
    tdist.barrier()
    before = sorted(os.path.join(d, n) for d, _, ns in os.walk(os.environ['DIST_LOGGING_TMPDIR']) for n in ns)
    got = {k: torch.zeros_like(v) for k, v in state(rank).items()}
    reader = CheckpointReader(root + '/bucket', max_in_flight=3, part_bytes=1024 * 1024)  # never closed
    dcp.load(got, checkpoint_id='run/step1', storage_reader=reader)
    exact = all(torch.equal(got[k], v) for k, v in state(rank).items())
    # Then with the node cache asked for: the ranks of this node share each downloaded file. Both close only
    # after both loaded (a reader that closed first would remove the folder the other still needs).
    cached = {k: torch.zeros_like(v) for k, v in state(rank).items()}
    node_reader = CheckpointReader(root + '/bucket', node_cache=True)
    dcp.load(cached, checkpoint_id='run/step1', storage_reader=node_reader)
    exact_cached = all(torch.equal(cached[k], v) for k, v in state(rank).items())
    tdist.barrier()
    node_reader.close()
    dump_rank_output({'exact': exact, 'before': before, 'read': reader.downloaded_bytes,
                      'exact_cached': exact_cached, 'cached_read': node_reader.downloaded_bytes})
    tdist.destroy_process_group()
'''


@pytest.mark.timeout(300)  # two loads per launch (ranged, then the node cache); 4 ranks on 2 cores under xdist
@pytest.mark.parametrize('world', [2, 4])
def test_loads_on_2_and_4_ranks_are_bit_exact_and_leave_nothing(tmp_path, world):
    script = write_script(tmp_path, RANKS_SCENARIO)
    state_dir = tmp_path / 'state'
    state_dir.mkdir(mode=0o700)
    run_torchrun(
        script, world, tmp_path / 'out', env={'ROOT': str(tmp_path), 'DIST_LOGGING_TMPDIR': str(state_dir)}, timeout=270
    )
    out = read_rank_outputs(tmp_path / 'out')
    assert sorted(out) == list(range(world))
    assert all(o['exact'] for o in out.values()), out
    assert files_under(state_dir) == out[0]['before']  # the loads (never closed) added no file, during or after
    shards = sum(p.stat().st_size for p in (tmp_path / 'bucket/run/step1').glob('*.distcp'))
    assert all(o['read'] < shards for o in out.values())  # each rank read its part, not the checkpoint
    # node_cache=True: every file the ranks needed was downloaded once for the node (the sum over ranks is the
    # checkpoint's files, each once; without the sharing the shared tensor's file and the metadata come again)
    assert all(o['exact_cached'] for o in out.values()), out
    # (and the commit marker, read once)
    metadata = (tmp_path / 'bucket/run/step1/.metadata').stat().st_size
    marker = marker_path(tmp_path / 'bucket', 'run/step1').stat().st_size
    assert sum(o['cached_read'] for o in out.values()) == shards + metadata + marker


MEMORY_SCENARIO = '''
    import json, os, torch, torch.distributed.checkpoint as dcp
    from dist_logging.checkpoint import CheckpointReader

    def status():
        found = {}
        for line in open('/proc/self/status'):
            if line.startswith(('VmRSS:', 'VmHWM:')):
                found[line.split(':')[0]] = int(line.split()[1]) * 1024
        return found

    spec = json.loads(os.environ['LOAD_SPEC'])
    got = {k: torch.zeros(n) for k, n in spec['sizes'].items()}  # allocated and touched before the load
    open('/proc/self/clear_refs', 'w').write('5')  # the peak (VmHWM) restarts from now
    base = status()['VmRSS']
    dcp.load(got, checkpoint_id=spec['cid'], storage_reader=CheckpointReader(spec['uri']))
    exact = all(float(got[k].double().sum()) == s for k, s in spec['sums'].items())
    print(json.dumps({'added': status()['VmHWM'] - base, 'exact': exact}))
'''


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason='needs Linux /proc/self/clear_refs')
def test_memory_added_by_a_load_is_bounded_by_the_buffers_not_the_checkpoint(tmp_path):
    # 256 MiB (a 1 GiB checkpoint's share on 4 ranks) in 16 MiB tensors, loaded in one process.
    sizes = {f'w{i}': 4 * MiB for i in range(16)}
    generator = torch.Generator().manual_seed(9)
    sd = {k: torch.randn(n, generator=generator) for k, n in sizes.items()}
    bucket = tmp_path / 'bucket'
    save(tmp_path, LocalObjectStore(str(bucket)), sd, 'run/big')
    sums = {k: float(v.double().sum()) for k, v in sd.items()}
    del sd
    spec = {'cid': 'run/big', 'uri': str(bucket), 'sizes': sizes, 'sums': sums}
    done = run_python(tmp_path, MEMORY_SCENARIO, {'LOAD_SPEC': json.dumps(spec)}, name='memory.py')
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out['exact']
    # Every tensor is read straight into its destination: what is added is the head and tail chunks of the items
    # (a few MiB), far below the 256 MiB being loaded and below the 128 MiB of parts a deserializing load holds.
    assert out['added'] < 64 * MiB, out['added'] / MiB


def test_cache_folder_without_node_cache_is_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"cache_folder=.*node_cache=False"):
        CheckpointReader(str(tmp_path / 'bucket'), cache_folder=tmp_path / 'cache')
    assert not (tmp_path / 'cache').exists()
    CheckpointReader(str(tmp_path / 'bucket'), node_cache=True, cache_folder=tmp_path / 'cache').close()


def direct_state(seed: int) -> dict:
    """Tensors big enough to be read straight in (several MiB), of several dtypes and shapes, and small ones."""
    generator = torch.Generator().manual_seed(seed)
    return {
        'f32': torch.randn(3 * MiB // 4 + 123, generator=generator),  # 3 MiB and a bit: one chunk past its head
        'bf16': torch.randn(512, 4096, generator=generator).to(torch.bfloat16),
        'f64': torch.randn(700_000, generator=generator).double(),
        'i8': torch.randint(-128, 127, (5 * MiB,), generator=generator, dtype=torch.int8),
        'small': torch.randn(1000, generator=generator),
        'step': seed,
    }


@pytest.mark.parametrize('kind', ['local', 's3'])
def test_whole_tensors_are_read_straight_into_their_destination_bit_exact(kind, tmp_path, request):
    sd = direct_state(11)
    if kind == 'local':
        store = LocalObjectStore(str(tmp_path / 'bucket'))
    else:
        endpoint, bucket = request.getfixturevalue('s3_bucket')
        store = S3ObjectStore(bucket, endpoint_url=endpoint)
    save(tmp_path, store, sd, 'run/step11')
    got = blank(sd)
    before = {k: v.data_ptr() for k, v in got.items() if isinstance(v, torch.Tensor)}
    with CheckpointReader(store, max_in_flight=4, part_bytes=2 * MiB) as reader:
        dcp.load(got, checkpoint_id='run/step11', storage_reader=reader)
        direct = reader.direct_bytes
    assert equal(got, sd)
    assert {k: v.data_ptr() for k, v in got.items() if isinstance(v, torch.Tensor)} == before  # loaded in place
    big = sum(v.numel() * v.element_size() for k, v in sd.items() if k not in ('small', 'step'))
    assert direct == big  # every big tensor straight in, the small one deserialized


def test_a_flipped_byte_in_a_range_read_straight_into_a_tensor_fails_naming_the_object(tmp_path):
    sd = direct_state(12)
    bucket = tmp_path / 'bucket'
    store = LocalObjectStore(str(bucket))
    save(tmp_path, store, sd, 'run/step12')
    with CheckpointReader(store) as reader:
        dcp.load(blank(sd), checkpoint_id='run/step12', storage_reader=reader)
        assert reader.direct_bytes > 0
    shard = next((bucket / 'run/step12').glob('*.distcp'))
    data = bytearray(shard.read_bytes())
    # The middle of the biggest item is a body chunk of a direct read (its head and tail chunks are the ones copied).
    index = data.find(sd['i8'][: 64 * 1024].numpy().tobytes()) + 2 * MiB + 77
    assert index > 2 * MiB
    data[index] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(BaseException) as info:
        dcp.load(blank(sd), checkpoint_id='run/step12', storage_reader=CheckpointReader(store))
    chunk = index // MiB
    assert 'ChecksumMismatch' in str(info.value) and shard.name in str(info.value), str(info.value)[-2000:]
    assert f'chunk {chunk}' in str(info.value)


def test_another_dtype_a_view_or_a_reshard_takes_the_general_path_bit_exact(tmp_path):
    sd = direct_state(13)
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    save(tmp_path, store, sd, 'run/step13')
    # Another dtype: converted as torch's reader converts (copy_), not read straight in.
    got = {'f32': torch.zeros(sd['f32'].numel(), dtype=torch.float64), 'bf16': torch.zeros(512, 4096)}
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id='run/step13', storage_reader=reader)
        assert reader.direct_bytes == 0
    assert torch.equal(got['f32'], sd['f32'].double()) and torch.equal(got['bf16'], sd['bf16'].float())
    # A non-contiguous destination (a transposed view): loaded through torch.load and copy_.
    holder = torch.zeros(4096, 512, dtype=torch.bfloat16)
    got = {'bf16': holder.t()}
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id='run/step13', storage_reader=reader)
        assert reader.direct_bytes == 0
    assert torch.equal(holder.t(), sd['bf16'])
    # Mixed: the matching tensor goes straight in, the other one the general way.
    got = {'i8': torch.zeros(5 * MiB, dtype=torch.int8), 'f64': torch.zeros(700_000, dtype=torch.float32)}
    with CheckpointReader(store) as reader:
        dcp.load(got, checkpoint_id='run/step13', storage_reader=reader)
        assert reader.direct_bytes == 5 * MiB
    assert torch.equal(got['i8'], sd['i8']) and torch.equal(got['f64'], sd['f64'].float())


RESHARD_SCENARIO = '''
    import os, torch, torch.distributed as tdist, torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    from dist_logging.checkpoint import CheckpointReader, CheckpointWriter
    from torchrun_helper import dump_rank_output
    tdist.init_process_group('gloo')
    rank, world = tdist.get_rank(), tdist.get_world_size()
    root = os.environ['ROOT']
    mesh = init_device_mesh('cpu', (world,))
    full = torch.randn(1024, 2048, generator=torch.Generator().manual_seed(5))  # 8 MiB: 4 MiB per rank
    saved = {'w': DTensor.from_local(full.chunk(world)[rank].clone(), mesh, [Shard(0)])}
    writer = CheckpointWriter(root + '/bucket', upload_staging_folder=f'{root}/staging/r{rank}', run_name='t')
    dcp.save(saved, checkpoint_id='run/step1', storage_writer=writer)
    writer.close()
    tdist.barrier()
    out = {}
    # The same sharding: each rank's saved shard straight into its local tensor.
    same = {'w': DTensor.from_local(torch.zeros(1024 // world, 2048), mesh, [Shard(0)])}
    reader = CheckpointReader(root + '/bucket')
    dcp.load(same, checkpoint_id='run/step1', storage_reader=reader)
    out['same'] = [torch.equal(same['w'].to_local(), full.chunk(world)[rank]), reader.direct_bytes]
    # Resharded (columns instead of rows): every rank reads parts of both saved shards, the general way.
    other = {'w': DTensor.from_local(torch.zeros(1024, 2048 // world), mesh, [Shard(1)])}
    reader = CheckpointReader(root + '/bucket')
    dcp.load(other, checkpoint_id='run/step1', storage_reader=reader)
    out['resharded'] = [torch.equal(other['w'].to_local(), full.chunk(world, dim=1)[rank]), reader.direct_bytes]
    dump_rank_output(out)
    tdist.destroy_process_group()
'''


def test_a_resharded_load_takes_the_general_path_and_an_unchanged_one_reads_straight_in(tmp_path):
    script = write_script(tmp_path, RESHARD_SCENARIO)
    run_torchrun(script, 2, tmp_path / 'out', env={'ROOT': str(tmp_path)}, timeout=150)
    out = read_rank_outputs(tmp_path / 'out')
    assert sorted(out) == [0, 1]
    for rank in out.values():
        assert rank['same'] == [True, 4 * MiB] and rank['resharded'] == [True, 0], out
