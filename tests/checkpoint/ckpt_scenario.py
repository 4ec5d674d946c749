"""One torchrun launch of a checkpointing job: resume from the latest committed checkpoint (checking it
bit-exactly), save some steps through CheckpointWriter (dcp.save and dcp.async_save alternating), optionally
SIGKILL itself at a chosen point. Configured by the JSON in $CKPT_PLAN:

    {"root": ..., "bucket": uri, "backend_kwargs": {...}, "steps": [1, 2, 3], "keep_last": 2,
     "kill": {"point": "write|local|upload|commit|retention", "step": 3, "ranks": "all" | [1]} | null,
     "fail_upload": {"step": 2, "rank": 1} | null, "commit_timeout": 60}

Kill points are armed here by wrapping methods (never hooks in the product):
  write      torch's _write_item: in the middle of writing a shard file (after its first item)
  local      CheckpointWriter._hand_over: shards written locally, nothing queued for upload yet
  upload     the store's upload_object on a shard of the step: an upload in flight
  commit     the committer found every shard landed and is about to commit
  retention  the store's delete during retention: after the first deletion (the marker)
"""

import json
import os
import signal
import time

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from torchrun_helper import dump_rank_output

plan = json.loads(os.environ['CKPT_PLAN'])
tdist.init_process_group('gloo')
rank, world = tdist.get_rank(), tdist.get_world_size()
mesh = init_device_mesh('cpu', (world,))
PREFIX = 'run/ckpt'


def state(step):
    # Different on every step and rank; a sharded tensor (one shard per rank) and per-rank state.
    full = torch.arange(world * 64 * 3, dtype=torch.float64).reshape(world * 64, 3) * step + 0.25
    return {'w': distribute_tensor(full, mesh, [Shard(0)]),
            f'opt_rank{rank}': torch.full((100,), rank * 1000.0 + step) + torch.arange(100.0) / 7,
            'step': torch.tensor(step)}


def blank():
    zero = torch.zeros(world * 64, 3, dtype=torch.float64)
    return {'w': distribute_tensor(zero, mesh, [Shard(0)]), f'opt_rank{rank}': torch.zeros(100),
            'step': torch.tensor(-1)}


def exact(a, b):
    la = a['w'].to_local() if hasattr(a['w'], 'to_local') else a['w']
    lb = b['w'].to_local() if hasattr(b['w'], 'to_local') else b['w']
    return (torch.equal(la, lb) and torch.equal(a[f'opt_rank{rank}'], b[f'opt_rank{rank}'])
            and int(a['step']) == int(b['step']))


from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint  # noqa: E402
from dist_logging.checkpoint import _committer, writer as writer_module  # noqa: E402

bucket, kwargs = plan['bucket'], plan.get('backend_kwargs') or None
out = {'world': world}

# ---- resume
latest = latest_checkpoint(bucket, PREFIX, backend_kwargs=kwargs)
out['latest'] = latest
if latest is not None:
    step = int(latest.rsplit('step', 1)[1])
    got = blank()
    with CheckpointReader(bucket, backend_kwargs=kwargs, cache_folder=plan['root'] + '/cache',
                          run_name='t') as reader:
        dcp.load(got, checkpoint_id=latest, storage_reader=reader)
        out['downloaded_bytes'] = reader.downloaded_bytes
    out['exact'] = exact(got, state(step))
    out['loaded_step'] = int(got['step'])
dump_rank_output(out)  # now: a launch killed later still reports what it resumed from
tdist.barrier()

# ---- arm the kill point
kill = plan.get('kill')
current = {'step': None}


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if kill and (kill['ranks'] == 'all' or rank in kill['ranks']):
    point, at = kill['point'], f"step{kill['step']}"
    if point == 'write':
        import torch.distributed.checkpoint.filesystem as fs
        real_write_item, seen = fs._write_item, []

        def write_item(*args, **kw):
            if current['step'] == kill['step']:
                seen.append(1)
                if len(seen) == 2:  # the step's first item is in the file, the second is not
                    die()
            return real_write_item(*args, **kw)
        fs._write_item = write_item
    elif point == 'local':
        real_hand_over = writer_module.CheckpointWriter._hand_over

        def hand_over(self, results):
            if current['step'] == kill['step']:
                die()
            return real_hand_over(self, results)
        writer_module.CheckpointWriter._hand_over = hand_over
    elif point == 'commit':
        real_commit = _committer.commit_checkpoint

        def commit(store, cid, files, *a, **kw):
            from dist_logging.checkpoint._layout import missing_files
            if cid.endswith(at) and not missing_files(cid, files, store.list(cid + '/')):
                die()
            return real_commit(store, cid, files, *a, **kw)
        _committer.commit_checkpoint = commit

# ---- save
kill_store = kill and (kill['ranks'] == 'all' or rank in kill['ranks']) and kill['point'] in ('upload', 'retention')
fail = plan.get('fail_upload')
writer = CheckpointWriter(bucket, backend_kwargs=kwargs, upload_staging_folder=plan['root'] + '/staging',
                          keep_last=plan.get('keep_last'), commit_timeout=plan.get('commit_timeout', 60),
                          num_concurrent_uploads=2)
if writer.uploader.retry_policy.initial_backoff > 0.1:
    import dataclasses
    writer.uploader.retry_policy = dataclasses.replace(writer.uploader.retry_policy, initial_backoff=0.05)
store = writer.store
if kill_store or fail:
    real_upload, real_delete = store.upload_object, store.delete
    deletes = []

    def upload_object(name, filename, *a, **kw):
        if fail and f"step{fail['step']}/__{fail['rank']}_" in name:
            raise PermissionError(f'injected permanent failure for {name}')
        if kill_store and kill['point'] == 'upload' and f"step{kill['step']}/__" in name:
            die()
        return real_upload(name, filename, *a, **kw)

    def delete(name):
        if kill_store and kill['point'] == 'retention' and current['step'] == kill['step']:
            deletes.append(name)
            if len(deletes) == 2:  # the marker is gone (deletion 1); die before the rest
                die()
        return real_delete(name)
    store.upload_object, store.delete = upload_object, delete

saved, errors = [], None
try:
    for i, step in enumerate(plan['steps']):
        current['step'] = step
        cid = f'{PREFIX}/step{step}'
        if i % 2:
            dcp.async_save(state(step), checkpoint_id=cid, storage_writer=writer).result()
        else:
            dcp.save(state(step), checkpoint_id=cid, storage_writer=writer)
        saved.append(cid)
        if kill and kill['point'] in ('commit', 'retention') and rank == 0:
            writer.wait_for_commits(60)  # let the committer reach the kill point before the next save
finally:
    try:
        writer.close()
    except Exception as exc:  # reported to the test
        errors = f'{type(exc).__name__}: {exc}'
out.update(saved=saved, close_error=errors,
           timings=[{'id': t.checkpoint_id, 'local_s': t.local_s, 'commit_s': t.commit_s, 'bytes': t.bytes_written}
                    for t in writer.timings])
dump_rank_output(out)
tdist.barrier()
tdist.destroy_process_group()
