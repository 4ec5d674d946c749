"""The staging folder's disk fills up.

``upload_file`` raises an ``OSError`` (errno ENOSPC) at the call that names the staging folder;
nothing half-written stays (no partial snapshot, no snapshot without its record, no half journal
line); the Logger stays usable and the next call, once there is room, works.

Two ways to fill the disk: a real 2 MiB tmpfs mounted as the staging folder (needs root; skipped
otherwise), and, always, the kernel copy primitive (and the journal's ``write``) failing with
ENOSPC part-way through (monkeypatched).
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.upload import journal as journal_module
from dist_logging import _files as snapshot_module
from dist_logging.upload.drain import list_pending
from dist_logging.upload.journal import read_journal
from reliability._common import bucket_objects, sha256, write

pytestmark = pytest.mark.timeout(60)

KiB, MiB = 1 << 10, 1 << 20


def _logger(tmp_path, staging):
    rud = RemoteUploaderDownloader(f'file://{tmp_path}/bucket', upload_staging_folder=str(staging))
    return Logger(rud, run_name='full'), rud


def _assert_clean(rud):
    """No snapshot without a record, no torn journal line, nothing recorded for the failed call."""
    files = set(os.listdir(os.path.join(rud.staging_dir, 'files')))
    state = read_journal(os.path.join(rud.staging_dir, 'journal.jsonl'))
    assert state.torn_lines == 0
    assert files <= {str(record.id) for record in state.pending.values()}
    return state


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount = tmp_path / 'staging'
    mount.mkdir()
    result = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here: {result.stderr.decode().strip()}')
    try:
        yield mount
    finally:
        subprocess.run(['umount', '-l', str(mount)], check=False)


def test_real_disk_full_on_a_2mib_tmpfs(tmp_path, tiny_tmpfs):
    logger, rud = _logger(tmp_path, tiny_tmpfs)
    small = os.urandom(100 * KiB)
    big = write(tmp_path / 'big.bin', os.urandom(3 * MiB))
    logger.upload_file('before.bin', write(tmp_path / 'before.bin', small))
    with pytest.raises(OSError) as info:
        logger.upload_file('too-big.bin', big)
    assert info.value.errno == errno.ENOSPC
    assert rud.staging_dir in str(info.value)  # names where it could not write
    assert any('too-big.bin' in note and 'nothing was queued' in note for note in info.value.__notes__)
    state = _assert_clean(rud)
    assert 'too-big.bin' not in {r.name for r in state.pending.values()}

    # the disk is full right up to the journal: a short journal write must not leave half a line
    filler = os.open(tiny_tmpfs / 'filler', os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(filler, os.urandom(4 * KiB)) > 0:
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(filler)
    failures = 0
    for i in range(5):
        try:
            logger.upload_file(f'while-full-{i}.bin', write(tmp_path / f'w{i}', b'x' * 5000))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            failures += 1
        _assert_clean(rud)
    assert failures  # the disk really was full
    os.unlink(tiny_tmpfs / 'filler')

    # training goes on: once there is room the next calls work, and everything accepted lands
    after = os.urandom(200 * KiB)
    logger.upload_file('after.bin', write(tmp_path / 'after.bin', after))
    logger.close()
    landed = bucket_objects(tmp_path / 'bucket')
    assert landed['before.bin'] == sha256(small) and landed['after.bin'] == sha256(after)
    assert 'too-big.bin' not in landed
    assert list_pending(str(tiny_tmpfs)) == []


def test_copy_fails_part_way_with_enospc(tmp_path, monkeypatch):
    logger, rud = _logger(tmp_path, tmp_path / 'staging')
    real = os.copy_file_range
    calls = {'n': 0}

    def copy_then_full(src, dst, count, *args):
        calls['n'] += 1
        if calls['n'] == 2:  # the second chunk of the copy: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, min(count, 256 * KiB), *args)

    monkeypatch.setattr(snapshot_module.os, 'copy_file_range', copy_then_full)
    monkeypatch.setattr(snapshot_module, '_no_clone', {(d, d) for d in [os.stat(tmp_path).st_dev]})
    with pytest.raises(OSError) as info:
        logger.upload_file('big.bin', write(tmp_path / 'big.bin', os.urandom(MiB)))
    assert info.value.errno == errno.ENOSPC and calls['n'] == 2  # it failed part-way through
    assert os.listdir(os.path.join(rud.staging_dir, 'files')) == []  # the partial snapshot is gone
    assert rud.staging_dir in str(info.value)
    _assert_clean(rud)
    monkeypatch.undo()
    data = os.urandom(MiB)
    logger.upload_file('big.bin', write(tmp_path / 'big.bin', data))  # the same name again: not "queued"
    logger.close()
    assert bucket_objects(tmp_path / 'bucket') == {'big.bin': sha256(data)}


def test_journal_short_write_leaves_no_half_record(tmp_path, monkeypatch):
    logger, rud = _logger(tmp_path, tmp_path / 'staging')
    first = os.urandom(1000)
    logger.upload_file('first.bin', write(tmp_path / 'first.bin', first))
    journal_fd = rud.uploader._staging.journal._fd
    real_write = os.write
    state = {'full': True}

    def short_write(fd, data):
        if fd == journal_fd and state['full']:
            if len(data) > 10 and not state.get('short'):
                state['short'] = True
                return real_write(fd, data[:10])  # the disk had room for 10 bytes
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(journal_module.os, 'write', short_write)
    with pytest.raises(OSError) as info:
        logger.upload_file('second.bin', write(tmp_path / 'second.bin', b'2' * 1000))
    assert info.value.errno == errno.ENOSPC and state.get('short')
    _assert_clean(rud)  # no torn line in the journal, and the snapshot of the failed call is gone
    state['full'] = False
    third = os.urandom(1000)
    logger.upload_file('third.bin', write(tmp_path / 'third.bin', third))
    assert rud.wait_for_uploads(30)
    logger.close()
    assert bucket_objects(tmp_path / 'bucket') == {'first.bin': sha256(first), 'third.bin': sha256(third)}
