"""Run under torchrun (4 ranks) by tests/test_logging_setup.py: setup_logging, warnings, prints, a crash.

Phase 1 (console_ranks='zero', stderr is the job's stderr): before init_process_group, setup_logging
is called twice; every rank logs a message, rank 2 a message of its own, every rank warns, rank 3
logs an ERROR; a FileLogger(capture_stdout=True) copies a print of every rank into its file.
Phase 2 (console_ranks='all', stderr redirected to OUT_DIR/console-all-rank{r}.txt): every rank
logs one message, rank 2 another. Then the process group starts (torch wraps sys.excepthook), every
rank meets at a barrier (the test's own collective: setup_logging issues none) so nothing is cut
short, and rank 3 dies of an uncaught exception.
"""

import logging
import os
import pathlib
import sys
import warnings

import torch.distributed as torch_dist

from dist_logging import Logger, dist, setup_logging
from dist_logging.destinations import FileLogger

out = pathlib.Path(os.environ['OUT_DIR'])
rank = dist.get_global_rank()  # from torchrun's environment: no process group yet
log_file = str(out / 'python-logs' / 'python-rank{rank}.log')
log = logging.getLogger('scenario')

# ---- phase 1
setup_logging(file=log_file, run_name='mp')
setup_logging(file=log_file, run_name='mp')  # a second call replaces, never duplicates
log.info('every rank says hello')
if rank == 2:
    log.info('rank 2 alone says this')
warnings.warn('a warning raised on every rank', UserWarning)
if rank == 3:
    log.error('rank 3 had a problem')

file_logger = FileLogger(str(out / 'file-logs' / 'logs-rank{rank}.txt'), capture_stdout=True)
logger = Logger(file_logger, run_name='mp')
print(f'print from rank {rank}', flush=True)
logger.close()

# ---- phase 2: every rank prints, each into its own stream
with open(out / f'console-all-rank{rank}.txt', 'w') as stream:
    saved, sys.stderr = sys.stderr, stream
    try:
        setup_logging(console_ranks='all', file=log_file, run_name='mp')
        log.info('phase two on every rank')
        if rank == 2:
            log.info('phase two on rank 2 alone')
    finally:
        sys.stderr = saved
setup_logging(file=log_file, run_name='mp')
# init_process_group wraps sys.excepthook (prefixing what it prints with '[rankN]: '): the crash below
# goes through that wrapper, then ours.
torch_dist.init_process_group('gloo')
torch_dist.barrier()
torch_dist.destroy_process_group()
if rank == 3:
    raise RuntimeError('rank 3 crashed')
