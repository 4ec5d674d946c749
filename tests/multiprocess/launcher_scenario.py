"""Run by srun / sbatch / mpirun (tests/multiprocess/test_launchers.py), without torchrun: setup_logging first,
then init_process_group_from_env, log, reduce a metric, upload a per-rank file, time a section for rank reports."""

import json
import logging
import os
import sys
import time

from dist_logging import Logger, dist, setup_logging
from dist_logging.destinations import FileLogger, RemoteUploaderDownloader

root = sys.argv[1]
# Before anything else: rank facts come from the launcher's variables (no process group yet).
python_log = setup_logging(file=root + '/py/{run_name}/rank{rank}.log')
before = {'rank': dist.get_global_rank(), 'world_size': dist.get_world_size(), 'launcher': dist.launcher()}
facts = dist.init_process_group_from_env(timeout=120)
logger = Logger(
    [
        FileLogger(root + '/local/{run_name}/rank{rank}.txt', remote_file_name='{run_name}/rank{rank}.txt'),
        RemoteUploaderDownloader(f'file://{root}/bucket', upload_staging_folder=root + '/staging'),
    ],
    sync_timeout=120,
    rank_report_every=2,
)
logging.getLogger('scenario').info('hello from rank %d of %d', dist.get_global_rank(), dist.get_world_size())
logger.log_metrics({'my_rank': dist.get_global_rank()})  # this rank's own line, in its own file
logger.log_metrics({'rank_plus_one': dist.get_global_rank() + 1}, reduce='sum')
logger.flush()
for _ in range(5):  # two rank reports (the first step is warm-up)
    with logger.section('work'):
        time.sleep(0.002)
    logger.batch_end()
report = logger.rank_report()
logger.close()
import torch.distributed as torch_dist  # noqa: E402

torch_dist.destroy_process_group()
with open(f'{root}/out-rank{dist.get_global_rank()}.json', 'w') as handle:
    json.dump(
        {
            'before': before,
            'launcher': dist.launcher(),
            'rank': dist.get_global_rank(),
            'local_rank': dist.get_local_rank(),
            'world_size': dist.get_world_size(),
            'run_name': logger.run_name,
            'python_log': python_log,
            'job': os.environ.get('SLURM_JOB_ID'),
            'step': os.environ.get('SLURM_STEP_ID'),
            'master': f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            'report': {
                'batch': report.batch,
                'complete': report.complete,
                'world_size': report.world_size,
                'series': sorted(report.series),
                'own_rank': report.own.rank,
                'own_host': report.own.host,
                'slowest': sorted([e.rank, e.host] for e in report.slowest),
            },
        },
        handle,
    )
