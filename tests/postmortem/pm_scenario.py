"""A job for the postmortem tests: MODE is clean, hang, desync, crash or sigterm; the last rank misbehaves.

argv: MODE BUCKET RUN_NAME (BUCKET: a folder or a URI, e.g. ``s3://bucket/prefix``; the S3 endpoint and
credentials come from the environment). Each rank writes its pid to OUT_DIR/pid<rank> once its Logger exists, and
OUT_DIR/ready<rank> just before the incident. ``sigterm`` is a hang that the test ends with SIGTERM
before the hang watchdog (60 s there) would see it.
"""

import os
import sys
import time

import torch
import torch.distributed as torch_dist

from dist_logging import Logger, dist
from dist_logging.destinations.remote import RemoteUploaderDownloader

mode, bucket, run_name = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group_from_env(backend='gloo', timeout=45)
rank = torch_dist.get_rank()
culprit = torch_dist.get_world_size() - 1
logger = Logger(
    RemoteUploaderDownloader(bucket),
    run_name=run_name,
    hang_timeout=60.0 if mode == 'sigterm' else 3.0,
    sync_timeout=60,
)
with open(os.path.join(os.environ['OUT_DIR'], f'pid{rank}'), 'w') as handle:
    handle.write(str(os.getpid()))
tensor = torch.ones(16)
for step in range(3):
    torch_dist.all_reduce(tensor)
    logger.log_metrics({'loss': 1.0 / (step + 1)})
    logger.batch_end()
with open(os.path.join(os.environ['OUT_DIR'], f'ready{rank}'), 'w') as handle:
    handle.write('1')
if mode in ('hang', 'sigterm') and rank == culprit:
    time.sleep(60)  # CULPRIT-HANG
if mode == 'desync' and rank == culprit:
    torch_dist.broadcast(tensor, 0)  # CULPRIT-DESYNC
elif mode == 'crash' and rank == culprit:
    raise ValueError('boom on purpose')  # CULPRIT-CRASH
else:
    torch_dist.all_reduce(tensor)
logger.batch_end()
logger.close()
torch_dist.destroy_process_group()
