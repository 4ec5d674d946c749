"""The per-machine upload bandwidth cap (DIST_LOGGING_UPLOAD_BYTES_PER_S).

Pacing is checked by lower bounds only (a cap may make uploads slower, never faster than
it allows); no test asserts that anything is fast.
"""

import os
import struct
import threading
import time

import pytest

from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store import ObjectStore, S3ObjectStore
from dist_logging.object_store.local import LocalObjectStore
from dist_logging.upload import rate_limit
from dist_logging.upload.rate_limit import ENV_VAR, NodeUploadRate, parse_byte_rate
from dist_logging.upload.retry import Interrupted
from dist_logging._files import copy_file
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

MiB = 1 << 20


@pytest.mark.parametrize(
    'text,expected',
    [
        ('250000000', 250e6),
        ('100MB', 100e6),
        ('100M', 100e6),
        ('100 mb', 100e6),
        ('1.5GiB', 1.5 * 2**30),
        ('64 KiB', 64 * 1024),
        ('2k', 2000),
        ('.5G', 0.5e9),
        ('3TiB', 3 * 2**40),
        ('1', 1.0),
        (' 8MiB ', 8 * MiB),
    ],
)
def test_byte_rates_parse(text, expected):
    assert parse_byte_rate(text) == expected


@pytest.mark.parametrize('text', ['', 'fast', '-5', '0', '0.5', '10 MBps', '1e9', '5 PB', 'MiB'])
def test_a_bad_byte_rate_is_refused_by_name(text):
    with pytest.raises(ValueError, match=ENV_VAR) as info:
        parse_byte_rate(text)
    assert repr(text) in str(info.value)


def test_a_bad_cap_fails_when_the_uploader_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, 'lots')
    with pytest.raises(ValueError, match="'lots'"):
        RemoteUploaderDownloader(bucket_uri=str(tmp_path / 'bucket'))


def test_no_cap_when_unset_or_empty(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert rate_limit.node_rate_from_env() is None
    monkeypatch.setenv(ENV_VAR, '  ')
    assert rate_limit.node_rate_from_env() is None
    monkeypatch.setenv(ENV_VAR, '5MiB')
    assert rate_limit.node_rate_from_env().bytes_per_s == 5 * MiB


@pytest.mark.parametrize('rate,burst', [(0, 0.25), (-1, 0.25), (True, 0.25), ('5', 0.25), (10, -1)])
def test_bad_limiter_arguments_are_refused(tmp_path, rate, burst):
    with pytest.raises(ValueError):
        NodeUploadRate(rate, str(tmp_path), burst_seconds=burst)


def test_every_limiter_of_the_machine_books_one_schedule(tmp_path):
    # Two instances on one folder stand for two processes of the node.
    first = NodeUploadRate(1000, str(tmp_path), burst_seconds=0)
    second = NodeUploadRate(1000, str(tmp_path), burst_seconds=0)
    assert first.reserve(1000) == 0
    assert second.reserve(500) == pytest.approx(1.0, abs=0.2)
    assert first.reserve(0) == pytest.approx(1.5, abs=0.2)


def test_a_quiet_machine_may_send_a_burst_at_once(tmp_path):
    rate = NodeUploadRate(1000, str(tmp_path), burst_seconds=0.5)
    # Half a second's worth goes at once; what is booked beyond it waits its turn.
    assert rate.reserve(400) == 0
    assert rate.reserve(100) == 0
    assert rate.reserve(400) == 0
    assert rate.reserve(0) == pytest.approx(0.4, abs=0.2)


def test_a_schedule_from_another_boot_is_ignored(tmp_path):
    # Written by a boot whose monotonic clock started a day earlier, with an hour of debt left.
    rate = NodeUploadRate(1000, str(tmp_path), burst_seconds=0)
    with open(os.path.join(str(tmp_path), 'schedule.bin'), 'wb') as handle:
        handle.write(struct.pack('<dd', time.time() - time.monotonic() - 86400, time.monotonic() + 3600))
    assert rate.reserve(10) == 0
    assert rate.reserve(0) == pytest.approx(0.01, abs=0.1)


@pytest.mark.timeout(30)
def test_waiting_for_the_cap_stops_with_the_uploader(tmp_path):
    rate = NodeUploadRate(1, str(tmp_path), burst_seconds=0)
    rate.reserve(3600)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Interrupted, match=ENV_VAR):
        rate.charge(1, stop)
    assert time.monotonic() - started < 20


def test_a_copy_reports_progress_in_steps(tmp_path):
    src = tmp_path / 'src'
    src.write_bytes(os.urandom(20 * MiB + 5))
    seen = []
    size, _ = copy_file(str(src), str(tmp_path / 'dst'), progress=lambda done, total: seen.append((done, total)))
    assert size == 20 * MiB + 5
    assert len(seen) >= 3 and seen[-1] == (size, size)
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    assert (tmp_path / 'dst').read_bytes() == src.read_bytes()


class _SilentStore(ObjectStore):
    """A store that never reports progress (allowed by Composer's protocol)."""

    def __init__(self, root):
        self.inner = LocalObjectStore(root)

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True):
        self.inner.upload_object(object_name, filename, overwrite=overwrite)

    def download_object(self, object_name, filename, overwrite=False, callback=None):
        self.inner.download_object(object_name, filename, overwrite)

    def get_object_size(self, object_name):
        return self.inner.get_object_size(object_name)

    def get_uri(self, object_name):
        return self.inner.get_uri(object_name)


def _paced_upload(tmp_path, store, *, use_procs, files=3, size=4 * MiB, copy=False, workers=2):
    uploader = RemoteUploaderDownloader(
        object_store=store,
        num_concurrent_uploads=workers,
        use_procs=use_procs,
        upload_staging_folder=str(tmp_path / 'staging'),
    )
    logger = Logger([uploader], run_name='r')
    payloads = {}
    for i in range(files):
        path = tmp_path / f'f{i}'
        payloads[f'obj{i}'] = os.urandom(size)
        path.write_bytes(payloads[f'obj{i}'])
    started = time.monotonic()
    for i in range(files):
        logger.upload_file(f'obj{i}', tmp_path / f'f{i}', copy=copy)
    assert uploader.wait_for_uploads(timeout=120)
    elapsed = time.monotonic() - started
    logger.close()
    return elapsed, payloads


@pytest.mark.timeout(180)
@pytest.mark.parametrize('use_procs', [False, True])
def test_uploads_are_paced_to_the_machine_cap(tmp_path, monkeypatch, use_procs):
    # 6 x 2 MiB at 8 MiB/s, a quarter second's worth of burst, bytes charged as each 2 MiB copy
    # reports them (the last one's after it was sent): at least (12 - 2 - 2) / 8 s, worker threads
    # and worker processes alike (processes share the schedule through its file).
    monkeypatch.setenv(ENV_VAR, '8MiB')
    monkeypatch.setattr(rate_limit, '_rate_for', rate_limit._rate_for.__wrapped__)  # no cached limiter
    elapsed, payloads = _paced_upload(
        tmp_path, LocalObjectStore(str(tmp_path / 'bucket')), use_procs=use_procs, files=6, size=2 * MiB
    )
    assert elapsed >= (12 - 2 - 2) / 8 - 0.05
    for name, data in payloads.items():
        assert (tmp_path / 'bucket' / name).read_bytes() == data


@pytest.mark.timeout(180)
def test_a_store_that_reports_nothing_is_charged_after_each_upload(tmp_path, monkeypatch):
    # Nothing is reported while copying, so each upload is charged when it ends and the next
    # one waits for that debt: three 4 MiB uploads at 8 MiB/s on one worker take at least
    # two uploads' worth, less the burst.
    monkeypatch.setenv(ENV_VAR, '8MiB')
    monkeypatch.setattr(rate_limit, '_rate_for', rate_limit._rate_for.__wrapped__)
    uploader_store = _SilentStore(str(tmp_path / 'bucket'))
    elapsed, _ = _paced_upload(tmp_path, uploader_store, use_procs=False, workers=1)
    assert elapsed >= (12 - 4 - 2) / 8 - 0.05
    assert sorted(os.listdir(tmp_path / 'bucket')) == ['obj0', 'obj1', 'obj2']


@pytest.mark.timeout(120)
def test_without_a_cap_nothing_is_booked(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    booked = []
    monkeypatch.setattr(NodeUploadRate, 'reserve', lambda self, n: booked.append(n) or 0.0)
    _paced_upload(tmp_path, LocalObjectStore(str(tmp_path / 'bucket')), use_procs=False, files=2, size=1024)
    assert booked == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize('overwrite', [True, False])
def test_s3_uploads_are_paced_as_they_send(s3_bucket, tmp_path, monkeypatch, overwrite):
    # boto3's managed transfer (overwrite=True) and the store's own multipart loop
    # (overwrite=False) both report progress while sending: 24 MiB in 8 MiB parts at 8 MiB/s.
    endpoint, bucket = s3_bucket
    monkeypatch.setenv(ENV_VAR, '8MiB')
    monkeypatch.setattr(rate_limit, '_rate_for', rate_limit._rate_for.__wrapped__)
    store = S3ObjectStore(
        bucket, 'paced', endpoint_url=endpoint, multipart_threshold=16 * MiB, multipart_chunksize=8 * MiB
    )
    data = os.urandom(24 * MiB)
    (tmp_path / 'f').write_bytes(data)
    uploader = RemoteUploaderDownloader(
        object_store=store, num_concurrent_uploads=1, upload_staging_folder=str(tmp_path / 'staging')
    )
    logger = Logger([uploader], run_name='r')
    started = time.monotonic()
    logger.upload_file('big', tmp_path / 'f', overwrite=overwrite)
    assert uploader.wait_for_uploads(timeout=120)
    elapsed = time.monotonic() - started
    logger.close()
    assert elapsed >= (24 - 8 - 2) / 8 - 0.05
    store.download_object('big', str(tmp_path / 'back'))
    assert (tmp_path / 'back').read_bytes() == data
