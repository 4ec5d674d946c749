"""Per-call cost of ``Logger.log_metrics`` on rank zero and on the other ranks, next to the alternatives.

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/log_overhead.py

Modes (interleaved round by round; each round times ``--inner`` back-to-back calls and
divides, because a single sub-microsecond call is below the timer's resolution):

* ``noop_call``: a Python function taking ``(metrics, step)`` that does nothing -- the cost
  of any Python-level logging API, the floor.
* ``dict_append``: appending the metrics dict to a list -- what a hand-rolled loop does.
* ``ours_3zero``: a :class:`~dist_logging.Logger` with 3 rank-zero destinations (in-memory,
  console to an in-memory stream, file). On other ranks no destination is active.
* ``ours_inmem``: a Logger with one rank-zero :class:`InMemoryLogger`.
* ``composer_design``: Composer's ``Logger.log_metrics`` + ``InMemoryLogger.log_metrics``
  re-implemented line for line (Composer 0.2x/0.3x: read the step from the state's
  timestamp, loop over destinations, deep-copy the metrics, append ``(timestamp, value)``).
  Composer has no rank policy, so its destinations run on every rank.
* ``composer_real``: Composer's own ``Logger`` + ``InMemoryLogger``, when ``mosaicml`` is importable.

Second part, per batch (``--lines-per-batch`` ``log_metrics`` calls, then ``batch_end``), on every
rank with a per-rank :class:`FileLogger` at its defaults (64 KiB buffer, flush every 100 batches):

* ``batch_file_durable``: as shipped: every ``batch_end`` hands the batch's lines to the OS (one
  ``write`` call), so a killed rank keeps them (issue 21).
* ``batch_file_buffered``: the previous behaviour (lines reach the OS every 100 batches only).
* ``batch_inmem``: the same calls with an in-memory destination only: the floor.
"""

from __future__ import annotations

import copy
import io
import os
import pathlib
import sys
import tempfile
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

NAME = 'log_overhead'
METRICS = {'loss/train': 0.6931, 'lr': 3e-4}


# ----------------------------------------------------------------------------- Composer's design, faithfully
class _ComposerTimestampLike:
    class _Batch:
        value = 0

    batch = _Batch()


class _ComposerStateLike:
    timestamp = _ComposerTimestampLike()


class ComposerDesignInMemoryLogger:
    """Composer's ``InMemoryLogger.log_metrics`` body (deep copy, per-key append, most-recent maps)."""

    def __init__(self, state: Any):
        self.state = state
        self.data: dict[str, list] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_timestamps: dict[str, Any] = {}

    def log_metrics(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        assert self.state is not None
        timestamp = self.state.timestamp
        copied_metrics = copy.deepcopy(metrics)
        for k, v in copied_metrics.items():
            if k not in self.data:
                self.data[k] = []
            self.data[k].append((timestamp, v))
        self.most_recent_values.update(copied_metrics.items())
        self.most_recent_timestamps.update({k: timestamp for k in copied_metrics})


class ComposerDesignLogger:
    """Composer's ``Logger.log_metrics`` body."""

    def __init__(self, state: Any, destinations: tuple):
        self.destinations = destinations
        self._state = state

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        if step is None:
            step = self._state.timestamp.batch.value
        for destination in self.destinations:
            destination.log_metrics(metrics, step)


def _composer_real() -> Optional[Callable]:
    """Composer's real Logger with its InMemoryLogger, or None when not importable."""
    if C.composer_available() is None:
        return None
    try:
        from composer.core import State  # noqa: F401
        from composer.loggers import InMemoryLogger, Logger
    except Exception:  # noqa: BLE001
        return None
    state = _ComposerStateLike()
    destination = InMemoryLogger()
    destination.state = state  # what InMemoryLogger.init does
    return Logger(state, destination).log_metrics  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the benchmark
def build_modes(workdir: pathlib.Path) -> tuple[dict[str, Callable], list]:
    from dist_logging import Logger
    from dist_logging.destinations.console import ConsoleLogger
    from dist_logging.destinations.file import FileLogger
    from dist_logging.destinations.in_memory import InMemoryLogger

    history: list = []
    append = history.append

    def noop_call(metrics: Any, step: Any = None) -> None:
        return None

    def dict_append(metrics: Any, step: Any = None) -> None:
        append(metrics)

    three = Logger(
        [
            InMemoryLogger(ranks='zero'),
            ConsoleLogger(ranks='zero', stream=io.StringIO(), log_interval=1 << 30),
            FileLogger(str(workdir / 'log-{rank}.txt'), remote_file_name='', ranks='zero', flush_interval=1 << 30),
        ],
        run_name='bench-log-overhead',
    )
    inmem = Logger([InMemoryLogger(ranks='zero')], run_name='bench-log-overhead')
    state = _ComposerStateLike()
    composer_design = ComposerDesignLogger(state, (ComposerDesignInMemoryLogger(state),))
    modes: dict[str, Callable] = {
        'noop_call': noop_call,
        'dict_append': dict_append,
        'ours_3zero': three.log_metrics,
        'ours_inmem': inmem.log_metrics,
        'composer_design': composer_design.log_metrics,
    }
    real = _composer_real()
    if real is not None:
        modes['composer_real'] = real
    return modes, [three, inmem]


def build_batch_modes(workdir: pathlib.Path) -> tuple[dict[str, Any], list]:
    """Loggers for the per-batch part: the durable FileLogger, the buffered-only one, in-memory only."""
    from dist_logging import Logger
    from dist_logging.destinations._periodic import PeriodicFlushMixin
    from dist_logging.destinations.file import FileLogger
    from dist_logging.destinations.in_memory import InMemoryLogger

    class BufferedOnlyFileLogger(FileLogger):
        """FileLogger before issue 21: lines reach the OS only at its flush (every 100 batches)."""

        batch_end = PeriodicFlushMixin.batch_end

    loggers = {
        'batch_file_durable': Logger(
            [FileLogger(str(workdir / 'durable-{rank}.txt'), remote_file_name='')], run_name='bench-durable'
        ),
        'batch_file_buffered': Logger(
            [BufferedOnlyFileLogger(str(workdir / 'buffered-{rank}.txt'), remote_file_name='')],
            run_name='bench-buffered',
        ),
        'batch_inmem': Logger([InMemoryLogger(ranks='all')], run_name='bench-inmem'),
    }
    return loggers, list(loggers.values())


def time_batches(logger: Any, metrics: dict, lines: int, batches: int) -> int:
    """Nanoseconds for ``batches`` batches of ``lines`` log_metrics calls and a batch_end."""
    log, end, rng = logger.log_metrics, logger.batch_end, range(lines)
    start = C.now_ns()
    for _ in range(batches):
        for _ in rng:
            log(metrics)
        end()
    return C.now_ns() - start


def time_batch(fn: Callable, metrics: dict, inner: int) -> int:
    """Nanoseconds for ``inner`` calls of ``fn(metrics)``."""
    rng = range(inner)
    start = C.now_ns()
    for _ in rng:
        fn(metrics)
    return C.now_ns() - start


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=300, help='timed batches per mode')
    parser.add_argument('--inner', type=int, default=2000, help='calls per timed batch')
    parser.add_argument('--batch-rounds', type=int, default=200, help='timed groups of batches per batch mode')
    parser.add_argument('--batches', type=int, default=50, help='batches per timed group')
    parser.add_argument('--lines-per-batch', type=int, default=10, help='log_metrics calls per batch')
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.inner, args.batch_rounds, args.batches = 20, 200, 10, 20
    d = C.init_distributed(args.backend)
    with tempfile.TemporaryDirectory(prefix='bench-log-overhead-') as tmp:
        modes, loggers = build_modes(pathlib.Path(tmp))
        d.log(f'log_overhead: {d.world_size} ranks, modes {list(modes)}, {args.rounds} rounds x {args.inner} calls')
        # Warm-up: a few batches of each, untimed.
        for fn in modes.values():
            time_batch(fn, METRICS, args.inner)
        d.barrier()
        per_call_ns: dict[str, list[float]] = {m: [] for m in modes}
        for _, order in C.rotations(list(modes), args.rounds):
            for mode in order:
                per_call_ns[mode].append(time_batch(modes[mode], METRICS, args.inner) / args.inner)
        for logger in loggers:
            logger.close()
        batch_loggers, to_close = build_batch_modes(pathlib.Path(tmp))
        for logger in batch_loggers.values():
            time_batches(logger, METRICS, args.lines_per_batch, args.batches)
        d.barrier()
        per_batch_ns: dict[str, list[float]] = {m: [] for m in batch_loggers}
        for _, order in C.rotations(list(batch_loggers), args.batch_rounds):
            for mode in order:
                ns = time_batches(batch_loggers[mode], METRICS, args.lines_per_batch, args.batches)
                per_batch_ns[mode].append(ns / args.batches)
        for logger in to_close:
            logger.close()
    gathered = d.all_gather_object({mode: C.summarize(v, 1e-3) for mode, v in per_call_ns.items()})
    gathered_batches = d.all_gather_object({mode: C.summarize(v, 1e-3) for mode, v in per_batch_ns.items()})

    summary: dict[str, Any] = {
        'what': 'per-call cost of log_metrics (µs per call; median etc. over timed batches of back-to-back calls)',
        'unit': 'us_per_call',
        'rounds': args.rounds,
        'inner': args.inner,
        'composer_version': C.composer_available(),
        'per_rank': {str(r): s for r, s in enumerate(gathered)},
    }
    rank0 = gathered[0]
    others = gathered[1:]

    def others_worst(mode: str) -> Optional[float]:
        return max((s[mode]['median'] for s in others), default=None)

    summary['rank0_median_us'] = {m: rank0[m]['median'] for m in modes}
    summary['other_ranks_worst_median_us'] = {m: others_worst(m) for m in modes} if others else None
    composer_ref = 'composer_real' if 'composer_real' in modes else 'composer_design'
    ours_other = others_worst('ours_3zero')
    targets = {
        'other_ranks_ours_3zero_le_0.3us': {
            'value_us': ours_other,
            'target_us': 0.3,
            'met': None if ours_other is None else ours_other <= 0.3,
            'note': None if others else 'world size 1: no non-zero rank measured',
        },
        f'rank0_ours_inmem_le_{composer_ref}': {
            'value_us': rank0['ours_inmem']['median'],
            'reference_us': rank0[composer_ref]['median'],
            'ratio': C.ratio(rank0['ours_inmem']['median'], rank0[composer_ref]['median']),
            'met': rank0['ours_inmem']['median'] <= rank0[composer_ref]['median'],
            'note': (
                'Composer not importable: compared with the line-for-line re-implementation of its design; '
                'the issue quotes about 2.2 µs for the real one on this machine'
            )
            if composer_ref != 'composer_real'
            else None,
        },
    }
    summary['ratios'] = {
        'rank0_ours_3zero_over_dict_append': C.ratio(rank0['ours_3zero']['median'], rank0['dict_append']['median']),
        'rank0_ours_inmem_over_composer': C.ratio(rank0['ours_inmem']['median'], rank0[composer_ref]['median']),
        'other_ours_3zero_over_noop_call': C.ratio(ours_other, others_worst('noop_call')) if others else None,
        'other_ours_3zero_over_dict_append': C.ratio(ours_other, others_worst('dict_append')) if others else None,
    }
    summary['targets'] = targets
    worst = {m: max(g[m]['median'] for g in gathered_batches) for m in per_batch_ns}
    summary['batch_durability'] = {
        'what': (
            f'µs per batch of {args.lines_per_batch} log_metrics calls + batch_end, FileLogger defaults; '
            'worst rank median'
        ),
        'per_rank': {str(r): g for r, g in enumerate(gathered_batches)},
        'worst_median_us': worst,
        'durable_minus_buffered_us_per_batch': worst['batch_file_durable'] - worst['batch_file_buffered'],
        'durable_over_buffered': C.ratio(worst['batch_file_durable'], worst['batch_file_buffered']),
    }
    summary = C.finish(NAME, d, summary, args, plot)
    return 0


def plot(summary: dict, d: C.Dist, out_json: Optional[str]) -> None:
    fig, (ax, ax_batch) = C.new_figure(ncols=2, width=6.5)
    modes = list(summary['rank0_median_us'])
    xs = range(len(modes))
    r0 = [summary['rank0_median_us'][m] for m in modes]
    ax.bar([x - 0.2 for x in xs], r0, width=0.4, label='rank 0')
    if summary.get('other_ranks_worst_median_us'):
        other = [summary['other_ranks_worst_median_us'][m] for m in modes]
        ax.bar([x + 0.2 for x in xs], other, width=0.4, label='other ranks (worst median)')
    ax.axhline(0.3, color='red', linestyle='--', linewidth=1, label='target on other ranks: 0.3 µs')
    ax.set_xticks(list(xs))
    ax.set_xticklabels(modes, rotation=20, ha='right')
    ax.set_ylabel('time per log_metrics call (µs, median)')
    ax.set_title(f'log_metrics per-call cost, {d.world_size} rank(s), {d.backend}')
    ax.legend()
    durability = summary.get('batch_durability')
    if durability:
        batch_modes = list(durability['worst_median_us'])
        ax_batch.bar(range(len(batch_modes)), [durability['worst_median_us'][m] for m in batch_modes])
        ax_batch.set_xticks(list(range(len(batch_modes))))
        ax_batch.set_xticklabels(batch_modes, rotation=20, ha='right')
        ax_batch.set_ylabel('µs per batch (worst rank median)')
        ax_batch.set_title('per batch: lines to the OS at every batch_end vs every 100')
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
