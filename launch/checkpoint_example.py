"""Train a model sharded with FSDP2 on gloo/CPU, checkpoint it to a bucket with ``dcp.async_save`` through
``CheckpointWriter``, get killed, restart and resume from the latest committed checkpoint.

Run it with ``python launch/checkpoint_run.py`` (two launches: killed, then resumed), or yourself::

    torchrun --standalone --nproc_per_node=2 launch/checkpoint_example.py --bucket file:///tmp/ckpt-bucket \\
        --staging /tmp/ckpt-staging --steps 40 --save-every 5 --die-at-step 17     # killed at step >= 17
    torchrun --standalone --nproc_per_node=2 launch/checkpoint_example.py --bucket file:///tmp/ckpt-bucket \\
        --staging /tmp/ckpt-staging --steps 40 --save-every 5                      # resumes, finishes

(``torchrun --max-restarts=1`` would restart the job by itself, but with torch 2.13 on CPU the
restarted workers' gloo ``init_process_group`` fails, "Gloo connectFullMesh failed ... Connection
refused", with or without dist_logging: a ten-line script that only inits gloo and SIGKILLs itself
on the first attempt reproduces it. So the demo launches twice, as a scheduler does after a
preemption.)

What happens on every rank:

1. ``latest_checkpoint(bucket, '<run>/checkpoints')`` (one listing and one read) names the newest
   committed checkpoint, or None on a fresh start. When there is one, ``dcp.load`` reads it
   straight from the bucket through ``CheckpointReader`` (each rank fetches only the shards its
   plan needs) into the sharded model and optimizer state, and training resumes at its step.
2. Every ``--save-every`` steps, ``dcp.async_save`` hands the sharded state (model, AdamW moments,
   step) to ``CheckpointWriter``: each rank writes its shards into the local staging folder, the
   durable upload queue takes them (a journal that survives SIGKILL), and the coordinator commits
   the checkpoint in the background once every shard landed. The training loop only waits for
   the previous async save's local write before starting the next one.
3. ``--die-at-step S`` (first attempt only): from step S on, as soon as the coordinator has seen a
   checkpoint commit (so the demo has something to resume from), every rank SIGKILLs itself,
   with the latest async save and its uploads possibly still in flight. The next launch's
   writer finds what the killed job left in its staging folder (same ``--staging``) and
   finishes it; ``latest_checkpoint`` only ever names a committed checkpoint.

The batches depend only on the step, so a resumed run computes what an uninterrupted run would.
With ``--out DIR`` each rank writes ``rank<r>-attempt<n>.json``: the step it resumed from, the
SHA-256 of its local state at every save and right after the load, and its final loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, format_checkpoint_id, latest_checkpoint

TEMPLATE = '{run_name}/checkpoints/step{step}'


def build_model(width: int, depth: int) -> torch.nn.Module:
    """An MLP whose every Linear is its own FSDP2 unit: parameters and optimizer state are sharded."""
    torch.manual_seed(0)  # the same initial weights on every rank and every attempt
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, 1))
    model = torch.nn.Sequential(*layers)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def batch(step: int, rank: int, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at ``step``: a function of (step, rank) only, so a resumed run sees the same data."""
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randn(size, width, generator=gen), torch.randn(size, 1, generator=gen)


def digest(state: Any) -> str:
    """SHA-256 of this rank's part of a (nested) state dict: local shards of DTensors, plain tensors, numbers."""
    h = hashlib.sha256()

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(f'{prefix}/{key}', value[key])
            return
        if hasattr(value, 'to_local'):
            value = value.to_local()
        h.update(prefix.encode())
        if isinstance(value, torch.Tensor):
            h.update(value.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())

    walk('', state)
    return h.hexdigest()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--bucket', required=True, help="bucket URI: file:///path, s3://bucket/prefix, ...")
    parser.add_argument('--endpoint-url', default=None, help='S3 endpoint (MinIO, moto, ...)')
    parser.add_argument('--run-name', default='ckpt-demo')
    parser.add_argument(
        '--staging',
        default=None,
        help='upload staging folder; the same on restart, so the restarted job finishes the '
        'uploads the killed one left (default: the writer\'s per-run folder)',
    )
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--save-every', type=int, default=5)
    parser.add_argument(
        '--die-at-step',
        type=int,
        default=None,
        help='first attempt only: SIGKILL every rank at the first step >= this one after a checkpoint committed',
    )
    parser.add_argument('--step-ms', type=float, default=0.0, help='sleep this long per step (a slower "GPU")')
    parser.add_argument('--width', type=int, default=64)
    parser.add_argument('--depth', type=int, default=2)
    parser.add_argument('--batch', type=int, default=16)
    parser.add_argument('--keep-last', type=int, default=None, help='retention: keep the newest N committed')
    parser.add_argument('--out', default=None, help='folder for per-rank JSON reports')
    parser.add_argument(
        '--attempt',
        type=int,
        default=None,
        help='names the reports (default: torchrun\'s restart count); --die-at-step acts in attempt 0',
    )
    args = parser.parse_args(argv)
    for name in ('steps', 'save_every', 'width', 'depth', 'batch'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1, got {getattr(args, name)}')

    dist.init_process_group('gloo')
    rank = dist.get_rank()
    attempt = args.attempt if args.attempt is not None else int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))
    # The background save's collectives get their own group: they must not interleave with FSDP's.
    ckpt_group = dist.new_group(backend='gloo')
    backend_kwargs = {'endpoint_url': args.endpoint_url} if args.endpoint_url else None
    model = build_model(args.width, args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    report: dict[str, Any] = {'rank': rank, 'attempt': attempt, 'saves': {}, 'resumed_from': None}

    # ---- resume
    prefix = f'{args.run_name}/checkpoints'
    latest = latest_checkpoint(args.bucket, prefix, backend_kwargs=backend_kwargs)
    start = 0
    if latest is not None:
        # AdamW's state exists only after a step: make it (zero-lr step, no gradients) so the load has slots.
        msd, osd = get_state_dict(model, optimizer)
        osd = _with_optimizer_slots(model, optimizer)
        state = {'model': msd, 'optim': osd, 'meta': {'step': torch.tensor(-1)}}
        # Ranged reads straight into memory (whole tensors into their destination): nothing on local disk.
        with CheckpointReader(args.bucket, backend_kwargs=backend_kwargs, run_name=args.run_name) as reader:
            dcp.load(state, checkpoint_id=latest, storage_reader=reader, process_group=ckpt_group)
        set_state_dict(model, optimizer, model_state_dict=state['model'], optim_state_dict=state['optim'])
        start = int(state['meta']['step'])
        report.update(resumed_from=start, resumed_id=latest, loaded_digest=digest(state))
        if rank == 0:
            print(f'[attempt {attempt}] resumed from {latest} (step {start})', flush=True)
    elif rank == 0:
        print(f'[attempt {attempt}] no committed checkpoint under {prefix}: starting at step 0', flush=True)

    writer = CheckpointWriter(
        args.bucket,
        backend_kwargs=backend_kwargs,
        upload_staging_folder=args.staging,
        run_name=args.run_name,
        keep_last=args.keep_last,
    )
    pending = None
    loss = torch.tensor(float('nan'))
    try:
        for step in range(start, args.steps):
            x, y = batch(step, rank, args.batch, args.width)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            done = step + 1  # steps completed: what a checkpoint taken now resumes at
            if done % args.save_every == 0:
                if pending is not None:
                    pending.result()  # the previous save's local write (its upload goes on)
                msd, osd = get_state_dict(model, optimizer)
                state = {'model': msd, 'optim': osd, 'meta': {'step': torch.tensor(done)}}
                report['saves'][str(done)] = digest(state)
                cid = format_checkpoint_id(TEMPLATE, run_name=args.run_name, step=done)
                response = dcp.async_save(state, checkpoint_id=cid, storage_writer=writer, process_group=ckpt_group)
                pending = getattr(response, 'upload_completion', response)
            if args.die_at_step is not None and attempt == 0 and done >= args.die_at_step and _committed(writer):
                _write_report(args.out, report)
                # Every rank's report is on disk before any rank dies: torchrun kills the other ranks
                # as soon as it sees one gone.
                dist.barrier()
                if rank == 0:
                    print(f'[attempt {attempt}] SIGKILL at step {done}', flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        if pending is not None:
            pending.result()
    finally:
        writer.close()  # waits for every upload and the coordinator's commits; raises what failed
    # Only the coordinator's close() waits for the commits: after this barrier every rank sees the last one.
    dist.barrier(group=ckpt_group)
    report['final_step'] = args.steps
    report['final_loss'] = loss.item()
    report['final_digest'] = digest(dict(zip(('model', 'optim'), get_state_dict(model, optimizer))))
    report['latest_at_end'] = latest_checkpoint(args.bucket, prefix, backend_kwargs=backend_kwargs)
    _write_report(args.out, report)
    if rank == 0:
        print(
            f'[attempt {attempt}] done: step {args.steps}, loss {loss.item():.6f}, latest {report["latest_at_end"]}',
            flush=True,
        )
    dist.destroy_process_group()
    return 0


def _with_optimizer_slots(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's sharded state dict with every slot allocated (a zero-lr step on zero gradients)."""
    lrs = [group['lr'] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group['lr'] = 0.0
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(optimizer.param_groups, lrs):
        group['lr'] = lr
    return get_state_dict(model, optimizer)[1]


def _committed(writer: CheckpointWriter) -> bool:
    """Whether the coordinator has committed a checkpoint of this run (the same answer on every rank)."""
    mine = torch.tensor([1 if any(t.commit_s is not None and not t.error for t in writer.timings) else 0])
    dist.broadcast(mine, src=0)
    return bool(mine.item())


def _write_report(out: Optional[str], report: dict) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f'rank{report["rank"]}-attempt{report["attempt"]}.json')
        with open(path + '.tmp', 'w') as handle:
            json.dump(report, handle)
        os.replace(path + '.tmp', path)


if __name__ == '__main__':
    sys.exit(main())
