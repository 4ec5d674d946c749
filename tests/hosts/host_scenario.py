"""One rank of a two-host job on the rig (tests/hosts/test_across_hosts.py), under torchrun --nnodes 2.

argv: steps (the job logs until then, or until an error), checkpoint_every (0: no checkpoints).
With ``RIG_POSTMORTEM=1`` the Logger captures its postmortem (``postmortem=True``: the Logger's failed collective,
an uncaught exception, SIGTERM; docs/postmortem.md) into the same bucket.
With ``RIG_INFLIGHT=1`` each step also issues an all_reduce on the default (training) group without waiting for
it, as DDP overlaps its bucket all-reduces with the step: after a partition they stay in flight.
Each rank: per-rank log file and uploads staged under this host's private /tmp, a mean over every rank,
an upload per step, a DCP checkpoint through CheckpointWriter every ``checkpoint_every`` steps. It writes
``start-rank<r>.json`` (pid, host), ``progress-rank<r>`` (the last step done) and ``result-rank<r>.json``
(the error, when one came, with the wall time it came at; what it had accepted for upload) into OUT_DIR,
shared by the hosts. An error is raised again after closing, so the process exits non-zero.
"""

import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as torch_dist

from dist_logging import Logger, dist
from dist_logging.destinations import FileLogger, InMemoryLogger, RemoteUploaderDownloader

steps, checkpoint_every = int(sys.argv[1]), int(sys.argv[2])
out, bucket = os.environ['OUT_DIR'], os.environ['RIG_BUCKET']
sync_timeout = float(os.environ['RIG_SYNC_TIMEOUT'])


def dump(name, data):
    path = os.path.join(out, name)
    with open(path + '.tmp', 'w') as handle:
        json.dump(data, handle)
    os.replace(path + '.tmp', path)


def wait_for_host_mates(limit=10.0):
    """Wait (at most ``limit`` s) until every rank on this host has finished closing. torchrun's agent ends
    the remaining workers of a failed attempt with SIGTERM as soon as one exits non-zero, which would cut a
    slower host mate's close(), and with it the named error this rig checks, short."""
    deadline = time.monotonic() + limit
    mates = [r for r in range(torch_dist.get_world_size()) if r != rank and r // local_world == rank // local_world]
    while time.monotonic() < deadline:
        done = []
        for r in mates:
            try:
                with open(os.path.join(out, f'result-rank{r}.json')) as handle:
                    done.append('close_seconds' in json.load(handle))
            except (OSError, ValueError):
                done.append(False)
        if all(done):
            return
        time.sleep(0.05)


dist.init_process_group_from_env(timeout=float(os.environ['RIG_PG_TIMEOUT']))
rank, host = torch_dist.get_rank(), socket.gethostname()
local_world = int(os.environ['LOCAL_WORLD_SIZE'])
dump(f'start-rank{rank}.json', {'pid': os.getpid(), 'host': host})
sink = InMemoryLogger()
# close() waits for the uploads in flight, each bounded by the S3 client's timeouts and the retry policy: short
# ones keep a partitioned host's close (and so its exit) within seconds here.
client = {
    'endpoint_url': os.environ['AWS_ENDPOINT_URL'],
    'client_config': {'connect_timeout': 2, 'read_timeout': 5, 'retries': {'total_max_attempts': 1}},
}
logger = Logger(
    [
        sink,
        FileLogger('/tmp/logs/{run_name}/rank{rank}.txt', remote_file_name='{run_name}/logs/rank{rank}.txt'),
        RemoteUploaderDownloader(f's3://{bucket}', upload_staging_folder='/tmp/staging', backend_kwargs=client),
    ],
    run_name='rig',
    sync_timeout=sync_timeout,
    postmortem=True if os.environ.get('RIG_POSTMORTEM') == '1' else None,
)
writer = None
if checkpoint_every:
    import torch.distributed.checkpoint as dcp

    from dist_logging.checkpoint import CheckpointWriter

    writer = CheckpointWriter(
        f's3://{bucket}', upload_staging_folder='/tmp/ckpt-staging', commit_timeout=sync_timeout, backend_kwargs=client
    )
result = {'rank': rank, 'host': host, 'pid': os.getpid(), 'accepted': {}, 'saved': []}
inflight, works = os.environ.get('RIG_INFLIGHT') == '1', []
os.makedirs('/tmp/src', exist_ok=True)
try:
    for step in range(1, steps + 1):
        if inflight:
            works = [work for work in works if not work.is_completed()]
            works.append(torch_dist.all_reduce(torch.ones(4), async_op=True))
        logger.log_metrics({'loss': float(rank + step)}, step=step, reduce='mean')
        logger.log_metrics({'rank_step': step}, step=step)
        data = f'rank {rank} step {step} on {host}\n'.encode() * 200
        path = f'/tmp/src/rank{rank}-step{step}.bin'
        with open(path, 'wb') as handle:
            handle.write(data)
        name = f'rig/uploads/rank{rank}/step{step}.bin'
        logger.upload_file(name, path)
        result['accepted'][name] = hashlib.sha256(data).hexdigest()
        logger.batch_end()
        if writer is not None and step % checkpoint_every == 0:
            state = {f'rank{rank}': torch.full((1000,), float(step + rank))}
            dcp.save(state, checkpoint_id=f'rig/checkpoints/step{step}', storage_writer=writer)
            result['saved'].append(step)
        with open(os.path.join(out, f'progress-rank{rank}'), 'w') as handle:
            handle.write(str(step))
        time.sleep(0.2)
    logger.close()
except Exception as exc:
    result['error'] = {
        'type': type(exc).__name__,
        'message': str(exc),
        'wall': time.time(),
        'missing': list(getattr(exc, 'missing_ranks', ())),
        'unreachable': list(getattr(exc, 'unreachable_ranks', ())),
        'left': list(getattr(exc, 'left_ranks', ())),
        'late': list(getattr(exc, 'late_ranks', ())),
        'hosts': {str(r): h for r, h in getattr(exc, 'hosts', {}).items()},
        'in_flight': len(works),
    }
    dump(f'result-rank{rank}.json', result)  # on record even if this rank is ended during close()
    t0 = time.monotonic()
    try:
        logger.close()
    except Exception as close_exc:  # noqa: BLE001 - recorded; the first error is what ends the process
        result['close_error'] = f'{type(close_exc).__name__}: {str(close_exc)[:1000]}'
    result['close_seconds'] = time.monotonic() - t0
    dump(f'result-rank{rank}.json', result)
    wait_for_host_mates()
    result['leaving'] = time.time()  # from here on, only the interpreter's exit
    dump(f'result-rank{rank}.json', result)
    raise
result['means'] = dict(sink.data.get('loss', [])) if rank == 0 else {}
dump(f'result-rank{rank}.json', result)
torch_dist.destroy_process_group()
