"""Under torchrun --max-restarts=1 (tests/multiprocess/test_restart.py): rank 1 exits (os._exit) right after
batch_end of step 2 in the first attempt; rank 0's flush fails and names it; the second attempt runs to the end.
With argv[2] == 'kill': no restart; the rank SIGKILLs itself right after batch_end of step 2."""

import json
import os
import signal
import sys

import torch.distributed as torch_dist

from dist_logging import DistributedLoggingError, Logger, dist, setup_logging
from dist_logging.destinations import FileLogger, RemoteUploaderDownloader

root, mode = sys.argv[1], sys.argv[2]
attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])
rank = int(os.environ['RANK'])
setup_logging(file=root + '/py/{run_name}-rank{rank}.log')
dist.init_process_group_from_env(timeout=60)  # also: a clean store per restart
# FileLogger's defaults (64 KiB buffer, uploads every 100 batches), uploads into a local bucket.
logger = Logger(
    [
        FileLogger(root + '/local/{run_name}/rank{rank}.txt', remote_file_name='{run_name}/rank{rank}.txt'),
        RemoteUploaderDownloader(f'file://{root}/bucket', upload_staging_folder=root + '/staging'),
    ],
    sync_timeout=60,
)
try:
    for step in range(1, 5):
        logger.log_metrics({f'attempt{attempt}_step{step}_rank{rank}': step})
        logger.log_metrics({'mean_rank': float(rank)}, reduce='mean')
        logger.batch_end()
        if step == 2 and rank == 1 and attempt == 0:
            if mode == 'kill':
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        logger.flush()  # a collective: the survivor learns here that rank 1 left
except DistributedLoggingError as exc:
    with open(f'{root}/error-attempt{attempt}-rank{rank}.json', 'w') as handle:
        json.dump(
            {'message': str(exc), 'missing': list(exc.missing_ranks), 'left': list(getattr(exc, 'left_ranks', ()))},
            handle,
        )
    raise
logger.close()
torch_dist.destroy_process_group()
with open(f'{root}/done-attempt{attempt}-rank{rank}.json', 'w') as handle:
    json.dump({'run_name': logger.run_name, 'launcher': dist.launcher()}, handle)
