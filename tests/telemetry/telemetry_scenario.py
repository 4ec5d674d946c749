"""A 2-rank training loop with telemetry on, run by tests/telemetry/test_endpoint.py under torchrun.

Environment: OUT_DIR (observations, the stop file), METRICS_PORT, SYNC_TIMEOUT. Each rank writes its
pid to OUT_DIR/pid<rank>; the loop runs until rank zero sees OUT_DIR/stop (shared through a MAX
all_reduce on the training group each batch: where rank zero blocks when a peer is stopped), at
most 90 s.
"""

import ctypes
import datetime
import os
import pathlib
import signal
import time

# End with the torchrun agent (a test that gives up kills the agent; the workers are in sessions of their own).
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

import torch
import torch.distributed as torch_dist

from dist_logging import Logger
from dist_logging.destinations import FileLogger, TensorboardLogger

out = pathlib.Path(os.environ['OUT_DIR'])
torch_dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
rank = torch_dist.get_rank()
(out / f'pid{rank}').write_text(str(os.getpid()))
logger = Logger(
    [TensorboardLogger(log_dir=str(out / 'tb')), FileLogger(str(out / 'file{rank}.txt'), ranks='zero')],
    run_name='telemetry-test',
    sync_timeout=float(os.environ.get('SYNC_TIMEOUT', '10')),
    system_metrics_every=0.5,
    metrics_port=int(os.environ['METRICS_PORT']),
    metrics_host='127.0.0.1',
    gather_summary_above=1,
    rank_report_every=5,
)
deadline = time.monotonic() + 90
batch = 0
while time.monotonic() < deadline:
    batch += 1
    logger.log_metrics({'loss': 10.0 * rank + batch / 1000}, reduce='gather')
    logger.batch_end()
    time.sleep(0.05)
    flag = torch.tensor([1.0 if rank == 0 and (out / 'stop').exists() else 0.0])
    torch_dist.all_reduce(flag, torch_dist.ReduceOp.MAX)
    if flag.item():
        break
logger.flush()
logger.close()
(out / f'done{rank}').write_text(str(batch))
torch_dist.destroy_process_group()
