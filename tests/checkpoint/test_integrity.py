"""End-to-end integrity (issue 34): each shard's CRC32C is taken while it is written and recorded in the commit
marker; bytes that change after the hand-over never commit, bytes that change in the bucket never load, and
latest_checkpoint skips a checkpoint whose objects disagree with its marker. On a local bucket and on moto S3."""

from __future__ import annotations

import json
import os
import tempfile

import crc32c
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint
from dist_logging.errors import UploadError
from dist_logging.object_store import store_from_uri
from dist_logging.object_store.checksums import b64, file_crc32c
from dist_logging.object_store.local import LocalObjectStore
from dist_logging.object_store.s3 import S3ObjectStore
from dist_logging.upload import Uploader
from s3_server import _moto_session, aws_credentials, s3_bucket  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def _flip(path: str) -> None:
    """Flip one bit in the middle of a file, in place (same size, same inode)."""
    with open(path, 'r+b') as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))


class _Flipping:
    """Mixed into a store: the first shard upload finds its staged bytes changed (a bit flipped on the local disk
    after the writer handed the file over and before the upload read it)."""

    flipped: list

    def upload_object(self, object_name, filename, callback=None, **kwargs):
        if object_name.endswith('.distcp') and not self.flipped:
            self.flipped.append(object_name)
            _flip(os.fspath(filename))
        return super().upload_object(object_name, filename, callback, **kwargs)


class FlippingLocal(_Flipping, LocalObjectStore):
    def __init__(self, root):
        super().__init__(root)
        self.flipped = []


class FlippingS3(_Flipping, S3ObjectStore):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flipped = []


@pytest.fixture(params=['local', 's3'])
def bucket(request, tmp_path):
    """(kind, uri, backend_kwargs, make_store(cls)): a local folder, or a fresh bucket on the moto server."""
    if request.param == 'local':
        root = str(tmp_path / 'bucket')
        return 'local', root, None, lambda cls: cls(root)
    endpoint, name = request.getfixturevalue('s3_bucket')
    return 's3', f's3://{name}', {'endpoint_url': endpoint}, lambda cls: cls(name, endpoint_url=endpoint)


def _state() -> dict:
    torch.manual_seed(0)
    return {'w': torch.randn(256, 64), 'b': torch.randn(64), 'step': torch.tensor(7)}


def _blank() -> dict:
    return {'w': torch.zeros(256, 64), 'b': torch.zeros(64), 'step': torch.tensor(0)}


def _marker(store, cid: str) -> dict:
    [name] = [info.name for info in store.list(f'{cid}/') if '/.committed-' in info.name]
    with tempfile.TemporaryDirectory() as scratch:
        store.download_object(name, os.path.join(scratch, 'm'))
        with open(os.path.join(scratch, 'm'), 'rb') as handle:
            return json.loads(handle.read())


def test_the_marker_records_the_crc32c_each_shard_was_written_with(bucket, tmp_path):
    kind, uri, kwargs, _ = bucket
    with CheckpointWriter(uri, backend_kwargs=kwargs, upload_staging_folder=str(tmp_path / 'st')) as writer:
        dcp.save(_state(), checkpoint_id='run/step1', storage_writer=writer, no_dist=True)
    store = store_from_uri(uri, kwargs)
    record = _marker(store, 'run/step1')
    assert set(record['checksums']) == set(record['files'])  # every shard, and the .metadata
    for relative, checksum in record['checksums'].items():
        local = tmp_path / 'got'
        store.download_object(f'run/step1/{relative}', str(local), overwrite=True)
        assert file_crc32c(local) == checksum, relative
        assert store.object_checksum(f'run/step1/{relative}') == checksum  # what the store kept when it landed
    store.close()


def test_a_bit_flipped_in_a_staged_shard_after_the_hand_over_never_commits_and_is_named(bucket, tmp_path):
    kind, uri, kwargs, make_store = bucket
    store = make_store(FlippingLocal if kind == 'local' else FlippingS3)
    uploader = Uploader(object_store=store, upload_staging_folder=str(tmp_path / 'st'), num_attempts=1)
    writer = CheckpointWriter(uploader, commit_timeout=30)
    dcp.save(_state(), checkpoint_id='run/step1', storage_writer=writer, no_dist=True)
    with pytest.raises(UploadError) as caught:
        writer.close()
    uploader.shutdown()
    [shard] = store.flipped
    assert shard in caught.value.failures  # the shard is named...
    assert "checkpoint 'run/step1'" in str(caught.value) and 'checksum' in str(caught.value)  # ...and its checkpoint
    assert latest_checkpoint(store, 'run') is None  # never committed
    intents = tmp_path / 'st' / 'checkpoint-commits'
    assert not (intents.exists() and os.listdir(intents))  # its intent is gone: no later job tries to commit it


def test_a_bit_flipped_in_a_landed_object_fails_the_load_naming_it(bucket, tmp_path):
    kind, uri, kwargs, make_store = bucket
    with CheckpointWriter(uri, backend_kwargs=kwargs, upload_staging_folder=str(tmp_path / 'st')) as writer:
        dcp.save(_state(), checkpoint_id='run/step1', storage_writer=writer, no_dist=True)
    store = make_store(LocalObjectStore if kind == 'local' else S3ObjectStore)
    [shard] = [info.name for info in store.list('run/step1/') if info.name.endswith('.distcp')]
    if kind == 'local':
        _flip(os.path.join(uri, shard))  # the bytes rot in place; the checksum kept with the file stays
    else:
        client = store.client
        key = store._key(shard)
        data = bytearray(client.get_object(Bucket=store.bucket, Key=key)['Body'].read())
        data[len(data) // 2] ^= 0x01
        client.put_object(Bucket=store.bucket, Key=key, Body=bytes(data))  # replaced by someone else, same size
    with CheckpointReader(uri, backend_kwargs=kwargs) as reader:
        with pytest.raises(CheckpointException) as caught:  # DCP's error carries each rank's
            dcp.load(_blank(), checkpoint_id='run/step1', storage_reader=reader, no_dist=True)
    assert shard in str(caught.value) and "checkpoint 'run/step1'" in str(caught.value)
    store.close()


def test_latest_checkpoint_skips_a_checkpoint_whose_objects_disagree_with_its_marker(s3_bucket, tmp_path):
    endpoint, name = s3_bucket
    uri, kwargs = f's3://{name}', {'endpoint_url': endpoint}
    with CheckpointWriter(uri, backend_kwargs=kwargs, upload_staging_folder=str(tmp_path / 'st')) as writer:
        for step in (1, 2):
            dcp.save(_state(), checkpoint_id=f'run/step{step}', storage_writer=writer, no_dist=True)
            writer.wait_for_commits()
    store = S3ObjectStore(name, endpoint_url=endpoint)
    assert latest_checkpoint(store, 'run') == 'run/step2'
    [shard] = [info.name for info in store.list('run/step2/') if info.name.endswith('.distcp')]
    data = bytearray(store.client.get_object(Bucket=name, Key=shard)['Body'].read())
    data[-1] ^= 0x01
    store.client.put_object(
        Bucket=name,
        Key=shard,
        Body=bytes(data),
        ChecksumAlgorithm='CRC32C',
        ChecksumCRC32C=b64(crc32c.crc32c(bytes(data))),
    )
    assert latest_checkpoint(store, 'run') == 'run/step1'  # same size, other bytes: skipped
    store.close()
