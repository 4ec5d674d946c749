"""A real (tiny) distributed training job that logs through dist_logging.

Run it under torchrun, e.g. ``torchrun --standalone --nproc_per_node=2 launch/train.py
--config configs/per_rank.yaml`` (or ``python launch/run.py``, which also shows where
every rank's output went). Each rank trains a small MLP with DistributedDataParallel
on synthetic data (gloo on CPU, NCCL when GPUs are present), logs its own loss
(per-rank destinations), the mean loss across ranks (rank-zero destinations), and
uploads a per-rank checkpoint every epoch. Python ``logging``, warnings and uncaught exceptions go
through :func:`dist_logging.setup_logging`: printed once (rank zero; errors from every rank, tagged
``[rank R]``) and recorded in one file per rank, uploaded with the other logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib

import torch
import torch.distributed as torch_dist
from torch import nn

from dist_logging import Logger, dist, setup_logging

PYTHON_LOG = '{run_name}/logs/python-rank{rank}.log'  # uploaded under the same name
log = logging.getLogger('train')


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default='configs/per_rank.yaml', help='Logger config (YAML)')
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--batches-per-epoch', type=int, default=20)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--report', default=None, help='folder where each rank writes where its output went (JSON)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # First thing, before the process group: a failure from here on is logged once per rank, tagged.
    setup_logging(file=PYTHON_LOG)
    use_cuda = torch.cuda.is_available()
    # Works under torchrun, `srun python` (SLURM) and `mpirun` alike: NCCL with CUDA, else gloo.
    dist.init_process_group_from_env()
    device = torch.device('cuda', torch.cuda.current_device()) if use_cuda else torch.device('cpu')
    rank, world_size = dist.get_global_rank(), dist.get_world_size()
    logging.getLogger('train').info(
        'launched by %s: %d rank(s) on %d node(s)', dist.launcher(), world_size, dist.get_num_nodes()
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1234 + rank)  # each rank sees its own data shard
    true_weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))

    logger = Logger.from_config(args.config)
    # Again, now with the Logger: the same file is also uploaded with the other logs.
    python_log = setup_logging(file=PYTHON_LOG, logger=logger)
    log.info('training %d epochs of %d batches on %d rank(s)', args.epochs, args.batches_per_epoch, world_size)
    logger.log_hyperparameters(
        {
            'lr': 1e-2,
            'batch_size': args.batch_size,
            'world_size': world_size,
            'epochs': args.epochs,
            'model': {'hidden': 64, 'layers': 2},
        }
    )
    checkpoint_dir = pathlib.Path(logger.run_name) / 'checkpoints'
    checkpoint_dir.mkdir(parents=True, exist_ok=True)

    logger.fit_start()
    for epoch in range(args.epochs):
        logger.epoch_start()
        for _ in range(args.batches_per_epoch):
            logger.batch_start()
            inputs = torch.randn(args.batch_size, 16, generator=generator)
            targets = inputs @ true_weights + 0.1 * torch.randn(args.batch_size, 1, generator=generator)
            inputs, targets = inputs.to(device), targets.to(device)
            loss = nn.functional.mse_loss(ddp_model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            # This rank's own loss goes to per-rank destinations; the mean across ranks
            # (a SUM and a MAX all_reduce at each scheduled flush, however many keys; issued
            # asynchronously at batch_end) goes to rank zero.
            logger.log_metrics({'rank_loss': loss.detach()})
            logger.log_metrics({'loss': loss.detach(), 'grad_norm': _grad_norm(model)}, reduce='mean')
            logger.log_metrics({'loss_max': loss.detach()}, reduce='max')
            logger.batch_end(samples=args.batch_size)
        # A fresh, unique file per epoch: hand it over without a copy (O(1), returns at once).
        path = checkpoint_dir / f'ep{epoch}-rank{rank}.pt'
        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}, path)
        logger.upload_file('{run_name}/checkpoints/ep{epoch}-rank{rank}.pt', path, copy=False)
        log.info('epoch %d done, checkpoint saved', epoch)  # every rank: one line on the console, one in each file
        logger.epoch_end()
    logger.fit_end()
    logger.close()

    if args.report:
        report = pathlib.Path(args.report)
        report.mkdir(parents=True, exist_ok=True)
        outputs = [describe(d) for d in logger.active_destinations]
        (report / f'rank{rank}.json').write_text(
            json.dumps(
                {
                    'rank': rank,
                    'local_rank': dist.get_local_rank(),
                    'node_rank': dist.get_node_rank(),
                    'launcher': dist.launcher(),
                    'run_name': logger.run_name,
                    'cwd': os.getcwd(),
                    'outputs': outputs,
                    'python_log': python_log,
                },
                indent=2,
            )
        )
    torch_dist.destroy_process_group()


def _grad_norm(model: nn.Module) -> torch.Tensor:
    return torch.norm(torch.stack([p.grad.detach().norm() for p in model.parameters() if p.grad is not None]))


def describe(destination: object) -> dict:
    """Where a destination put this rank's output (for the demo's summary)."""
    info = {'destination': type(destination).__name__, 'ranks': getattr(destination, 'ranks', 'zero')}
    for attribute in ('filename', 'remote_file_name', 'log_dir', 'bucket_uri', 'tracking_uri'):
        value = getattr(destination, attribute, None)
        if isinstance(value, (str, os.PathLike)):
            info[attribute] = os.fspath(value)
    return info


if __name__ == '__main__':
    main()
