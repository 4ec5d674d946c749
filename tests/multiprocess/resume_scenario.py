"""One launch of a 2-rank job that checkpoints its model and its Logger with DCP every 10 steps (test_resume.py).

Usage: ``torchrun --nproc_per_node=2 resume_scenario.py WORKDIR LAUNCH STEPS [DIE_AT]``.

Every launch resumes from ``latest_checkpoint`` (the Logger inside the DCP state dict, loaded through
``CheckpointReader``) and logs ``loss = step + 1000 * LAUNCH`` at steps 1, 2, ... (``batch_end`` first, so a
step is the count of finished batches), so the winner of every step is known. At step ``DIE_AT`` every rank
writes ``WORKDIR/ready-launch<L>-rank<r>.json`` (its pid) and waits to be SIGKILLed by the test.
Destinations: TensorBoard and an MLflow run (sqlite) on rank 0, a FileLogger per rank, an InMemoryLogger on
rank 0 whose resumes are written to ``WORKDIR/memory-launch<L>.json`` at the end (or, in a launch that is
killed, when it reaches ``DIE_AT``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp

from dist_logging import Logger
from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint
from dist_logging.destinations import FileLogger, InMemoryLogger, MLFlowLogger, TensorboardLogger

RUN = 'resume-demo'
EVERY = 10


def _dump_memory(work: str, launch: int, memory: InMemoryLogger) -> None:
    with open(os.path.join(work, f'memory-launch{launch}.json'), 'w') as handle:
        json.dump(
            {'resumes': [dataclasses.asdict(info) for info in memory.resumes], 'loss': memory.data.get('loss', [])},
            handle,
        )


def main() -> int:
    work, launch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    torch_dist.init_process_group('gloo')
    rank = torch_dist.get_rank()
    bucket = os.path.join(work, 'bucket')
    memory = InMemoryLogger()
    destinations = [
        TensorboardLogger(log_dir=os.path.join(work, 'tb'), flush_interval=1, remote_dir=None),
        FileLogger(os.path.join(work, 'logs', 'rank{rank}.txt'), remote_file_name='', flush_interval=1),
        memory,
    ]
    if os.environ.get('RESUME_MLFLOW'):
        destinations.append(
            MLFlowLogger(
                f'sqlite:///{work}/mlflow.db',
                experiment_name='resume',
                synchronous=True,
                flush_interval=1,
                logging_buffer_seconds=None,
            )
        )
    logger = Logger(destinations, run_name=RUN)
    logger.log_hyperparameters({'launch': launch})
    model = torch.nn.Linear(4, 1)
    latest = latest_checkpoint(bucket, f'{RUN}/checkpoints')
    if latest is not None:
        state = {'model': model.state_dict(), 'logger': logger}
        with CheckpointReader(bucket, run_name=RUN) as reader:
            dcp.load(state, checkpoint_id=latest, storage_reader=reader)
        model.load_state_dict(state['model'])
    writer = CheckpointWriter(bucket, upload_staging_folder=os.path.join(work, 'staging'), run_name=RUN)
    try:
        while logger.state.timestamp.batch < steps:
            logger.batch_end()
            step = logger.state.timestamp.batch
            logger.log_metrics({'loss': float(step + 1000 * launch), 'launch': float(launch)})
            if step % EVERY == 0:
                dcp.save(
                    {'model': model.state_dict(), 'logger': logger},
                    checkpoint_id=f'{RUN}/checkpoints/step{step}',
                    storage_writer=writer,
                )
                writer.wait_for_commits(60)
                torch_dist.barrier()  # the commit is visible to every rank before anyone may die
            if step == die_at:
                for destination in logger.active_destinations:
                    flush = getattr(destination, 'flush', None)
                    if flush is not None:
                        flush()
                if rank == 0:
                    _dump_memory(work, launch, memory)
                ready = os.path.join(work, f'ready-launch{launch}-rank{rank}.json')
                with open(ready + '.tmp', 'w') as handle:
                    json.dump({'pid': os.getpid(), 'step': step}, handle)
                os.replace(ready + '.tmp', ready)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # the test SIGKILLs this process
                    time.sleep(0.1)
                raise SystemExit('was not killed within 120 s')
    finally:
        writer.close()
    if rank == 0:
        _dump_memory(work, launch, memory)
    logger.close()
    torch_dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    sys.exit(main())
