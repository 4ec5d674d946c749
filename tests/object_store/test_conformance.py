"""The ObjectStore conformance suite: every backend opts in through the ``store`` fixture below.

Backends: LocalObjectStore, S3ObjectStore (moto server, and moto's in-process ``mock_aws``, which is how
most users test their S3 code), and FsspecObjectStore over ``memory://`` and over s3fs (the moto server).
"""

from __future__ import annotations

import os
import pickle
import threading

import pytest

from dist_logging.object_store import FsspecObjectStore, LocalObjectStore, ObjectStore, S3ObjectStore
from s3_server import aws_credentials, s3_bucket, _moto_session  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


@pytest.fixture(params=['local', 's3', 's3-mock_aws', 'fsspec-memory', 'fsspec-s3fs'])
def store(request, tmp_path) -> ObjectStore:
    if request.param == 'local':
        backend = LocalObjectStore(str(tmp_path / 'bucket'))
    elif request.param == 's3-mock_aws':
        from moto import mock_aws

        request.getfixturevalue('aws_credentials')
        mock = mock_aws()
        mock.start()
        request.addfinalizer(mock.stop)
        backend = S3ObjectStore(
            'mocked-bucket',
            'some/prefix',
            region_name='us-east-1',
            multipart_threshold=5 * MiB,
            multipart_chunksize=5 * MiB,
        )
        backend.client.create_bucket(Bucket='mocked-bucket')
    elif request.param == 'fsspec-memory':
        backend = FsspecObjectStore(f'memory://conformance/{tmp_path.name}')
    else:
        endpoint, bucket = request.getfixturevalue('s3_bucket')
        if request.param == 's3':
            backend = S3ObjectStore(
                bucket,
                'some/prefix',
                endpoint_url=endpoint,
                multipart_threshold=5 * MiB,
                multipart_chunksize=5 * MiB,
                client_config={'retries': {'total_max_attempts': 1}},
            )
        else:
            backend = FsspecObjectStore(f's3://{bucket}/some/prefix', endpoint_url=endpoint, skip_instance_cache=True)
    with backend:  # a store is a context manager that closes it
        yield backend


class Progress:
    """A ``callback(transferred_so_far, total)`` that checks Composer's contract as it is called."""

    def __init__(self, total: int):
        self.total, self.done, self.calls = total, 0, 0
        self.lock = threading.Lock()

    def __call__(self, transferred: int, total: int) -> None:
        with self.lock:
            assert total == self.total
            assert transferred >= self.done, 'progress must not go backwards'
            self.done, self.calls = transferred, self.calls + 1

    def finished(self) -> bool:
        return self.calls >= 1 and self.done == self.total


def _file(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_roundtrip_size_uri(store, tmp_path):
    src = _file(tmp_path, 'a.bin', b'hello world')
    seen = Progress(11)
    store.upload_object('dir/sub/a.bin', src, callback=seen)
    assert seen.finished()
    assert store.get_object_size('dir/sub/a.bin') == 11
    assert 'dir/sub/a.bin' in store.get_uri('dir/sub/a.bin')
    out = tmp_path / 'out' / 'a.bin'
    got = Progress(11)
    store.download_object('dir/sub/a.bin', out, callback=got)  # a pathlib.Path is fine
    assert out.read_bytes() == b'hello world'
    assert got.finished()


def test_composer_keyword_names(store, tmp_path):
    # Composer calls these with keywords: object_name=, filename=.
    src = tmp_path / 'kw.bin'
    src.write_bytes(b'kw')
    store.upload_object(object_name='kw', filename=src)
    assert store.get_object_size(object_name='kw') == 2
    store.download_object(object_name='kw', filename=tmp_path / 'kw.out')
    assert (tmp_path / 'kw.out').read_bytes() == b'kw'


def test_list_objects(store, tmp_path):
    src = _file(tmp_path, 'l', b'l')
    for name in ('logs/b.txt', 'logs/a.txt', 'ckpt/x.pt'):
        store.upload_object(name, src)
    assert store.list_objects('logs/') == ['logs/a.txt', 'logs/b.txt']
    assert store.list_objects() == ['ckpt/x.pt', 'logs/a.txt', 'logs/b.txt']
    assert store.list_objects('nothing/') == []


def test_empty_file(store, tmp_path):
    seen = Progress(0)
    store.upload_object('empty', _file(tmp_path, 'e', b''), callback=seen)
    assert store.get_object_size('empty') == 0
    assert seen.finished()


def test_overwrite_semantics(store, tmp_path):
    store.upload_object('x', _file(tmp_path, 'one', b'one'))
    store.upload_object('x', _file(tmp_path, 'two', b'two'), overwrite=True)
    with pytest.raises(FileExistsError):
        store.upload_object('x', _file(tmp_path, 'three', b'three'), overwrite=False)
    out = tmp_path / 'x.out'
    store.download_object('x', str(out))
    assert out.read_bytes() == b'two'
    store.upload_object('fresh', _file(tmp_path, 'f', b'f'), overwrite=False)
    assert store.get_object_size('fresh') == 1


def test_missing_object(store, tmp_path):
    with pytest.raises(FileNotFoundError):
        store.get_object_size('nope/missing')
    with pytest.raises(FileNotFoundError):
        store.download_object('nope/missing', str(tmp_path / 'never'))
    assert not (tmp_path / 'never').exists()


def test_download_overwrite(store, tmp_path):
    store.upload_object('obj', _file(tmp_path, 'src', b'new'))
    dest = tmp_path / 'dest'
    dest.write_bytes(b'old')
    with pytest.raises(FileExistsError):
        store.download_object('obj', str(dest))
    assert dest.read_bytes() == b'old'
    store.download_object('obj', str(dest), overwrite=True)
    assert dest.read_bytes() == b'new'
    assert sorted(os.listdir(tmp_path)) == ['dest', 'src'] or not any(p.endswith('.tmp') for p in os.listdir(tmp_path))


@pytest.mark.parametrize('bad', ['../escape', '/abs/name', 'a/../../b', ''])
def test_escaping_names_rejected(store, tmp_path, bad):
    src = _file(tmp_path, 's', b's')
    with pytest.raises(ValueError):
        store.upload_object(bad, src)


def test_pickle_roundtrip(store, tmp_path):
    store.get_uri('warm')  # a client may exist; it must not be pickled
    clone = pickle.loads(pickle.dumps(store))
    clone.upload_object('pickled', _file(tmp_path, 'p', b'pp'))
    assert store.get_object_size('pickled') == 2
    clone.close()


def test_overwrite_false_race_has_one_winner(store, tmp_path):
    files = [_file(tmp_path, f'r{i}', bytes([65 + i]) * 100) for i in range(4)]
    outcomes = []

    def attempt(path):
        try:
            store.upload_object('contended', path, overwrite=False)
            outcomes.append('won')
        except FileExistsError:
            outcomes.append('lost')

    threads = [threading.Thread(target=attempt, args=(f,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ['lost', 'lost', 'lost', 'won']


@pytest.mark.parametrize('overwrite', [True, False])
def test_multipart_sized_file(store, tmp_path, overwrite):
    data = os.urandom(11 * MiB + 123)
    src = _file(tmp_path, 'big', data)
    seen = Progress(len(data))
    store.upload_object('big/object', src, callback=seen, overwrite=overwrite)
    assert seen.finished()
    assert store.get_object_size('big/object') == len(data)
    out = tmp_path / 'big.out'
    store.download_object('big/object', str(out))
    assert out.read_bytes() == data
    if not overwrite:
        with pytest.raises(FileExistsError):
            store.upload_object('big/object', src, overwrite=False)


def test_list_names_and_sizes(store, tmp_path):
    store.upload_object('ck/step1/a.distcp', _file(tmp_path, 'a', b'a' * 3))
    store.upload_object('ck/step1/.metadata', _file(tmp_path, 'm', b'm' * 5))
    store.upload_object('ck/step10/b', _file(tmp_path, 'b', b''))
    store.upload_object('other/c', _file(tmp_path, 'c', b'c'))
    assert store.list('ck/step1/') == [('ck/step1/.metadata', 5), ('ck/step1/a.distcp', 3)]
    # a plain string prefix, not a folder
    assert [info.name for info in store.list('ck/step1')] == ['ck/step1/.metadata', 'ck/step1/a.distcp', 'ck/step10/b']
    assert store.list('ck/step10/')[0].size == 0
    assert [info.name for info in store.list()] == ['ck/step1/.metadata', 'ck/step1/a.distcp', 'ck/step10/b', 'other/c']
    assert store.list('missing/') == []
    assert store.list('ck/st') == store.list('ck/step1')
    with pytest.raises(ValueError):
        store.list('../up')


def test_list_is_one_paginated_listing(store, tmp_path):
    # More objects than one page (S3: pages of 10 here): every one is listed, with its size.
    if hasattr(store, 'list_page_size'):
        store.list_page_size = 10
    src = _file(tmp_path, 'p', b'pp')
    names = [f'many/{i:03d}' for i in range(25)]
    for name in names:
        store.upload_object(name, src)
    listed = store.list('many/')
    assert [info.name for info in listed] == names
    assert {info.size for info in listed} == {2}


def test_delete(store, tmp_path):
    store.upload_object('del/x/one', _file(tmp_path, 'one', b'1'))
    store.upload_object('del/two', _file(tmp_path, 'two', b'22'))
    store.delete('del/x/one')
    with pytest.raises(FileNotFoundError):
        store.get_object_size('del/x/one')
    assert store.list('del/') == [('del/two', 2)]
    store.delete('del/x/one')  # a missing object: not an error
    store.delete('never/there')
    store.delete('del/two')
    assert store.list('del/') == []
    with pytest.raises(ValueError):
        store.delete('../escape')


def test_read_range(store, tmp_path):
    data = os.urandom(3 * MiB + 17)
    store.upload_object('r/a.bin', _file(tmp_path, 'a.bin', data))
    for offset, length in ((0, 10), (5, 1), (MiB - 3, MiB + 7), (len(data) - 4, 4), (0, len(data)), (7, 0)):
        buffer = bytearray(length)
        store.read_range('r/a.bin', offset, buffer)
        assert bytes(buffer) == data[offset : offset + length]
    view = memoryview(bytearray(100))  # into part of a larger buffer, as the checkpoint reader does
    store.read_range('r/a.bin', 1000, view[10:60])
    assert bytes(view[10:60]) == data[1000:1050] and bytes(view[:10]) == bytes(10)
    with pytest.raises(EOFError):
        store.read_range('r/a.bin', len(data) - 2, bytearray(4))
    with pytest.raises(FileNotFoundError):
        store.read_range('r/missing.bin', 0, bytearray(4))
    with pytest.raises(ValueError):
        store.read_range('r/a.bin', -1, bytearray(4))
