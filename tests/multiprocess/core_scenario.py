"""Run by torchrun from tests/multiprocess/test_core.py; each rank reports what its destinations saw."""

import os
import sys

import torch.distributed as torch_dist

from dist_logging import Logger, dist
from dist_logging.destinations import FileLogger, InMemoryLogger
from torchrun_helper import dump_rank_output

use_process_group = '--no-pg' not in sys.argv
if use_process_group:
    torch_dist.init_process_group('gloo')

zero = InMemoryLogger(ranks='zero')
local_zero = InMemoryLogger(ranks='local_zero')
everywhere = InMemoryLogger(ranks='all')
files = FileLogger(
    filename='{run_name}/logs-node{node_rank}-local{local_rank}-rank{rank}.txt', ranks='all', flush_interval=1
)
logger = Logger(
    [zero, local_zero, everywhere, files], sync_timeout=60
)  # a stuck collective is reported well within the test's time
logger.log_hyperparameters({'lr': 0.01, 'world': dist.get_world_size(), 'password': 'p'})
for step in range(3):
    logger.log_metrics({'loss': float(step + 10 * dist.get_global_rank())})
    logger.batch_end(samples=2)
logger.close()

dump_rank_output(
    {
        'run_name': logger.run_name,
        'cwd': os.getcwd(),
        'log_file': files.filename,
        'facts': [
            dist.get_global_rank(),
            dist.get_local_rank(),
            dist.get_world_size(),
            dist.get_local_world_size(),
            dist.get_node_rank(),
        ],
        'zero': {'hparams': zero.hyperparameters, 'loss': zero.data.get('loss')},
        'local_zero': {'hparams': local_zero.hyperparameters, 'loss': local_zero.data.get('loss')},
        'all': {'hparams': everywhere.hyperparameters, 'loss': everywhere.data.get('loss')},
    }
)
if use_process_group:
    torch_dist.destroy_process_group()
