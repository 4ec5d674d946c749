"""No second copy into a local bucket: an owned (copy=True) snapshot is placed by hard link; an object
never shares the caller's inode and never changes after it landed, whatever the caller does to its file."""

from __future__ import annotations

import os
import stat

import pytest

from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store import LocalObjectStore
from dist_logging.upload.journal import Journal, read_journal
from dist_logging.upload.retry import RetryPolicy
from dist_logging.upload.workers import UploadTask, run_upload
from upload._probes import PlacementProbeStore

pytestmark = pytest.mark.timeout(60)


def _uploader(tmp_path, store):
    return RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'))


def test_owned_upload_links_with_the_mode_of_a_copy(tmp_path):
    store = LocalObjectStore(str(tmp_path / 'bucket'))
    snapshot = tmp_path / 'snapshot'
    snapshot.write_bytes(b'abc')
    os.chmod(snapshot, 0o600)  # staging snapshots are private
    store.upload_object('copied', str(snapshot))
    store.upload_object('linked/obj', str(snapshot), owned=True, overwrite=False)
    linked, copied = os.stat(tmp_path / 'bucket' / 'linked' / 'obj'), os.stat(tmp_path / 'bucket' / 'copied')
    assert linked.st_ino == snapshot.stat().st_ino != copied.st_ino
    assert stat.S_IMODE(linked.st_mode) == stat.S_IMODE(copied.st_mode)  # 0o666 & ~umask, like `cp`
    assert (linked.st_uid, linked.st_gid) == (copied.st_uid, copied.st_gid)
    assert sorted(os.listdir(tmp_path / 'bucket' / 'linked')) == ['obj']  # no temp or probe file left
    with pytest.raises(FileExistsError):
        store.upload_object('linked/obj', str(snapshot), owned=True, overwrite=False)


def test_copy_true_is_placed_without_copying_bytes(tmp_path):
    store = PlacementProbeStore(str(tmp_path / 'bucket'))
    rud = _uploader(tmp_path, store)
    src = tmp_path / 'ckpt.bin'
    src.write_bytes(b'x' * 100_000)
    rud.upload_file(None, 'ckpt.bin', str(src), copy=True)
    rud.shutdown()
    placed = store.placed['ckpt.bin']
    assert placed['owned'] is True
    assert placed['object_ino'] == placed['source_ino'] != src.stat().st_ino  # the snapshot's inode, not the caller's
    assert placed['object_nlink'] == 2  # the snapshot and the object, until staging drops the snapshot
    assert os.stat(tmp_path / 'bucket' / 'ckpt.bin').st_nlink == 1  # now the object's alone
    files = tmp_path / 'staging' / 'rank0' / 'files'
    assert not files.exists() or list(files.iterdir()) == []


def test_copy_false_never_shares_the_callers_inode(tmp_path):
    store = PlacementProbeStore(str(tmp_path / 'bucket'))
    rud = _uploader(tmp_path, store)
    src = tmp_path / 'ckpt.bin'
    src.write_bytes(b'y' * 100_000)
    rud.upload_file(None, 'ckpt.bin', str(src), copy=False)
    rud.shutdown()
    placed = store.placed['ckpt.bin']
    assert placed['owned'] is False
    assert placed['source_ino'] == src.stat().st_ino  # the hand-over is a link to the caller's file...
    assert placed['object_ino'] != src.stat().st_ino  # ...which the object never shares


def _rewrite_in_place(path, data):
    with open(path, 'r+b') as handle:
        handle.write(data)


def _replace(path, data):
    tmp = f'{path}.new'
    with open(tmp, 'wb') as handle:
        handle.write(data)
    os.replace(tmp, path)


@pytest.mark.parametrize('change', [_rewrite_in_place, _replace], ids=['rewritten', 'replaced'])
@pytest.mark.parametrize('copy', [True, False], ids=['copy', 'handover'])
def test_object_never_changes_after_it_landed(tmp_path, copy, change):
    rud = _uploader(tmp_path, LocalObjectStore(str(tmp_path / 'bucket')))
    src = tmp_path / 'ckpt.bin'
    src.write_bytes(b'old' * 1000)
    rud.upload_file(None, 'a.bin', str(src), copy=copy)
    if copy:  # a copy=True caller may change its file as soon as the call returns
        change(src, b'new' * 1000)
    assert rud.wait_for_uploads(30)
    if not copy:  # a hand-over's caller may reuse its file once it landed
        change(src, b'new' * 1000)
    assert (tmp_path / 'bucket' / 'a.bin').read_bytes() == b'old' * 1000
    # The caller's next round of the same file lands as a new object; the first one stays as it was.
    rud.upload_file(None, 'b.bin', str(src), copy=copy)
    assert rud.wait_for_uploads(30)
    change(src, b'end' * 1000)
    rud.shutdown()
    assert (tmp_path / 'bucket' / 'a.bin').read_bytes() == b'old' * 1000
    assert (tmp_path / 'bucket' / 'b.bin').read_bytes() == b'new' * 1000


class ComposerStyleStore(LocalObjectStore):
    """A store whose upload_object has no ``owned`` keyword (written for another framework)."""

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True):
        self.calls = getattr(self, 'calls', 0) + 1
        return super().upload_object(object_name, filename, callback, overwrite=overwrite)


def test_stores_without_owned_are_called_as_before(tmp_path):
    store = ComposerStyleStore(str(tmp_path / 'bucket'))
    snapshot = tmp_path / 'snap'
    snapshot.write_bytes(b'z')
    run_upload(store, UploadTask(1, 'z', str(snapshot), 1, False, owned=True), RetryPolicy(num_attempts=1))
    assert store.calls == 1
    assert os.stat(tmp_path / 'bucket' / 'z').st_ino != snapshot.stat().st_ino


def test_ownership_is_journaled_for_resume(tmp_path):
    journal = Journal(str(tmp_path / 'journal.jsonl'))
    journal.append_queued(1, 'owned', 3, False, 'sid')
    journal.append_queued(2, 'handed', -1, False, 'sid')
    journal.close()
    pending = read_journal(str(tmp_path / 'journal.jsonl')).pending
    assert pending[1].owned is False  # default
    journal = Journal(str(tmp_path / 'journal.jsonl'))
    journal.append_queued(3, 'owned', 3, False, 'sid', owned=True)
    journal.close()
    assert read_journal(str(tmp_path / 'journal.jsonl')).pending[3].owned is True
