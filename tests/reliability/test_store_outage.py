"""The object store goes away mid-run (moto S3 on loopback, stopped and restarted by the test).

* An outage longer than one retry interval: every accepted upload lands exactly once (one
  version in a versioned bucket), byte-identical, and close() returns without an error.
* An outage that does not end: close() raises UploadError naming every missing object within a
  bounded time, the staging folder still holds them (byte-identical), and `drain` delivers them
  once the server is back.
"""

from __future__ import annotations

import collections
import os
import time

import pytest

from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.upload.drain import drain, list_pending
from dist_logging.upload.retry import RetryPolicy
from reliability._common import file_sha256, sha256, write
from s3_server import aws_credentials, s3_server  # noqa: F401 - fixtures

MiB = 1 << 20
SIZES = [1000 + 37 * i for i in range(10)] + [6 * MiB + 123, 7 * MiB]  # small ones and two multipart uploads


def _uploader(tmp_path, server, bucket, staging, policy) -> RemoteUploaderDownloader:
    kwargs = {
        'endpoint_url': server.endpoint,
        'multipart_threshold': 5 * MiB,
        'multipart_chunksize': 5 * MiB,
        'client_config': {'retries': {'total_max_attempts': 1}, 'connect_timeout': 2, 'read_timeout': 10},
    }
    rud = RemoteUploaderDownloader(
        f's3://{bucket}/runs',
        backend_kwargs=kwargs,
        upload_staging_folder=str(tmp_path / staging),
        num_concurrent_uploads=3,
    )
    rud.retry_policy = policy
    return rud


def _versioned_bucket(server) -> str:
    bucket = server.create_bucket()
    server.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={'Status': 'Enabled'})
    return bucket


def _versions(server, bucket) -> collections.Counter:
    pages = server.client().get_paginator('list_object_versions').paginate(Bucket=bucket)
    return collections.Counter(v['Key'] for page in pages for v in page.get('Versions', []))


def _object_sha(server, bucket, key) -> str:
    return sha256(server.client().get_object(Bucket=bucket, Key=key)['Body'].read())


def _sources(tmp_path, prefix):
    sums = {}
    paths = {}
    for i, size in enumerate(SIZES):
        data = os.urandom(size)
        name = f'{prefix}/file{i}.bin'
        paths[name] = write(tmp_path / 'src' / prefix / f'file{i}.bin', data)
        sums[name] = sha256(data)
    return paths, sums


@pytest.mark.timeout(240)
def test_outage_longer_than_a_retry_interval_every_upload_lands_once(tmp_path, s3_server):
    bucket = _versioned_bucket(s3_server)
    policy = RetryPolicy(num_attempts=10, initial_backoff=0.5, multiplier=2.0, max_backoff=2.0, jitter=0.2)
    rud = _uploader(tmp_path, s3_server, bucket, 'staging', policy)
    logger = Logger(rud, run_name='outage')
    paths, sums = _sources(tmp_path, 'run')
    names = list(paths)
    half = len(names) // 2
    for name in names[:half]:
        logger.upload_file(name, paths[name])
    s3_server.stop()  # some of those are in flight right now
    for name in names[half:]:
        logger.upload_file(name, paths[name])  # accepted during the outage: returns at once
    time.sleep(3.0)  # longer than the first retry intervals (0.4-0.5 s, 0.8-1 s, ...)
    s3_server.start()
    start = time.monotonic()
    logger.close()  # no UploadError: everything landed after the server came back
    assert time.monotonic() - start < 120

    versions = _versions(s3_server, bucket)
    assert {f'runs/{n}' for n in names} == set(versions)
    assert all(count == 1 for count in versions.values()), f'uploaded more than once: {versions}'
    for name in names:
        assert _object_sha(s3_server, bucket, f'runs/{name}') == sums[name], name
    assert list_pending(str(tmp_path / 'staging')) == []


@pytest.mark.timeout(240)
def test_outage_for_good_close_raises_naming_every_object_then_drain_delivers(tmp_path, s3_server):
    bucket = _versioned_bucket(s3_server)
    policy = RetryPolicy(num_attempts=3, initial_backoff=0.2, jitter=0.2)
    rud = _uploader(tmp_path, s3_server, bucket, 'staging', policy)
    logger = Logger(rud, run_name='outage')
    paths, sums = _sources(tmp_path, 'run')
    s3_server.stop()
    for name, path in paths.items():
        logger.upload_file(name, path)
    start = time.monotonic()
    with pytest.raises(UploadError) as info:
        logger.close()
    assert time.monotonic() - start < 90  # bounded: retries run out, close does not hang
    assert set(info.value.failures) == set(paths)
    for name in paths:
        assert name in str(info.value)

    pending = list_pending(str(tmp_path / 'staging'))
    assert {p.remote_name for p in pending} == set(paths)
    assert all(file_sha256(p.snapshot_path) == sums[p.remote_name] for p in pending)  # staged whole
    assert all(p.bucket_uri == f's3://{bucket}/runs' for p in pending)
    for path in paths.values():
        os.unlink(path)  # the originals may be gone by now: staging has the bytes

    s3_server.start()
    report = drain(str(tmp_path / 'staging'), progress_bar=False)
    assert sorted(report.uploaded) == sorted(paths) and not report.failed
    versions = _versions(s3_server, bucket)
    assert versions == collections.Counter({f'runs/{n}': 1 for n in paths})
    for name in paths:
        assert _object_sha(s3_server, bucket, f'runs/{name}') == sums[name], name
    assert list_pending(str(tmp_path / 'staging')) == []
