"""S3ObjectStore sends the CRC32C of what it uploads itself (and no second payload hash over HTTPS).

The requests are read as botocore sends them (its ``before-send`` event), against a moto server:
moto does not check checksums, so the test checks that each one is the CRC32C of its body.
"""

from __future__ import annotations

import base64
import os
import zlib

import crc32c
import pytest

from dist_logging.object_store import S3ObjectStore
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


def _crc32c(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, 'big')).decode()


def _body(request) -> bytes:
    body = request.body
    if body is None:
        return b''
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    position = body.tell()
    data = body.read()
    body.seek(position)
    return data


@pytest.fixture
def recorded(s3_bucket):
    endpoint, bucket = s3_bucket
    store = S3ObjectStore(bucket, endpoint_url=endpoint, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    sent = []

    def record(request, event_name, **_):
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        sent.append((event_name.rsplit('.', 1)[-1], headers, _body(request)))

    store.client.meta.events.register('before-send.s3', record)
    yield store, sent
    store.close()


def _operations(sent, name):
    return [(headers, body) for operation, headers, body in sent if operation == name]


@pytest.mark.parametrize('overwrite', [False, True])
def test_a_part_carries_the_crc32c_of_its_bytes_and_the_object_its_whole_crc32c(recorded, tmp_path, overwrite):
    store, sent = recorded
    data = os.urandom(12 * MiB + 3)
    (tmp_path / 'f').write_bytes(data)
    store.upload_object('big', tmp_path / 'f', overwrite=overwrite)
    [(create, _)] = _operations(sent, 'CreateMultipartUpload')
    assert create['x-amz-checksum-algorithm'] == 'CRC32C'
    assert create['x-amz-checksum-type'] == 'FULL_OBJECT'
    parts = _operations(sent, 'UploadPart')
    assert len(parts) == 3
    for headers, body in parts:
        assert headers['x-amz-checksum-crc32c'] == _crc32c(body)
        assert 'content-encoding' not in headers  # a plain body: nothing re-chunked in Python
    [(complete_headers, complete)] = _operations(sent, 'CompleteMultipartUpload')
    assert ('if-none-match' in complete_headers) == (not overwrite)
    for _, body in parts:
        assert f'<ChecksumCRC32C>{_crc32c(body)}</ChecksumCRC32C>'.encode() in complete
    assert complete_headers['x-amz-checksum-crc32c'] == _crc32c(data)  # the whole file's, combined from the parts
    assert store.get_object_size('big') == len(data)
    assert store.object_checksum('big') == f'crc32c:{_crc32c(data)}'


def test_a_single_put_carries_the_crc32c_of_the_file(recorded, tmp_path):
    store, sent = recorded
    data = os.urandom(3 * MiB + 7)
    (tmp_path / 'f').write_bytes(data)
    store.upload_object('small', tmp_path / 'f', overwrite=False)
    [(headers, body)] = _operations(sent, 'PutObject')
    assert body == data
    assert headers['x-amz-checksum-crc32c'] == _crc32c(data)
    assert store.object_checksum('small') == f'crc32c:{_crc32c(data)}'  # what S3 keeps, one HEAD


def test_crc32_asked_for_is_still_sent_by_the_store(recorded, tmp_path):
    store, sent = recorded
    (tmp_path / 'f').write_bytes(b'payload')
    store.upload_object('c32', tmp_path / 'f', ExtraArgs={'ChecksumAlgorithm': 'CRC32'})
    [(headers, _)] = _operations(sent, 'PutObject')
    assert headers['x-amz-checksum-crc32'] == base64.b64encode(zlib.crc32(b'payload').to_bytes(4, 'big')).decode()
    assert 'x-amz-checksum-crc32c' not in headers
    assert store.object_checksum('c32') is None  # no CRC32C kept: nothing to compare


def test_another_checksum_asked_for_is_left_to_botocore(recorded, tmp_path):
    store, sent = recorded
    (tmp_path / 'f').write_bytes(b'payload')
    store.upload_object('sha', tmp_path / 'f', overwrite=False, ExtraArgs={'ChecksumAlgorithm': 'SHA256'})
    [(headers, _)] = _operations(sent, 'PutObject')
    assert 'x-amz-checksum-crc32c' not in headers
    assert 'x-amz-checksum-sha256' in headers or headers.get('x-amz-sdk-checksum-algorithm') == 'SHA256'


@pytest.mark.parametrize(
    'endpoint,given,expected',
    [
        ('https://s3.example.com', None, False),
        (None, None, False),  # AWS itself: https
        ('http://127.0.0.1:9000', None, None),  # plain http keeps botocore's signed payload
        ('https://s3.example.com', True, True),  # the user's setting wins
    ],
)
def test_payloads_go_unsigned_only_over_https(monkeypatch, endpoint, given, expected):
    for variable in ('AWS_ENDPOINT_URL_S3', 'AWS_ENDPOINT_URL', 'S3_ENDPOINT_URL'):
        monkeypatch.delenv(variable, raising=False)
    config = {'s3': {'payload_signing_enabled': given}} if given is not None else None
    store = S3ObjectStore(
        'bucket',
        endpoint_url=endpoint,
        region_name='us-east-1',
        client_config=config,
        aws_access_key_id='a',
        aws_secret_access_key='b',
    )
    assert store.client.meta.config.s3.get('payload_signing_enabled') == expected


def test_parts_carry_each_upload_s_own_bytes(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    store = S3ObjectStore(
        bucket, endpoint_url=endpoint, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=2
    )
    first, second = os.urandom(15 * MiB + 1), os.urandom(10 * MiB + 9)
    for name, data in (('first', first), ('second', second)):
        (tmp_path / name).write_bytes(data)
        store.upload_object(name, tmp_path / name)
    for name, data in (('first', first), ('second', second)):
        store.download_object(name, tmp_path / f'{name}.out')
        assert (tmp_path / f'{name}.out').read_bytes() == data
    store.close()


def test_a_transfer_setting_only_boto3_honours_uses_its_transfer_manager(s3_bucket, tmp_path, monkeypatch):
    endpoint, bucket = s3_bucket
    store = S3ObjectStore(
        bucket,
        endpoint_url=endpoint,
        multipart_threshold=5 * MiB,
        multipart_chunksize=5 * MiB,
        transfer_config={'max_bandwidth': 1 << 30},
    )
    used = []
    original = type(store.client).upload_file if hasattr(type(store.client), 'upload_file') else None
    monkeypatch.setattr(
        store.client,
        'upload_file',
        lambda **kw: used.append(kw['Config'].max_bandwidth) or original(store.client, **kw),
    )
    (tmp_path / 'f').write_bytes(os.urandom(6 * MiB))
    store.upload_object('throttled', tmp_path / 'f')
    assert used == [1 << 30]
    assert store.get_object_size('throttled') == 6 * MiB
    with pytest.raises(FileExistsError):  # overwrite=False keeps its own conditional upload
        store.upload_object('throttled', tmp_path / 'f', overwrite=False)
    assert used == [1 << 30]
    store.close()
