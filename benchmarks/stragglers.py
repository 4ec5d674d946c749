"""Rank reports (issue 32): does the report name a slowed rank, stay quiet without one, and cost the step nothing?

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/stragglers.py          # ~2-4 minutes on 2 cores
    torchrun --standalone --nproc_per_node=2 benchmarks/stragglers.py --quick

The step is GPU-like: a short CPU part (a busy loop) and a longer wait standing for device work
(a sleep), both in a ``forward`` section, then a real all-reduce of a gradient-sized tensor in a
``grad_sync`` wait section (DDP's gradient sync: every rank leaves it together, so the wall-clock
step is the same on every rank), then ``batch_end``. Every rank's work gets +-5 % uniform jitter
per step; in the ``slowed`` run the last rank's work is 1.2x.

Parts, all in one run:

* **detection** (``slowed``): the report at which the slowed rank is first named chronic (target:
  within 2 reports), and any other rank ever flagged (target: none).
* **false reports** (``even``): ``--even-steps`` steps (default 10,000) without a slowed rank; every
  flag (chronic or one-off) on any rank counts (target: 0).
* **overhead**: the same loop with reports off, on every ``--every`` batches and on every ten times as many,
  interleaved in rounds (the order rotated). The training thread's CPU time the report adds, call by
  call: the sections over the reports-off sections, plus the rank reporter's share of ``batch_end``
  (the report's collectives and hand-over at report steps included), per step, against the step
  (target: <= 0.1 %). The whole Logger's time on minus off is given as well (less the instrument's
  probed cost): it also holds the Logger's own ``batch_end`` in two different Logger objects, whose
  difference (some 10 us either way, cache placement) is as large as the report's. So is the ratio
  of the rounds' wall-clock step time (on / off), which the +-5 % jitter makes noisy.
* **simulated**: on rank zero, the model of a 2-, 4- and 4,096-rank job (the same per-step jitter
  and slowdown, averaged per window as the timer does) through the same report code: detection,
  false reports over 10,000 steps, rank zero's CPU per report, and bytes per rank per report.

Output: ``benchmarks/results/stragglers-<host>-<date>-n<N>.json`` and a PNG beside it (left: busy
ratio per rank per report in the slowed run; middle: Logger time per step, on vs off; right: the
simulated detection).
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402

NAME = 'stragglers'


def spin(seconds: float) -> None:
    """Busy CPU for ``seconds`` (the step's host-side part)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def make_logger(every: Optional[int], run_name: str) -> Any:
    from dist_logging import Logger
    from dist_logging.destinations import InMemoryLogger

    return Logger(
        InMemoryLogger(),
        run_name=run_name,
        rank_report_every=every,
        sync_timeout=120,
        rank_report_options={'history': False, 'heatmap': False},
    )


class _ReporterClock:
    """Stands in front of a Logger's rank reporter to sum the training thread's CPU and wall time in its
    ``batch_end``: the report's own share of ``Logger.batch_end`` (the benchmark's instrument, not part of
    the product; everything else is forwarded, at the cost of one lookup more, counted against the report)."""

    def __init__(self, logger: Any):
        self.cpu_s = self.wall_s = self.probe_cpu_s = self.probe_wall_s = 0.0
        self._reporter = getattr(logger, '_ranks', None)
        if self._reporter is not None:
            logger._ranks = self
            self.timer = self._reporter.timer  # read by the Logger at every flush: no forwarding on that path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reporter, name)

    def batch_end(self, *args: Any, **kwargs: Any) -> Any:
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return self._reporter.batch_end(*args, **kwargs)
        finally:
            self.cpu_s += time.thread_time() - c0
            self.wall_s += time.perf_counter() - w0

    def probe(self) -> None:
        """The same instrument around a call that does nothing: what the instrument itself adds, to subtract."""
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return self._nothing()
        finally:
            self.probe_cpu_s += time.thread_time() - c0
            self.probe_wall_s += time.perf_counter() - w0

    @staticmethod
    def _nothing() -> None:
        return None

    def take(self) -> tuple[float, float, float, float]:
        """CPU and wall seconds in the reporter's ``batch_end`` since the last call, less the instrument's own;
        then the instrument's own CPU and wall seconds (what it added to the whole Logger's time)."""
        taken = (self.cpu_s - self.probe_cpu_s, self.wall_s - self.probe_wall_s, self.probe_cpu_s, self.probe_wall_s)
        self.cpu_s = self.wall_s = self.probe_cpu_s = self.probe_wall_s = 0.0
        return taken


def run_loop(
    logger: Any,
    steps: int,
    slow: float,
    args: Any,
    rng: random.Random,
    grad: torch.Tensor,
    timed: bool = False,
    reporter_clock: Optional[_ReporterClock] = None,
) -> dict[str, float]:
    """``steps`` training steps; with ``timed``, the training thread's time inside the Logger's calls, measured
    around each call: CPU time (the work the Logger does on the training thread) and wall time (that plus
    waiting, e.g. at a report's collective for the last rank to arrive, which the next gradient all-reduce
    would otherwise have waited for); separately, the sections' enters and exits, and (``reporter_clock``) the
    rank reporter's share of ``batch_end``, less what its instrument costs (probed once per step, after the
    Logger's calls)."""
    forward, sync = logger.section('forward'), logger.section('grad_sync', wait=True)
    wall, cpu = time.perf_counter, time.thread_time
    inside_wall = inside_cpu = sections_cpu = 0.0
    if reporter_clock is not None:
        reporter_clock.take()
    start = wall()
    for _ in range(steps):
        factor = rng.uniform(0.95, 1.05) * slow
        if timed:
            w0, c0 = wall(), cpu()
            forward.__enter__()
            c1, w1 = cpu(), wall()
        else:
            forward.__enter__()
        spin(args.cpu_ms * factor / 1e3)
        time.sleep(args.device_ms * factor / 1e3)
        if timed:
            w2, c2 = wall(), cpu()
            forward.__exit__(None, None, None)
            sync.__enter__()
            c3, w3 = cpu(), wall()
        else:
            forward.__exit__(None, None, None)
            sync.__enter__()
        torch_dist.all_reduce(grad)
        if timed:
            w4, c4 = wall(), cpu()
            sync.__exit__(None, None, None)
            c45 = cpu()
            logger.batch_end()
            c5, w5 = cpu(), wall()
            if reporter_clock is not None and reporter_clock._reporter is not None:
                reporter_clock.probe()  # after the measured calls: not counted in them
            inside_wall += (w1 - w0) + (w3 - w2) + (w5 - w4)
            inside_cpu += (c1 - c0) + (c3 - c2) + (c5 - c4)
            sections_cpu += (c1 - c0) + (c3 - c2) + (c45 - c4)
        else:
            sync.__exit__(None, None, None)
            logger.batch_end()
    elapsed = wall() - start
    reporter_cpu, reporter_wall, probe_cpu, probe_wall = (
        reporter_clock.take() if reporter_clock is not None else (0.0, 0.0, 0.0, 0.0)
    )
    # the whole Logger's time, less what the instrument in front of the reporter added to it
    return {
        'wall_s': elapsed,
        'step_ms': elapsed / steps * 1e3,
        'logger_us_per_step': (inside_wall - probe_wall) / steps * 1e6,
        'logger_cpu_us_per_step': (inside_cpu - probe_cpu) / steps * 1e6,
        'sections_cpu_us_per_step': sections_cpu / steps * 1e6,
        'reporter_cpu_us_per_step': reporter_cpu / steps * 1e6,
        'reporter_wall_us_per_step': reporter_wall / steps * 1e6,
    }


def runqueue_wait_s() -> float:
    """Seconds this thread has waited for a CPU while runnable (Linux schedstat; 0 elsewhere)."""
    try:
        with open('/proc/thread-self/schedstat') as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def detection(d: C.Dist, args: Any, grad: torch.Tensor, steps: int, slowed_rank: Optional[int]) -> dict[str, Any]:
    """One run with reports on; every report's flagged ranks, as rank zero saw them.

    Each rank also records, per window, how long it waited for a CPU while runnable (the kernel's
    run-queue wait): on a shared, oversubscribed machine a rank starved of CPU for a whole window
    really is slower, and the report names it; those flags are counted apart as explained."""
    rng = random.Random(1000 + d.rank)
    slow = args.slowdown if d.rank == slowed_rank else 1.0
    logger = make_logger(args.every, f'bench-stragglers-{"slowed" if slowed_rank is not None else "even"}')
    reports = []
    waits = []
    last = None

    def note(report: Any) -> None:
        nonlocal last
        if report is not None and report is not last and d.is_zero:
            last = report
            busy = report.series['busy']
            reports.append(
                {
                    'batch': report.batch,
                    'flagged': {str(e.rank): e.verdict for e in report.stragglers},
                    'busy_min_ms': busy.min_s * 1e3,
                    'busy_max_ms': busy.max_s * 1e3,
                    'busy_median_ms': busy.median_s * 1e3,
                    'spread': busy.spread,
                    'ratios': {str(e.rank): e.ratio for e in report.slowest},
                }
            )

    for _ in range(steps // args.every):
        before = runqueue_wait_s()
        run_loop(logger, args.every, slow, args, rng, grad)
        waits.append((runqueue_wait_s() - before) / args.every)
        note(logger.rank_report())  # a report is completed one step after its batch: this is the previous window's
    logger.close()
    note(logger.rank_report())  # the last window's, completed by close()
    all_waits = d.all_gather_object(waits)
    out: dict[str, Any] = {'steps': steps, 'reports': len(reports), 'slowed_rank': slowed_rank}
    if not d.is_zero:
        return out
    typical = [float(np.median([w[i] for w in all_waits])) for i in range(len(waits))]

    def starved(rank: int, window: int) -> bool:
        """The rank waited for a CPU, beyond the typical rank, at least half of its busy excess."""
        ratio = reports[window]['ratios'].get(str(rank))
        if ratio is None:
            return False
        excess_busy = (ratio - 1) * reports[window]['busy_min_ms']
        excess_wait = (all_waits[rank][window] - typical[window]) * 1e3
        return excess_busy > 0 and excess_wait >= 0.5 * excess_busy

    explained = 0
    for window, rep in enumerate(reports):
        rep['runqueue_wait_ms_per_step'] = {str(r): w[window] * 1e3 for r, w in enumerate(all_waits)}
        for rank in rep['flagged']:
            if slowed_rank is None or int(rank) != slowed_rank:
                # a chronic verdict outlives the slow window: look back over the verdict's window of reports
                explained += any(starved(int(rank), w) for w in range(max(0, window - 4), window + 1))
    out['false_flags_explained_by_cpu_starvation'] = explained
    others = sorted({int(r) for rep in reports for r in rep['flagged'] if slowed_rank is None or int(r) != slowed_rank})
    out['false_flags'] = sum(
        1 for rep in reports for r in rep['flagged'] if slowed_rank is None or int(r) != slowed_rank
    )
    out['falsely_flagged_ranks'] = others
    if slowed_rank is not None:
        chronic_at = [i + 1 for i, rep in enumerate(reports) if rep['flagged'].get(str(slowed_rank)) == 'chronic']
        named_at = [i + 1 for i, rep in enumerate(reports) if str(slowed_rank) in rep['flagged']]
        out['first_named_report'] = named_at[0] if named_at else None
        out['first_chronic_report'] = chronic_at[0] if chronic_at else None
        out['chronic_in_reports'] = len(chronic_at)
    out['per_report'] = reports
    return out


def overhead(d: C.Dist, args: Any, grad: torch.Tensor) -> dict[str, Any]:
    """Reports off, on every ``--every`` batches, and on every ten times as many (``sparse``), interleaved rounds;
    the training thread's time inside the Logger per step. The two intervals separate the per-step cost
    (sections, ``batch_end``) from the per-report cost, which the interval divides."""
    rng = random.Random(2000 + d.rank)
    intervals = {'on': args.every, 'sparse': args.every * 10, 'off': None}
    loggers = {mode: make_logger(every, f'bench-stragglers-{mode}') for mode, every in intervals.items()}
    clocks = {mode: _ReporterClock(logger) for mode, logger in loggers.items()}
    for mode, logger in loggers.items():  # warm-up: the first report agrees on names and gathers hosts
        run_loop(logger, (intervals[mode] or args.every) + 1, 1.0, args, rng, grad)
    rounds: list[dict[str, Any]] = []
    for _, order in C.rotations(list(loggers), args.rounds):
        row = {}
        for mode in order:
            row[mode] = run_loop(
                loggers[mode], args.round_steps, 1.0, args, rng, grad, timed=True, reporter_clock=clocks[mode]
            )
        rounds.append(row)
    for logger in loggers.values():
        logger.close()

    def median(mode: str, key: str) -> float:
        return float(np.median([r[mode][key] for r in rounds]))

    mine: dict[str, float] = {'step_ms': median('off', 'step_ms')}
    for mode in loggers:
        for key in ('logger_us', 'logger_cpu_us', 'sections_cpu_us', 'reporter_cpu_us', 'reporter_wall_us'):
            mine[f'{key}_{mode}'] = median(mode, f'{key}_per_step')
        # What the report adds on the training thread, attributed call by call: the sections over the
        # reports-off sections, plus the reporter's share of batch_end (0 with reports off).
        mine[f'added_cpu_us_{mode}'] = (
            mine[f'sections_cpu_us_{mode}']
            - median('off', 'sections_cpu_us_per_step')
            + mine[f'reporter_cpu_us_{mode}']
        )
    mine['wall_ratio'] = float(np.median([r['on']['step_ms'] / r['off']['step_ms'] for r in rounds]))
    everyone = d.all_gather_object(mine)

    def worst(key: str, mode: str) -> float:
        return max((m[f'{key}_{mode}'] - m[f'{key}_off']) / (m['step_ms'] * 1e3) for m in everyone)

    def worst_added(mode: str) -> float:
        return max(m[f'added_cpu_us_{mode}'] / (m['step_ms'] * 1e3) for m in everyone)

    return {
        'rounds': args.rounds,
        'round_steps': args.round_steps,
        'intervals': intervals,
        'per_rank': everyone,
        'worst_rank_added_cpu_fraction': worst_added('on'),
        'sparse_worst_rank_added_cpu_fraction': worst_added('sparse'),
        'worst_rank_cpu_overhead_fraction': worst('logger_cpu_us', 'on'),
        'worst_rank_wall_inside_overhead_fraction': worst('logger_us', 'on'),
        'sparse_worst_rank_cpu_overhead_fraction': worst('logger_cpu_us', 'sparse'),
        'sparse_worst_rank_wall_inside_overhead_fraction': worst('logger_us', 'sparse'),
        'wall_ratio_on_off_median': float(np.median([m['wall_ratio'] for m in everyone])),
    }


# ---------------------------------------------------------------------------- the simulated model


def simulate(args: Any, worlds: list[int]) -> dict[str, Any]:
    """The report code over modelled per-rank windows: +-5 % per-step jitter, one rank 1.2x, at N ranks."""
    from dist_logging.stragglers.report import (
        BUSY,
        FIXED,
        JITTER,
        MEMORY,
        STEPS,
        WALL,
        build_report,
        report_metrics,
        table_rows,
    )
    from dist_logging.stragglers.stats import VerdictTracker, Verdicts

    step_s = (args.cpu_ms + args.device_ms) / 1e3
    every = args.every
    out: dict[str, Any] = {}
    for world in worlds:
        rng = np.random.default_rng(world)
        sections = 2
        result: dict[str, Any] = {
            'bytes_per_rank_all_reduce': 8 * (2 * (3 + sections) + 1),
            'bytes_per_rank_gather': 8 * (FIXED + sections),
            'bytes_rank_zero_receives': 8 * (FIXED + sections) * world,
        }
        for label, slowed in (('slowed', world - 1), ('even', None)):
            tracker = VerdictTracker(world, Verdicts())
            windows = 10_000 // every if label == 'even' else 20
            flags, first_chronic, cpu = 0, None, []
            previous = None
            for window in range(windows):
                # The median of `every` steps of uniform +-5 % jitter per rank, and their median absolute
                # deviation (what the timer reports).
                steps = rng.uniform(0.95, 1.05, (every, world)) * step_s
                if slowed is not None:
                    steps[:, slowed] *= args.slowdown
                work = np.median(steps, axis=0)
                mad = np.median(np.abs(steps - work), axis=0)
                table = np.zeros((world, FIXED + sections))
                table[:, STEPS] = every
                table[:, BUSY] = work  # seconds per step
                table[:, WALL] = work.max() * every * 1.05
                table[:, MEMORY] = 2e9
                table[:, JITTER] = mad
                table[:, FIXED] = work * every * 0.3
                table[:, FIXED + 1] = work * every * 0.7
                t0 = time.thread_time_ns()
                report, previous = build_report(
                    table, ['data', 'forward'], ['host'] * world, tracker, previous, (window + 1) * every, window, 5
                )
                report_metrics(report)
                table_rows(report)
                cpu.append(time.thread_time_ns() - t0)
                for entry in report.stragglers:
                    if entry.rank != slowed:
                        flags += 1
                    elif entry.verdict == 'chronic' and first_chronic is None:
                        first_chronic = window + 1
            result[label] = {
                'reports': windows,
                'steps': windows * every,
                'false_flags': flags,
                'rank_zero_cpu_ms_per_report': C.summarize(cpu, scale=1e-6),
            }
            if slowed is not None:
                result[label]['first_chronic_report'] = first_chronic
        out[str(world)] = result
    return out


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = C.base_parser(__doc__.split('\n')[0])
    parser.add_argument('--every', type=int, default=100, help='rank_report_every')
    parser.add_argument('--cpu-ms', type=float, default=1.0, help='CPU part of the work per step (ms)')
    parser.add_argument('--device-ms', type=float, default=9.0, help='GPU-like wait of the work per step (ms)')
    parser.add_argument('--slowdown', type=float, default=1.2, help="the slowed rank's work factor")
    parser.add_argument('--slowed-steps', type=int, default=2000, help='steps of the slowed run')
    parser.add_argument('--even-steps', type=int, default=10_000, help='steps of the run without a slowed rank')
    parser.add_argument('--rounds', type=int, default=6, help='overhead rounds (each runs every mode)')
    parser.add_argument('--round-steps', type=int, default=1000, help='steps per mode per round')
    parser.add_argument('--simulate', default='2,4,4096', help='world sizes of the simulated model')
    args = parser.parse_args()
    if args.quick:
        args.slowed_steps, args.even_steps, args.rounds, args.round_steps = 500, 1000, 2, 300
    d = C.init_distributed(args.backend)
    load_start = os.getloadavg()  # this machine is shared: the load says how much the figures can be trusted
    grad = torch.ones(256 * 1024, device=d.device)  # 1 MiB of float32 "gradients"
    d.log(f'{d.world_size} rank(s): slowed run ({args.slowed_steps} steps)')
    slowed = detection(d, args, grad, args.slowed_steps, d.world_size - 1 if d.world_size > 1 else None)
    d.log(f'even run ({args.even_steps} steps)')
    even = detection(d, args, grad, args.even_steps, None)
    d.log(f'overhead ({args.rounds} rounds x {args.round_steps} steps x 3 modes)')
    cost = overhead(d, args, grad)
    simulated = simulate(args, [int(n) for n in args.simulate.split(',') if n.strip()]) if d.is_zero else {}
    summary: dict[str, Any] = {
        'what': 'rank reports: detection of a rank slowed 1.2x, false reports without one, training-thread overhead '
        'with reports on vs off (interleaved), and the simulated model at 2, 4 and 4,096 ranks',
        'world_size': d.world_size,
        'config': {
            k: getattr(args, k)
            for k in ('every', 'cpu_ms', 'device_ms', 'slowdown', 'slowed_steps', 'even_steps', 'rounds', 'round_steps')
        },
        'slowed': slowed,
        'even': even,
        'overhead': cost,
        'simulated': simulated,
        'load_average_1m': {'start': load_start[0], 'end': os.getloadavg()[0], 'cpus': os.cpu_count()},
    }
    if d.is_zero:
        targets: dict[str, Any] = {}
        if d.world_size > 1:
            first = slowed.get('first_chronic_report')
            targets['slowed_rank_chronic_within_2_reports'] = {'report': first, 'met': first is not None and first <= 2}
            targets['slowed_run_no_other_rank_flagged'] = {
                'flags': slowed['false_flags'],
                'met': slowed['false_flags'] == 0,
            }
        targets['no_false_reports_even_run'] = {
            'steps': args.even_steps,
            'flags': even['false_flags'],
            'met': even['false_flags'] == 0,
            'flags_explained_by_cpu_starvation': even['false_flags_explained_by_cpu_starvation'],
        }
        for mode, prefix in (('on', ''), ('sparse', 'sparse_')):
            fraction = cost[f'{prefix}worst_rank_added_cpu_fraction']
            targets[f'overhead_le_0.1pct_of_step_every_{cost["intervals"][mode]}'] = {
                'measure': "training thread's CPU time the report adds per step (sections over the reports-off "
                "sections, plus the reporter's share of batch_end) / step (worst rank)",
                'fraction': fraction,
                'met': fraction <= 0.001,
                'logger_cpu_on_minus_off_fraction': cost[f'{prefix}worst_rank_cpu_overhead_fraction'],
                'wall_inside_fraction': cost[f'{prefix}worst_rank_wall_inside_overhead_fraction'],
            }
        targets[f'overhead_le_0.1pct_of_step_every_{args.every}']['wall_step_ratio_on_off'] = cost[
            'wall_ratio_on_off_median'
        ]
        for world, sim in simulated.items():
            first = sim['slowed'].get('first_chronic_report')
            targets[f'simulated_{world}_chronic_within_2_reports'] = {
                'report': first,
                'met': first is not None and first <= 2,
            }
            targets[f'simulated_{world}_no_false_reports'] = {
                'flags': sim['even']['false_flags'] + sim['slowed']['false_flags'],
                'met': sim['even']['false_flags'] + sim['slowed']['false_flags'] == 0,
            }
        summary['targets'] = targets
    C.finish(NAME, d, summary, args, plot)
    return 0


def plot(summary: dict, d: C.Dist, out_json: Optional[str]) -> None:
    fig, (ax, bx, cx) = C.new_figure(ncols=3, width=5.6)
    reports = summary['slowed'].get('per_report', [])
    slowed_rank = summary['slowed'].get('slowed_rank')
    for rank in range(summary['world_size']):
        ys = [rep['ratios'].get(str(rank)) for rep in reports]
        if any(y is not None for y in ys):
            ax.plot(
                [rep['batch'] for rep in reports],
                ys,
                marker='o',
                label=f'rank {rank}' + (' (slowed 1.2x)' if rank == slowed_rank else ''),
            )
    ax.axhline(1.1, color='grey', linestyle='--', label='slow_ratio 1.1')
    ax.set_xlabel('batch')
    ax.set_ylabel('busy time / lower quartile')
    ax.set_title(f'Slowed run, {summary["world_size"]} ranks')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    per_rank = summary['overhead']['per_rank']
    xs = np.arange(len(per_rank))
    every = summary['config']['every']
    sections = [m['sections_cpu_us_on'] - m['sections_cpu_us_off'] for m in per_rank]
    bx.bar(xs - 0.3, sections, 0.2, label='sections, over reports-off sections')
    bx.bar(xs - 0.1, [m['reporter_cpu_us_on'] for m in per_rank], 0.2, label=f'reporter in batch_end, every {every}')
    bx.bar(
        xs + 0.1,
        [m['reporter_cpu_us_sparse'] for m in per_rank],
        0.2,
        label=f'reporter in batch_end, every {every * 10}',
    )
    bx.bar(
        xs + 0.3,
        [m['logger_cpu_us_on'] - m['logger_cpu_us_off'] for m in per_rank],
        0.2,
        label=f'whole Logger, on minus off (every {every})',
    )
    bx.axhline(0.001 * per_rank[0]['step_ms'] * 1e3, color='grey', linestyle='--', label='0.1 % of the step')
    bx.set_xticks(xs, [f'rank {r}' for r in xs])
    bx.set_ylabel('training thread CPU µs per step')
    step_ms = per_rank[0]['step_ms']
    cost = summary['overhead']
    bx.set_title(
        f'Added by the report, {step_ms:.2f} ms step: {cost["worst_rank_added_cpu_fraction"] * 100:.3f} % '
        f'(every {every}), {cost["sparse_worst_rank_added_cpu_fraction"] * 100:.3f} % (every {every * 10})',
        fontsize=9,
    )
    bx.legend(fontsize=7)
    worlds = sorted(summary['simulated'], key=int)
    cpu = [summary['simulated'][w]['even']['rank_zero_cpu_ms_per_report']['median'] for w in worlds]
    cx.plot([int(w) for w in worlds], cpu, marker='o', label='rank zero CPU per report (ms)')
    for w, y in zip(worlds, cpu):
        first = summary['simulated'][w]['slowed']['first_chronic_report']
        flags = summary['simulated'][w]['even']['false_flags']
        cx.annotate(f'chronic at report {first}, {flags} false', (int(w), y), fontsize=7)
    cx.set_xscale('log')
    cx.set_yscale('log')
    cx.set_xlabel('world size N (simulated model)')
    cx.set_ylabel('ms')
    cx.set_title('Simulated: detection and rank-zero cost')
    cx.grid(True, which='both', alpha=0.3)
    cx.legend(fontsize=7)
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
