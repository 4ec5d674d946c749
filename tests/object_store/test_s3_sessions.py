"""S3ObjectStore's clients: each store resolves credentials and settings on its own, while the stores of a process
share what botocore parsed (the service model), so that a store made per load (``CheckpointReader(uri)``) is cheap.
"""

from __future__ import annotations

from dist_logging.object_store import S3ObjectStore
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures


def _put(store, tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    store.upload_object(name, path)


def _access_keys(store):
    """Record the access key each request of ``store`` is signed with (the ``Credential=`` of its Authorization)."""
    keys = []

    def record(request, **_):
        authorization = request.headers.get('Authorization', b'')
        text = authorization.decode() if isinstance(authorization, bytes) else authorization
        keys.append(text.split('Credential=', 1)[1].split('/', 1)[0])

    store.client.meta.events.register('before-send.s3', record)
    return keys


def test_a_store_made_after_the_environment_changed_signs_with_the_new_credentials(s3_bucket, monkeypatch, tmp_path):
    endpoint, bucket = s3_bucket
    first = S3ObjectStore(bucket, endpoint_url=endpoint)
    first_keys = _access_keys(first)
    _put(first, tmp_path, 'a', b'1')
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', 'rotated-key')
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'rotated-secret')
    second = S3ObjectStore(bucket, endpoint_url=endpoint)
    second_keys = _access_keys(second)
    _put(second, tmp_path, 'b', b'2')
    _put(first, tmp_path, 'c', b'3')  # the first store keeps the credentials it resolved
    assert set(first_keys) == {'testing'}, first_keys
    assert set(second_keys) == {'rotated-key'}, second_keys
    assert sorted(info.name for info in second.list('')) == ['a', 'b', 'c']
    first.close()
    second.close()


def test_explicit_credentials_and_region_are_each_store_s_own(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    plain = S3ObjectStore(bucket, endpoint_url=endpoint)
    explicit = S3ObjectStore(
        bucket, endpoint_url=endpoint, region_name='eu-west-1', aws_access_key_id='own-key', aws_secret_access_key='x'
    )
    plain_keys, explicit_keys = _access_keys(plain), _access_keys(explicit)
    _put(plain, tmp_path, 'p', b'1')
    _put(explicit, tmp_path, 'e', b'2')
    assert set(plain_keys) == {'testing'} and set(explicit_keys) == {'own-key'}
    assert explicit.client.meta.region_name == 'eu-west-1'
    assert plain.client.meta.region_name == 'us-east-1'
    plain.close()
    explicit.close()
