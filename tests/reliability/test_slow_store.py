"""A slow object store never slows the training loop; pending work waits in staging, bounded.

* With the store blocked entirely (a gate), every ``upload_file`` call still returns: the call
  never waits for the store, the work queues as snapshots in the staging folder.
* The call's blocking time with a slow store (a sleep per call) is reported next to a fast store's
  (no timing is asserted beyond a generous "does not hang" bound).
* With ``max_staged_bytes``, the bytes in the staging folder never exceed it while the slow store
  catches up, and nothing is dropped.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.upload.retry import RetryPolicy
from reliability._common import PeakSampler, bucket_objects, sha256, write
from upload._stores import TestStore

pytestmark = pytest.mark.timeout(120)

N = 30
SIZE = 64 * 1024


def _logger(tmp_path, store, tag, **kwargs):
    rud = RemoteUploaderDownloader(
        object_store=store, upload_staging_folder=str(tmp_path / f'staging-{tag}'), num_concurrent_uploads=2, **kwargs
    )
    rud.retry_policy = RetryPolicy(num_attempts=3, initial_backoff=0.01)
    return Logger(rud, run_name=tag), rud


def _blocking_times(logger, sources, prefix):
    times = []
    for i, path in enumerate(sources):
        t0 = time.perf_counter()
        logger.upload_file(f'{prefix}/f{i}.bin', path)
        times.append(time.perf_counter() - t0)
    return times


def test_blocked_store_never_blocks_the_caller(tmp_path):
    gate = tmp_path / 'gate'
    gate.touch()
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'state'), gate=str(gate))
    logger, rud = _logger(tmp_path, store, 'gated')
    data = [os.urandom(SIZE) for _ in range(N)]
    sources = [write(tmp_path / 'src' / f'f{i}', d) for i, d in enumerate(data)]
    _blocking_times(logger, sources, 'ckpt')
    # every call returned although no upload could finish: the work waits in staging
    assert sum(store.successes(f'ckpt/f{i}.bin') for i in range(N)) == 0
    assert len(os.listdir(os.path.join(rud.staging_dir, 'files'))) == N
    gate.unlink()
    logger.close()
    assert bucket_objects(tmp_path / 'bucket') == {f'ckpt/f{i}.bin': sha256(d) for i, d in enumerate(data)}


def test_slow_store_blocking_time_and_bounded_staging(tmp_path, capsys):
    data = [os.urandom(SIZE) for _ in range(N)]
    sources = [write(tmp_path / 'src' / f'f{i}', d) for i, d in enumerate(data)]
    fast_store = TestStore(str(tmp_path / 'fast-bucket'), str(tmp_path / 'fast-state'))
    slow_store = TestStore(str(tmp_path / 'slow-bucket'), str(tmp_path / 'slow-state'), delay=0.1)
    fast, _ = _logger(tmp_path, fast_store, 'fast')
    limit = 8 * SIZE
    slow, slow_rud = _logger(tmp_path, slow_store, 'slow', max_staged_bytes=limit)
    with PeakSampler([str(tmp_path / 'staging-slow')]) as sampler:
        # interleaved, so drift on this shared machine hits both alike
        fast_times, slow_times = [], []
        for i, path in enumerate(sources):
            fast_times += _blocking_times(fast, [path], f'a{i}')
            if i < 8:  # the budget is not exhausted yet: the slow store's call is the plain hand-over
                slow_times += _blocking_times(slow, [path], f'a{i}')
            else:
                with pytest.warns(RuntimeWarning, match='max_staged_bytes') if i == 8 else _nothing():
                    slow.upload_file(f'a{i}/f0.bin', path)  # may wait for space: never more than `limit` staged
        start = time.monotonic()
        fast.close()
        slow.close()
        assert time.monotonic() - start < 60
    expected = {f'a{i}/f0.bin': sha256(d) for i, d in enumerate(data)}
    assert bucket_objects(tmp_path / 'slow-bucket') == expected  # nothing dropped
    assert bucket_objects(tmp_path / 'fast-bucket') == expected
    # the staging folder's files (snapshots + a journal of a few hundred bytes) stayed under the budget
    assert sampler.peak <= limit + 16 * 1024, sampler.peak
    fast_ms = statistics.median(fast_times) * 1e3
    slow_ms = statistics.median(slow_times) * 1e3
    assert max(slow_times) < 5.0  # "does not hang": the store sleeps 0.1 s per call, the caller does not
    with capsys.disabled():
        print(
            f'\n[slow store] upload_file median blocking: fast store {fast_ms:.3f} ms, slow store {slow_ms:.3f} ms; '
            f'peak staged {sampler.peak} B (max_staged_bytes {limit})'
        )


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
