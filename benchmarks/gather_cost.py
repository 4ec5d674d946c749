"""Cost of ``Logger.flush()`` with K reduced keys, next to one all_reduce (the floor) and K all_reduces.

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/gather_cost.py --keys 1,10,100,1000

For each K, rounds alternate between three modes (the order rotates every round), each
preceded by a barrier so all ranks start together:

* ``flush``: every rank logs K keys with ``reduce='mean'`` (not timed; its per-key cost is
  reported separately as ``buffer``), then ``logger.flush()`` is timed.
* ``floor_1tensor``: one ``all_reduce`` of a K-element float64 CPU tensor on the same gloo
  group the Logger uses -- what a flush cannot beat.
* ``per_key``: K ``all_reduce`` calls of one element each -- what per-call ``sync_dist``
  (Lightning) or a naive loop does.

With CUDA/NCCL, ``floor_nccl`` (one all_reduce of a K-element CUDA tensor on the NCCL
group) is added for reference; the Logger itself always reduces on a gloo CPU group.

A round's cost is the slowest rank's time (the flush is over when every rank has it); the
summary reports the median over rounds of that, and rank zero's own median.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402


NAME = 'gather_cost'


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument('--keys', default='1,10,100,1000', help='comma-separated K values')
    parser.add_argument('--rounds', type=int, default=40, help='rounds per K (per_key uses fewer at large K)')
    parser.add_argument('--per-key-budget', type=int, default=8000,
                        help='at most this many single-element all_reduces per K for the per_key mode')
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.rounds, args.per_key_budget = '1,10', 4, 200
    ks = [int(k) for k in args.keys.split(',') if k.strip()]

    d = C.init_distributed(args.backend)
    from dist_logging import Logger
    from dist_logging.destinations.in_memory import InMemoryLogger

    sink = InMemoryLogger(ranks='zero')
    logger = Logger([sink], run_name='bench-gather-cost', auto_flush=False)
    group = getattr(logger, '_group', None)
    floor_group = d.cpu_group  # gloo; the Logger reuses WORLD when the backend is gloo
    rank_value = float(d.rank + 1)
    d.log(f'gather_cost: {d.world_size} ranks ({d.backend}), K={ks}, {args.rounds} rounds')

    def do_flush(k: int, metrics: dict[str, float]) -> tuple[int, int, Optional[int]]:
        t0 = C.now_ns()
        logger.log_metrics(metrics, step=0, reduce='mean')
        t1 = C.now_ns()
        before = getattr(group, 'collective_count', None)
        logger.flush()
        t2 = C.now_ns()
        after = getattr(group, 'collective_count', None)
        return t2 - t1, t1 - t0, (after - before) if before is not None else None

    def floor(k: int) -> int:
        tensor = torch.full((k,), rank_value, dtype=torch.float64)
        t0 = C.now_ns()
        torch_dist.all_reduce(tensor, group=floor_group)
        return C.now_ns() - t0

    def per_key(k: int) -> int:
        tensors = [torch.full((1,), rank_value, dtype=torch.float64) for _ in range(k)]
        t0 = C.now_ns()
        for tensor in tensors:
            torch_dist.all_reduce(tensor, group=floor_group)
        return C.now_ns() - t0

    def floor_nccl(k: int) -> int:
        tensor = torch.full((k,), rank_value, dtype=torch.float64, device=d.device)
        C.device_sync(d.device)
        t0 = C.now_ns()
        torch_dist.all_reduce(tensor)
        C.device_sync(d.device)
        return C.now_ns() - t0

    results: dict[str, Any] = {}
    for k in ks:
        metrics = {f'metric/key{i:04d}': rank_value * (i + 1) for i in range(k)}
        modes = ['flush', 'floor_1tensor', 'per_key'] + (['floor_nccl'] if d.backend == 'nccl' else [])
        per_key_rounds = max(2, min(args.rounds, args.per_key_budget // max(k, 1)))
        samples: dict[str, list[int]] = {m: [] for m in modes}
        buffer_ns: list[int] = []
        collectives: list[Optional[int]] = []
        # Warm-up (lazy group creation, first key-set agreement, allocator): untimed.
        for _ in range(2):
            d.barrier()
            do_flush(k, metrics)
            d.barrier()
            floor(k)
        d.barrier()
        per_key(min(k, 10))
        for r, order in C.rotations(modes, args.rounds):
            for mode in order:
                if mode == 'per_key' and r >= per_key_rounds:
                    continue
                d.barrier()
                if mode == 'flush':
                    dt, buf, count = do_flush(k, metrics)
                    buffer_ns.append(buf)
                    collectives.append(count)
                elif mode == 'floor_1tensor':
                    dt = floor(k)
                elif mode == 'per_key':
                    dt = per_key(k)
                else:
                    dt = floor_nccl(k)
                samples[mode].append(dt)
        every = d.all_gather_object({'samples': samples, 'buffer': buffer_ns, 'collectives': collectives})
        entry: dict[str, Any] = {'rounds': args.rounds, 'per_key_rounds': per_key_rounds}
        for mode in modes:
            per_round_max = [max(rank['samples'][mode][i] for rank in every)
                             for i in range(len(samples[mode]))]
            entry[mode] = {
                'slowest_rank': C.summarize(per_round_max),
                'rank0': C.summarize(every[0]['samples'][mode]),
            }
        entry['buffer_log_metrics_K_keys'] = C.summarize(every[0]['buffer'])
        counts = [c for c in every[0]['collectives'] if c is not None]
        entry['collectives_per_flush'] = {'min': min(counts), 'max': max(counts)} if counts else None
        med = {m: entry[m]['slowest_rank']['median'] for m in modes}
        entry['ratio_flush_over_floor'] = C.ratio(med['flush'], med['floor_1tensor'])
        entry['ratio_per_key_over_flush'] = C.ratio(med['per_key'], med['flush'])
        results[str(k)] = entry
        d.log(f'  K={k}: flush {med["flush"]:.1f} µs, floor {med["floor_1tensor"]:.1f} µs, '
              f'per-key {med["per_key"]:.1f} µs, collectives/flush {entry["collectives_per_flush"]}')
    logger.close()

    summary: dict[str, Any] = {
        'what': 'flush() cost vs one all_reduce of a K-element tensor (floor) vs K all_reduces; µs, slowest rank per round',
        'unit': 'us',
        'keys': ks,
        'results': results,
    }
    targets: dict[str, Any] = {}
    if '100' in results:
        e = results['100']
        note = None if d.world_size == 4 else f'the target is stated for 4 ranks; this run has {d.world_size}'
        if d.world_size == 1:
            note = 'world size 1: flush issues no collective; ratios are not meaningful'
        targets['flush_100_le_2x_floor'] = {'ratio': e['ratio_flush_over_floor'], 'target': 2.0,
                                            'met': e['ratio_flush_over_floor'] is not None and e['ratio_flush_over_floor'] <= 2.0,
                                            'note': note}
        targets['per_key_100_ge_10x_flush'] = {'ratio': e['ratio_per_key_over_flush'], 'target': 10.0,
                                               'met': e['ratio_per_key_over_flush'] is not None and e['ratio_per_key_over_flush'] >= 10.0,
                                               'note': note}
    if d.world_size > 1 and any((results[str(k)]['collectives_per_flush'] or {}).get('max') == 0 for k in ks):
        summary['warning'] = 'flush() issued no collective at world size > 1: the flush figures are not a real reduction'
    summary['targets'] = targets
    summary = C.finish(NAME, d, summary, args, plot)
    return 0


def plot(summary: dict, d: C.Dist, out_json: Optional[str]) -> None:
    fig, (ax,) = C.new_figure()
    ks = summary['keys']
    modes = [m for m in ('flush', 'floor_1tensor', 'per_key', 'floor_nccl') if m in summary['results'][str(ks[0])]]
    labels = {'flush': 'Logger.flush()', 'floor_1tensor': 'one all_reduce of K floats (floor)',
              'per_key': 'K all_reduces (per-key sync_dist)', 'floor_nccl': 'one NCCL all_reduce (CUDA)'}
    for mode in modes:
        ys = [summary['results'][str(k)][mode]['slowest_rank']['median'] for k in ks]
        ax.plot(ks, ys, marker='o', label=labels[mode])
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('K (reduced keys per flush)')
    ax.set_ylabel('time per flush (µs, median of slowest rank)')
    note = ' (oversubscribed cores)' if d.local_world_size > (os.cpu_count() or 1) else ''
    ax.set_title(f'Metric reduction cost, {d.world_size} rank(s), {d.backend}{note}')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend()
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
