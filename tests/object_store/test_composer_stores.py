"""Object stores written for Composer, used unchanged (but for their import) through RemoteUploaderDownloader.

The stores (``object_store/_composer_store.py``) have only Composer's methods and signatures:
``upload_object(object_name, filename, callback=None)`` without ``overwrite``, progress as
``callback(transferred_so_far, total)``, ``ObjectStoreTransientError`` for what may be retried.
"""

from __future__ import annotations

import functools
import threading

import pytest

from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.destinations import remote as remote_module
from dist_logging.object_store import ObjectStoreTransientError, supports_overwrite
from dist_logging.upload.retry import RetryPolicy
from object_store._composer_store import DuckFolderStore, FolderStore, ForeignTransientError, PlainFolderStore

pytestmark = pytest.mark.timeout(60)

QUICK = RetryPolicy(num_attempts=3, initial_backoff=0.0)
STORES = [FolderStore, PlainFolderStore, DuckFolderStore]


def uploader(tmp_path, store, **kwargs) -> RemoteUploaderDownloader:
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'), **kwargs)
    rud.retry_policy = QUICK
    return rud


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_composer_signatures_are_detected(tmp_path):
    from dist_logging.object_store import LocalObjectStore

    # Composer's **kwargs pass through to the backend: they do not take overwrite=
    assert not supports_overwrite(FolderStore(str(tmp_path / 'a')))
    assert not supports_overwrite(PlainFolderStore(str(tmp_path / 'b')))
    assert not supports_overwrite(DuckFolderStore(str(tmp_path / 'c')))
    assert supports_overwrite(LocalObjectStore(str(tmp_path / 'd')))


@pytest.mark.parametrize('store_class', STORES)
def test_upload_and_download_through_the_logger(tmp_path, store_class):
    store = store_class(str(tmp_path / 'bucket'))
    rud = uploader(tmp_path, store)
    logger = Logger(rud, run_name='composer')
    logger.upload_file('{run_name}/ckpt-rank{rank}.pt', write(tmp_path / 'a', b'weights v1'))
    logger.upload_file('{run_name}/latest.pt', write(tmp_path / 'b', b'latest'), overwrite=True)
    logger.close()
    assert store.read('composer/ckpt-rank0.pt') == b'weights v1'
    assert store.read('composer/latest.pt') == b'latest'
    rud.download_file('composer/ckpt-rank0.pt', str(tmp_path / 'down.pt'))
    assert (tmp_path / 'down.pt').read_bytes() == b'weights v1'
    assert not (tmp_path / 'staging' / 'rank0').exists()


@pytest.mark.parametrize('store_class', STORES)
def test_overwrite_rules(tmp_path, store_class):
    store = store_class(str(tmp_path / 'bucket'))
    rud = uploader(tmp_path, store)
    seed = write(tmp_path / 'seed', b'already there')
    store.upload_object('taken.txt', seed)
    store.upload_object('replace.txt', seed)
    logger = Logger(rud, run_name='r')
    # Hold the upload of once.txt so that it is still queued at its second call (else it may land first).
    release = threading.Event()
    upload_object = store.upload_object

    @functools.wraps(upload_object)  # keeps the signature the uploader inspects
    def held_upload_object(*args, **kwargs):
        if kwargs.get('object_name', args[0] if args else None) == 'once.txt':
            release.wait(30)
        return upload_object(*args, **kwargs)

    store.upload_object = held_upload_object
    logger.upload_file('replace.txt', write(tmp_path / 'new', b'new bytes'), overwrite=True)
    logger.upload_file('once.txt', str(tmp_path / 'new'))
    with pytest.raises(FileExistsError, match='once.txt'):  # a name this rank queued: refused at the call
        logger.upload_file('once.txt', str(tmp_path / 'new'))
    release.set()
    # last: its failure would otherwise be raised by whichever upload_file call comes next
    logger.upload_file('taken.txt', str(tmp_path / 'new'))  # overwrite=False by default
    with pytest.raises(UploadError) as info:
        logger.close()
    assert set(info.value.failures) == {'taken.txt'}
    assert isinstance(info.value.failures['taken.txt'], FileExistsError)
    assert 'checked before the upload' in str(info.value)  # the message says how it was enforced
    assert store.read('taken.txt') == b'already there'  # never overwritten
    assert store.read('replace.txt') == b'new bytes'
    assert store.read('once.txt') == b'new bytes'
    assert store.attempts('taken.txt') == 1  # the seed only: the refused upload never called the store


@pytest.mark.parametrize('store_class', STORES)
def test_transient_errors_are_retried_and_partial_objects_replaced(tmp_path, store_class):
    store = store_class(str(tmp_path / 'bucket'), transient_failures=2)
    logger = Logger(uploader(tmp_path, store), run_name='r')
    data = bytes(range(256)) * 10
    logger.upload_file('ckpt.pt', write(tmp_path / 'ckpt', data))  # overwrite=False
    logger.close()
    # attempts 1 and 2 left half an object behind, then raised ObjectStoreTransientError; the retry
    # replaced that partial object although overwrite=False (it is our own attempt's leftover).
    assert store.attempts('ckpt.pt') == 3
    assert store.read('ckpt.pt') == data


@pytest.mark.parametrize('store_class', [FolderStore, DuckFolderStore])
def test_transient_errors_give_up_after_num_attempts(tmp_path, store_class):
    store = store_class(str(tmp_path / 'bucket'), transient_failures=99)
    logger = Logger(uploader(tmp_path, store), run_name='r')
    logger.upload_file('x.bin', write(tmp_path / 'x', b'xxxx'))
    with pytest.raises(UploadError) as info:
        logger.close()
    error = info.value.failures['x.bin']
    assert type(error).__name__ == 'ObjectStoreTransientError'
    assert isinstance(error, (ObjectStoreTransientError, ForeignTransientError))
    assert store.attempts('x.bin') == 3
    assert (tmp_path / 'staging' / 'rank0' / 'files').exists()  # the file stays in staging


def test_worker_processes(tmp_path):
    store = FolderStore(str(tmp_path / 'bucket'), transient_failures=1)
    rud = uploader(tmp_path, store, use_procs=True, num_concurrent_uploads=1)
    logger = Logger(rud, run_name='r')
    logger.upload_file('p.bin', write(tmp_path / 'p', b'from a worker process'))
    logger.close()
    assert store.read('p.bin') == b'from a worker process' and store.attempts('p.bin') == 2


def test_download_progress_is_transferred_so_far(tmp_path, monkeypatch):
    import tqdm.auto

    class Bar:
        instances: list = []

        def __init__(self, total=None, **kwargs):
            self.total, self.n, self.updates = total, 0, []
            Bar.instances.append(self)

        def update(self, n):
            self.updates.append(n)
            self.n += n

        def reset(self):
            self.n = 0

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, 'tqdm', Bar)
    monkeypatch.setattr(remote_module, '_PROGRESS_MIN_BYTES', 0)
    store = FolderStore(str(tmp_path / 'bucket'), chunk=3)
    data = b'0123456789abcdef'
    store.upload_object('obj', write(tmp_path / 'obj', data))
    rud = uploader(tmp_path, store)
    rud.download_file('obj', str(tmp_path / 'out'), progress_bar=True)
    (bar,) = Bar.instances
    assert bar.total == len(data) and bar.n == len(data)  # not the sum of running totals
    assert bar.updates == [3, 3, 3, 3, 3, 1]
    assert (tmp_path / 'out').read_bytes() == data
    rud.shutdown()


def test_stores_are_context_managers(tmp_path):
    with FolderStore(str(tmp_path / 'bucket')) as store:
        store.upload_object('a', write(tmp_path / 'a', b'a'))
        assert not store.closed
    assert store.closed
