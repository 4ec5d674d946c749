"""Load: many ranks on this small machine, every rank logging and uploading at once (real torchrun, gloo).

Each rank makes ``metrics`` log_metrics calls (a reduced metric and a flush every 100), uploads
``small`` small files and ``big`` large files to a local bucket *and* to the moto S3 server on
loopback (two uploaders, ``copy=True``, ``max_staged_bytes`` each), then closes. Every object lands
with the right checksum (sha256 for the local bucket; the S3 ETag, which the server computes from the
bytes it received, for S3); peak RSS per rank and peak staged bytes per rank stay bounded, and are
printed; the run finishes within a generous bound.

The issue's full size (8 ranks; 10,000 metric calls, 200 small files and 4 files of 64 MiB per
rank: 2 GiB per store) takes about 2.5 minutes on the 2-core development machine and is what the test
runs; ``DIST_LOGGING_LOAD_TEST=0`` runs the same checks at a reduced size (4 ranks; 2,000 calls, 40 small
files and 2 files of 20 MiB per rank) for a quick local run. The reduced size used to run as a test of its
own beside the full one: every check it made, the full size makes too (and only the full size stages more
than ``max_staged_bytes``), so ``make test`` runs one launch, the full one.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from reliability._common import TESTS_DIR, bucket_objects
from s3_server import aws_credentials, s3_server  # noqa: F401 - fixtures
from torchrun_helper import read_rank_outputs, run_torchrun, write_script

pytestmark = pytest.mark.multiprocess

MiB = 1 << 20
STAGED_LIMIT = 160 * MiB  # max_staged_bytes of each uploader

SCENARIO = '''
import hashlib, json, os, resource, sys, threading, time
import torch.distributed as torch_dist
from dist_logging import Logger
from dist_logging.destinations import FileLogger, InMemoryLogger, RemoteUploaderDownloader

root, endpoint, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
metrics, small, big, big_size, limit = (int(x) for x in sys.argv[4:9])
torch_dist.init_process_group('gloo')
rank, W = torch_dist.get_rank(), torch_dist.get_world_size()
MiB = 1 << 20
local = RemoteUploaderDownloader(f'file://{root}/bucket', upload_staging_folder=f'{root}/staging-local',
                                 max_staged_bytes=limit, num_concurrent_uploads=2)
s3 = RemoteUploaderDownloader(f's3://{bucket}/load', upload_staging_folder=f'{root}/staging-s3',
                              max_staged_bytes=limit, num_concurrent_uploads=2,
                              backend_kwargs={'endpoint_url': endpoint, 'multipart_threshold': 16 * MiB,
                                              'multipart_chunksize': 8 * MiB})
memory = InMemoryLogger()
logger = Logger([memory, FileLogger(f'{root}/logs/rank{{rank}}.jsonl', format='jsonl', remote_file_name=''),
                 local, s3], run_name='load', sync_timeout=600)

staged_dirs = [f'{root}/staging-local/rank{rank}', f'{root}/staging-s3/rank{rank}']
peak = {'staged': 0}
stop = threading.Event()
def sample():
    while not stop.is_set():
        total = 0
        for folder in staged_dirs:
            for dirpath, _, names in os.walk(folder):
                for name in names:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_size
                    except FileNotFoundError:
                        pass
        peak['staged'] = max(peak['staged'], total)
        stop.wait(0.02)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()

def etag(path, size):
    if size <= 16 * MiB:
        with open(path, 'rb') as handle:
            return hashlib.md5(handle.read()).hexdigest()
    digests = []
    with open(path, 'rb') as handle:
        for chunk in iter(lambda: handle.read(8 * MiB), b''):
            digests.append(hashlib.md5(chunk).digest())
    return hashlib.md5(b''.join(digests)).hexdigest() + f'-{len(digests)}'

def make_file(path, size):
    with open(path, 'wb') as handle:
        left = size
        while left > 0:
            n = min(left, 8 * MiB)
            handle.write(os.urandom(n))
            left -= n

expected = {}
def upload(name, path, size):
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for chunk in iter(lambda: handle.read(8 * MiB), b''):
            digest.update(chunk)
    sha = digest.hexdigest()
    expected[name] = {'sha256': sha, 'etag': etag(path, size), 'size': size}
    t0 = time.perf_counter()
    logger.upload_file(name, path)
    return time.perf_counter() - t0

os.makedirs(f'{root}/src/rank{rank}', exist_ok=True)
small_every = max(metrics // max(small, 1), 1)
big_at = {int(metrics * (k + 0.5) / big) for k in range(big)}
blocking = []
small_done = big_done = 0
t_start = time.monotonic()
for i in range(metrics):
    logger.log_metrics({'loss': 1.0 / (i + 1), 'lr': 1e-3, 'rank_step': float(rank * metrics + i)}, step=i)
    if i % 100 == 0:
        logger.log_metrics({'loss_mean': float(i + rank)}, step=i, reduce='mean')
    if i % 100 == 99:
        logger.batch_end()  # a flush: one collective
    if i % small_every == 0 and small_done < small:
        path = f'{root}/src/rank{rank}/small-{small_done}.bin'
        size = 1000 + (small_done * 37 + rank) % 3000
        with open(path, 'wb') as handle:
            handle.write(os.urandom(size))
        blocking.append(upload(f'rank{rank}/small/{small_done}.bin', path, size))
        os.unlink(path)  # copy=True: the caller may delete its file at once
        small_done += 1
    if i in big_at and big_done < big:
        path = f'{root}/src/rank{rank}/big.bin'
        make_file(path, big_size)
        blocking.append(upload(f'rank{rank}/big/{big_done}.bin', path, big_size))
        os.unlink(path)
        big_done += 1
logger.flush()
loop_seconds = time.monotonic() - t_start
t0 = time.monotonic()
logger.close()
close_seconds = time.monotonic() - t0
stop.set()
sampler.join()
out = {'rank': rank, 'expected': expected, 'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
       'peak_staged_bytes': peak['staged'], 'loop_seconds': loop_seconds, 'close_seconds': close_seconds,
       'max_blocking_s': max(blocking), 'uploads': len(expected)}
if rank == 0:
    out['metric_points'] = sum(len(v) for v in memory.data.values())
with open(f'{os.environ["OUT_DIR"]}/rank{rank}.json', 'w') as handle:
    json.dump(out, handle)
'''

FULL = dict(nproc=8, metrics=10_000, small=200, big=4, big_size=64 * MiB, timeout=1500)
REDUCED = dict(nproc=4, metrics=2_000, small=40, big=2, big_size=20 * MiB, timeout=400)


def _run_load(tmp_path, server, nproc, metrics, small, big, big_size, timeout, capsys):
    bucket = server.create_bucket()
    script = write_script(tmp_path, SCENARIO)
    start = time.monotonic()
    run_torchrun(
        script,
        nproc,
        tmp_path / 'out',
        timeout=timeout,
        args=[
            str(tmp_path),
            server.endpoint,
            bucket,
            str(metrics),
            str(small),
            str(big),
            str(big_size),
            str(STAGED_LIMIT),
        ],
        env={'PYTHONPATH': f'{TESTS_DIR.parent}:{TESTS_DIR}'},
    )
    seconds = time.monotonic() - start
    outputs = read_rank_outputs(tmp_path / 'out')
    assert sorted(outputs) == list(range(nproc))

    expected = {}
    for out in outputs.values():
        assert out['uploads'] == small + big
        expected.update(out['expected'])
    # the local bucket: every object, byte-identical, nothing else
    assert bucket_objects(tmp_path / 'bucket') == {name: e['sha256'] for name, e in expected.items()}
    # S3: every object, with the checksum the server computed from what it received
    client = server.client()
    listed = {}
    for page in client.get_paginator('list_objects_v2').paginate(Bucket=bucket, Prefix='load/'):
        for item in page.get('Contents', []):
            listed[item['Key'][len('load/') :]] = (item['ETag'].strip('"'), item['Size'])
    assert listed == {name: (e['etag'], e['size']) for name, e in expected.items()}
    # nothing left pending
    for store in ('local', 's3'):
        for rank in range(nproc):
            journal = tmp_path / f'staging-{store}' / f'rank{rank}' / 'journal.jsonl'
            assert not journal.exists(), f'{journal} still lists pending uploads'

    rss = {r: round(o['peak_rss_mib']) for r, o in sorted(outputs.items())}
    staged = {r: round(o['peak_staged_bytes'] / MiB, 1) for r, o in sorted(outputs.items())}
    for r, out in outputs.items():
        assert out['peak_staged_bytes'] <= 2 * max(STAGED_LIMIT, big_size) + 4 * MiB, (r, out['peak_staged_bytes'])
        assert out['peak_rss_mib'] < 2048, (r, out['peak_rss_mib'])
    assert outputs[0]['metric_points'] >= metrics * 3
    summary = {
        'ranks': nproc,
        'seconds': round(seconds, 1),
        'peak_rss_mib_per_rank': rss,
        'peak_staged_mib_per_rank': staged,
        'staged_limit_mib_per_uploader': STAGED_LIMIT // MiB,
        'max_blocking_s': round(max(o['max_blocking_s'] for o in outputs.values()), 3),
        'objects_per_store': len(expected),
        'bytes_per_store_mib': round(sum(e['size'] for e in expected.values()) / MiB),
    }
    with capsys.disabled():
        print('\n[load] ' + json.dumps(summary))
    (tmp_path / 'load-summary.json').write_text(json.dumps(summary))
    return summary


@pytest.mark.timeout(1800)
def test_load(tmp_path, s3_server, capsys):
    size = REDUCED if os.environ.get('DIST_LOGGING_LOAD_TEST') == '0' else FULL
    _run_load(tmp_path, s3_server, capsys=capsys, **size)
