"""What node sampling and the Prometheus endpoint cost a training step (issue 41: <= 0.1 % at one sample a second).

Modes, interleaved round by round (the order rotates each round; round 0 is an untimed warm-up):

* ``off``: a Logger without telemetry;
* ``on``: ``system_metrics_every=1`` on every node's local-zero rank, the endpoint on rank zero
  (``metrics_port=0``) scraped once a second by a thread of this process, as Prometheus would;
* ``on_fast``: the same with a sample every 0.1 s, ten times the sampling work, to see the slope.

Each rank runs the same CPU training step (a small MLP's forward, backward and SGD update, with a
gradient all_reduce like data parallelism) followed by ``Logger.batch_end``. The figure of merit
is, per round, the median step time of a mode over ``off``'s in the same round; the summary gives
the median of those ratios over the rounds. Besides the step ratios (noisy on a shared machine),
the cost of one sample is timed directly (``sample_once``) and divided by the period: the share of
one core the sampler thread takes, which bounds what it can take from the step.

    torchrun --standalone --nproc_per_node=2 benchmarks/telemetry_overhead.py [--rounds 8 --steps 150]
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402
from _common import (
    base_parser,
    init_distributed,
    new_figure,
    rotations,
    save_figure,
    shutdown,  # noqa: E402
    summarize,
    write_results,
)

from dist_logging import Logger  # noqa: E402

NAME = 'telemetry_overhead'
MODES = ('off', 'on', 'on_fast')


def make_step(width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)

    def step() -> None:
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        if torch_dist.get_world_size() > 1:
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            torch_dist.all_reduce(flat)
        optimizer.step()

    return step


def scraper(url: str, stop: threading.Event, counts: list) -> None:
    while not stop.wait(1.0):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            counts[0] += 1
        except OSError:
            counts[1] += 1


def run_mode(mode: str, steps: int, step, d) -> list[float]:
    kwargs = {}
    if mode != 'off':
        kwargs = dict(system_metrics_every=1.0 if mode == 'on' else 0.1, metrics_port=0, metrics_host='127.0.0.1')
    logger = Logger(sync_timeout=60, **kwargs)
    stop, counts, thread = threading.Event(), [0, 0], None
    if logger.metrics_url:
        thread = threading.Thread(target=scraper, args=(logger.metrics_url, stop, counts), name='bench-scraper')
        thread.start()
    times = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            step()
            logger.batch_end()
            times.append(time.perf_counter_ns() - t0)
    finally:
        stop.set()
        if thread is not None:
            thread.join(5)
        logger.close()
    return times


def sample_cost_us(calls: int) -> dict:
    import psutil

    from dist_logging.telemetry import sample_once

    psutil.cpu_percent(None)
    samples = []
    for _ in range(calls):
        t0 = time.thread_time_ns()
        sample_once(psutil)
        samples.append(time.thread_time_ns() - t0)
    return summarize(samples)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=8, help='timed rounds per mode (plus one warm-up)')
    parser.add_argument('--steps', type=int, default=150, help='steps per mode per round')
    parser.add_argument('--width', type=int, default=512, help='the MLP width (sets the step time)')
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.width = 1, 20, 128
    d = init_distributed(args.backend or 'gloo')
    step = make_step(args.width)
    per_round: dict[str, list[float]] = {mode: [] for mode in MODES}
    all_times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r, order in rotations(MODES, args.rounds + 1):
        for mode in order:
            d.barrier()
            times = run_mode(mode, args.steps, step, d)
            if r == 0:
                continue  # warm-up
            per_round[mode].append(summarize(times)['median'])
            all_times[mode].extend(times)
        d.log(f'round {r}: ' + ', '.join(f'{m} {per_round[m][-1]:.0f} us' for m in MODES if per_round[m]))
    ratios = {
        mode: sorted(per_round[mode][i] / per_round['off'][i] for i in range(args.rounds))
        for mode in MODES
        if mode != 'off'
    }
    cost = sample_cost_us(20 if args.quick else 200)
    summary = {
        'question': 'step-time overhead of system_metrics_every (+ a scraped endpoint on rank zero)',
        'ranks': d.world_size,
        'rounds': args.rounds,
        'steps_per_round': args.steps,
        'width': args.width,
        'step_us': {mode: summarize([t for t in all_times[mode]]) for mode in MODES},
        'median_round_ratio_vs_off': {mode: values[len(values) // 2] for mode, values in ratios.items()},
        'round_ratios_vs_off': ratios,
        'sample_once_cpu_us': cost,
        'sampler_core_share_at_1s': cost['median'] / 1e6,
        'sampler_core_share_at_0.1s': cost['median'] / 1e5,
    }
    gathered = d.all_gather_object(summary['median_round_ratio_vs_off'])
    summary['median_round_ratio_vs_off_per_rank'] = gathered
    write_results(NAME, d, summary, args.out_json)
    if not args.no_plot and d.is_zero:
        fig, (left, right) = new_figure(2)
        for mode in MODES:
            left.plot(range(1, args.rounds + 1), [t / 1000 for t in per_round[mode]], marker='o', label=mode)
        left.set_xlabel('round')
        left.set_ylabel('median step time (ms)')
        left.set_title(f'{d.world_size} ranks, {args.steps} steps per mode per round')
        left.legend()
        names = list(ratios)
        right.boxplot([[(x - 1) * 100 for x in ratios[m]] for m in names])
        right.set_xticks(range(1, len(names) + 1), names)
        right.axhline(0.1, color='red', linestyle='--', label='0.1 % budget')
        right.axhline(-0.1, color='red', linestyle='--')
        right.set_ylabel('step time vs off, same round (%)')
        right.set_title(f'sample_once: {cost["median"]:.0f} us CPU ({cost["median"] / 1e4:.3f} % of a core at 1/s)')
        right.legend()
        save_figure(fig, NAME, d, args.out_json)
    shutdown(d)


if __name__ == '__main__':
    main()
