"""How long ``upload_file`` blocks the calling thread, per rank, next to the floors and the alternatives.

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/upload_latency.py --sizes 4KiB,1MiB,64MiB,256MiB

For each store target (a local folder, and an S3 server on loopback) and each file
size, every rank runs rounds; in each round every mode (in an order that rotates from
round to round) makes a burst of back-to-back calls after a barrier, and the upload modes
then wait until their objects landed. Recorded per mode:

* blocking time of each call on the calling thread (median, p95, p99, max; all ranks pooled,
  and the worst rank's median); also, separately, the first call of each burst (nothing of
  this mode in flight: the cost of a call itself, without contention from its own uploads);
* end to end: from the first call of the burst to the last object landed, the slowest rank;
* CPU seconds per GiB uploaded: the CPU the rank process (all threads, the calls included) and
  its worker processes spent from the first call to the last object landed, per GiB; the S3
  server is not counted (it stands for a remote machine, and runs at the lowest CPU and I/O
  priority unless ``--s3-server-priority normal``).

The S3 server is ``--s3-server sink`` (default: ``_s3_sink.py``, which answers what boto3 sends
and discards the bytes, at little CPU) or ``moto`` (a full emulator that keeps every byte, CPU-heavy).
``--s3-scheme https`` (default) is what clients of real S3 do: botocore sends PutObject/UploadPart
bodies unsigned (``STREAMING-UNSIGNED-PAYLOAD-TRAILER``), ``aws-chunked`` with an
``x-amz-checksum-crc32`` trailer, over TLS (the sink serves a throwaway self-signed certificate,
trusted through ``AWS_CA_BUNDLE``); ``--s3-scheme http`` has botocore sign every payload with
SHA-256 (which real S3 users do not pay) and no TLS (which they do): about the same client CPU per
GiB in all on a machine with SHA and AES instructions, spent differently. moto serves http only
(``--s3-server moto --s3-scheme http``).

Modes:

* ``ours_copy``, ``ours_nocopy``: ``Logger.upload_file(copy=True/False)`` with a
  ``RemoteUploaderDownloader`` (worker threads; ``--workers`` of them);
* ``ours_procs``: the same with ``use_procs=True`` and ``copy=True``;
* ``ours_copy_prio_normal``, ``ours_nocopy_prio_normal`` (not in the default list): the same as
  ``ours_copy``/``ours_nocopy`` with ``upload_priority='normal'`` (workers not lowered);
* ``floor_cfr``, ``floor_copy2``, ``floor_link``: a bare ``os.copy_file_range`` (in-kernel
  copy), ``shutil.copy2``, ``os.link`` of the same file -- what a snapshot cannot beat;
* ``sync_upload``: the upload done on the training thread (boto3 ``upload_file`` / copy + rename);
* ``composer_design``: ``shutil.copy2`` to a staging folder, an enqueue thread, a spawn
  ``multiprocessing`` queue and worker processes (Composer's RemoteUploaderDownloader design,
  with its defaults: 1 worker process, ``overwrite=False`` existence check);
* ``composer_real``: Composer's own RemoteUploaderDownloader on the S3 target, when ``mosaicml`` is importable.

All calls use unique names and ``overwrite=False`` (the API default). Objects are
checked (count and size) after each round, outside the timing, then deleted.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time
import uuid
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _baselines as B  # noqa: E402
import _common as C  # noqa: E402

NAME = 'upload_latency'
ALL_MODES = (
    'ours_copy',
    'ours_nocopy',
    'ours_procs',
    'floor_cfr',
    'floor_copy2',
    'floor_link',
    'sync_upload',
    'composer_design',
    'composer_real',
)
UPLOAD_MODES = (
    'ours_copy',
    'ours_nocopy',
    'ours_procs',
    'ours_procs_nocopy',
    'ours_copy_prio_normal',
    'ours_nocopy_prio_normal',
    'sync_upload',
    'composer_design',
    'composer_real',
)
FLOORS = ('floor_cfr', 'floor_copy2', 'floor_link')


def plan(size: int, quick: bool) -> tuple[int, int]:
    """(rounds, calls per burst) for a file size: many small calls, few large ones."""
    if quick:
        return 2, 3
    if size <= 64 << 10:
        return 12, 10
    if size <= 4 << 20:
        return 8, 4
    if size <= 64 << 20:
        return 5, 2
    if size <= 256 << 20:
        return 4, 2
    return 3, 1


class StoreTarget:
    """One store target on this rank: its URI for ours, its spec for the baselines, and checks."""

    def __init__(self, kind: str, work: pathlib.Path, endpoint: Optional[str]):
        self.kind = kind
        self.endpoint = endpoint
        if kind == 'local':
            self.root = work / 'bucket'
            self.root.mkdir(parents=True, exist_ok=True)
            self.uri = f'file://{self.root}'
            self.backend_kwargs: Optional[dict] = None
            self.spec = {'kind': 'local', 'root': str(self.root)}
        else:
            self.uri = f's3://{C.MOTO_BUCKET}'
            self.backend_kwargs = {'endpoint_url': endpoint}
            self.spec = {'kind': 's3', 'bucket': C.MOTO_BUCKET, 'endpoint': endpoint}
            self.client = C.s3_client(endpoint)  # type: ignore[arg-type]

    def check_and_delete(self, names: list[str], size: int) -> int:
        """Number of objects in ``names`` missing or of the wrong size; deletes the others."""
        bad = 0
        if self.kind == 'local':
            for name in names:
                path = self.root / name
                try:
                    if path.stat().st_size != size:
                        bad += 1
                    path.unlink()
                except FileNotFoundError:
                    bad += 1
            return bad
        for name in names:
            try:
                if int(self.client.head_object(Bucket=C.MOTO_BUCKET, Key=name)['ContentLength']) != size:
                    bad += 1
            except Exception:  # noqa: BLE001
                bad += 1
        for i in range(0, len(names), 1000):
            self.client.delete_objects(
                Bucket=C.MOTO_BUCKET, Delete={'Objects': [{'Key': n} for n in names[i : i + 1000]], 'Quiet': True}
            )
        return bad


class Modes:
    """Callables per mode for one store target on this rank, plus how each waits for landing."""

    def __init__(
        self,
        target: StoreTarget,
        work: pathlib.Path,
        wanted: list[str],
        workers: int,
        composer_workers: int,
        skipped: dict[str, str],
    ):
        from dist_logging import Logger

        self.target = target
        self.call: dict[str, Callable[[str, str], None]] = {}
        self.wait: dict[str, Callable[[list[str]], None]] = {}
        self._closers: list[Callable[[], None]] = []
        rank_tag = os.environ.get('RANK', '0')
        floor_dir = work / f'floor-{target.kind}-r{rank_tag}'
        floor_dir.mkdir(parents=True, exist_ok=True)
        self.floor_dir = floor_dir

        def ours(use_procs: bool, priority: str = 'idle') -> Optional[Any]:
            try:
                from dist_logging.destinations import RemoteUploaderDownloader
            except ImportError as exc:
                for m in wanted:
                    if m.startswith('ours'):
                        skipped[m] = f'dist_logging.destinations.RemoteUploaderDownloader not importable: {exc}'
                return None
            dest = RemoteUploaderDownloader(
                target.uri,
                backend_kwargs=target.backend_kwargs,
                num_concurrent_uploads=workers,
                use_procs=use_procs,
                upload_priority=priority,
                upload_staging_folder=str(
                    work / f'staging-{target.kind}-{"procs" if use_procs else "threads"}-{priority}'
                ),
            )
            logger = Logger([dest], run_name='bench-upload')
            self._closers.append(logger.close)
            return logger, dest

        if any(m in wanted for m in ('ours_copy', 'ours_nocopy')):
            made = ours(False)
            if made:
                logger, dest = made
                if 'ours_copy' in wanted:
                    self.call['ours_copy'] = lambda name, path, lg=logger: lg.upload_file(name, path, copy=True)
                    self.wait['ours_copy'] = self._ours_wait(dest)
                if 'ours_nocopy' in wanted:
                    self.call['ours_nocopy'] = lambda name, path, lg=logger: lg.upload_file(name, path, copy=False)
                    self.wait['ours_nocopy'] = self._ours_wait(dest)
        if any(m in wanted for m in ('ours_copy_prio_normal', 'ours_nocopy_prio_normal')):
            made = ours(False, 'normal')
            if made:
                logger, dest = made
                for mode, copy in (('ours_copy_prio_normal', True), ('ours_nocopy_prio_normal', False)):
                    if mode in wanted:
                        self.call[mode] = lambda name, path, lg=logger, c=copy: lg.upload_file(name, path, copy=c)
                        self.wait[mode] = self._ours_wait(dest)
        if any(m in wanted for m in ('ours_procs', 'ours_procs_nocopy')):
            made = ours(True)
            if made:
                logger, dest = made
                if 'ours_procs' in wanted:
                    self.call['ours_procs'] = lambda name, path, lg=logger: lg.upload_file(name, path, copy=True)
                    self.wait['ours_procs'] = self._ours_wait(dest)
                if 'ours_procs_nocopy' in wanted:
                    self.call['ours_procs_nocopy'] = lambda name, path, lg=logger: lg.upload_file(
                        name, path, copy=False
                    )
                    self.wait['ours_procs_nocopy'] = self._ours_wait(dest)
        floors = {'floor_cfr': B.floor_copy_file_range, 'floor_copy2': B.floor_copy2, 'floor_link': B.floor_link}
        for mode, fn in floors.items():
            if mode in wanted:
                self.call[mode] = lambda name, path, fn=fn: fn(path, str(floor_dir / uuid.uuid4().hex))
        if 'sync_upload' in wanted:
            backend = B.Backend(target.spec)
            self.call['sync_upload'] = lambda name, path: B.sync_upload(backend, name, path)
            self.wait['sync_upload'] = lambda names: None
        if 'composer_design' in wanted:
            uploader = B.ComposerDesignUploader(
                target.spec,
                str(work / f'staging-composer-{target.kind}-r{rank_tag}'),
                num_concurrent_uploads=composer_workers,
            )
            self._closers.append(uploader.close)
            self.call['composer_design'] = lambda name, path: uploader.upload_file(name, path)
            self.wait['composer_design'] = lambda names: _require(uploader.wait_landed(names, 900), names)
        if 'composer_real' in wanted:
            reason = self._composer_real(target, work, rank_tag)
            if reason:
                skipped['composer_real'] = reason

    def _composer_real(self, target: StoreTarget, work: pathlib.Path, rank_tag: str) -> Optional[str]:
        if C.composer_available() is None:
            return 'mosaicml (Composer) is not importable in this environment'
        if target.kind != 's3':
            return 'Composer has no plain local-folder bucket URI; measured on the S3 target only'
        try:
            from composer.loggers import Logger as CLogger

            uploader = B.composer_real_uploader(target.kind, target.spec, str(work / f'staging-creal-r{rank_tag}'))

            class _State:  # what RemoteUploaderDownloader.init/upload_file read from the state
                run_name = 'bench-upload'

            state = _State()
            uploader.init(state, None)
            clog = CLogger(state, uploader)  # type: ignore[arg-type]
            self._closers.append(uploader.post_close)
            self.call['composer_real'] = lambda name, path: clog.upload_file(name, path)

            def wait(names: list[str]) -> None:
                deadline = time.monotonic() + 900
                while True:
                    missing = [n for n in names if not _s3_exists(target, n)]
                    if not missing or time.monotonic() > deadline:
                        return
                    time.sleep(0.01)

            self.wait['composer_real'] = wait
        except Exception as exc:  # noqa: BLE001
            return f'Composer present but could not be driven here: {type(exc).__name__}: {exc}'
        return None

    @staticmethod
    def _ours_wait(dest: Any) -> Callable[[list[str]], None]:
        waiter = getattr(dest, 'wait_for_uploads', None)
        if waiter is None:
            raise RuntimeError('RemoteUploaderDownloader has no wait_for_uploads(); cannot time landing')

        def wait(names: list[str]) -> None:
            if not waiter(900):
                raise RuntimeError(f'uploads did not land within 900 s: {names[:3]}...')

        return wait

    def clean_floor(self) -> None:
        for entry in os.scandir(self.floor_dir):
            os.unlink(entry.path)

    def close(self) -> None:
        for closer in self._closers:
            closer()


def _require(ok: bool, names: list[str]) -> None:
    if not ok:
        raise RuntimeError(f'uploads did not land in time: {names[:3]}...')


def _s3_exists(target: StoreTarget, name: str) -> bool:
    try:
        target.client.head_object(Bucket=C.MOTO_BUCKET, Key=name)
        return True
    except Exception:  # noqa: BLE001
        return False


def run_target(
    d: C.Dist,
    target: StoreTarget,
    work: pathlib.Path,
    sizes: list[int],
    wanted: list[str],
    args: Any,
    sources: dict[int, str],
    exclude_pids: tuple[int, ...] = (),
) -> tuple[dict, dict]:
    skipped: dict[str, str] = {}
    modes = Modes(target, work, wanted, args.workers, args.composer_workers, skipped)
    active = [m for m in wanted if m in modes.call]
    # Every rank must run the same modes in the same order.
    everyone = d.all_gather_object(active)
    active = [m for m in active if all(m in other for other in everyone)]
    results: dict[str, Any] = {}
    try:
        for size in sizes:
            rounds, burst = plan(size, args.quick)
            if args.rounds:
                rounds = args.rounds
            label = C.format_size(size)
            d.log(f'  {target.kind} {label}: {rounds} rounds x {burst} calls x {len(active)} modes')
            src = sources[size]
            block: dict[str, list[int]] = {m: [] for m in active}
            first_block: dict[str, list[int]] = {m: [] for m in active}  # first call of a burst: nothing in flight
            e2e: dict[str, list[int]] = {m: [] for m in active if m in UPLOAD_MODES}
            bad: dict[str, int] = {m: 0 for m in e2e}
            cpu: dict[str, float] = {m: 0.0 for m in e2e}  # CPU seconds from the first call to landed
            uploaded: dict[str, int] = {m: 0 for m in e2e}
            for r, order in C.rotations(active, rounds + 1):
                warmup = r == 0  # round 0 warms caches and fresh memory; not recorded
                for mode in order:
                    names = [f'{mode}/r{d.rank}/{label}/round{r}-{i}.bin' for i in range(burst)]
                    call = modes.call[mode]
                    d.barrier()
                    samples = []
                    cpu0 = C.cpu_seconds(exclude_pids) if mode in e2e else 0.0
                    first = C.now_ns()
                    for name in names:
                        t0 = C.now_ns()
                        call(name, src)
                        samples.append(C.now_ns() - t0)
                    if mode in e2e:
                        modes.wait[mode](names)
                        landed = C.now_ns()
                        spent = C.cpu_seconds(exclude_pids) - cpu0
                        bad[mode] += target.check_and_delete(names, size)
                        if not warmup:
                            e2e[mode].append(landed - first)
                            cpu[mode] += spent
                            uploaded[mode] += size * len(names)
                    else:
                        modes.clean_floor()
                    if not warmup:
                        block[mode].extend(samples)
                        first_block[mode].append(samples[0])
            every = d.all_gather_object(
                {'block': block, 'first': first_block, 'e2e': e2e, 'bad': bad, 'cpu': cpu, 'uploaded': uploaded}
            )
            entry: dict[str, Any] = {'size_bytes': size, 'rounds': rounds, 'calls_per_round': burst, 'modes': {}}
            for mode in active:
                pooled = [v for rank in every for v in rank['block'][mode]]
                m: dict[str, Any] = {
                    'blocking_us': C.summarize(pooled),
                    'blocking_worst_rank_median_us': max(C.summarize(rank['block'][mode])['median'] for rank in every),
                    'blocking_first_in_burst_us': C.summarize([v for rank in every for v in rank['first'][mode]]),
                }
                if mode in e2e:
                    per_round = [max(rank['e2e'][mode][i] for rank in every) for i in range(len(e2e[mode]))]
                    m['end_to_end_ms'] = C.summarize(per_round, 1e-6)
                    m['bad_objects'] = sum(rank['bad'][mode] for rank in every)
                    gib = sum(rank['uploaded'][mode] for rank in every) / (1 << 30)
                    m['cpu_s_per_gib'] = sum(rank['cpu'][mode] for rank in every) / gib if gib else None
                entry['modes'][mode] = m
            results[label] = entry
    finally:
        modes.close()
    for mode in wanted:
        if mode not in active and mode not in skipped:
            skipped[mode] = 'not available on every rank'
    return results, skipped


def evaluate(results: dict[str, Any], world: int) -> dict[str, Any]:
    """The issue's targets, per store and size, from this run's figures."""
    out: dict[str, Any] = {}
    for store, by_size in results.items():
        rows: dict[str, Any] = {}
        for label, entry in by_size.items():
            med = {m: v['blocking_us']['median'] for m, v in entry['modes'].items()}
            e2e = {m: v['end_to_end_ms']['median'] for m, v in entry['modes'].items() if 'end_to_end_ms' in v}
            row: dict[str, Any] = {
                'median_blocking_us': med,
                'median_end_to_end_ms': e2e,
                'cpu_s_per_gib': {m: v.get('cpu_s_per_gib') for m, v in entry['modes'].items() if 'cpu_s_per_gib' in v},
            }
            cd = med.get('composer_design')
            if 'ours_nocopy' in med:
                row['nocopy_le_50us'] = med['ours_nocopy'] <= 50
                row['composer_over_nocopy'] = C.ratio(cd, med['ours_nocopy'])
            if 'ours_copy' in med:
                row['copy_over_floor_cfr'] = C.ratio(med['ours_copy'], med.get('floor_cfr'))
                row['copy_le_1.2x_floor_cfr'] = (
                    row['copy_over_floor_cfr'] is not None and row['copy_over_floor_cfr'] <= 1.2
                )
                row['copy_over_composer'] = C.ratio(med['ours_copy'], cd)
                row['copy_le_composer'] = row['copy_over_composer'] is not None and row['copy_over_composer'] <= 1.0
            if 'ours_procs' in med:
                row['procs_over_floor_cfr'] = C.ratio(med['ours_procs'], med.get('floor_cfr'))
            for mode in ('ours_copy', 'ours_nocopy', 'ours_procs'):
                if mode in e2e and 'composer_design' in e2e:
                    row[f'e2e_{mode}_over_composer'] = C.ratio(e2e[mode], e2e['composer_design'])
            rows[label] = row
        out[store] = rows
    # Headline checks against the wording.
    headline: dict[str, Any] = {'world_size': world}
    for store, rows in out.items():
        h: dict[str, Any] = {}
        nocopy = [r['median_blocking_us'].get('ours_nocopy') for r in rows.values()]
        if all(v is not None for v in nocopy) and nocopy:
            h['nocopy_max_median_us'] = max(nocopy)
            h['nocopy_le_50us_every_size'] = max(nocopy) <= 50
        if '256MiB' in rows and rows['256MiB'].get('composer_over_nocopy') is not None:
            h['composer_over_nocopy_at_256MiB'] = rows['256MiB']['composer_over_nocopy']
            h['nocopy_ge_1000x_below_composer_at_256MiB'] = rows['256MiB']['composer_over_nocopy'] >= 1000
        ratios = [r.get('copy_over_floor_cfr') for r in rows.values() if r.get('copy_over_floor_cfr') is not None]
        if ratios:
            h['copy_over_floor_cfr_worst'] = max(ratios)
            h['copy_le_1.2x_floor_every_size'] = max(ratios) <= 1.2
        if '4KiB' in rows and rows['4KiB'].get('copy_over_composer') is not None:
            h['copy_over_composer_at_4KiB'] = rows['4KiB']['copy_over_composer']
            h['copy_le_0.5x_composer_at_4KiB'] = rows['4KiB']['copy_over_composer'] <= 0.5
        over = [r.get('copy_over_composer') for r in rows.values() if r.get('copy_over_composer') is not None]
        if over:
            h['copy_over_composer_worst'] = max(over)
            h['copy_never_above_composer'] = max(over) <= 1.0
        e2e = [
            r.get('e2e_ours_copy_over_composer')
            for r in rows.values()
            if r.get('e2e_ours_copy_over_composer') is not None
        ]
        if e2e:
            h['e2e_copy_over_composer_worst'] = max(e2e)
            h['e2e_le_composer_every_size'] = max(e2e) <= 1.0
        headline[store] = h
    out['headline'] = headline
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        '--sizes', default='4KiB,1MiB,64MiB,256MiB', help='file sizes, e.g. 4KiB,1MiB,64MiB,256MiB,1GiB'
    )
    parser.add_argument('--stores', default='local,s3', help='store targets: local, s3 (--s3-server on loopback)')
    parser.add_argument(
        '--s3-max-size',
        default='64MiB',
        help='sizes above this are skipped for the S3 target (kept short for --s3-server moto: it keeps '
        'objects in memory and is slow)',
    )
    parser.add_argument(
        '--modes', default=','.join(ALL_MODES), help=f'subset of {",".join(ALL_MODES)} (+ ours_procs_nocopy)'
    )
    parser.add_argument('--workers', type=int, default=4, help='num_concurrent_uploads for ours (its default)')
    parser.add_argument(
        '--composer-workers',
        type=int,
        default=1,
        help='worker processes for the Composer-design baseline (Composer\'s default: 1)',
    )
    parser.add_argument('--rounds', type=int, default=0, help='override the rounds per size (0: by size)')
    parser.add_argument(
        '--workdir',
        default=None,
        help='scratch folder (sources, staging, local bucket); one filesystem so hard links work',
    )
    C.add_s3_server_arguments(parser)
    args = parser.parse_args(argv)
    C.check_s3_scheme(parser, args)
    if args.quick:
        args.sizes = '4KiB,1MiB' if args.sizes == parser.get_default('sizes') else args.sizes
    sizes = C.parse_sizes(args.sizes)
    stores = [s.strip() for s in args.stores.split(',') if s.strip()]
    wanted = [m.strip() for m in args.modes.split(',') if m.strip()]
    s3_max = C.parse_size(args.s3_max_size)

    d = C.init_distributed(args.backend)
    base = args.workdir or d.shared_temp_dir('dist_logging-bench-upload-')
    work = pathlib.Path(base) / f'node-{d.node}'
    work.mkdir(parents=True, exist_ok=True)
    d.log(
        f'upload_latency: {d.world_size} ranks, sizes {[C.format_size(s) for s in sizes]}, stores {stores}, work {work}'
    )
    s3_proc = None
    results: dict[str, Any] = {}
    skipped: dict[str, Any] = {}
    try:
        sources = {}
        for size in sizes:
            path = work / 'src' / f'r{d.rank}-{size}.bin'
            C.write_file(path, size, seed=d.rank * 1000 + size % 997)
            sources[size] = str(path)
        C.touch_memory(max(sizes))
        for store in stores:
            endpoint = None
            if store == 's3':
                endpoint, s3_proc = C.start_s3_server(d, args.s3_server, args.s3_server_priority, args.s3_scheme)
            target = StoreTarget(store, work, endpoint)
            store_sizes = [s for s in sizes if store != 's3' or s <= s3_max]
            if len(store_sizes) < len(sizes):
                skipped[f'{store}:sizes'] = (
                    f'sizes above {C.format_size(s3_max)} skipped on S3 '
                    f'(--s3-max-size): {[C.format_size(s) for s in sizes if s > s3_max]}'
                )
            exclude = (s3_proc.pid,) if s3_proc is not None else ()
            results[store], skipped_modes = run_target(d, target, work, store_sizes, wanted, args, sources, exclude)
            for mode, reason in skipped_modes.items():
                skipped[f'{store}:{mode}'] = reason
            if store == 's3':
                d.barrier()
                C.stop_s3_server(s3_proc)
                s3_proc = None
    finally:
        C.stop_s3_server(s3_proc)
        d.barrier()
        if d.local_rank == 0 and not args.workdir:
            shutil.rmtree(base, ignore_errors=True)

    summary = {
        'what': (
            'upload_file blocking time on the calling thread (µs; all ranks pooled) and end to end '
            '(first call of a burst to last object landed, slowest rank; ms), per store and size'
        ),
        'workers': args.workers,
        'composer_workers': args.composer_workers,
        'composer_version': C.composer_available(),
        's3_server': args.s3_server,
        's3_scheme': args.s3_scheme,
        's3_server_priority': args.s3_server_priority,
        'skipped': skipped,
        'results': results,
        'evaluation': evaluate(results, d.world_size),
    }
    summary = C.finish(NAME, d, summary, args, plot)
    return 0


STYLE = {
    'ours_copy': ('tab:blue', 'o', '-'),
    'ours_nocopy': ('tab:green', 'o', '-'),
    'ours_procs': ('tab:cyan', 'o', '-'),
    'ours_procs_nocopy': ('tab:olive', 'o', '-'),
    'ours_copy_prio_normal': ('tab:purple', 'v', '-'),
    'ours_nocopy_prio_normal': ('tab:pink', 'v', '-'),
    'floor_cfr': ('black', 'x', ':'),
    'floor_copy2': ('gray', 'x', ':'),
    'floor_link': ('silver', 'x', ':'),
    'sync_upload': ('tab:red', 's', '--'),
    'composer_design': ('tab:orange', 's', '--'),
    'composer_real': ('tab:brown', 's', '--'),
}


def plot(summary: dict, d: C.Dist, out_json: Optional[str]) -> None:
    stores = list(summary['results'])
    if not stores:
        return
    fig, axes = C.new_figure(ncols=2 * len(stores), width=6.0, height=4.8)
    note = ' (oversubscribed)' if d.local_world_size > (os.cpu_count() or 1) else ''
    for i, store in enumerate(stores):
        by_size = summary['results'][store]
        labels = list(by_size)
        sizes = [by_size[lbl]['size_bytes'] for lbl in labels]
        modes = list(by_size[labels[0]]['modes']) if labels else []
        ax_b, ax_e = axes[2 * i], axes[2 * i + 1]
        for mode in modes:
            color, marker, style = STYLE.get(mode, (None, 'o', '-'))
            ys = [by_size[lbl]['modes'][mode]['blocking_us']['median'] for lbl in labels]
            ax_b.plot(sizes, ys, marker=marker, linestyle=style, color=color, label=mode)
            if 'end_to_end_ms' in by_size[labels[0]]['modes'][mode]:
                ye = [by_size[lbl]['modes'][mode]['end_to_end_ms']['median'] for lbl in labels]
                ax_e.plot(sizes, ye, marker=marker, linestyle=style, color=color, label=mode)
        ax_b.axhline(50, color='green', linewidth=0.8, linestyle='-.', alpha=0.6, label='copy=False target 50 µs')
        for ax in (ax_b, ax_e):
            ax.set_xscale('log', base=2)
            ax.set_yscale('log')
            ax.set_xticks(sizes)
            ax.set_xticklabels(labels)
            ax.set_xlabel('file size')
            ax.grid(True, which='both', alpha=0.3)
        ax_b.set_ylabel('upload_file blocking time (µs, median)')
        ax_b.set_title(f'{store}: blocking time, {d.world_size} rank(s){note}')
        ax_e.set_ylabel('first call to last object landed (ms, median of slowest rank)')
        ax_e.set_title(f'{store}: end to end per burst')
        ax_b.legend(fontsize=7)
        ax_e.legend(fontsize=7)
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
