"""FsspecObjectStore outside the conformance suite: URIs through the uploader and the config, install hints."""

from __future__ import annotations

import sys
import uuid

import pytest

from dist_logging import Logger, UploadError
from dist_logging.config import load_config, package_status
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store import FsspecObjectStore, get_store_class, store_from_uri
from dist_logging.upload.drain import list_pending
from dist_logging.upload.retry import RetryPolicy
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_memory_uri_through_the_uploader(tmp_path):
    uri = f'memory://runs/{uuid.uuid4().hex}'
    rud = RemoteUploaderDownloader(uri, upload_staging_folder=str(tmp_path / 'staging'))
    assert isinstance(rud.object_store, FsspecObjectStore) and rud.bucket_uri == uri
    logger = Logger(rud, run_name='mem')
    logger.upload_file('{run_name}/log-rank{rank}.txt', write(tmp_path / 'log', b'log lines'))
    logger.close()
    assert store_from_uri(uri).get_object_size('mem/log-rank0.txt') == 9
    rud.download_file('mem/log-rank0.txt', str(tmp_path / 'back'))
    assert (tmp_path / 'back').read_bytes() == b'log lines'


def test_s3fs_store_through_the_uploader(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    store = FsspecObjectStore(f's3://{bucket}/prefix', endpoint_url=endpoint, skip_instance_cache=True)
    store.upload_object('taken', write(tmp_path / 'seed', b'seed'))
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'))
    rud.retry_policy = RetryPolicy(num_attempts=1)
    logger = Logger(rud, run_name='s3fs')
    logger.upload_file('fresh', write(tmp_path / 'new', b'new'))
    logger.upload_file('taken', str(tmp_path / 'new'))  # overwrite=False: refused (raised at close: no call follows)
    with pytest.raises(UploadError) as info:
        logger.close()
    assert isinstance(info.value.failures['taken'], FileExistsError)
    assert store.get_object_size('taken') == 4 and store.get_object_size('fresh') == 3
    # what stayed in staging names its store by URI and the (non-secret) endpoint, so drain can rebuild it
    (pending,) = list_pending(str(tmp_path / 'staging'))
    assert pending.bucket_uri == f's3://{bucket}/prefix' and pending.backend_kwargs['endpoint_url'] == endpoint


def test_config_accepts_fsspec_uris():
    config = load_config({'upload': {'bucket_uri': 'memory://cfg/run'}})
    assert package_status(config)['fsspec'] == (True, 'fsspec')


def test_missing_implementation_names_the_package(monkeypatch):
    from fsspec.registry import known_implementations

    monkeypatch.setitem(
        known_implementations,
        'fakeproto',
        {'class': 'no_such_fs_package_xyz.FakeFileSystem', 'err': 'Install no_such_fs_package_xyz'},
    )
    with pytest.raises(ImportError, match=r'fakeproto://.*no_such_fs_package_xyz.*pip install no_such_fs_package_xyz'):
        RemoteUploaderDownloader('fakeproto://bucket/prefix')


def test_missing_fsspec_has_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, 'fsspec', None)
    monkeypatch.setitem(sys.modules, 'fsspec.registry', None)
    monkeypatch.delitem(sys.modules, 'dist_logging.object_store.fsspec_store', raising=False)
    with pytest.raises(ImportError, match=r'pip install "dist-logging\[fsspec\]"'):
        RemoteUploaderDownloader('gs://bucket/prefix')
    with pytest.raises(ValueError, match="unsupported scheme 'magic'"):
        RemoteUploaderDownloader('magic://bucket/prefix')


def test_every_other_scheme_maps_to_fsspec():
    for scheme in ('gs', 'az', 'abfs', 'oci', 'sftp', 'hf', 'memory'):
        assert get_store_class(scheme) is FsspecObjectStore
    with pytest.raises(ValueError, match='protocol://'):
        FsspecObjectStore('no/protocol/here')


def test_s3fs_overwrite_false_is_refused_by_the_server(s3_bucket, tmp_path, monkeypatch):
    # Without the pre-check (as when two ranks both passed it), the conditional put itself refuses.
    endpoint, bucket = s3_bucket
    store = FsspecObjectStore(f's3://{bucket}/p', endpoint_url=endpoint, skip_instance_cache=True)
    store.upload_object('x', write(tmp_path / 'a', b'first'))
    monkeypatch.setattr(store, '_refuse_existing', lambda *args: None)
    with pytest.raises(FileExistsError, match='already exists'):
        store.upload_object('x', write(tmp_path / 'b', b'second'), overwrite=False)
    store.download_object('x', tmp_path / 'back')
    assert (tmp_path / 'back').read_bytes() == b'first'
