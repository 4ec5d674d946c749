"""S3ObjectStore in Composer's terms: ExtraArgs, S3_CANNED_ACL, S3_ENDPOINT_URL (against a moto server)."""

from __future__ import annotations

import os

import pytest

from dist_logging.object_store import S3ObjectStore
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
ALL_USERS = 'http://acs.amazonaws.com/groups/global/AllUsers'


@pytest.fixture
def s3(s3_bucket, monkeypatch):
    monkeypatch.delenv('S3_CANNED_ACL', raising=False)
    endpoint, bucket = s3_bucket
    store = S3ObjectStore(bucket, endpoint_url=endpoint, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    yield store
    store.close()


def public_read(store, key) -> bool:
    grants = store.client.get_object_acl(Bucket=store.bucket, Key=key)['Grants']
    return any(g['Grantee'].get('URI') == ALL_USERS and g['Permission'] == 'READ' for g in grants)


@pytest.mark.parametrize('overwrite', [True, False])
@pytest.mark.parametrize('size', [10, 6 * MiB])  # a single put, and a multipart upload
def test_extra_args(s3, tmp_path, overwrite, size):
    src = tmp_path / 'f'
    src.write_bytes(b'x' * size)
    s3.upload_object(
        object_name='meta',
        filename=src,
        overwrite=overwrite,
        ExtraArgs={'Metadata': {'run': 'exp1'}, 'ContentType': 'text/plain'},
    )
    head = s3.client.head_object(Bucket=s3.bucket, Key='meta')
    assert head['Metadata'] == {'run': 'exp1'} and head['ContentType'] == 'text/plain'
    assert head['ContentLength'] == size


@pytest.mark.parametrize('overwrite', [True, False])
def test_canned_acl_from_the_environment(s3, tmp_path, monkeypatch, overwrite):
    src = tmp_path / 'f'
    src.write_bytes(b'acl')
    s3.upload_object('private', str(src), overwrite=overwrite)
    assert not public_read(s3, 'private')
    monkeypatch.setenv('S3_CANNED_ACL', 'public-read')
    s3.upload_object('public', str(src), overwrite=overwrite)
    assert public_read(s3, 'public')
    s3.upload_object('explicit', str(src), overwrite=overwrite, ExtraArgs={'ACL': 'private'})  # ExtraArgs wins
    assert not public_read(s3, 'explicit')


def test_bad_extra_arguments_are_refused(s3, tmp_path):
    src = tmp_path / 'f'
    src.write_bytes(b'x')
    with pytest.raises(ValueError, match="'Bogus'"):
        s3.upload_object('k', str(src), ExtraArgs={'Bogus': 1})
    with pytest.raises(ValueError, match='ExtraArgs'):
        s3.upload_object('k', str(src), Metadata={})
    with pytest.raises(FileNotFoundError):
        s3.get_object_size('k')  # nothing was sent


def test_composer_endpoint_variable(s3_bucket, tmp_path, monkeypatch):
    endpoint, bucket = s3_bucket
    monkeypatch.setenv('S3_ENDPOINT_URL', endpoint)
    src = tmp_path / 'f'
    src.write_bytes(b'env')
    with S3ObjectStore(bucket) as store:
        store.upload_object('via-env', str(src))
        assert store.get_object_size('via-env') == 3


def test_composer_constructor(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    # Composer's positional order (bucket, prefix, region_name, endpoint_url, ...) and its transfer_config
    store = S3ObjectStore(
        bucket, 'pre', None, endpoint, transfer_config={'multipart_chunksize': 6 * MiB, 'num_download_attempts': 2}
    )
    assert (store.endpoint_url, store.prefix, store.multipart_chunksize) == (endpoint, 'pre', 6 * MiB)
    assert store._transfer_config().num_download_attempts == 2
    src = tmp_path / 'f'
    src.write_bytes(b'x')
    store.upload_object('a/b', str(src))
    assert store.list_objects() == ['a/b']  # relative to the prefix, like every other method
    with pytest.raises(TypeError, match='transfer_config'):
        S3ObjectStore(bucket, transfer_config={'no_such_setting': 1})


def test_composer_backend_kwargs_name_the_bucket_and_prefix(s3_bucket, tmp_path):
    from dist_logging import Logger
    from dist_logging.destinations import RemoteUploaderDownloader

    endpoint, bucket = s3_bucket
    rud = RemoteUploaderDownloader(
        f's3://{bucket}',
        upload_staging_folder=str(tmp_path / 'staging'),
        backend_kwargs={'bucket': bucket, 'prefix': 'folder/sub', 'endpoint_url': endpoint},
    )
    assert rud.object_store.get_uri('x') == f's3://{bucket}/folder/sub/x'
    logger = Logger(rud, run_name='c')
    src = tmp_path / 'f'
    src.write_bytes(b'composer')
    logger.upload_file('x', src)
    logger.close()
    assert rud.object_store.get_object_size('x') == 8
    with pytest.raises(ValueError, match="bucket='other'"):
        RemoteUploaderDownloader(f's3://{bucket}', backend_kwargs={'bucket': 'other'})
    with pytest.raises(ValueError, match="prefix='b'"):
        RemoteUploaderDownloader(f's3://{bucket}/a', backend_kwargs={'prefix': 'b'})


@pytest.mark.parametrize('size', [10, 6 * MiB])  # a single put, and a multipart upload
def test_extra_args_needed_on_every_part_go_through_boto3_upload_file(s3, tmp_path, monkeypatch, size):
    """Object headers ride on the store's own upload; arguments S3 wants on every part (or the completion)
    hand the upload to boto3's transfer manager, as Composer's store does for every upload."""
    routed = []
    real_upload_file = s3.client.upload_file

    def upload_file(**kwargs):
        routed.append(kwargs.get('ExtraArgs'))
        return real_upload_file(**kwargs)

    monkeypatch.setattr(s3.client, 'upload_file', upload_file)
    src = tmp_path / 'f'
    src.write_bytes(os.urandom(size))
    s3.upload_object(
        'headers',
        src,
        ExtraArgs={'Metadata': {'run': 'a'}, 'StorageClass': 'STANDARD_IA', 'ChecksumAlgorithm': 'CRC32'},
    )
    assert routed == []
    per_part = {'ChecksumAlgorithm': 'SHA256', 'RequestPayer': 'requester', 'Metadata': {'run': 'b'}}
    s3.upload_object('per-part', src, ExtraArgs=per_part)
    assert routed == [per_part]
    head = s3.client.head_object(Bucket=s3.bucket, Key='per-part')
    assert head['Metadata'] == {'run': 'b'} and head['ContentLength'] == size
    body = s3.client.get_object(Bucket=s3.bucket, Key='per-part')['Body'].read()
    assert body == src.read_bytes()
    with pytest.raises(FileExistsError):  # overwrite=False on that route: checked first
        s3.upload_object('per-part', src, overwrite=False, ExtraArgs=per_part)
    assert len(routed) == 1
