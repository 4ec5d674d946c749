"""Sharded checkpoints (torch.distributed.checkpoint) to S3 every K steps: who blocks the training loop, for how
long, and when is the checkpoint committed?

Launch::

    torchrun --standalone --nproc_per_node=4 benchmarks/checkpoint_stall.py --sizes 256MiB,1GiB --every 10
    # GPU-like and CPU-bound steps:
    torchrun --standalone --nproc_per_node=2 benchmarks/checkpoint_stall.py --device-ms 200,0

The job: an MLP (``--width`` x ``--depth``, GELU) sharded with FSDP2's ``fully_shard`` (gloo, CPU),
AdamW, random batches. The checkpointed state is the model's and the optimizer's sharded state
dict (``get_state_dict``) plus a ``uint8`` DTensor sharded over the ranks (``Shard(0)``) that
brings the total to each ``--sizes`` entry: every rank holds and writes 1/N of it. The filler is a
table of ``--filler-cols`` columns, like an embedding (0: one flat 1-D tensor, the layout of runs
before 2026-11-26 05:00; torch 2.13's DTensor save planning materializes an int64 ``arange`` over
a shard's dim 0, so a flat filler costs every mode 8 bytes of fresh memory per filler byte and save). A save every
``--every`` steps; ``--device-ms N`` makes each step also wait N ms, the cores idle meanwhile, as a
host waits on its GPU (0: the CPU computes the whole step, the worst case for background work).

Modes (interleaved: segments of ``--saves`` saves per mode, the order rotating each round):

* ``none``: the same loop without saves (the CPU reference);
* ``ours_save`` / ``ours_async``: ``dist_logging.checkpoint.CheckpointWriter`` with ``dcp.save`` /
  ``dcp.async_save`` (thread checkpointer);
* ``fs_upload``: ``dcp.save`` to local disk with ``FileSystemWriter``, then ``Logger.upload_file``
  (``copy=False``) of every file the rank wrote: what users write today (no commit rule: the
  checkpoint counts as complete when every file landed);
* ``fs_async_local``: ``dcp.async_save`` with ``FileSystemWriter`` to local disk, no upload: the
  reference for ours with ``async_save``;
* ``fsspec_async``: ``dcp.async_save`` with DCP's ``FsspecWriter`` to ``s3://`` (s3fs);
* ``s3tc_save`` / ``s3tc_async``: ``s3torchconnector``'s ``S3StorageWriter`` (AWS CRT client), with
  ``dcp.save`` / ``dcp.async_save``;
  (its defaults: no fsync, one shard file per rank for ``dcp.save`` and four for ``dcp.async_save``,
  each queued for upload as soon as written);
* not by default: ``ours_save_fsync`` / ``ours_async_fsync``: ours with ``sync_files=True`` (every
  shard fsynced before its hand-over, as ``FileSystemWriter`` does by default: the other local-disk
  modes fsync); ``ours_save_4files`` / ``ours_async_4files``: ours with ``files_per_rank=4`` (each
  file queued as soon as written: the upload of the first files overlaps the write of the next);
  ``ours_async_1file``: ours' ``dcp.async_save`` with one file per rank (its default there is 4);
  ``ours_async_process``: ours with ``dcp.async_save(async_checkpointer_type=PROCESS)`` (the write
  runs in torch's checkpoint process, the hand-over, upload and commit in the trainer's writer);
  ``ours_async_normal``: ours' ``dcp.async_save`` with ``upload_priority='normal'`` (upload workers
  at the training thread's priority instead of ``SCHED_IDLE``); ``ours_async_8files``: with
  ``files_per_rank=8``; ``ours_async_fresh``: with ``cache_staged_state_dict=False`` (a new staged copy
  every save, as torch's writers stage); ``ours_save_zstd`` / ``ours_async_zstd``: with torch's
  ``_extensions=[ZStandard()]`` (compressed shards; ``bytes_written`` in the timings is the compressed size).

Every async mode uses a separate gloo process group for the checkpoint's collectives (the
background thread must not share the training group's collectives), waits for the previous
save's future before the next save (as torchtitan does), and thread checkpointers unless named otherwise.

Per save:

* **blocking**: time the training thread spent in checkpoint code at that save (waiting for the
  previous async save if it has not finished, plus the ``dcp.save``/``dcp.async_save`` call, plus
  the ``upload_file`` calls in ``fs_upload``), slowest rank. ``fs_upload`` also reports its
  ``dcp.save`` alone (``save_call_ms``): ``FileSystemWriter``'s local save, target 1's reference.
  Fetching the state dict (``get_state_dict``, the same in every mode) is not counted.
* **time to local durability**: start of the save to the local write done (the call's return, or
  the async future's completion), slowest rank.
* **time to committed**: start of the save (coordinator) to the checkpoint visible and complete
  in the bucket: ours, the commit marker (``SaveTiming.commit_s``); DCP's writers, the coordinator's
  ``finish`` (``.metadata`` renamed into place, after every rank's shards were written: the
  return of ``dcp.save``, the completion of the ``async_save`` future); ``fs_upload``, every file
  of the checkpoint listed in the bucket (polled by a thread on rank 0 every 50 ms).
* **CPU**: CPU seconds of the rank processes and their descendants (S3 server left out) over a
  segment and its tail, minus the same for a ``none`` segment and for as many ``none`` steps as
  the tail had, per GiB of checkpoint (``ckpt_cpu_s_per_gib``); minus the training thread's own
  CPU inside the save calls, what runs in the background (``background_cpu_s_per_gib``: the upload,
  and for async modes the write).
* **local disk bytes** per byte of checkpoint, from ``/proc/<pid>/io`` of every rank process and
  its live descendants over the segment: ``write_bytes`` (file pages dirtied: what reaches the
  local disk; sockets and hard links add nothing; a page written over while still dirty counts
  once, so ours, writing over its spare files, can show less than 1) and ``rchar`` (bytes through read()-family
  calls on any descriptor: every local file read, plus the few bytes of S3 responses; an upper
  bound on the file bytes read for upload). ``read_bytes`` (misses of the page cache) is reported
  too: a checkpoint read back while still cached costs the disk nothing.

After a segment's last save the loop trains on, timed, until every save of the segment is
committed (the *tail*, at most ``--max-tail-steps``), then the mode's objects and files are
deleted (not timed).

The S3 server is ``--s3-server sink`` (default; ``_s3_sink.py``, which discards the bytes) or
``moto``, over ``--s3-scheme https`` (default with the sink) or http, at the lowest CPU and I/O
priority: it stands for a remote machine. s3torchconnector's client (the AWS CRT, s2n TLS)
ignores ``AWS_CA_BUNDLE``: over https the benchmark points ``SSL_CERT_FILE`` at the sink's
throwaway certificate, which s2n reads; ``S3StorageWriter`` has no endpoint argument, so its
``S3FileSystem`` is replaced by one whose ``S3Client`` has ``endpoint=`` (path-style addressing).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

NAME = 'checkpoint_stall'
ALL_MODES = (
    'none',
    'ours_save',
    'ours_async',
    'fs_upload',
    'fs_async_local',
    'fsspec_async',
    's3tc_save',
    's3tc_async',
)
# Not by default: ours with sync_files=True, and ours with 4 shard files per rank (upload overlapping the write).
EXTRA_MODES = (
    'ours_save_fsync',
    'ours_async_fsync',
    'ours_save_4files',
    'ours_async_4files',
    'ours_async_1file',
    'ours_async_process',
    'ours_async_normal',
    'ours_async_8files',
    'ours_async_fresh',
    'ours_save_zstd',
    'ours_async_zstd',
)
POLL_S = 0.05


def build_model(width: int, depth: int) -> torch.nn.Module:
    """An MLP sharded with FSDP2 (every Linear its own unit, then the whole)."""
    from torch.distributed.fsdp import fully_shard

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


def local_bytes(value: Any) -> int:
    """Bytes of the tensors of a (nested) state dict held by this rank (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(local_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(local_bytes(v) for v in value)
    return 0


class BucketWatcher:
    """A thread on rank 0 that lists checkpoint prefixes every 50 ms and records when each is complete
    (``fs_upload``: ``.metadata`` and one shard file per rank listed)."""

    def __init__(self, endpoint: str, world_size: int):
        self._client = C.s3_client(endpoint)
        self._world = world_size
        self._pending: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='bucket-watcher', daemon=True)
        self._thread.start()

    def watch(self, prefix: str) -> None:
        with self._lock:
            self._pending[prefix] = time.time()

    def done_at(self, prefix: str) -> Optional[float]:
        """Wall time ``prefix`` was first seen complete, or None while it is not."""
        with self._lock:
            return self.done.get(prefix)

    def _complete(self, prefix: str) -> bool:
        listing = self._client.list_objects_v2(Bucket=C.MOTO_BUCKET, Prefix=prefix + '/')
        names = [obj['Key'][len(prefix) + 1 :] for obj in listing.get('Contents', [])]
        return '.metadata' in names and sum(n.endswith('.distcp') for n in names) >= self._world

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                pending = list(self._pending)
            for prefix in pending:
                if self._complete(prefix):
                    with self._lock:
                        self._pending.pop(prefix, None)
                        self.done[prefix] = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def main(argv: Optional[list[str]] = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        '--sizes', default='256MiB', help='total checkpoint sizes (all ranks together), comma-separated'
    )
    parser.add_argument(
        '--device-ms',
        default='0',
        help='comma-separated: emulated accelerator wait per step in ms (0: a CPU-bound step); '
        'each value is its own experiment',
    )
    parser.add_argument('--every', type=int, default=10, help='a save every this many steps')
    parser.add_argument('--saves', type=int, default=2, help='saves per timed segment')
    parser.add_argument('--rounds', type=int, default=2, help='timed segments per mode (plus one warm-up round)')
    parser.add_argument(
        '--filler-cols',
        type=int,
        default=4096,
        help="columns of the uint8 filler table (0: a flat 1-D filler, the old layout)",
    )
    parser.add_argument('--width', type=int, default=1024)
    parser.add_argument('--depth', type=int, default=4)
    parser.add_argument('--batch', type=int, default=128)
    parser.add_argument('--modes', default=','.join(ALL_MODES))
    parser.add_argument('--workers', type=int, default=4, help='upload workers of ours and of fs_upload')
    parser.add_argument('--workdir', default=None)
    parser.add_argument('--max-tail-steps', type=int, default=3000)
    parser.add_argument(
        '--memory-saves',
        type=int,
        default=300,
        help="then this many back-to-back saves of a small sharded state through one "
        "CheckpointWriter (dcp.save and dcp.async_save alternating, keep_last=2), "
        "sampling the rank's RSS and the memory dist_logging's code holds (0: skip)",
    )
    parser.add_argument('--memory-state', default='1MiB', help="the memory experiment's state size per rank")
    C.add_s3_server_arguments(parser)
    args = parser.parse_args(argv)
    C.check_s3_scheme(parser, args)
    if args.quick:
        args.sizes, args.every, args.saves, args.rounds = '4MiB', 2, 1, 1
        args.width, args.depth, args.batch = 64, 2, 16
        args.memory_saves = min(args.memory_saves, 24)
    if args.memory_saves < 0:
        parser.error(f'--memory-saves must be >= 0, got {args.memory_saves}')
    if args.filler_cols < 0:
        parser.error(f'--filler-cols must be >= 0, got {args.filler_cols}')
    sizes = C.parse_sizes(args.sizes)
    device_ms = [float(v) for v in args.device_ms.split(',') if v.strip()]
    if any(v < 0 for v in device_ms):
        parser.error(f'--device-ms values must be >= 0, got {args.device_ms!r}')
    if args.every < 1 or args.saves < 1 or args.rounds < 1:
        parser.error('--every, --saves and --rounds must be >= 1')
    wanted = [m.strip() for m in args.modes.split(',') if m.strip()]
    unknown = sorted(set(wanted) - set(ALL_MODES) - set(EXTRA_MODES))
    if unknown:
        parser.error(f'unknown mode(s) {unknown}; known: {list(ALL_MODES + EXTRA_MODES)}')
    if 'none' not in wanted:
        wanted.insert(0, 'none')

    d = C.init_distributed('gloo')  # FSDP2 on CPU; DCP's async path needs a CPU (gloo) group anyway
    ckpt_group = torch_dist.new_group(backend='gloo') if d.world_size > 1 else None
    base = pathlib.Path(args.workdir or d.shared_temp_dir('dist_logging-bench-ckpt-'))
    work = base / f'node-{d.node}'
    work.mkdir(parents=True, exist_ok=True)
    endpoint, s3_proc = C.start_s3_server(d, args.s3_server, args.s3_server_priority, args.s3_scheme)
    if os.environ.get('AWS_CA_BUNDLE'):
        os.environ['SSL_CERT_FILE'] = os.environ['AWS_CA_BUNDLE']  # the AWS CRT's TLS (s2n) reads this one
    exclude = (s3_proc.pid,) if s3_proc is not None else ()
    skipped: dict[str, str] = {}
    closers: list[Callable[[], None]] = []
    watcher = BucketWatcher(endpoint, d.world_size) if d.is_zero and 'fs_upload' in wanted else None
    setups = _make_modes(args, d, work, endpoint, wanted, skipped, closers, ckpt_group, watcher)
    modes = [m for m in wanted if m in setups]
    everyone = d.all_gather_object(modes)
    modes = [m for m in modes if all(m in other for other in everyone)]
    experiments: dict[str, Any] = {}
    try:
        for total in sizes:
            for ms in device_ms:
                label = f'{C.format_size(total)}/{"cpu-bound" if ms == 0 else f"device-{ms:g}ms"}'
                d.log(
                    f'{NAME}: {label}, {d.world_size} ranks, modes {modes}, a save every {args.every} steps, '
                    f'{args.rounds} rounds x {args.saves} saves'
                )
                experiments[label] = _experiment(args, d, total, ms, modes, setups, watcher, exclude, label)
        memory = (
            _memory_experiment(args, d, work, endpoint, ckpt_group)
            if args.memory_saves and not any(m.startswith('ours') for m in skipped)
            else None
        )
    finally:
        if watcher is not None:
            watcher.close()
        errors = []
        for closer in closers:
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - report every closer's failure, then raise
                errors.append(exc)
        C.stop_s3_server(s3_proc)
        d.barrier()
        if d.local_rank == 0 and not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
        if errors:
            raise errors[0]
    summary: dict[str, Any] = {
        'what': 'DCP checkpoints to S3 every K steps: training-thread blocking, time to committed, CPU, '
        'local disk bytes',
        'sizes': sizes,
        'device_ms': device_ms,
        'every': args.every,
        'saves_per_segment': args.saves,
        'rounds': args.rounds,
        'workers': args.workers,
        's3_server': args.s3_server,
        's3_scheme': args.s3_scheme,
        's3_server_priority': args.s3_server_priority,
        'model': {'width': args.width, 'depth': args.depth, 'batch': args.batch, 'sharding': 'FSDP2 fully_shard'},
        'filler_cols': args.filler_cols,
        'skipped': skipped,
        'experiments': experiments,
        'targets': {label: _targets(exp) for label, exp in experiments.items()},
        'memory': memory,
    }
    C.finish(NAME, d, summary, args, plot)
    return 0


# ----------------------------------------------------------------------------- modes


class Mode:
    """How one mode saves: ``save(state, ckpt_id)`` returns (call ns, future or None, extra timings)."""

    def __init__(
        self,
        save: Callable[[dict, str], tuple[Optional[Future], dict]],
        *,
        committed: Callable[[str, float], Optional[float]],
        cleanup: Callable[[list[str]], None],
        uploads: bool = True,
    ):
        self.save = save
        self.committed = committed  # (ckpt id, start wall time) -> wall time it committed, None while pending
        self.cleanup = cleanup
        self.uploads = uploads


def _future_of(response: Any) -> Future:
    return getattr(response, 'upload_completion', response)  # AsyncSaveResponse (stager futures) or a Future


def _make_modes(
    args: Any,
    d: C.Dist,
    work: pathlib.Path,
    endpoint: str,
    wanted: list[str],
    skipped: dict[str, str],
    closers: list[Callable[[], None]],
    ckpt_group: Any,
    watcher: Optional[BucketWatcher],
) -> dict[str, Mode]:
    setups: dict[str, Mode] = {
        'none': Mode(lambda sd, cid: (None, {}), committed=lambda cid, t0: t0, cleanup=lambda ids: None, uploads=False)
    }
    s3 = C.s3_client(endpoint)
    bucket_uri = f's3://{C.MOTO_BUCKET}'
    # Wall times the coordinator saw each async save finish (DCP's writers: its finish() is the commit).
    finished: dict[str, float] = {}

    def on_done(cid: str) -> Callable[[Future], None]:
        def callback(_: Future) -> None:
            finished[cid] = time.time()

        return callback

    def delete_prefix(prefix: str) -> None:
        if not d.is_zero:
            return
        for page in s3.get_paginator('list_objects_v2').paginate(Bucket=C.MOTO_BUCKET, Prefix=prefix):
            keys = [{'Key': obj['Key']} for obj in page.get('Contents', [])]
            if keys:
                s3.delete_objects(Bucket=C.MOTO_BUCKET, Delete={'Objects': keys, 'Quiet': True})

    def cleanup_bucket(mode: str) -> Callable[[list[str]], None]:
        return lambda ids: delete_prefix(f'ckpt/{mode}/')

    def by_future_or_return(cid: str, t0: float) -> Optional[float]:
        return finished.get(cid)

    # ---- ours
    if any(m.startswith('ours') for m in wanted):
        try:
            from dist_logging.checkpoint import CheckpointWriter
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        except ImportError as exc:
            for m in wanted:
                if m.startswith('ours'):
                    skipped[m] = f'dist_logging.checkpoint.CheckpointWriter not importable: {exc}'
        else:
            from torch.distributed.checkpoint._extension import ZStandard

            for mode in ('ours_save', 'ours_async', *EXTRA_MODES):
                if mode not in wanted:
                    continue
                writer = CheckpointWriter(
                    bucket_uri,
                    backend_kwargs={'endpoint_url': endpoint},
                    upload_staging_folder=str(work / f'staging-{mode}'),
                    run_name=f'bench-{mode}',
                    num_concurrent_uploads=args.workers,
                    sync_files=mode.endswith('_fsync'),
                    files_per_rank=(
                        4
                        if mode.endswith('_4files')
                        else 8
                        if mode.endswith('_8files')
                        else 1
                        if mode.endswith('_1file')
                        else None
                    ),
                    upload_priority='normal' if mode.endswith('_normal') else 'idle',
                    cache_staged_state_dict=not mode.endswith('_fresh'),
                    _extensions=[ZStandard()] if mode.endswith('_zstd') else None,
                )
                closers.append(writer.close)

                def ours_committed(cid: str, t0: float, writer: Any = writer) -> Optional[float]:
                    for timing in reversed(writer.timings):
                        if timing.checkpoint_id == cid:
                            if timing.error:
                                raise RuntimeError(f'{cid} did not commit: {timing.error}')
                            return None if timing.commit_s is None else timing.started_at + timing.commit_s
                    return None

                def ours_cleanup(ids: list[str], writer: Any = writer, mode: str = mode) -> None:
                    if not writer.wait_for_commits(900):
                        raise RuntimeError(f'{mode}: saves did not commit within 900 s')
                    delete_prefix(f'ckpt/{mode}/')

                if mode.startswith('ours_save'):

                    def save(sd: dict, cid: str, writer: Any = writer) -> tuple[Optional[Future], dict]:
                        dcp.save(sd, checkpoint_id=cid, storage_writer=writer, process_group=ckpt_group)
                        return None, {}
                else:
                    # ours_async_process: torch's PROCESS checkpointer (the write in its checkpoint process)
                    kind = (
                        {'async_checkpointer_type': AsyncCheckpointerType.PROCESS} if mode.endswith('_process') else {}
                    )

                    def save(
                        sd: dict, cid: str, writer: Any = writer, kind: dict = kind
                    ) -> tuple[Optional[Future], dict]:
                        fut = _future_of(
                            dcp.async_save(
                                sd, checkpoint_id=cid, storage_writer=writer, process_group=ckpt_group, **kind
                            )
                        )
                        return fut, {}

                setups[mode] = Mode(
                    save, committed=ours_committed if d.is_zero else (lambda cid, t0: t0), cleanup=ours_cleanup
                )

    # ---- DCP FileSystemWriter to local disk (+ upload_file per file)
    from torch.distributed.checkpoint import FileSystemWriter

    local_root = work / 'dcp-local'
    if 'fs_upload' in wanted:
        from dist_logging import Logger
        from dist_logging.destinations import RemoteUploaderDownloader

        dest = RemoteUploaderDownloader(
            bucket_uri,
            backend_kwargs={'endpoint_url': endpoint},
            num_concurrent_uploads=args.workers,
            upload_staging_folder=str(work / 'staging-fs_upload'),
        )
        logger = Logger([dest], run_name='bench-ckpt')
        closers.append(logger.close)

        def fs_save(sd: dict, cid: str) -> tuple[Optional[Future], dict]:
            folder = local_root / cid
            t0 = C.now_ns()
            dcp.save(sd, storage_writer=FileSystemWriter(str(folder)), process_group=ckpt_group)
            save_ns = C.now_ns() - t0
            # What this rank wrote: its shard files, and on the coordinator .metadata (written last).
            mine = sorted(p for p in folder.iterdir() if p.name.startswith(f'__{d.rank}_'))
            if d.is_zero:
                mine.append(folder / '.metadata')
            for path in mine:
                logger.upload_file(f'{cid}/{path.name}', str(path), copy=False)
            return None, {'save_call_ns': save_ns}

        def fs_committed(cid: str, t0: float) -> Optional[float]:
            assert watcher is not None  # rank 0 only
            return watcher.done_at(cid)

        def fs_cleanup(ids: list[str]) -> None:
            if not dest.wait_for_uploads(900):
                raise RuntimeError('fs_upload: uploads did not land within 900 s')
            shutil.rmtree(local_root / 'ckpt' / 'fs_upload', ignore_errors=True)
            delete_prefix('ckpt/fs_upload/')

        setups['fs_upload'] = Mode(
            fs_save, committed=fs_committed if d.is_zero else (lambda cid, t0: t0), cleanup=fs_cleanup
        )
    if 'fs_async_local' in wanted:

        def fsa_save(sd: dict, cid: str) -> tuple[Optional[Future], dict]:
            fut = _future_of(
                dcp.async_save(sd, storage_writer=FileSystemWriter(str(local_root / cid)), process_group=ckpt_group)
            )
            fut.add_done_callback(on_done(cid))
            return fut, {}

        def fsa_cleanup(ids: list[str]) -> None:
            shutil.rmtree(local_root / 'ckpt' / 'fs_async_local', ignore_errors=True)

        # No bucket: "committed" is the local save's completion (reported as local durability only).
        setups['fs_async_local'] = Mode(fsa_save, committed=by_future_or_return, cleanup=fsa_cleanup, uploads=False)

    # ---- DCP's FsspecWriter (s3fs)
    if 'fsspec_async' in wanted:
        try:
            import s3fs  # noqa: F401
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        except ImportError as exc:
            skipped['fsspec_async'] = f's3fs / FsspecWriter not importable: {exc}'
        else:

            def fsspec_save(sd: dict, cid: str) -> tuple[Optional[Future], dict]:
                # A writer per save: reset(checkpoint_id) would re-open the filesystem without endpoint_url.
                writer = FsspecWriter(f's3://{C.MOTO_BUCKET}/{cid}', endpoint_url=endpoint)
                fut = _future_of(dcp.async_save(sd, storage_writer=writer, process_group=ckpt_group))
                fut.add_done_callback(on_done(cid))
                return fut, {}

            setups['fsspec_async'] = Mode(
                fsspec_save, committed=by_future_or_return, cleanup=cleanup_bucket('fsspec_async')
            )

    # ---- s3torchconnector
    if any(m.startswith('s3tc') for m in wanted):
        try:
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client
            from s3torchconnector.dcp import S3StorageWriter
            from s3torchconnector.dcp.s3_file_system import S3FileSystem
        except ImportError as exc:
            for m in ('s3tc_save', 's3tc_async'):
                skipped[m] = f's3torchconnector[dcp] not importable (pip install "dist-logging[bench]"): {exc}'
        else:
            region = os.environ.get('AWS_DEFAULT_REGION', 'us-east-1')
            config = S3ClientConfig(force_path_style=True)
            # S3StorageWriter takes no endpoint; its S3FileSystem accepts a client that has one.
            fs = S3FileSystem(region, s3_client=S3Client(region, endpoint=endpoint, s3client_config=config))

            def s3tc_writer(cid: str) -> Any:
                writer = S3StorageWriter(region, f's3://{C.MOTO_BUCKET}/{cid}', s3client_config=config)
                writer.fs = fs
                return writer

            def s3tc_save(sd: dict, cid: str) -> tuple[Optional[Future], dict]:
                dcp.save(sd, storage_writer=s3tc_writer(cid), process_group=ckpt_group)
                finished[cid] = time.time()
                return None, {}

            def s3tc_async(sd: dict, cid: str) -> tuple[Optional[Future], dict]:
                fut = _future_of(dcp.async_save(sd, storage_writer=s3tc_writer(cid), process_group=ckpt_group))
                fut.add_done_callback(on_done(cid))
                return fut, {}

            if 's3tc_save' in wanted:
                setups['s3tc_save'] = Mode(
                    s3tc_save, committed=by_future_or_return, cleanup=cleanup_bucket('s3tc_save')
                )
            if 's3tc_async' in wanted:
                setups['s3tc_async'] = Mode(
                    s3tc_async, committed=by_future_or_return, cleanup=cleanup_bucket('s3tc_async')
                )
    return setups


# ----------------------------------------------------------------------------- one experiment


def _experiment(
    args: Any,
    d: C.Dist,
    total: int,
    device_ms: float,
    modes: list[str],
    setups: dict[str, Mode],
    watcher: Optional[BucketWatcher],
    exclude: tuple,
    label: str,
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    torch.manual_seed(1234)
    model = build_model(args.width, args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(99 + d.rank)
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randn(args.batch, 1, generator=gen)
    wait_s = device_ms / 1000

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if wait_s:
            time.sleep(wait_s)  # the host waiting on its accelerator (emulated): the cores idle

    for _ in range(2):
        train_step()  # optimizer state exists from here on
    msd, osd = get_state_dict(model, optimizer)
    state_total = sum(d.all_gather_object(local_bytes({'m': msd, 'o': osd})))
    per_rank = max((total - state_total) // d.world_size, 1)
    mesh = init_device_mesh('cpu', (d.world_size,))
    cols = args.filler_cols
    # rows rounded up: the checkpoint is at least the size asked for
    shape = (-(-per_rank // cols), cols) if cols else (per_rank,)
    local = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    filler = DTensor.from_local(
        local,
        mesh,
        [Shard(0)],
        run_check=False,
        shape=torch.Size([shape[0] * d.world_size, *shape[1:]]),
        stride=local.stride(),
    )
    ckpt_bytes = sum(d.all_gather_object(local_bytes({'m': msd, 'o': osd, 'f': filler})))
    C.touch_memory(3 * per_rank)

    rec: dict[str, dict[str, list]] = {
        m: {
            k: []
            for k in (
                'steps',
                'blocking',
                'wait',
                'call',
                'save_call',
                'call_cpu',
                'local',
                'commit',
                'cpu',
                'io',
                'tail',
            )
        }
        for m in modes
    }
    tail_capped = dict.fromkeys(modes, 0)
    for r, order in C.rotations(modes, args.rounds + 1):
        for mode in order:
            setup = setups[mode]
            d.barrier()
            io0, cpu0 = C.io_bytes(exclude), C.cpu_seconds(exclude)
            call_cpu = 0.0
            ids: list[str] = []
            starts: list[float] = []
            prev: Optional[Future] = None
            dones: dict[str, float] = {}
            for s in range(args.saves):
                for _ in range(args.every):
                    t0 = C.now_ns()
                    train_step()
                    if r > 0:
                        rec[mode]['steps'].append(C.now_ns() - t0)
                if mode == 'none':
                    continue
                cid = f'ckpt/{mode}/{label.replace("/", "-")}-r{r}-s{s}'
                msd, osd = get_state_dict(model, optimizer)
                sd = {'model': msd, 'optim': osd, 'filler': filler}
                d.barrier()  # every rank starts the save together: blocking is the save's, not a straggler's
                start_wall = time.time()
                c0 = time.thread_time()
                t0 = C.now_ns()
                if prev is not None and not prev.done():
                    prev.result(timeout=900)
                t1 = C.now_ns()
                fut, extra = setup.save(sd, cid)
                t2 = C.now_ns()
                call_cpu += time.thread_time() - c0
                if fut is None:
                    dones[cid] = time.time()
                else:
                    fut.add_done_callback(lambda _f, cid=cid: dones.__setitem__(cid, time.time()))
                prev = fut
                ids.append(cid)
                starts.append(start_wall)
                if watcher is not None and mode == 'fs_upload':
                    watcher.watch(cid)
                if r > 0:
                    rec[mode]['blocking'].append(t2 - t0)
                    rec[mode]['wait'].append(t1 - t0)
                    rec[mode]['call'].append(t2 - t1)
                    if 'save_call_ns' in extra:
                        rec[mode]['save_call'].append(extra['save_call_ns'])
            # The tail: train on, timed, until every save of the segment committed (coordinator) and every
            # rank's futures finished.
            tail: list[int] = []

            def settled() -> bool:
                if any(cid not in dones for cid in ids):
                    return False
                if d.is_zero:
                    return all(setup.committed(cid, t) is not None for cid, t in zip(ids, starts))
                return True

            done = _all_ranks(d, settled())
            while not done and len(tail) < args.max_tail_steps:
                t0 = C.now_ns()
                train_step()
                tail.append(C.now_ns() - t0)
                done = _all_ranks(d, settled())
            if not done:
                deadline = time.monotonic() + 900
                while not settled() and time.monotonic() < deadline:
                    time.sleep(POLL_S)
                if not settled():
                    raise RuntimeError(f'{mode}: saves {ids} not settled within 900 s after the tail')
            if r > 0:
                cpu = C.cpu_seconds(exclude) - cpu0
                io1 = C.io_bytes(exclude)
                rec[mode]['cpu'].append((cpu, call_cpu))
                rec[mode]['io'].append({k: io1[k] - io0[k] for k in io0})
                rec[mode]['tail'].append(tail)
                tail_capped[mode] += not done
                for cid, t in zip(ids, starts):
                    rec[mode]['local'].append(dones[cid] - t)
                    if d.is_zero and setup.uploads:
                        rec[mode]['commit'].append(setup.committed(cid, t) - t)
            setup.cleanup(ids)
            d.barrier()
    return _summarize(args, d, modes, rec, tail_capped, ckpt_bytes, state_total, device_ms, setups)


def _all_ranks(d: C.Dist, flag: bool) -> bool:
    if d.world_size == 1:
        return flag
    value = torch.tensor([1 if flag else 0])
    torch_dist.all_reduce(value, op=torch_dist.ReduceOp.MIN, group=d.cpu_group)
    return bool(value.item())


def _summarize(
    args: Any,
    d: C.Dist,
    modes: list[str],
    rec: dict,
    tail_capped: dict,
    ckpt_bytes: int,
    state_total: int,
    device_ms: float,
    setups: dict[str, Mode],
) -> dict[str, Any]:
    every = d.all_gather_object(rec)
    gib = ckpt_bytes / (1 << 30)
    per_segment_steps = args.every * args.saves
    out: dict[str, Any] = {
        'checkpoint_bytes': ckpt_bytes,
        'model_and_optimizer_bytes': state_total,
        'device_ms': device_ms,
        'modes': {},
    }

    def slowest(key: str, mode: str) -> list[float]:
        n = len(rec[mode][key])
        return [max(rank[mode][key][i] for rank in every) for i in range(n)]

    def seg_cpu(mode: str) -> list[tuple[float, float]]:  # (tree CPU, in-call CPU), summed over ranks
        n = len(rec[mode]['cpu'])
        return [
            (sum(rank[mode]['cpu'][i][0] for rank in every), sum(rank[mode]['cpu'][i][1] for rank in every))
            for i in range(n)
        ]

    none_cpu = [c for c, _ in seg_cpu('none')]
    none_cpu_per_step = sum(none_cpu) / len(none_cpu) / per_segment_steps if none_cpu else 0.0
    none_steps = slowest('steps', 'none')
    none_step_s = sorted(none_steps)[len(none_steps) // 2] * 1e-9 if none_steps else 0.0
    for mode in modes:
        entry: dict[str, Any] = {'step_ms': C.summarize(slowest('steps', mode), 1e-6)}
        out['modes'][mode] = entry
        if mode == 'none':
            continue
        entry['blocking_ms'] = C.summarize(slowest('blocking', mode), 1e-6)
        entry['wait_previous_ms'] = C.summarize(slowest('wait', mode), 1e-6)
        entry['call_ms'] = C.summarize(slowest('call', mode), 1e-6)
        if rec[mode]['save_call']:
            entry['save_call_ms'] = C.summarize(slowest('save_call', mode), 1e-6)
        entry['local_durable_s'] = C.summarize(slowest('local', mode), 1.0)
        if setups[mode].uploads:
            entry['commit_s'] = C.summarize(every[0][mode]['commit'], 1.0)
        tails = [len(t) for t in rec[mode]['tail']]
        tail_steps = sum(tails) / len(tails) if tails else 0.0
        cpu = seg_cpu(mode)
        if cpu:
            total_cpu = sum(c for c, _ in cpu) / len(cpu)
            in_call = sum(i for _, i in cpu) / len(cpu)
            ckpt_cpu = total_cpu - none_cpu_per_step * (per_segment_steps + tail_steps)
            entry['ckpt_cpu_s_per_gib'] = ckpt_cpu / (gib * args.saves)
            entry['in_call_cpu_s_per_gib'] = in_call / (gib * args.saves)
            entry['background_cpu_s_per_gib'] = (ckpt_cpu - in_call) / (gib * args.saves)
        ios = [
            {k: sum(rank[mode]['io'][i][k] for rank in every) for k in C.IO_FIELDS} for i in range(len(rec[mode]['io']))
        ]
        if ios:
            mean = {k: sum(io[k] for io in ios) / len(ios) for k in C.IO_FIELDS}
            entry['disk_bytes_per_checkpoint_byte'] = {k: mean[k] / (ckpt_bytes * args.saves) for k in C.IO_FIELDS}
        entry['tail_steps_mean'] = tail_steps
        entry['tail_seconds_at_none_median'] = tail_steps * none_step_s
        entry['tail_capped_segments'] = tail_capped[mode]
    return out


def _targets(exp: dict[str, Any]) -> dict[str, Any]:
    m = exp['modes']

    def med(mode: str, key: str) -> Optional[float]:
        return m.get(mode, {}).get(key, {}).get('median')

    targets: dict[str, Any] = {}
    ref = med('fs_upload', 'save_call_ms')
    for name, mode, refmode, refkey in (
        ('ours_save_blocking_le_1.1x_filesystemwriter_save', 'ours_save', 'fs_upload', 'save_call_ms'),
        ('ours_async_blocking_le_1.1x_dcp_async_local', 'ours_async', 'fs_async_local', 'blocking_ms'),
    ):
        value, ref = med(mode, 'blocking_ms'), med(refmode, refkey)
        r = C.ratio(value, ref)
        targets[name] = {'ours_ms': value, 'reference_ms': ref, 'ratio': r, 'met': None if r is None else r <= 1.1}
    others = {mode: med(mode, 'commit_s') for mode in ('fsspec_async', 's3tc_save', 's3tc_async')}
    others = {k: v for k, v in others.items() if v is not None}
    best = min(others.values()) if others else None
    for mode in ('ours_save', 'ours_async'):
        value = med(mode, 'commit_s')
        r = C.ratio(value, best)
        targets[f'{mode}_commit_le_best_of_modes_4_5'] = {
            'ours_s': value,
            'best_s': best,
            'best_mode': min(others, key=others.get) if others else None,
            'ratio': r,
            'met': None if r is None else r <= 1.0,
        }
    for mode in ('ours_save', 'ours_async'):
        io = m.get(mode, {}).get('disk_bytes_per_checkpoint_byte')
        if io:
            # "Once": within 5 % over one pass (.metadata, journal lines, S3 responses, /proc reads).
            targets[f'{mode}_written_once_read_once'] = {
                'write_bytes_x': io['write_bytes'],
                'rchar_x': io['rchar'],
                'met': io['write_bytes'] <= 1.05 and io['rchar'] <= 1.05,
            }
    return targets


def _rss_bytes() -> int:
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('no VmRSS in /proc/self/status')


def _memory_experiment(args: Any, d: C.Dist, work: pathlib.Path, endpoint: str, ckpt_group: Any) -> dict[str, Any]:
    """Hundreds of saves through one writer: does anything grow per save?

    Every rank saves a small sharded state (``--memory-state`` per rank) back to back, ``dcp.save``
    and ``dcp.async_save`` alternating, in blocks of 10 saves that alternate between ours
    (``CheckpointWriter`` to the S3 server, ``keep_last=2``, the coordinator waiting for each commit)
    and the reference, torch's ``FileSystemWriter`` to local disk (the previous checkpoint deleted):
    both run in the same process, so a growth of torch's own shows in both. Each block's change of
    RSS is charged to its mode. After each of ours' blocks each rank also samples the Python memory
    allocated by dist_logging's code (tracemalloc, filtered to the package, with the lines that grew
    over the second half), its threads and open file descriptors, and the bytes in its staging
    folder. Growth is judged on the second half (the first saves warm up allocators and caches), in
    bytes per 100 saves.
    """
    import gc
    import tracemalloc

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import async_save, save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dist_logging.checkpoint import CheckpointWriter, list_checkpoints

    per_rank = C.parse_size(args.memory_state)
    rows = max(1, per_rank // (64 * 4))
    if d.world_size > 1:
        mesh = init_device_mesh('cpu', (d.world_size,))
        weight = distribute_tensor(torch.zeros(rows * d.world_size, 64), mesh, [Shard(0)])
    else:
        weight = torch.zeros(rows, 64)
    state = {'w': weight, f'opt_rank{d.rank}': torch.zeros(1024), 'step': torch.tensor(0)}
    staging = work / 'staging-memory'
    local_root = pathlib.Path(d.broadcast_object(str(work / 'fs-memory')))
    writer = CheckpointWriter(
        f's3://{C.MOTO_BUCKET}/memory',
        backend_kwargs={'endpoint_url': endpoint},
        upload_staging_folder=str(staging),
        run_name='bench-memory',
        keep_last=2,
        num_concurrent_uploads=args.workers,
    )
    package = str(pathlib.Path(__file__).resolve().parents[1] / 'dist_logging')
    samples: list[dict[str, Any]] = []
    rss_growth = {'ours': [], 'filesystemwriter': []}  # (saves of the mode so far, cumulative RSS change)
    halfway: Any = None  # the snapshot at half the saves, to attribute what grew after it
    growth: list[dict[str, Any]] = []
    block = 10
    d.log(
        f'{NAME}: memory, {args.memory_saves} saves of {C.format_size(per_rank)} per rank through one writer, '
        f'interleaved with as many FileSystemWriter saves'
    )
    started = time.monotonic()
    tracemalloc.start()
    try:
        done = {'ours': 0, 'filesystemwriter': 0}
        total = {'ours': 0, 'filesystemwriter': 0}
        while done['ours'] < args.memory_saves:
            for mode in ('ours', 'filesystemwriter'):
                gc.collect()
                before = _rss_bytes()
                for _ in range(min(block, args.memory_saves - done[mode])):
                    n = done[mode]
                    local = state['w'].to_local() if hasattr(state['w'], 'to_local') else state['w']
                    local.add_(1.0)
                    state['step'] = torch.tensor(n)
                    if mode == 'ours':
                        cid, target = f'ckpt/memory/step{n:05d}', writer
                    else:
                        cid = str(local_root / f'step{n:05d}')
                        target = FileSystemWriter(cid)
                    if n % 2:
                        async_save(state, checkpoint_id=cid, storage_writer=target, process_group=ckpt_group).result()
                    else:
                        save(state, checkpoint_id=cid, storage_writer=target)
                    if mode == 'ours' and d.is_zero and not writer.wait_for_commits(120):
                        raise RuntimeError(f'{cid}: not committed within 120 s')
                    if mode == 'filesystemwriter':
                        d.barrier()
                        if d.local_rank == 0 and n:
                            shutil.rmtree(local_root / f'step{n - 1:05d}', ignore_errors=True)
                    done[mode] += 1
                gc.collect()
                total[mode] += _rss_bytes() - before
                rss_growth[mode].append((done[mode], total[mode]))
            staged = [(f.stat().st_size, str(f.relative_to(staging))) for f in staging.rglob('*') if f.is_file()]
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, package + '/*')])
            if halfway is None and done['ours'] > args.memory_saves // 2:
                halfway = snapshot
            elif done['ours'] >= args.memory_saves and halfway is not None:
                growth = [
                    {'where': str(stat.traceback), 'bytes': stat.size_diff, 'blocks': stat.count_diff}
                    for stat in snapshot.compare_to(halfway, 'lineno')[:5]
                    if stat.size_diff
                ]
            samples.append(
                {
                    'saves': done['ours'],
                    'rss': _rss_bytes(),
                    'dist_logging_py': sum(stat.size for stat in snapshot.statistics('filename')),
                    'threads': threading.active_count(),
                    'fds': len(os.listdir('/proc/self/fd')),
                    'staged': sum(size for size, _ in staged),
                    'largest_staged': max(staged, default=None),
                    'timings_kept': len(writer.timings),
                }
            )
    finally:
        tracemalloc.stop()
        writer.close()
        d.barrier()
        if d.local_rank == 0:
            shutil.rmtree(local_root, ignore_errors=True)
    # one listing, no read: the sink keeps no bytes
    committed = list_checkpoints(
        f's3://{C.MOTO_BUCKET}/memory', 'ckpt/memory', backend_kwargs={'endpoint_url': endpoint}
    )

    def per_100(series: list[tuple[int, int]]) -> Optional[float]:
        half = [point for point in series if point[0] > args.memory_saves // 2] or series
        if len(half) < 2 or half[-1][0] == half[0][0]:
            return None
        return (half[-1][1] - half[0][1]) * 100 / (half[-1][0] - half[0][0])

    mine = {
        'samples': samples,
        'rss_growth_by_mode': rss_growth,
        'rss_growth_bytes_per_100_saves': {mode: per_100(series) for mode, series in rss_growth.items()},
        'dist_logging_py_growth_bytes_per_100_saves': per_100([(s['saves'], s['dist_logging_py']) for s in samples]),
        'dist_logging_py_top_growth_second_half': growth,
        'threads_first_last': [samples[0]['threads'], samples[-1]['threads']] if samples else None,
        'fds_first_last': [samples[0]['fds'], samples[-1]['fds']] if samples else None,
        'staged_bytes_max': max((s['staged'] for s in samples), default=0),
    }
    everyone = d.all_gather_object(mine)
    return {
        'saves': args.memory_saves,
        'state_bytes_per_rank': per_rank,
        'keep_last': 2,
        'seconds': time.monotonic() - started,
        'committed_at_end': committed,
        'worst_rss_growth_bytes_per_100_saves': {
            mode: max((r['rss_growth_bytes_per_100_saves'][mode] or 0) for r in everyone) for mode in rss_growth
        },
        'worst_dist_logging_py_growth_bytes_per_100_saves': max(
            (r['dist_logging_py_growth_bytes_per_100_saves'] or 0) for r in everyone
        ),
        'ranks': everyone,
    }


def plot(summary: dict, d: C.Dist, out_json: Optional[str]) -> None:
    memory = summary.get('memory')
    fig, axes = C.new_figure(ncols=4 if memory else 3, width=5.6)
    labels = list(summary['experiments'])
    modes = [m for m in next(iter(summary['experiments'].values()))['modes'] if m != 'none'] if labels else []
    width = 0.8 / max(len(labels), 1)
    xs = list(range(len(modes)))
    panels = (
        ('blocking_ms', 'training-thread blocking per save (ms, median, slowest rank)', True),
        ('commit_s', 'save start -> committed in the bucket (s, median)', False),
        ('disk', 'local disk per checkpoint byte: written (bar), read() (dot)', False),
    )
    for ax, (key, title, log) in zip(axes, panels):
        for i, label in enumerate(labels):
            exp = summary['experiments'][label]['modes']
            if key == 'disk':
                vals = [(exp[m].get('disk_bytes_per_checkpoint_byte') or {}).get('write_bytes') or 0 for m in modes]
                reads = [(exp[m].get('disk_bytes_per_checkpoint_byte') or {}).get('rchar') or 0 for m in modes]
                ax.scatter([x + i * width for x in xs], reads, color='black', s=12, zorder=3)
            else:
                vals = [((exp[m].get(key) or {}).get('median') or 0) for m in modes]
            ax.bar([x + i * width for x in xs], vals, width=width, label=label)
        ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in xs])
        ax.set_xticklabels(modes, rotation=30, ha='right', fontsize=8)
        ax.set_title(title, fontsize=9)
        if log:
            ax.set_yscale('log')
        ax.legend(fontsize=7)
    if memory:
        ax = axes[3]
        for rank, mine in enumerate(memory['ranks']):
            for mode, series in mine['rss_growth_by_mode'].items():
                ax.plot(
                    [x for x, _ in series], [y / 2**20 for _, y in series], label=f'RSS change, {mode}, rank {rank}'
                )
            ax.plot(
                [s['saves'] for s in mine['samples']],
                [s['dist_logging_py'] / 2**20 for s in mine['samples']],
                linestyle='--',
                label=f"dist_logging's Python memory, rank {rank}",
            )
        ax.set_xlabel('saves (of each mode, interleaved in blocks of 10)')
        ax.set_ylabel('MiB')
        ax.set_title(
            f"memory over {memory['saves']} saves of {C.format_size(memory['state_bytes_per_rank'])} per rank",
            fontsize=9,
        )
        ax.legend(fontsize=6)
    note = ' (oversubscribed)' if d.local_world_size > (os.cpu_count() or 1) else ''
    fig.suptitle(
        f'{NAME}: {d.world_size} rank(s){note}, a save every {summary["every"]} steps, '
        f'S3 {summary["s3_server"]} over {summary["s3_scheme"]}',
        fontsize=10,
    )
    C.save_figure(fig, NAME, d, out_json)


if __name__ == '__main__':
    sys.exit(main())
