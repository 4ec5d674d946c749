"""The flight recorder's cost on a training step: ``TORCH_FR_BUFFER_SIZE=0`` (off) against ``2000`` (what
``dist_logging.dist.init_process_group_from_env`` sets), interleaved.

Run (a driver; it launches the torchrun jobs itself)::

    python benchmarks/recorder_cost.py --nproc 2 --rounds 6 --steps 300

torch reads the variable once per process, so every setting is its own torchrun job; the jobs
alternate (off, on / on, off, round by round) so that a machine whose load drifts charges both
alike. Each job runs ``training_stall``'s step (the same MLP in DistributedDataParallel over gloo,
AdamW, random batches: one gradient all-reduce per bucket per step, each recorded by the flight
recorder when on) and reports rank zero's median step time over the timed steps. The figure is the
median over rounds of ``median(on) / median(off) - 1``; the target is at most 1 %.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NAME = 'recorder_cost'
SETTINGS = ('0', '2000')
RESULTS_DIR = pathlib.Path(__file__).resolve().parent / 'results'


def worker(args: argparse.Namespace) -> None:
    """One job: train ``args.warmup + args.steps`` steps, write rank zero's step times to ``args.worker_out``."""
    import torch
    import torch.distributed as torch_dist

    from training_stall import build_model

    torch_dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = build_model(args.width, args.depth, torch.device('cpu'))
    if torch_dist.get_world_size() > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    times = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    entries = None
    try:
        import pickle

        entries = len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))['entries'])
    except Exception:  # noqa: BLE001 - a torch without it
        pass
    # The recorder's own cost per collective, which a noisy step time hides: many small all_reduces,
    # wall time and the training thread's CPU time per call.
    small = torch.ones(8)
    torch_dist.barrier()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(args.collectives):
        torch_dist.all_reduce(small)
    per_call_us = 1e6 * (time.perf_counter() - wall) / args.collectives
    per_call_cpu_us = 1e6 * (time.thread_time() - cpu) / args.collectives
    torch_dist.barrier()
    if torch_dist.get_rank() == 0:
        pathlib.Path(args.worker_out).write_text(
            json.dumps(
                {
                    'step_s': times,
                    'fr_entries': entries,
                    'collective_us': per_call_us,
                    'collective_cpu_us': per_call_cpu_us,
                }
            )
        )
    torch_dist.destroy_process_group()


def micro_worker(args: argparse.Namespace) -> None:
    """One process, a world of one (gloo over a file store): CPU and wall time per small all_reduce."""
    import torch
    import torch.distributed as torch_dist

    torch_dist.init_process_group('gloo', init_method='file://' + args.micro_out + '.store', rank=0, world_size=1)
    small = torch.ones(8)
    for _ in range(200):
        torch_dist.all_reduce(small)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.collectives):
        torch_dist.all_reduce(small)
    report = {
        'wall_us': 1e6 * (time.perf_counter() - wall) / args.collectives,
        'cpu_us': 1e6 * (time.process_time() - cpu) / args.collectives,
    }
    pathlib.Path(args.micro_out).write_text(json.dumps(report))
    torch_dist.destroy_process_group()


def micro(args: argparse.Namespace, scratch: str) -> dict:
    """Alternate single-process runs with the recorder off and on; the per-call differences, per round."""
    rows = []
    for index in range(args.micro_rounds):
        row = {}
        for setting in SETTINGS if index % 2 == 0 else SETTINGS[::-1]:
            out = os.path.join(scratch, f'micro-{index}-{setting}.json')
            env = dict(os.environ, TORCH_FR_BUFFER_SIZE=setting, OMP_NUM_THREADS='1')
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), '--micro-out', out, '--collectives', str(args.collectives)],
                env=env,
                check=True,
                timeout=600,
            )
            row[setting] = json.loads(pathlib.Path(out).read_text())
        row['extra_cpu_us'] = row['2000']['cpu_us'] - row['0']['cpu_us']
        row['extra_wall_us'] = row['2000']['wall_us'] - row['0']['wall_us']
        print(
            f'[{NAME}] micro round {index}: off {row["0"]["cpu_us"]:.1f} us CPU, on {row["2000"]["cpu_us"]:.1f} us '
            f'CPU per all_reduce ({row["extra_cpu_us"]:+.1f} us)',
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return {
        'rounds': rows,
        'extra_cpu_us_median': statistics.median(r['extra_cpu_us'] for r in rows),
        'extra_wall_us_median': statistics.median(r['extra_wall_us'] for r in rows),
        'collectives': args.collectives,
    }


def launch(args: argparse.Namespace, setting: str, out: str) -> dict:
    """Run one job with ``TORCH_FR_BUFFER_SIZE=setting`` and return rank zero's report."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=setting, OMP_NUM_THREADS='1')
    cmd = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        f'--nproc_per_node={args.nproc}',
        os.path.abspath(__file__),
        '--worker-out',
        out,
        '--width',
        str(args.width),
        '--depth',
        str(args.depth),
        '--batch',
        str(args.batch),
        '--steps',
        str(args.steps),
        '--warmup',
        str(args.warmup),
        '--collectives',
        str(args.collectives),
    ]
    subprocess.run(cmd, env=env, check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(pathlib.Path(out).read_text())


def plot(summary: dict, path: pathlib.Path) -> None:
    """Step times per round and setting, and the per-round ratio."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    rounds = summary['rounds']
    for setting, marker in zip(SETTINGS, ('o', 's')):
        left.plot(
            range(len(rounds)),
            [r[setting]['median_ms'] for r in rounds],
            marker=marker,
            label=f'TORCH_FR_BUFFER_SIZE={setting}',
        )
    left.set_xlabel('round')
    left.set_ylabel('median step (ms)')
    left.legend()
    left.set_title('step time per job')
    right.bar(range(len(rounds)), [100 * r['cost'] for r in rounds])
    median = 100 * summary['cost_median']
    right.axhline(median, color='k', linestyle='--', label=f'median {median:+.2f} %')
    right.axhline(1.0, color='r', linestyle=':', label='target 1 %')
    right.set_xlabel('round')
    right.set_ylabel('on / off - 1 (%)')
    right.legend()
    right.set_title('flight recorder cost per round')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; be a worker under torchrun, else drive the interleaved jobs and write JSON + PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--steps', type=int, default=300)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--width', type=int, default=1024)
    parser.add_argument('--depth', type=int, default=4)
    parser.add_argument('--batch', type=int, default=128)
    parser.add_argument('--collectives', type=int, default=2000, help='small all_reduces timed after the steps')
    parser.add_argument('--out-json', default=None)
    parser.add_argument('--no-plot', action='store_true')
    parser.add_argument('--quick', action='store_true', help='2 rounds of 60 steps, a small model')
    parser.add_argument('--micro-only', action='store_true', help='only the single-process per-call timing')
    parser.add_argument('--worker-out', default=None, help=argparse.SUPPRESS)
    parser.add_argument('--micro-out', default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        '--micro-rounds',
        type=int,
        default=6,
        help='single-process runs per setting timing the recorder per all_reduce (0: none)',
    )
    args = parser.parse_args(argv)
    if args.worker_out:
        worker(args)
        return 0
    if args.micro_out:
        micro_worker(args)
        return 0
    if 'LOCAL_RANK' in os.environ:
        parser.error('run this driver with plain python (it launches its own torchrun jobs)')
    if args.quick:
        args.rounds, args.steps, args.warmup, args.width = 2, 60, 10, 256
    rounds = []
    with tempfile.TemporaryDirectory() as scratch:
        per_call = micro(args, scratch) if args.micro_rounds else None
        for index in range(0 if args.micro_only else args.rounds):
            order = SETTINGS if index % 2 == 0 else SETTINGS[::-1]
            row: dict = {'order': list(order)}
            for setting in order:
                report = launch(args, setting, os.path.join(scratch, f'{index}-{setting}.json'))
                steps = report['step_s']
                row[setting] = {
                    'median_ms': 1e3 * statistics.median(steps),
                    'mean_ms': 1e3 * statistics.fmean(steps),
                    'fr_entries': report['fr_entries'],
                    'collective_us': report['collective_us'],
                    'collective_cpu_us': report['collective_cpu_us'],
                }
            row['cost'] = row['2000']['median_ms'] / row['0']['median_ms'] - 1
            row['collective_extra_us'] = row['2000']['collective_us'] - row['0']['collective_us']
            row['collective_extra_cpu_us'] = row['2000']['collective_cpu_us'] - row['0']['collective_cpu_us']
            rounds.append(row)
            print(
                f'[{NAME}] round {index}: off {row["0"]["median_ms"]:.2f} ms, on {row["2000"]["median_ms"]:.2f} ms, '
                f'cost {100 * row["cost"]:+.2f} % (entries on: {row["2000"]["fr_entries"]}); per small all_reduce '
                f'{row["collective_extra_us"]:+.1f} us wall, {row["collective_extra_cpu_us"]:+.1f} us CPU',
                file=sys.stderr,
                flush=True,
            )
    summary = {
        'benchmark': NAME,
        'nproc': args.nproc,
        'steps': args.steps,
        'width': args.width,
        'depth': args.depth,
        'batch': args.batch,
        'rounds': rounds,
        'target': 0.01,
        'single_process_per_all_reduce': per_call,
        'host': os.uname().nodename,
        'load_average': os.getloadavg(),
    }
    if rounds:
        costs = [r['cost'] for r in rounds]
        summary.update(
            {
                'cost_median': statistics.median(costs),
                'cost_mean': statistics.fmean(costs),
                'cost_min': min(costs),
                'cost_max': max(costs),
                'collective_extra_us_median': statistics.median(r['collective_extra_us'] for r in rounds),
                'collective_extra_cpu_us_median': statistics.median(r['collective_extra_cpu_us'] for r in rounds),
                'collectives_per_step': (rounds[0]['2000']['fr_entries'] or 0) / max(1, args.steps + args.warmup),
                'note': 'fr_entries counts the training steps only (taken before the small all_reduces)',
            }
        )
    stamp = time.strftime('%Y%m%d-%H%M%S')
    default = RESULTS_DIR / f'{NAME}-{os.uname().nodename}-{stamp}-n{args.nproc}.json'
    path = pathlib.Path(args.out_json) if args.out_json else default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + '\n')
    print(json.dumps({k: v for k, v in summary.items() if k != 'rounds'}, indent=2))
    print(f'[bench] wrote {path}', file=sys.stderr)
    if not args.no_plot and rounds:
        plot(summary, path.with_suffix('.png'))
        print(f'[bench] wrote {path.with_suffix(".png")}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
