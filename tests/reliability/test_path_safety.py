"""Nothing is written outside the places given.

* ``LocalObjectStore`` never writes outside its root: not through ``..`` or absolute names, and not
  through a symbolic link inside the root that points out of it (the upload fails with a ValueError
  naming the object, is not retried, and the outside folder stays empty). An object name that is
  itself a symlink is replaced, never followed.
* Downloads write only the destination file (through a temporary file next to it): a failed
  download leaves nothing behind, an escaping name writes nothing, and a symlink at the destination
  is replaced, never followed.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.object_store.local import LocalObjectStore
from dist_logging.upload.retry import RetryPolicy
from reliability._common import write

pytestmark = pytest.mark.timeout(60)


def _listing(folder: pathlib.Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob('*')}


@pytest.fixture
def trap(tmp_path):
    """A bucket root with symlinks pointing out of it, and the outside folder they point to."""
    root, outside = tmp_path / 'root', tmp_path / 'outside'
    root.mkdir()
    outside.mkdir()
    (outside / 'victim.txt').write_bytes(b'do not touch')
    os.symlink(outside, root / 'link')  # a folder link
    (root / 'deep').mkdir()
    os.symlink('../../outside', root / 'deep' / 'rel')  # a relative one, deeper
    os.symlink(outside / 'victim.txt', root / 'victim-link')  # a file link
    return root, outside


@pytest.mark.parametrize(
    'name', ['link/escaped.bin', 'link/new/sub/escaped.bin', 'deep/rel/escaped.bin', 'link/victim.txt']
)
@pytest.mark.parametrize('overwrite', [True, False])
def test_local_store_never_writes_through_a_symlink_out_of_its_root(trap, tmp_path, name, overwrite):
    root, outside = trap
    store = LocalObjectStore(str(root))
    src = write(tmp_path / 'src.bin', b'payload')
    with pytest.raises(ValueError, match='outside the store root') as info:
        store.upload_object(name, src, overwrite=overwrite)
    assert repr(name) in str(info.value)
    assert _listing(outside) == {'victim.txt'} and (outside / 'victim.txt').read_bytes() == b'do not touch'
    with pytest.raises(ValueError, match='outside the store root'):
        store.download_object(name, str(tmp_path / 'down.bin'))  # nor reads through it
    assert not (tmp_path / 'down.bin').exists()


def test_object_that_is_a_symlink_is_replaced_not_followed(trap, tmp_path):
    root, outside = trap
    store = LocalObjectStore(str(root))
    store.upload_object('victim-link', write(tmp_path / 'src.bin', b'new object'), overwrite=True)
    assert not os.path.islink(root / 'victim-link') and (root / 'victim-link').read_bytes() == b'new object'
    assert (outside / 'victim.txt').read_bytes() == b'do not touch'
    with pytest.raises(FileExistsError):
        store.upload_object('link', write(tmp_path / 'src.bin', b'x'), overwrite=False)


def test_escaping_symlink_upload_fails_at_once_and_stays_in_staging(trap, tmp_path):
    root, outside = trap
    rud = RemoteUploaderDownloader(str(root), upload_staging_folder=str(tmp_path / 'staging'))
    rud.retry_policy = RetryPolicy(num_attempts=5, initial_backoff=0.01)
    logger = Logger(rud, run_name='trap')
    logger.upload_file('link/ckpt.bin', write(tmp_path / 'ckpt.bin', b'weights'))
    reported = {}
    try:
        logger.upload_file('fine/ckpt.bin', str(tmp_path / 'ckpt.bin'))
    except UploadError as exc:  # the first may already have failed: reported at this call (still queued)
        reported.update(exc.failures)
    try:
        logger.close()
    except UploadError as exc:  # ... or at close
        reported.update(exc.failures)
    assert set(reported) == {'link/ckpt.bin'} and isinstance(reported['link/ckpt.bin'], ValueError)
    assert 'outside the store root' in str(reported['link/ckpt.bin'])
    from dist_logging.upload.drain import list_pending

    assert [p.remote_name for p in list_pending(str(tmp_path / 'staging'))] == ['link/ckpt.bin']
    assert (root / 'fine' / 'ckpt.bin').read_bytes() == b'weights'
    assert _listing(outside) == {'victim.txt'}


def test_lexical_escapes_are_refused_before_anything_is_written(tmp_path):
    store = LocalObjectStore(str(tmp_path / 'root'))
    src = write(tmp_path / 'src.bin', b'x')
    before = _listing(tmp_path)
    for name in ('../escape.bin', '/abs/escape.bin', 'a/../../escape.bin', 'a/../../../etc/x'):
        with pytest.raises(ValueError, match='object name'):
            store.upload_object(name, src)
    assert _listing(tmp_path) == before


def test_downloads_write_only_the_destination(tmp_path):
    bucket = tmp_path / 'bucket'
    write(bucket / 'ckpt' / 'weights.bin', b'w' * 10_000)
    rud = RemoteUploaderDownloader(str(bucket), upload_staging_folder=str(tmp_path / 'staging'))
    dest_dir = tmp_path / 'dest'
    dest_dir.mkdir()
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'victim.txt').write_bytes(b'do not touch')

    rud.download_file('ckpt/weights.bin', str(dest_dir / 'weights.bin'))
    assert _listing(dest_dir) == {'weights.bin'}  # no temporary file left beside it
    # an escaping object name writes nothing anywhere
    for name in ('../outside/victim.txt', '/etc/passwd'):
        with pytest.raises(ValueError):
            rud.download_file(name, str(dest_dir / 'other.bin'))
    assert _listing(dest_dir) == {'weights.bin'}
    # a missing object: nothing is created
    with pytest.raises(FileNotFoundError):
        rud.download_file('missing.bin', str(dest_dir / 'missing.bin'))
    assert _listing(dest_dir) == {'weights.bin'}
    # a symlink at the destination is replaced (with overwrite=True), never followed
    os.symlink(outside / 'victim.txt', dest_dir / 'linked.bin')
    with pytest.raises(FileExistsError):
        rud.download_file('ckpt/weights.bin', str(dest_dir / 'linked.bin'))
    rud.download_file('ckpt/weights.bin', str(dest_dir / 'linked.bin'), overwrite=True)
    assert not os.path.islink(dest_dir / 'linked.bin') and (dest_dir / 'linked.bin').read_bytes() == b'w' * 10_000
    assert (outside / 'victim.txt').read_bytes() == b'do not touch' and _listing(outside) == {'victim.txt'}
    rud.shutdown()


def test_failed_download_leaves_no_temporary_file(tmp_path, monkeypatch):
    from dist_logging import _files as snapshot

    bucket = tmp_path / 'bucket'
    write(bucket / 'big.bin', os.urandom(1 << 20))
    store = LocalObjectStore(str(bucket))
    dest_dir = tmp_path / 'dest'

    def broken_copy(*args, **kwargs):
        raise OSError(5, 'Input/output error')

    monkeypatch.setattr('dist_logging.object_store.local.copy_file', broken_copy)
    with pytest.raises(OSError):
        store.download_object('big.bin', str(dest_dir / 'big.bin'))
    assert _listing(dest_dir) == set()
    assert snapshot.copy_file is not broken_copy


@pytest.mark.parametrize('planted', ['symlink', 'foreign_owner'])
def test_default_staging_base_in_the_shared_temp_dir_must_be_ours(tmp_path, monkeypatch, planted):
    """The default staging folder is `<tmp>/dist_logging-<user>/...`, a guessable name in a shared folder:
    a folder planted there by someone else (or a symlink) is refused, never written into."""
    import getpass
    import tempfile

    monkeypatch.setattr(tempfile, 'gettempdir', lambda: str(tmp_path))
    base = tmp_path / f'dist_logging-{getpass.getuser()}'
    elsewhere = tmp_path / 'attacker'
    elsewhere.mkdir()
    if planted == 'symlink':
        os.symlink(elsewhere, base)
    else:
        if os.getuid() != 0:
            pytest.skip('needs root to create a folder owned by another user')
        base.mkdir()
        os.chown(base, 65534, 65534)
    rud = RemoteUploaderDownloader(str(tmp_path / 'bucket'))  # no upload_staging_folder: the default
    with pytest.warns(RuntimeWarning, match='will not use .*dist_logging-.*(symlink|owned by uid)'):
        logger = Logger(rud, run_name='planted')  # reported once at start-up (destination isolation)...
    with pytest.raises(PermissionError, match='upload_staging_folder'):
        logger.upload_file('x.bin', write(tmp_path / 'x.bin', b'x'))  # ...and at the call that needs it
    with pytest.raises(PermissionError):
        logger.close()
    assert _listing(elsewhere) == set()
    if planted == 'symlink':
        base.unlink()
    else:
        base.rmdir()
    logger = Logger(RemoteUploaderDownloader(str(tmp_path / 'bucket')), run_name='fine')  # our own: fine
    logger.upload_file('x.bin', write(tmp_path / 'x.bin', b'x'))
    logger.close()
    assert (tmp_path / 'bucket' / 'x.bin').read_bytes() == b'x'
