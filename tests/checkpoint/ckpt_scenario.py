"""One torchrun launch of a checkpointing job: resume from the latest committed checkpoint (checking it
bit-exactly), save some steps through CheckpointWriter (dcp.save and dcp.async_save alternating), optionally
SIGKILL itself at a chosen point. Configured by the JSON in $CKPT_PLAN:

    {"root": ..., "bucket": uri, "backend_kwargs": {...}, "steps": [1, 2, 3], "keep_last": 2,
     "kill": {"point": "write|local|upload|commit|retention", "step": 3, "ranks": "all" | [1]} | null,
     "fail_upload": {"step": 2, "rank": 1} | null, "commit_timeout": 60,
     "wait_commits": false,   # rank 0 waits for the commits after each save
     "report_bucket": false}  # rank 0 reports, before resuming, the committed ids and the latest one's objects

Kill points are armed here by wrapping methods (never hooks in the product):
  write      torch's _write_item: in the middle of writing a shard file (after its first item)
  local      CheckpointWriter._hand_over_file, at the rank's second shard file: the first file is queued for
             upload (it may land), the second is written and closed but not queued
  upload     the store's upload_object on a shard of the step: an upload in flight
  commit     the committer found every shard landed and is about to commit (its first write: .metadata)
  retention  the store's delete during retention: after the first deletion (the marker)
Only the coordinator commits and deletes, so "ranks": "all" at commit or retention kills the coordinator
there and every other rank at the same moment: they finish the step's save, wait for the coordinator's
flag file (written just before its SIGKILL) and SIGKILL themselves, uploads of their own still running.

A chain of launches may run as one torchrun job restarted after each kill (``--max_restarts``):
$CKPT_PLAN is then ``{"attempts": [plan, plan, ...]}``, attempt k (torchrun's restart count) runs plan k
and writes its outputs under ``$OUT_DIR/attempt<k>``. A rank about to SIGKILL itself first leaves
``sigkill-rank<r>`` in its output folder (so the test knows each attempt ended by its kill point).
"""

import json
import os
import signal
import time

import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh

from torchrun_helper import dump_rank_output
from _states import blank_sharded_state, same_sharded_state, sharded_state

plan = json.loads(os.environ['CKPT_PLAN'])
if 'attempts' in plan:  # one job, restarted by torchrun after each kill: this attempt's plan and output folder
    attempt = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))
    plan = plan['attempts'][attempt]
    os.environ['OUT_DIR'] = os.path.join(os.environ['OUT_DIR'], f'attempt{attempt}')
    os.makedirs(os.environ['OUT_DIR'], exist_ok=True)
    # torchrun's agent keeps one store across restarts with the killed attempt's keys in it (gloo would
    # connect to the dead ranks' addresses): each attempt's group gets keys of its own, as
    # dist_logging.dist.init_process_group_from_env does
    base_store = tdist.TCPStore(
        os.environ['MASTER_ADDR'],
        int(os.environ['MASTER_PORT']),
        int(os.environ['WORLD_SIZE']),
        is_master=os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True' and os.environ['RANK'] == '0',
    )
    tdist.init_process_group(
        'gloo',
        store=tdist.PrefixStore(f'ckpt_scenario/attempt{attempt}', base_store),
        rank=int(os.environ['RANK']),
        world_size=int(os.environ['WORLD_SIZE']),
    )
else:
    tdist.init_process_group('gloo')
rank, world = tdist.get_rank(), tdist.get_world_size()
mesh = init_device_mesh('cpu', (world,))
PREFIX = 'run/ckpt'


def state(step):
    return sharded_state(mesh, rank, step)


def blank():
    return blank_sharded_state(mesh, rank)


def exact(a, b):
    return same_sharded_state(a, b, rank)


from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint, list_checkpoints  # noqa: E402
from dist_logging.object_store import store_from_uri  # noqa: E402
from dist_logging.checkpoint import writer as writer_module  # noqa: E402

bucket, kwargs = plan['bucket'], plan.get('backend_kwargs') or None
out = {'world': world}

# ---- resume
latest = latest_checkpoint(bucket, PREFIX, backend_kwargs=kwargs)
out['latest'] = latest
if plan.get('report_bucket') and rank == 0:  # what the test would list between two launches
    out['listed'] = list_checkpoints(bucket, PREFIX, backend_kwargs=kwargs)
    if latest is not None:
        out['latest_sizes'] = {i.name: i.size for i in store_from_uri(bucket, kwargs).list(latest + '/')}
if latest is not None:
    step = int(latest.rsplit('step', 1)[1])
    got = blank()
    with CheckpointReader(bucket, backend_kwargs=kwargs, run_name='t') as reader:
        dcp.load(got, checkpoint_id=latest, storage_reader=reader)
        out['downloaded_bytes'] = reader.downloaded_bytes
    out['exact'] = exact(got, state(step))
    out['loaded_step'] = int(got['step'])
dump_rank_output(out)  # now: a launch killed later still reports what it resumed from
tdist.barrier()

# ---- arm the kill point
kill = plan.get('kill')
current = {'step': None}


# "all" at a coordinator-only point: the coordinator flags its death so the other ranks die with it
flag = (
    f"{plan['root']}/killed-{kill['point']}-step{kill['step']}"
    if kill and kill['ranks'] == 'all' and kill['point'] in ('commit', 'retention')
    else None
)


def sigkill_self():
    with open(os.path.join(os.environ['OUT_DIR'], f'sigkill-rank{rank}'), 'w'):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def die():
    if flag:
        with open(flag, 'w'):
            pass
    sigkill_self()


def die_with_coordinator():
    deadline = time.monotonic() + 120
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise RuntimeError(f'rank {rank}: the coordinator never reached the kill point {kill}')
        time.sleep(0.01)
    sigkill_self()


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
        real_hand_over, handed = writer_module.CheckpointWriter._hand_over_file, []

        def hand_over(self, results):
            if current['step'] == kill['step']:
                handed.append(1)
                if len(handed) == 2:
                    die()
            return real_hand_over(self, results)

        writer_module.CheckpointWriter._hand_over_file = hand_over

# ---- save
kill_store = (
    kill and (kill['ranks'] == 'all' or rank in kill['ranks']) and kill['point'] in ('upload', 'commit', 'retention')
)
fail = plan.get('fail_upload')
writer = CheckpointWriter(
    bucket,
    backend_kwargs=kwargs,
    upload_staging_folder=plan['root'] + '/staging',
    keep_last=plan.get('keep_last'),
    commit_timeout=plan.get('commit_timeout', 60),
    num_concurrent_uploads=2,
    files_per_rank=2,
)  # 2 files: the per-file hand-over
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
        if kill_store and kill['point'] == 'commit' and name == f"{PREFIX}/step{kill['step']}/.metadata":
            die()  # the committer saw every shard landed; .metadata then the marker would follow
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
        if flag and rank != 0 and step == kill['step']:
            die_with_coordinator()
        if rank == 0 and (plan.get('wait_commits') or (kill and kill['point'] in ('commit', 'retention'))):
            writer.wait_for_commits(60)  # let the committer reach the kill point (or commit) before the next save
finally:
    try:
        writer.close()
    except Exception as exc:  # reported to the test
        errors = f'{type(exc).__name__}: {exc}'
out.update(
    saved=saved,
    close_error=errors,
    timings=[
        {'id': t.checkpoint_id, 'local_s': t.local_s, 'commit_s': t.commit_s, 'bytes': t.bytes_written}
        for t in writer.timings
    ],
)
dump_rank_output(out)
tdist.barrier()
tdist.destroy_process_group()
