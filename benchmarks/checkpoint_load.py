"""Time to resume: ``dcp.load`` of a sharded checkpoint from the bucket, every reader side by side in one run.

Launch with torchrun (2 or 4 ranks, gloo)::

    torchrun --standalone --nproc_per_node=2 benchmarks/checkpoint_load.py --sizes 256MiB,1GiB

One checkpoint per size is saved with :class:`~dist_logging.checkpoint.CheckpointWriter` into a local bucket
and into S3 (``--s3-server moto-ranges``: moto with ranged GETs that read only the range, as S3 serves them,
``_lazy_moto.py``). Plain moto (5.2) copies the whole object out of its backing ``SpooledTemporaryFile`` (in
memory up to 5 MiB - 1 KiB, a temporary file on local disk above that: every shard file here) for every GET,
ranged or not, then slices the range: a range costs in proportion to its object's size, not its own (measured
on a 256 MiB object, a loaded 2-core VM: a 1 MiB range 0.89 s, an 8 MiB range 0.77 s, the whole object 3.67 s,
i.e. about a quarter of a whole GET per range whatever its size; patched, 0.13 s for either range). Plain moto
would charge a reader per range it asks for, which S3 does not. Each rank owns ``size / world`` bytes of the
state (its own keys, in tensors of at most 32 MiB).
Then, in interleaved rotations, every mode loads the same checkpoint into zeroed tensors, checked bit-exact
(a CRC32C of every tensor against the saved state's):

* ``floor``: one plain GET per rank of its shard file straight into preallocated memory (no DCP): the
  store's floor.
* ``fs_local``: DCP's ``FileSystemReader`` on the local bucket's folder (local disk, no store).
* ``boto3_fs``: boto3 downloads the files the rank reads, then ``FileSystemReader`` (the files are deleted
  after the load).
* ``fsspec``: DCP's ``FsspecReader('s3://...')`` (s3fs).
* ``s3tc``: s3torchconnector's ``S3StorageReader`` (AWS CRT; its default DCP-optimized reader).
* ``ours``: :class:`~dist_logging.checkpoint.CheckpointReader`, as torch's docs use readers (never closed).
* ``ours_local``: the same on the local bucket.
* ``ours_unshared``: ``ours`` with ``share_node_reads=False``; ``ours_local_shared``: ``ours_local`` with
  ``share_node_reads=True`` (by default a remote store's reader shares the items two or more ranks of a node
  read, downloaded once per node through ``/dev/shm``, and a local bucket's does not; when no two ranks of the
  node read the same item, both settings load the same way).

``--replicated``: every rank holds (and loads) the same whole state of each size, as under DDP (DCP saves each
tensor once); ``ours`` then downloads it once per node, shared through ``/dev/shm``, ``ours_unshared`` once
per rank. The summary adds the bytes the ranks read from the bucket (``downloaded_mib``, all ranks of the
node together) for ``CheckpointReader`` modes. ``floor`` and ``boto3_fs`` read one shard per rank: not with it.

For each: the load's wall time (the slowest rank), the RSS it added (peak during the load minus before, the
destination tensors already allocated and touched; ``/proc/self/clear_refs`` resets the peak), the bytes on
local disk during the load (sampled every 5 ms: the download folder, and the per-user dist_logging base
where any cache would go) and after it. Ratios inside one run are the figures to trust (shared machine).
"""

from __future__ import annotations

import functools
import gc
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from dist_logging import _private_dirs  # noqa: E402
from dist_logging.checkpoint.reader import MAX_IN_FLIGHT, PART_BYTES  # noqa: E402
from dist_logging.object_store.checksums import crc32c  # noqa: E402

MiB = 1024 * 1024
ALL_MODES = (
    'floor',
    'fs_local',
    'boto3_fs',
    'fsspec',
    's3tc',
    'ours',
    'ours_local',
    'ours_unshared',
    'ours_local_shared',
)
DEFAULT_MODES = ALL_MODES[:7]
REPLICATED_MODES = ('ours', 'ours_unshared', 'ours_local', 'ours_local_shared')
LAST_READ: dict[str, int] = {}  # the bytes the last CheckpointReader mode read from the bucket (this rank)
# CheckpointReader with other settings, compared in the same run: ours:<max_in_flight>x<part MiB>, e.g. ours:4x32
TUNED_MODE = re.compile(r'ours:(\d+)x(\d+)')
S3_OTHERS = ('boto3_fs', 'fsspec', 's3tc')
TENSOR_BYTES = 32 * MiB


def make_state(rank: int, share: int, replicated: bool = False) -> dict[str, torch.Tensor]:
    """This rank's keys: float32 tensors of at most ``TENSOR_BYTES``, ``share`` bytes in all (seeded by rank; with
    ``replicated`` the same keys and values on every rank)."""
    generator = torch.Generator().manual_seed(1234 + (0 if replicated else rank))
    state, left, index = {}, share, 0
    while left > 0:
        size = min(TENSOR_BYTES, left)
        state[f'w{index}' if replicated else f'r{rank}.w{index}'] = torch.randint(
            -(2**31), 2**31 - 1, (size // 4,), generator=generator, dtype=torch.int32
        ).view(torch.float32)
        left -= size
        index += 1
    return state


def crcs(state: dict[str, torch.Tensor]) -> dict[str, int]:
    return {key: crc32c(memoryview(t.numpy()).cast('B')) for key, t in state.items()}


def rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    found = {}
    with open('/proc/self/status') as handle:
        for line in handle:
            if line.startswith(('VmRSS:', 'VmHWM:')):
                found[line.split(':')[0]] = int(line.split()[1]) * 1024
    return found['VmRSS'], found['VmHWM']


def reset_peak() -> None:
    with open('/proc/self/clear_refs', 'w') as handle:
        handle.write('5')


def tree_bytes(paths: list[str]) -> int:
    total = 0
    for root in paths:
        for folder, _, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
    return total


class DiskWatch:
    """The largest number of bytes seen in ``paths`` while it runs (sampled every 5 ms)."""

    def __init__(self, paths: list[str]):
        self.paths, self.peak = paths, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='bench-disk-watch', daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_bytes(self.paths))
            self._stop.wait(0.005)

    def __enter__(self) -> 'DiskWatch':
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peak = max(self.peak, tree_bytes(self.paths))


def build_modes(
    d: C.Dist,
    endpoint: str,
    local_root: str,
    work: str,
    wanted: list[str],
    skipped: dict[str, str],
    max_in_flight: int,
    part_bytes: int,
) -> dict[str, Callable[[dict, str, str], None]]:
    """mode -> load(state, checkpoint_id, own shard file name)."""
    from torch.distributed.checkpoint import FileSystemReader

    kwargs = {'endpoint_url': endpoint}
    s3_uri = f's3://{C.MOTO_BUCKET}'
    modes: dict[str, Callable[[dict, str, str], None]] = {}
    client = C.s3_client(endpoint)

    scratch = memoryview(bytearray(MiB))

    def floor(state: dict, cid: str, shard: str) -> None:
        """The rank's shard file in one GET, its bytes read straight into the tensors' memory, in order (the
        few KiB of torch.save headers between them into a scratch buffer): the transfer alone."""
        response = client.get_object(Bucket=C.MOTO_BUCKET, Key=f'{cid}/{shard}')
        left = int(response['ContentLength'])
        raw = response['Body']._raw_stream
        targets = [memoryview(t.numpy()).cast('B') for t in state.values()]
        for view in targets + [scratch] * (1 + left // len(scratch)):
            done, want = 0, min(len(view), left)
            while done < want:
                count = raw.readinto(view[done:want])
                if not count:
                    raise EOFError(f'{cid}/{shard}: the body ended early')
                done += count
            left -= want
            if not left:
                break
        response['Body'].close()

    modes['floor'] = floor
    modes['fs_local'] = lambda state, cid, shard: dcp.load(
        state, storage_reader=FileSystemReader(os.path.join(local_root, cid))
    )

    def boto3_fs(state: dict, cid: str, shard: str) -> None:
        folder = tempfile.mkdtemp(prefix=f'load-r{d.rank}-', dir=work)
        try:
            for name in ('.metadata', shard):
                client.download_file(C.MOTO_BUCKET, f'{cid}/{name}', os.path.join(folder, name))
            dcp.load(state, storage_reader=FileSystemReader(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    modes['boto3_fs'] = boto3_fs
    try:
        import s3fs  # noqa: F401
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        modes['fsspec'] = lambda state, cid, shard: dcp.load(
            state, storage_reader=FsspecReader(f'{s3_uri}/{cid}', endpoint_url=endpoint, skip_instance_cache=True)
        )
    except ImportError as exc:
        skipped['fsspec'] = f's3fs not importable: {exc}'
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageReader
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        region = os.environ.get('AWS_DEFAULT_REGION', 'us-east-1')
        config = S3ClientConfig(force_path_style=True)

        def s3tc(state: dict, cid: str, shard: str) -> None:
            reader = S3StorageReader(region, f'{s3_uri}/{cid}', s3client_config=config)
            reader.fs = S3FileSystem(region, s3_client=S3Client(region, endpoint=endpoint, s3client_config=config))
            dcp.load(state, storage_reader=reader)

        modes['s3tc'] = s3tc
    except ImportError as exc:
        skipped['s3tc'] = f's3torchconnector[dcp] not importable (pip install "dist-logging[bench]"): {exc}'
    for name, uri, options, share in (
        ('ours', s3_uri, kwargs, None),
        ('ours_local', local_root, None, None),
        ('ours_unshared', s3_uri, kwargs, False),
        ('ours_local_shared', local_root, None, True),
    ):
        modes[name] = functools.partial(load_ours, uri, options, max_in_flight, part_bytes, share)
    for mode in wanted:
        tuned = TUNED_MODE.fullmatch(mode)
        if tuned:
            modes[mode] = functools.partial(load_ours, s3_uri, kwargs, int(tuned[1]), int(tuned[2]) * MiB, None)
    return {mode: fn for mode, fn in modes.items() if mode in wanted}


def load_ours(
    uri: str,
    kwargs: Optional[dict],
    max_in_flight: int,
    part_bytes: int,
    share: Optional[bool],
    state: dict,
    cid: str,
    shard: str,
) -> None:
    """``CheckpointReader`` as torch's docs use readers (never closed); its bytes read kept in ``LAST_READ``."""
    from dist_logging.checkpoint import CheckpointReader

    reader = CheckpointReader(
        uri, backend_kwargs=kwargs, max_in_flight=max_in_flight, part_bytes=part_bytes, share_node_reads=share
    )
    dcp.load(state, checkpoint_id=cid, storage_reader=reader)
    LAST_READ['read'] = reader.downloaded_bytes


def save_checkpoints(d: C.Dist, state: dict, cid: str, endpoint: str, local_root: str, staging: str) -> str:
    """Save ``state`` as ``cid`` into the local bucket and into S3 (committed); this rank's shard file name in S3."""
    from dist_logging.checkpoint import CheckpointWriter

    for bucket, kwargs in ((local_root, {}), (f's3://{C.MOTO_BUCKET}', {'backend_kwargs': {'endpoint_url': endpoint}})):
        writer = CheckpointWriter(
            bucket, upload_staging_folder=os.path.join(staging, f'r{d.rank}'), run_name='bench-load', **kwargs
        )
        dcp.save(state, checkpoint_id=cid, storage_writer=writer)
        writer.close()  # every upload landed and (coordinator) the commit happened
        torch_dist.barrier(group=d.cpu_group)
    listing = C.s3_client(endpoint).list_objects_v2(Bucket=C.MOTO_BUCKET, Prefix=f'{cid}/__{d.rank}_')
    mine = [item['Key'].rsplit('/', 1)[1] for item in listing.get('Contents', [])]
    assert len(mine) <= 1, mine
    return mine[0] if mine else ''  # replicated: DCP saves each tensor once, some rank may write no shard


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.split('\n')[0])
    parser.add_argument('--sizes', default='256MiB', help='checkpoint sizes (all ranks together), e.g. 256MiB,1GiB')
    parser.add_argument('--modes', default=None, help=f'modes: {",".join(ALL_MODES)} (default: the first 7)')
    parser.add_argument('--replicated', action='store_true', help='every rank loads the same whole state (DDP)')
    parser.add_argument('--rounds', type=int, default=2, help='interleaved rotations of the modes per size')
    parser.add_argument(
        '--max-in-flight', type=int, default=MAX_IN_FLIGHT, help="CheckpointReader's ranged reads per rank"
    )
    parser.add_argument(
        '--part-mib', type=int, default=PART_BYTES // MiB, help="CheckpointReader's largest ranged read, MiB"
    )
    parser.add_argument('--s3-server', default='moto-ranges', choices=C.S3_SERVERS[1:])
    parser.add_argument('--s3-server-priority', default='low', choices=C.S3_SERVER_PRIORITIES)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds = '32MiB', 1
    if args.modes is None:
        args.modes = ','.join(REPLICATED_MODES if args.replicated else DEFAULT_MODES)
    wanted = [m.strip() for m in args.modes.split(',') if m.strip()]
    if args.replicated and {'floor', 'boto3_fs'} & set(wanted):
        parser.error('--replicated: floor and boto3_fs read one shard per rank, not the whole state')
    unknown = sorted(mode for mode in set(wanted) - set(ALL_MODES) if not TUNED_MODE.fullmatch(mode))
    if unknown:
        parser.error(f'unknown modes {unknown}; known: {ALL_MODES}')
    d = C.init_distributed('gloo')
    endpoint, s3_proc = C.start_s3_server(d, args.s3_server, args.s3_server_priority, 'http')
    work = d.shared_temp_dir('dist_logging-bench-load-')
    os.environ[_private_dirs.ENV_VAR] = os.path.join(work, 'private')  # this run's dist_logging state, watched
    local_root = os.path.join(work, 'bucket')
    skipped: dict[str, str] = {}
    watched = [work]
    results: dict[str, Any] = {}
    try:
        modes = build_modes(d, endpoint, local_root, work, wanted, skipped, args.max_in_flight, args.part_mib * MiB)
        for total in C.parse_sizes(args.sizes):
            label = C.format_size(total)
            share = total if args.replicated else total // d.world_size
            cid = f'load/{label}'
            state = make_state(d.rank, share, args.replicated)
            expected = crcs(state)
            shard = save_checkpoints(d, state, cid, endpoint, local_root, os.path.join(work, 'staging'))
            del state
            gc.collect()
            target = {
                key: torch.zeros(value.numel(), dtype=torch.float32)
                for key, value in make_state(d.rank, share, args.replicated).items()
            }  # allocated and touched before any load
            records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for _, order in C.rotations(list(modes), args.rounds):
                for mode in order:
                    for tensor in target.values():
                        tensor.zero_()
                    gc.collect()
                    before_disk = tree_bytes(watched)
                    torch_dist.barrier(group=d.cpu_group)
                    reset_peak()
                    base, _ = rss()
                    LAST_READ.clear()
                    with DiskWatch(watched) as disk:
                        t0 = time.perf_counter()
                        modes[mode](target, cid, shard)
                        seconds = time.perf_counter() - t0
                    _, peak = rss()
                    gc.collect()  # what a reader left once it is garbage (ours is never closed here)
                    after = tree_bytes(watched) - before_disk
                    exact = None if mode == 'floor' else crcs(target) == expected  # floor: raw bytes, not loaded
                    records[mode].append(
                        {
                            'load_s': seconds,
                            'rss_added': max(0, peak - base),
                            'disk_during': max(0, disk.peak - before_disk),
                            'disk_after': after,
                            'exact': exact,
                            'downloaded': LAST_READ.get('read'),
                        }
                    )
            gathered = d.all_gather_object(records)
            results[label] = summarize_size(gathered, share)
            del target
            gc.collect()
    finally:
        torch_dist.barrier(group=d.cpu_group)
        C.stop_s3_server(s3_proc)
        if d.rank == 0:
            shutil.rmtree(work, ignore_errors=True)
    summary = {
        'benchmark': 'checkpoint_load',
        'world_size': d.world_size,
        'sizes': args.sizes,
        'replicated': args.replicated,
        'rounds': args.rounds,
        'max_in_flight': args.max_in_flight,
        'part_mib': args.part_mib,
        's3_server': args.s3_server,
        'tensor_bytes': TENSOR_BYTES,
        'skipped': skipped,
        'results': results,
        'environment': C.environment(d),
        'note': 'shared 2-core VM, other jobs running: compare modes within one run (ratios), not runs',
    }
    C.write_results('checkpoint_load', d, summary, args.out_json)  # every rank: it agrees on the file name
    if not args.no_plot and d.rank == 0:
        plot(summary, d, args.out_json)
    C.shutdown(d)
    return 0


def summarize_size(gathered: list[dict[str, list[dict[str, Any]]]], share: int) -> dict[str, Any]:
    """Per mode: the median over rounds of the slowest rank's load time, the largest RSS added and disk use."""
    out: dict[str, Any] = {}
    for mode in gathered[0]:
        rounds = len(gathered[0][mode])
        slowest = [max(rank[mode][i]['load_s'] for rank in gathered) for i in range(rounds)]
        out[mode] = {
            'load_s': statistics.median(slowest),
            'load_s_all': slowest,
            'rss_added_mib': max(r['rss_added'] for rank in gathered for r in rank[mode]) / MiB,
            'disk_during_mib': max(r['disk_during'] for rank in gathered for r in rank[mode]) / MiB,
            'disk_after_mib': max(r['disk_after'] for rank in gathered for r in rank[mode]) / MiB,
            'exact': None if mode == 'floor' else all(r['exact'] for rank in gathered for r in rank[mode]),
        }
        if gathered[0][mode][0].get('downloaded') is not None:  # CheckpointReader: the node's bytes from the bucket
            out[mode]['downloaded_mib'] = sum(rank[mode][0]['downloaded'] for rank in gathered) / MiB
    ours = out.get('ours', {}).get('load_s')
    others = {m: out[m]['load_s'] for m in S3_OTHERS if m in out}
    best = min(others, key=others.get) if others else None
    # Per round (the modes of a round ran back to back, so a round's ratios share the machine's state).
    ours_rounds = out.get('ours', {}).get('load_s_all', [])
    other_rounds = [out[m]['load_s_all'] for m in S3_OTHERS if m in out]
    best_rounds = [min(times) for times in zip(*other_rounds)] if other_rounds else []
    floor_rounds = out.get('floor', {}).get('load_s_all', [])
    per_best = [C.ratio(a, b) for a, b in zip(ours_rounds, best_rounds)]
    per_floor = [C.ratio(a, b) for a, b in zip(ours_rounds, floor_rounds)]
    out['targets'] = {
        'share_mib': share / MiB,
        'best_other': best,
        'ours_over_best_other': C.ratio(ours, others.get(best)) if best else None,
        'ours_over_floor': C.ratio(ours, out.get('floor', {}).get('load_s')),
        'ours_over_best_other_per_round': per_best,
        'ours_over_best_other_round_median': statistics.median(per_best) if per_best else None,
        'ours_over_floor_per_round': per_floor,
        'ours_over_floor_round_median': statistics.median(per_floor) if per_floor else None,
        'target_best_other': 0.8,
        'target_floor': 2.0,
    }
    return out


def plot(summary: dict[str, Any], d: C.Dist, out_json: Optional[str]) -> None:
    try:
        fig, axes = C.new_figure(ncols=2)
    except ImportError:
        return
    sizes = list(summary['results'])
    modes = list(dict.fromkeys(m for s in sizes for m in summary['results'][s] if m != 'targets'))
    width = 0.8 / max(1, len(sizes))
    for column, (key, title) in enumerate(
        (('load_s', 'dcp.load, slowest rank (s)'), ('rss_added_mib', 'RSS added during the load (MiB)'))
    ):
        ax = axes[column]
        for i, size in enumerate(sizes):
            values = [summary['results'][size].get(m, {}).get(key, 0) for m in modes]
            ax.bar([x + i * width for x in range(len(modes))], values, width, label=size)
        ax.set_xticks([x + width * (len(sizes) - 1) / 2 for x in range(len(modes))])
        ax.set_xticklabels(modes, rotation=30)
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f'checkpoint_load: {summary["world_size"]} ranks, S3 {summary["s3_server"]} (shared VM)')
    C.save_figure(fig, 'checkpoint_load', d, out_json)


if __name__ == '__main__':
    sys.exit(main())
