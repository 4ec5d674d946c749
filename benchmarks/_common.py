"""Shared helpers for the benchmarks: distributed set-up, timing, summaries, results, plots, S3 server.

Every benchmark is a script launched by ``torchrun`` (or plain ``python``, which runs a
world of one). This module holds what they share so each script reads as its experiment:

* :func:`init_distributed` -- NCCL + CUDA when ``torch.cuda.is_available()``, gloo + CPU
  otherwise; a gloo side group for the benchmark's own bookkeeping (gathering samples,
  barriers) so that bookkeeping never touches the training group's stream.
* :func:`summarize` -- median / p95 / p99 / max of nanosecond samples, in microseconds.
* :func:`write_results` -- the JSON summary, printed on rank zero and written to
  ``benchmarks/results/<name>-<host>-<date>-n<world>.json``.
* :func:`start_s3_server` -- one S3 server per node (a child process of local rank zero, so
  its request handling never holds a benchmarked process's GIL), at the lowest CPU and I/O
  priority by default: it stands for a remote machine. ``'sink'`` (default, ``_s3_sink.py``)
  discards the bytes and costs little CPU, over https by default (what real S3 clients do:
  unsigned aws-chunked payloads with a CRC32 trailer, TLS) or http; ``'moto'`` is a full
  emulator, CPU-heavy, http only.
* :func:`cpu_seconds` -- CPU time of this process and its child processes (upload workers).
* :func:`parse_sizes` -- ``"4KiB,1MiB,64MiB,256MiB"`` -> byte counts.

Timing is ``time.perf_counter_ns`` throughout. Comparisons are always made inside one
run with the modes interleaved (see :func:`rotations`), because the machines these run
on are shared and drift; ratios inside one run are the figures to trust.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
import torch.distributed as torch_dist

BENCH_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / 'results'

if str(REPO_ROOT) not in sys.path:  # `python benchmarks/x.py` from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

# ---------------------------------------------------------------------------- sizes

_UNITS = {
    '': 1,
    'b': 1,
    'k': 1000,
    'kb': 1000,
    'm': 1000**2,
    'mb': 1000**2,
    'g': 1000**3,
    'gb': 1000**3,
    'kib': 1 << 10,
    'mib': 1 << 20,
    'gib': 1 << 30,
    'tib': 1 << 40,
}


def parse_size(text: str) -> int:
    """``'4KiB'`` -> 4096, ``'1.5MiB'`` -> 1572864, ``'100'`` -> 100, ``'2MB'`` -> 2000000.

    Raises:
        ValueError: an unknown unit or a non-positive size.
    """
    match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*', text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f'bad size {text!r}: expected a number and a unit such as 4KiB, 64MiB, 1GiB, 2MB')
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise ValueError(f'bad size {text!r}: must be positive')
    return value


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes -> byte counts, in the given order."""
    return [parse_size(part) for part in text.split(',') if part.strip()]


def format_size(nbytes: int) -> str:
    """4096 -> ``'4KiB'``; exact binary units where possible."""
    for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f'{nbytes // scale}{unit}'
    for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f}{unit}'
    return f'{nbytes}B'


# ---------------------------------------------------------------------------- timing & statistics

now_ns = time.perf_counter_ns


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already-sorted values, linear interpolation."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low))


def summarize(samples_ns: Iterable[float], scale: float = 1e-3) -> dict[str, Any]:
    """n, median, p95, p99, max, min, mean of samples given in ns; values in µs by default."""
    values = sorted(float(v) * scale for v in samples_ns)
    if not values:
        return {'n': 0}
    return {
        'n': len(values),
        'median': percentile(values, 50),
        'p95': percentile(values, 95),
        'p99': percentile(values, 99),
        'max': values[-1],
        'min': values[0],
        'mean': sum(values) / len(values),
    }


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator


def rotations(modes: Sequence[str], rounds: int) -> Iterator[tuple[int, list[str]]]:
    """(round, mode order) with the order rotated each round, so no mode always goes first or last."""
    modes = list(modes)
    for r in range(rounds):
        k = r % max(len(modes), 1)
        yield r, modes[k:] + modes[:k]


# ---------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    """What a benchmark needs to know about the job it runs in."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    backend: str
    device: torch.device
    cpu_group: Any = None  # gloo group for bookkeeping (WORLD when the backend is gloo)
    extra: dict = field(default_factory=dict)

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """A barrier on the gloo bookkeeping group."""
        if self.world_size > 1:
            torch_dist.barrier(group=self.cpu_group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank (gloo bookkeeping group)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch_dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=src, group=self.cpu_group)
        return box[0]

    def shared_temp_dir(self, prefix: str) -> str:
        """A new folder in the system temp dir, made by rank zero only and shared with every rank
        (each rank making its own and keeping rank zero's would leave the others behind)."""
        return self.broadcast_object(tempfile.mkdtemp(prefix=prefix) if self.rank == 0 else None)

    def log(self, *parts: Any) -> None:
        """Progress line on rank zero (stderr, so stdout stays the JSON summary)."""
        if self.rank == 0:
            print('[bench]', *parts, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def init_distributed(force_backend: Optional[str] = None) -> Dist:
    """Initialize ``torch.distributed`` the way a training job on this hardware would.

    NCCL with one CUDA device per local rank when CUDA is available, gloo on CPU
    otherwise. Run without torchrun, this is a world of one (a gloo group on a free
    loopback port), so every benchmark also runs as a plain script.
    """
    if 'RANK' not in os.environ:
        os.environ.update(
            RANK='0',
            WORLD_SIZE='1',
            LOCAL_RANK='0',
            LOCAL_WORLD_SIZE='1',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(_free_port()),
        )
    rank = int(os.environ['RANK'])
    world_size = int(os.environ['WORLD_SIZE'])
    local_rank = int(os.environ.get('LOCAL_RANK', '0'))
    local_world_size = int(os.environ.get('LOCAL_WORLD_SIZE', str(world_size)))
    use_cuda = torch.cuda.is_available() and force_backend != 'gloo'
    backend = force_backend or ('nccl' if use_cuda else 'gloo')
    if use_cuda:
        device = torch.device('cuda', local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device('cpu')
    if not torch_dist.is_initialized():
        kwargs: dict[str, Any] = dict(backend=backend, timeout=datetime.timedelta(minutes=10))
        if backend == 'nccl':
            kwargs['device_id'] = device
        torch_dist.init_process_group(**kwargs)
    cpu_group = torch_dist.group.WORLD if backend == 'gloo' else torch_dist.new_group(backend='gloo')
    d = Dist(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node=socket.gethostname(),
        backend=backend,
        device=device,
        cpu_group=cpu_group,
    )
    return d


def shutdown(d: Dist) -> None:
    if torch_dist.is_initialized():
        try:
            d.barrier()
        finally:
            torch_dist.destroy_process_group()


def device_sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- arguments & results


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='tiny sizes and few repetitions (smoke test)')
    parser.add_argument(
        '--out-json',
        default=None,
        help='where to write the JSON summary (default: benchmarks/results/<name>-<host>-<date>-n<N>.json)',
    )
    parser.add_argument('--no-plot', action='store_true', help='skip the PNG plot')
    parser.add_argument(
        '--backend',
        choices=('nccl', 'gloo'),
        default=None,
        help='force a backend (default: nccl with CUDA, gloo otherwise)',
    )
    return parser


def environment(d: Dist) -> dict[str, Any]:
    """Facts that make a result interpretable later."""
    import platform

    info = {
        'host': d.node,
        'world_size': d.world_size,
        'local_world_size': d.local_world_size,
        'backend': d.backend,
        'device': str(d.device),
        'cpu_count': os.cpu_count(),
        'oversubscribed': d.local_world_size > (os.cpu_count() or 1),
        'torch': torch.__version__,
        'python': platform.python_version(),
        'platform': platform.platform(),
        'utc': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
    }
    if d.device.type == 'cuda':
        info['gpu'] = torch.cuda.get_device_name(d.device)
    return info


def result_path(name: str, d: Dist, suffix: str, out_json: Optional[str] = None) -> pathlib.Path:
    if out_json:
        base = pathlib.Path(out_json)
        return base if suffix == '.json' else base.with_suffix(suffix)
    stamp = d.extra.get('stamp')
    if stamp is None:
        stamp = d.broadcast_object(time.strftime('%Y%m%d-%H%M%S'))
        d.extra['stamp'] = stamp
    return RESULTS_DIR / f'{name}-{d.node}-{stamp}-n{d.world_size}{suffix}'


def write_results(
    name: str, d: Dist, summary: dict[str, Any], out_json: Optional[str] = None
) -> Optional[pathlib.Path]:
    """Print the JSON summary on rank zero and write it to the results folder; returns the path there."""
    path = result_path(name, d, '.json', out_json)  # a collective the first time (agreeing on the stamp)
    if not d.is_zero:
        return None
    summary = dict(summary)
    summary.setdefault('benchmark', name)
    summary.setdefault('environment', environment(d))
    text = json.dumps(summary, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix('.json.tmp')
    tmp.write_text(text + '\n')
    os.replace(tmp, path)
    print(text, flush=True)
    print(f'[bench] wrote {path}', file=sys.stderr, flush=True)
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, (pathlib.Path, torch.device)):
        return str(value)
    if hasattr(value, 'item'):
        return value.item()
    raise TypeError(f'not JSON serializable: {type(value).__name__}')


def clean_nan(value: Any) -> Any:
    """Replace NaN/inf floats with None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_nan(v) for v in value]
    return value


def new_figure(ncols: int = 1, width: float = 6.4, height: float = 4.8):
    """A matplotlib figure (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig: Any, name: str, d: Dist, out_json: Optional[str] = None) -> Optional[pathlib.Path]:
    if not d.is_zero:
        return None
    import matplotlib.pyplot as plt

    path = result_path(name, d, '.png', out_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f'[bench] wrote {path}', file=sys.stderr, flush=True)
    return path


def composer_available() -> Optional[str]:
    """Composer's version when ``mosaicml`` is importable, else None."""
    try:
        import composer  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return getattr(composer, '__version__', 'unknown')


# ---------------------------------------------------------------------------- S3 server on loopback

# argv: port, priority, kind, benchmarks folder (where _s3_sink.py is), TLS certificate and key ('' '': http).
_S3_CHILD = r'''
import ctypes, os, platform, sys, threading
if sys.argv[2] == 'low':
    # The server stands for another machine: run it below everything benchmarked (SCHED_IDLE,
    # nice 19, idle I/O class), so its CPU is not charged to the job it serves. Its threads
    # inherit all three.
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    if hasattr(os, 'SCHED_IDLE'):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    number = {'x86_64': 251, 'aarch64': 30}.get(platform.machine())
    if number is not None and sys.platform.startswith('linux'):
        ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(number), ctypes.c_long(1), ctypes.c_long(0),
                                                  ctypes.c_long(3 << 13))  # IOPRIO_CLASS_IDLE
if sys.argv[3] == 'sink':
    sys.path.insert(0, sys.argv[4])
    from _s3_sink import SinkServer
    server = SinkServer(int(sys.argv[1]), sys.argv[5] or None, sys.argv[6] or None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = server.shutdown
else:
    if sys.argv[3] == 'moto-ranges':  # ranged GETs read only the range, as S3 serves them (_lazy_moto.py)
        sys.path.insert(0, sys.argv[4])
        import _lazy_moto
        _lazy_moto.patch()
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
    server.start()
    stop = server.stop
print("ready", flush=True)
sys.stdin.read()  # runs until the parent closes our stdin (or dies)
stop()
'''

MOTO_BUCKET = 'bench'


def set_dummy_aws_env() -> None:
    """Dummy credentials, unless the environment already has some (moto and the sink accept any)."""
    os.environ.setdefault('AWS_ACCESS_KEY_ID', 'testing')
    os.environ.setdefault('AWS_SECRET_ACCESS_KEY', 'testing')
    os.environ.setdefault('AWS_DEFAULT_REGION', 'us-east-1')


S3_SERVER_PRIORITIES = ('low', 'normal')
S3_SERVERS = ('sink', 'moto', 'moto-ranges')
S3_SCHEMES = ('https', 'http')
S3_SCHEME_HELP = (
    'how the benchmarked clients reach the S3 server: https (default; what clients of real S3 do: '
    'botocore sends unsigned aws-chunked payloads with a CRC32 trailer, and pays for TLS; the sink '
    'serves a throwaway self-signed certificate trusted through AWS_CA_BUNDLE) or http (botocore '
    'signs every payload with SHA-256 instead and there is no TLS: about the same client CPU per GiB '
    'on a machine with SHA and AES instructions, spent differently). '
    '--s3-server moto serves http only: pass --s3-scheme http with it'
)


def add_s3_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--s3-server``, ``--s3-scheme`` and ``--s3-server-priority`` (check them with :func:`check_s3_scheme`)."""
    parser.add_argument(
        '--s3-server',
        choices=S3_SERVERS,
        default='sink',
        help='the S3 server on loopback: sink (discards the bytes, little CPU) or moto (a full emulator, CPU-heavy)',
    )
    parser.add_argument('--s3-scheme', choices=S3_SCHEMES, default='https', help=S3_SCHEME_HELP)
    parser.add_argument(
        '--s3-server-priority',
        choices=S3_SERVER_PRIORITIES,
        default='low',
        help='CPU/I/O priority of the S3 server (low: it stands for a remote machine)',
    )


def check_s3_scheme(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--s3-scheme https`` (the default) with ``--s3-server moto``, which serves http only."""
    if args.s3_server == 'moto' and args.s3_scheme == 'https':
        parser.error(
            '--s3-server moto serves plain http only: pass --s3-scheme http with it '
            '(https, the default, is served by --s3-server sink)'
        )


def start_s3_server(
    d: Dist, kind: str = 'sink', priority: str = 'low', scheme: str = 'https'
) -> tuple[str, Optional[subprocess.Popen]]:
    """Start one S3 server per node (by local rank zero) and return its endpoint on every rank.

    ``kind='sink'`` (default) is ``_s3_sink.py``: it answers what the benchmarks send and
    discards the bytes, at a small fraction of moto's CPU per GiB; ``'moto'`` is moto's
    server, a full emulator that parses and keeps every byte (CPU-heavy).

    ``scheme='https'`` (default; the sink only) is what clients of real S3 do: local rank zero
    writes a throwaway self-signed certificate for 127.0.0.1 into a temp folder (removed by
    :func:`stop_s3_server`), the sink serves TLS with it, and every rank sets ``AWS_CA_BUNDLE`` to
    its node's certificate before returning, so every boto3 client made afterwards in the rank
    or in processes it starts (ours, the baselines, Composer's) trusts it; botocore then sends
    PutObject and UploadPart bodies unsigned, ``aws-chunked`` with a CRC32 trailer. Over
    ``'http'`` it signs every payload with SHA-256 instead. The endpoint is
    ``<scheme>://127.0.0.1:<port>``.

    The server runs in a child process rather than a thread of a benchmarked process: a
    thread would make that rank's timings pay for serving every rank's requests (the GIL).
    With ``priority='low'`` (default) it runs under SCHED_IDLE at nice 19 and in the idle I/O
    class (the lowest CPU and I/O priority there is): it stands for
    a remote machine, so the two cores go to the job first; ``'normal'`` keeps the old rig,
    where the server competes with the job as an equal. The bucket :data:`MOTO_BUCKET` is
    created before the endpoint is shared.
    """
    if priority not in S3_SERVER_PRIORITIES:
        raise ValueError(f'S3 server priority must be one of {S3_SERVER_PRIORITIES}, got {priority!r}')
    if kind not in S3_SERVERS:
        raise ValueError(f'S3 server must be one of {S3_SERVERS}, got {kind!r}')
    if scheme not in S3_SCHEMES:
        raise ValueError(f'S3 scheme must be one of {S3_SCHEMES}, got {scheme!r}')
    if kind.startswith('moto') and scheme == 'https':
        raise ValueError('the moto S3 server serves plain http only (scheme="http")')
    set_dummy_aws_env()
    proc = None
    endpoint = None
    ca_bundle = None
    if d.local_rank == 0:
        tls_dir = None
        try:
            certfile = keyfile = ''
            if scheme == 'https':
                if str(BENCH_DIR) not in sys.path:
                    sys.path.insert(0, str(BENCH_DIR))
                from _s3_sink import make_certificate

                tls_dir = tempfile.mkdtemp(prefix='dist_logging-bench-tls-')
                certfile, keyfile = make_certificate(tls_dir)
                ca_bundle = certfile
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-c", _S3_CHILD, str(port), priority, kind, str(BENCH_DIR), certfile, keyfile],
                stdin=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            proc.tls_dir = tls_dir  # type: ignore[attr-defined] - removed by stop_s3_server
            line = proc.stdout.readline() if proc.stdout else ''
            if 'ready' not in line:
                raise RuntimeError(f'the {kind} S3 server did not start')
            endpoint = f'{scheme}://127.0.0.1:{port}'
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(('127.0.0.1', port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            if ca_bundle:
                os.environ['AWS_CA_BUNDLE'] = ca_bundle
            s3_client(endpoint).create_bucket(Bucket=MOTO_BUCKET)
        except BaseException:
            if proc is not None:
                stop_s3_server(proc)
            elif tls_dir is not None:
                shutil.rmtree(tls_dir, ignore_errors=True)
            raise
    endpoints = d.all_gather_object((d.node, d.local_rank, endpoint, ca_bundle))
    mine = [(ep, ca) for node, local, ep, ca in endpoints if node == d.node and local == 0 and ep]
    if not mine:
        raise RuntimeError(f'no S3 endpoint for node {d.node}: {endpoints}')
    endpoint, ca_bundle = mine[0]
    if ca_bundle:
        # Before any boto3 client of this rank exists; processes started from here on inherit it.
        os.environ['AWS_CA_BUNDLE'] = ca_bundle
    return endpoint, proc


def start_moto(d: Dist, priority: str = 'low') -> tuple[str, Optional[subprocess.Popen]]:
    """:func:`start_s3_server` with moto (http)."""
    return start_s3_server(d, 'moto', priority, 'http')


def stop_s3_server(proc: Optional[subprocess.Popen]) -> None:
    """Stop a server :func:`start_s3_server` started and remove its certificate (None: nothing to stop,
    e.g. not local rank zero). ``AWS_CA_BUNDLE`` is left set: no S3 call follows in the benchmarks."""
    if proc is None:
        return
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        tls_dir = getattr(proc, 'tls_dir', None)
        if tls_dir:
            shutil.rmtree(tls_dir, ignore_errors=True)


stop_moto = stop_s3_server


def _proc_cpu_ticks(pid: int) -> tuple[int, int]:
    """(parent pid, utime + stime in clock ticks) of a live process, from /proc/<pid>/stat."""
    with open(f'/proc/{pid}/stat', 'rb') as handle:
        fields = handle.read().rsplit(b')', 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def cpu_seconds(exclude: Iterable[int] = ()) -> float:
    """CPU seconds (user + system) used so far by this process (all threads) and its live descendants.

    Descendants are the upload worker processes (ours with ``use_procs=True``, the Composer
    design's spawn workers); ``exclude`` names processes left out with their subtrees (the S3
    server: it stands for another machine). Linux reads /proc; elsewhere only this process counts.
    """
    me = os.getpid()
    times = os.times()
    total = times.user + times.system
    if not sys.platform.startswith('linux'):
        return total
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            parents[int(entry)], ticks[int(entry)] = _proc_cpu_ticks(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    skip = set(exclude)
    hz = os.sysconf('SC_CLK_TCK')
    for pid in ticks:
        chain, seen = pid, 0
        while chain not in (0, 1, me) and chain not in skip and seen < 64:
            chain, seen = parents.get(chain, 0), seen + 1
        if chain == me and pid != me:
            total += ticks[pid] / hz
    return total


def _descendants(exclude: Iterable[int] = ()) -> list[int]:
    """Live descendant processes of this one (Linux /proc), leaving out ``exclude`` and their subtrees."""
    me = os.getpid()
    parents: dict[int, int] = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                parents[int(entry)] = _proc_cpu_ticks(int(entry))[0]
            except (OSError, ValueError, IndexError):
                continue
    skip = set(exclude)
    found = []
    for pid in parents:
        chain, seen = pid, 0
        while chain not in (0, 1, me) and chain not in skip and seen < 64:
            chain, seen = parents.get(chain, 0), seen + 1
        if chain == me and pid != me:
            found.append(pid)
    return found


IO_FIELDS = ('rchar', 'wchar', 'read_bytes', 'write_bytes', 'cancelled_write_bytes')


def io_bytes(exclude: Iterable[int] = ()) -> dict[str, int]:
    """I/O counters of this process (all its threads, live and exited) and its live descendants.

    From ``/proc/<pid>/io`` (Linux; elsewhere every counter is 0): ``write_bytes`` counts file
    pages this process tree dirtied in the page cache (what goes to the local disk; network sends
    and hard links add nothing), ``read_bytes`` what it made the kernel fetch from the disk (0 for a
    page-cache hit: a freshly written checkpoint is read back from memory), ``rchar``/``wchar`` the
    bytes passed through read()/write()-family calls on any file descriptor (sockets included;
    ``copy_file_range``/``sendfile`` count on both). ``exclude`` as for :func:`cpu_seconds` (the S3
    server). A descendant that exits between two samples takes its counters with it.
    """
    totals = dict.fromkeys(IO_FIELDS, 0)
    if not sys.platform.startswith('linux'):
        return totals
    for pid in [os.getpid(), *_descendants(exclude)]:
        try:
            with open(f'/proc/{pid}/io') as handle:
                for line in handle:
                    name, _, value = line.partition(':')
                    if name in totals:
                        totals[name] += int(value)
        except (OSError, ValueError):
            continue
    return totals


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    set_dummy_aws_env()
    return boto3.client('s3', endpoint_url=endpoint, config=Config(retries={'max_attempts': 3, 'mode': 'standard'}))


# ---------------------------------------------------------------------------- files


def write_file(path: pathlib.Path, nbytes: int, seed: int = 0) -> None:
    """A file of ``nbytes`` pseudo-random bytes (incompressible; written in 8 MiB chunks), read back once
    so it is in the page cache like a freshly written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    chunk = 8 << 20
    with open(path, 'wb') as f:
        left = nbytes
        while left > 0:
            n = min(chunk, left)
            f.write(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).numpy().tobytes())
            left -= n
    with open(path, 'rb') as f:
        while f.read(chunk):
            pass


def touch_memory(nbytes: int) -> None:
    """Fault in ``nbytes`` of fresh anonymous memory once and free it: this VM hands freed memory back to
    its host, so the first large copy of a run would otherwise pay for page faults the others do not."""
    if nbytes <= 0:
        return
    buf = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        buf[i] = 1
    del buf


def finish(
    name: str, d: Dist, summary: dict[str, Any], args: Any, plot: Callable[[dict[str, Any], Dist, Optional[str]], None]
) -> dict[str, Any]:
    """The end of every benchmark: clean the summary, print and write it, plot on rank zero, shut down.

    Returns:
        The summary as written (NaN replaced).
    """
    summary = clean_nan(summary)
    write_results(name, d, summary, args.out_json)
    if not args.no_plot and d.is_zero:
        plot(summary, d, args.out_json)
    shutdown(d)
    return summary
