"""Soak: the load test's workload for N minutes; throughput, and any growth in memory or open files.

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/soak.py --minutes 30 --stores local,s3

Every rank runs a training-like loop for ``--minutes``: each step logs a few metrics (and a
reduced one every step, flushed every ``--flush-every`` steps: one collective), uploads a small file
every ``--small-every`` steps and a large one every ``--big-every`` steps to each store
(``copy=True``, the caller deletes its file at once). Every ``--sample-every`` seconds each rank
records its resident memory (RSS, from ``/proc/self/statm``), open file descriptors, threads,
bytes in its staging folders and the counts so far.

The JSON summary has, per rank and for the slowest/largest rank: throughput (metric calls/s,
uploads/s, MiB/s uploaded), RSS and open fds at the start and the end of the steady state, their
growth per hour from a least-squares fit over the second half of the run (the first half includes
warm-up: imports, clients, page cache), and whether every object landed. The PNG plots RSS, open
fds and staged bytes over time per rank. A leak shows as a steady positive slope; a flat line with
noise is what a healthy run looks like.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import threading
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

NAME = 'soak'
_PAGE = os.sysconf('SC_PAGE_SIZE') if hasattr(os, 'sysconf') else 4096


def rss_bytes() -> int:
    """Current resident set size (not the peak)."""
    try:
        with open('/proc/self/statm') as handle:
            return int(handle.read().split()[1]) * _PAGE
    except OSError:  # not Linux: the peak is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def open_fds() -> int:
    for folder in ('/proc/self/fd', '/dev/fd'):
        try:
            return len(os.listdir(folder)) - 1  # minus the listing's own descriptor
        except OSError:
            continue
    return -1


def tree_bytes(folder: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def slope_per_hour(times: list[float], values: list[float]) -> Optional[float]:
    """Least-squares slope of values over times (seconds), per hour; None with fewer than 3 points."""
    n = len(times)
    if n < 3:
        return None
    mt, mv = sum(times) / n, sum(values) / n
    var = sum((t - mt) ** 2 for t in times)
    if var == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in zip(times, values)) / var * 3600.0


class Sampler:
    """Samples RSS, fds, threads and staged bytes on a thread every ``interval`` seconds."""

    def __init__(self, interval: float, staging: list[str], counters: dict[str, int]):
        self.interval, self.staging, self.counters = interval, staging, counters
        self.samples: list[dict[str, Any]] = []
        self.peak_staged = 0
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name='soak-sampler', daemon=True)

    def start(self) -> 'Sampler':
        self._thread.start()
        return self

    def sample(self) -> None:
        staged = sum(tree_bytes(f) for f in self.staging)
        self.peak_staged = max(self.peak_staged, staged)
        self.samples.append(
            {
                't': round(time.monotonic() - self._start, 3),
                'rss': rss_bytes(),
                'fds': open_fds(),
                'threads': threading.active_count(),
                'staged': staged,
                **dict(self.counters),
            }
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def run_rank(args: Any, d: C.Dist, workdir: pathlib.Path, endpoint: Optional[str]) -> dict[str, Any]:
    from dist_logging import Logger
    from dist_logging.destinations import FileLogger, InMemoryLogger, RemoteUploaderDownloader

    stores = [s for s in args.stores.split(',') if s]
    uploaders = []
    for store in stores:
        staging = str(workdir / f'staging-{store}')
        if store == 'local':
            uploaders.append(
                RemoteUploaderDownloader(
                    f'file://{workdir}/bucket', upload_staging_folder=staging, max_staged_bytes=args.max_staged_bytes
                )
            )
        else:
            uploaders.append(
                RemoteUploaderDownloader(
                    f's3://{C.MOTO_BUCKET}/soak',
                    upload_staging_folder=staging,
                    max_staged_bytes=args.max_staged_bytes,
                    backend_kwargs={'endpoint_url': endpoint},
                )
            )
    memory = InMemoryLogger()
    logger = Logger(
        [memory, FileLogger(str(workdir / 'logs' / 'rank{rank}.jsonl'), format='jsonl', remote_file_name='')]
        + uploaders,
        run_name='soak',
        sync_timeout=600,
    )
    src = workdir / 'src' / f'rank{d.rank}'
    src.mkdir(parents=True, exist_ok=True)
    counters = {'metric_calls': 0, 'uploads': 0, 'uploaded_bytes': 0, 'steps': 0}
    staging_dirs = [str(workdir / f'staging-{s}' / f'rank{d.rank}') for s in stores]
    sampler = Sampler(args.sample_every, staging_dirs, counters)
    sampler.sample()
    sampler.start()
    d.barrier()
    deadline = time.monotonic() + args.minutes * 60.0
    step = 0
    expected: dict[str, int] = {}
    t0 = time.monotonic()
    while True:
        # every rank stops at the same step (the flush is a collective): agree at each flush
        logger.log_metrics({'loss': 1.0 / (step + 1), 'lr': 3e-4, 'grad_norm': 0.5}, step=step)
        logger.log_metrics({'loss_mean': float(step % 7)}, step=step, reduce='mean')
        counters['metric_calls'] += 2
        if step % args.small_every == 0:
            path = src / 'small.bin'
            path.write_bytes(os.urandom(args.small_size))
            name = f'rank{d.rank}/small/{step}.bin'
            logger.upload_file(name, str(path))
            expected[name] = args.small_size
            counters['uploads'] += len(uploaders)
            counters['uploaded_bytes'] += args.small_size * len(uploaders)
            path.unlink()
        if args.big_every and step % args.big_every == args.big_every - 1:
            path = src / 'big.bin'
            with open(path, 'wb') as handle:
                left = args.big_size
                while left > 0:
                    n = min(left, 8 << 20)
                    handle.write(os.urandom(n))
                    left -= n
            name = f'rank{d.rank}/big/{step}.bin'
            logger.upload_file(name, str(path))
            expected[name] = args.big_size
            counters['uploads'] += len(uploaders)
            counters['uploaded_bytes'] += args.big_size * len(uploaders)
            path.unlink()
        step += 1
        counters['steps'] = step
        if step % args.flush_every == 0:
            logger.batch_end()
            done = d.all_gather_object(time.monotonic() >= deadline)
            if any(done):
                break
        else:
            logger.state.advance_batch()
        memory.data.clear()  # the in-memory sink is for checking, not for growing over an hour
    loop_seconds = time.monotonic() - t0
    sampler.stop()  # the steady state ends here; close() stops threads and closes files
    t1 = time.monotonic()
    logger.close()
    close_seconds = time.monotonic() - t1
    after_close = {'rss_mib': rss_bytes() / (1 << 20), 'fds': open_fds(), 'threads': threading.active_count()}

    # every object landed, with its size
    missing = []
    if 'local' in stores:
        for name, size in expected.items():
            path = workdir / 'bucket' / name
            if not path.exists() or path.stat().st_size != size:
                missing.append(f'local:{name}')
    if 's3' in stores:
        client = C.s3_client(endpoint)
        for name, size in expected.items():
            try:
                if client.head_object(Bucket=C.MOTO_BUCKET, Key=f'soak/{name}')['ContentLength'] != size:
                    missing.append(f's3:{name}')
            except Exception:  # noqa: BLE001 - reported, not raised
                missing.append(f's3:{name}')

    samples = sampler.samples
    half = [s for s in samples if s['t'] >= samples[-1]['t'] / 2] or samples
    times = [s['t'] for s in half]
    return {
        'steps': step,
        'loop_seconds': loop_seconds,
        'close_seconds': close_seconds,
        'metric_calls_per_s': counters['metric_calls'] / loop_seconds,
        'uploads_per_s': counters['uploads'] / loop_seconds,
        'upload_mib_per_s': counters['uploaded_bytes'] / loop_seconds / (1 << 20),
        'objects': len(expected) * len(uploaders),
        'missing_objects': missing[:20],
        'missing_count': len(missing),
        'rss_mib': {
            'start_steady': half[0]['rss'] / (1 << 20),
            'end': samples[-1]['rss'] / (1 << 20),
            'max': max(s['rss'] for s in samples) / (1 << 20),
            'growth_mib_per_hour': _scaled(slope_per_hour(times, [s['rss'] for s in half]), 1 << 20),
        },
        'open_fds': {
            'start_steady': half[0]['fds'],
            'end': samples[-1]['fds'],
            'max': max(s['fds'] for s in samples),
            'growth_per_hour': slope_per_hour(times, [s['fds'] for s in half]),
        },
        'threads': {'start_steady': half[0]['threads'], 'end': samples[-1]['threads']},  # end: before close()
        'peak_staged_mib': sampler.peak_staged / (1 << 20),
        'after_close': after_close,
        'samples': samples,
    }


def _scaled(value: Optional[float], scale: float) -> Optional[float]:
    return None if value is None else value / scale


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument('--minutes', type=float, default=10.0, help='how long to run')
    parser.add_argument('--stores', default='local,s3', help='comma-separated: local, s3 (moto on loopback)')
    parser.add_argument('--flush-every', type=int, default=100, help='steps between flushes (batch_end)')
    parser.add_argument('--small-every', type=int, default=50, help='steps between small-file uploads')
    parser.add_argument('--small-size', type=C.parse_size, default=4096, help='size of a small file')
    parser.add_argument('--big-every', type=int, default=2500, help='steps between large-file uploads (0: none)')
    parser.add_argument('--big-size', type=C.parse_size, default=64 << 20, help='size of a large file')
    parser.add_argument('--max-staged-bytes', type=C.parse_size, default=256 << 20, help='per uploader')
    parser.add_argument('--sample-every', type=float, default=2.0, help='seconds between samples')
    parser.add_argument('--workdir', default=None, help='scratch folder (default: a temp dir, removed after)')
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.big_size, args.big_every, args.sample_every = 0.3, 1 << 20, 500, 0.5

    d = C.init_distributed(args.backend)
    endpoint, moto = (None, None)
    if 's3' in args.stores.split(','):
        endpoint, moto = C.start_moto(d)
    workdir = pathlib.Path(args.workdir or d.shared_temp_dir('dist_logging-soak-'))
    d.log(f'soak: {d.world_size} ranks for {args.minutes} min, stores {args.stores}, workdir {workdir}')
    try:
        mine = run_rank(args, d, workdir, endpoint)
        everyone = d.all_gather_object(mine)
    finally:
        d.barrier()
        C.stop_moto(moto)
        if d.local_rank == 0 and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    per_rank = {str(r): {k: v for k, v in res.items() if k != 'samples'} for r, res in enumerate(everyone)}
    growth = [
        res['rss_mib']['growth_mib_per_hour'] for res in everyone if res['rss_mib']['growth_mib_per_hour'] is not None
    ]
    fd_growth = [
        res['open_fds']['growth_per_hour'] for res in everyone if res['open_fds']['growth_per_hour'] is not None
    ]
    summary = {
        'config': {k: v for k, v in vars(args).items() if k not in ('out_json',)},
        'per_rank': per_rank,
        'overall': {
            'minutes': max(res['loop_seconds'] for res in everyone) / 60.0,
            'metric_calls_per_s_total': sum(res['metric_calls_per_s'] for res in everyone),
            'uploads_per_s_total': sum(res['uploads_per_s'] for res in everyone),
            'upload_mib_per_s_total': sum(res['upload_mib_per_s'] for res in everyone),
            'max_rss_mib': max(res['rss_mib']['max'] for res in everyone),
            'max_rss_growth_mib_per_hour': max(growth) if growth else None,
            'max_open_fds': max(res['open_fds']['max'] for res in everyone),
            'max_fd_growth_per_hour': max(fd_growth) if fd_growth else None,
            'fds_end_minus_start_max': max(
                res['open_fds']['end'] - res['open_fds']['start_steady'] for res in everyone
            ),
            'peak_staged_mib_max': max(res['peak_staged_mib'] for res in everyone),
            'objects': sum(res['objects'] for res in everyone),
            'missing_objects': sum(res['missing_count'] for res in everyone),
            'max_close_seconds': max(res['close_seconds'] for res in everyone),
        },
        'series': {str(r): res['samples'] for r, res in enumerate(everyone)},
    }
    summary = C.finish(NAME, d, summary, args, plot)
    return 0 if summary['overall']['missing_objects'] == 0 else 1


def plot(summary: dict[str, Any], d: C.Dist, out_json: Optional[str]) -> None:
    fig, (ax_rss, ax_fds, ax_staged) = C.new_figure(ncols=3, width=5.0)
    for rank, samples in summary['series'].items():
        minutes = [s['t'] / 60.0 for s in samples]
        ax_rss.plot(minutes, [s['rss'] / (1 << 20) for s in samples], label=f'rank {rank}')
        ax_fds.plot(minutes, [s['fds'] for s in samples], label=f'rank {rank}')
        ax_staged.plot(minutes, [s['staged'] / (1 << 20) for s in samples], label=f'rank {rank}')
    overall = summary['overall']
    ax_rss.set_title(f"RSS (max growth {overall['max_rss_growth_mib_per_hour'] or 0:.1f} MiB/h, 2nd half)")
    ax_rss.set_ylabel('MiB')
    ax_fds.set_title(f"open file descriptors (max growth {overall['max_fd_growth_per_hour'] or 0:.1f}/h)")
    ax_staged.set_title('bytes in staging (MiB)')
    for ax in (ax_rss, ax_fds, ax_staged):
        ax.set_xlabel('minutes')
        ax.grid(True, alpha=0.3)
    ax_rss.legend(fontsize='small')
    fig.suptitle(
        f"soak: {d.world_size} ranks, {overall['minutes']:.1f} min, "
        f"{overall['metric_calls_per_s_total']:.0f} metric calls/s, "
        f"{overall['upload_mib_per_s_total']:.1f} MiB/s uploaded, {overall['missing_objects']} missing"
    )
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
