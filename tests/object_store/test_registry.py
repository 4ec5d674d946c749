"""The bucket-URI registry and the store-specific behaviours outside the conformance suite."""

from __future__ import annotations

import os

import pytest

from dist_logging import object_store
from dist_logging.object_store import (
    LocalObjectStore,
    S3ObjectStore,
    get_store_class,
    persistable_kwargs,
    persistable_uri,
    split_bucket_uri,
    store_from_uri,
)
from dist_logging.upload.retry import is_transient
from s3_server import aws_credentials, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


def test_split_bucket_uri(tmp_path):
    assert split_bucket_uri('s3://bucket/a/b') == ('s3', 'bucket/a/b')
    assert split_bucket_uri('file:///abs/dir') == ('file', '/abs/dir')
    assert split_bucket_uri('relative/dir') == ('file', os.path.abspath('relative/dir'))
    with pytest.raises(ValueError, match="'magic'"):
        split_bucket_uri('magic://bucket')
    assert split_bucket_uri('gs://bucket/p') == ('gs', 'bucket/p')  # FsspecObjectStore's
    with pytest.raises(ValueError, match='absolute'):
        split_bucket_uri('file://relative')
    with pytest.raises(ValueError, match='bucket'):
        split_bucket_uri('s3://')


def test_store_from_uri(tmp_path):
    local = store_from_uri(str(tmp_path / 'b'))
    assert isinstance(local, LocalObjectStore) and local.bucket_uri == f'file://{tmp_path}/b'
    s3 = store_from_uri('s3://bkt/pre/fix', {'endpoint_url': 'http://127.0.0.1:1'})
    assert isinstance(s3, S3ObjectStore) and (s3.bucket, s3.prefix) == ('bkt', 'pre/fix')
    assert s3.get_uri('x/y') == 's3://bkt/pre/fix/x/y'
    with pytest.raises(TypeError):
        store_from_uri(str(tmp_path), {'endpoint_url': 'x'})


def test_missing_dependency_has_install_hint(monkeypatch):
    monkeypatch.setitem(object_store._REGISTRY, 'fake', ('dist_logging_no_such_module', 'X', 'fake'))
    with pytest.raises(ImportError, match=r'pip install "dist-logging\[fake\]"'):
        get_store_class('fake')


def test_secrets_are_not_persisted():
    kept = persistable_kwargs(
        {
            'endpoint_url': 'http://e',
            'aws_secret_access_key': 's',
            'aws_access_key_id': 'k',
            'aws_session_token': 't',
            'region_name': 'r',
            'client_config': {'a': 1},
        }
    )
    assert kept == {'endpoint_url': 'http://e', 'region_name': 'r'}
    fsspec_options = {
        'account_name': 'acct',
        'account_key': 'k',
        'connection_string': 'c',
        'sas_token': 's',
        'pkey': 'p',
        'key': 'k',
        'project': 'proj',
        'anon': False,
    }
    assert persistable_kwargs(fsspec_options) == {'account_name': 'acct', 'project': 'proj', 'anon': False}


def test_a_credential_inside_an_innocent_value_is_not_persisted():
    from credential_samples import samples

    # (AWS's documentation key AKIAIOSFODNN7EXAMPLE is a placeholder: gitleaks' allowlist keeps it, so do we)
    kept = persistable_kwargs(
        {
            'endpoint_url': 'https://minio:s3cr3t-pw@minio.internal:9000',
            'profile_name': samples()['aws_access_key_id'],
            'region_name': 'us-east-1',
        }
    )
    assert kept == {'region_name': 'us-east-1'}


def test_local_store_leaves_no_temp_files(tmp_path):
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    src = tmp_path / 'f'
    src.write_bytes(b'x' * 1000)
    store.upload_object('a/b', str(src))
    with pytest.raises(FileExistsError):
        store.upload_object('a/b', str(src), overwrite=False)
    assert os.listdir(tmp_path / 'bucket' / 'a') == ['b']


def test_s3_error_classification(s3_server, tmp_path):
    src = tmp_path / 'f'
    src.write_bytes(b'data')
    quick = {'retries': {'total_max_attempts': 1}, 'connect_timeout': 2}
    missing_bucket = S3ObjectStore('no-such-bucket', endpoint_url=s3_server.endpoint, client_config=quick)
    with pytest.raises(Exception) as info:
        missing_bucket.upload_object('x', str(src))
    assert not is_transient(info.value)  # NoSuchBucket: permanent
    with pytest.raises(Exception) as info:
        missing_bucket.upload_object('x', str(src), overwrite=False)
    assert not is_transient(info.value)
    s3_server.stop()
    down = S3ObjectStore('any', endpoint_url=s3_server.endpoint, client_config=quick)
    with pytest.raises(Exception) as info:
        down.upload_object('x', str(src))
    assert is_transient(info.value)  # connection refused: transient


@pytest.mark.parametrize(
    'uri,expected',
    [
        ('sftp://alice:s3cr3t@host:22/data/runs', 'sftp://alice@host:22/data/runs'),
        ('sftp://alice:p@ss@host/x', 'sftp://alice@host/x'),  # the last '@' ends the user-info
        ('sftp://alice@host/x', 'sftp://alice@host/x'),  # a user without a password is kept
        ('s3://bucket/prefix', 's3://bucket/prefix'),
        ('gs://bucket/a@b:c', 'gs://bucket/a@b:c'),  # '@' and ':' in the path are not user-info
        ('/a/local/path', '/a/local/path'),
    ],
)
def test_a_password_in_the_bucket_uri_is_not_persisted(uri, expected):
    assert persistable_uri(uri) == expected
