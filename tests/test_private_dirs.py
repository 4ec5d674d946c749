"""dist_logging._private_dirs: the one owner of the package's folders in the shared temp dir.

Same-user checks (no root needed, except where said): the base is created 0o700 whatever the
umask and checked on every use; a planted symlink, a folder open to others or owned by someone
else is refused with an error naming the folder, the problem and the way out; DIST_LOGGING_TMPDIR
and upload_staging_folder= keep every file out of ``<tmp>/dist_logging-<user>``; a download
marker that is not a private file of ours is ignored (the object is fetched again). The checks
with real users are in tests/reliability/test_shared_machine.py.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
import stat
import tempfile

import pytest

from dist_logging import _private_dirs
from dist_logging.destinations.remote import RemoteUploaderDownloader, default_staging_folder
from dist_logging.state import State
from dist_logging.upload import node_slots, rate_limit

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):
    """A fresh system temp dir (1777 like /tmp) and no knob set."""
    shared = tmp_path / 'tmp'
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, 'tempdir', str(shared))
    monkeypatch.delenv(_private_dirs.ENV_VAR, raising=False)
    monkeypatch.delenv(node_slots.ENV_VAR, raising=False)
    monkeypatch.delenv(rate_limit.ENV_VAR, raising=False)
    return shared


def _base(shared):
    return shared / f'dist_logging-{getpass.getuser()}'


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_base_and_its_folders_are_0700_whatever_the_umask(shared_tmp):
    old = os.umask(0)
    try:
        staging = default_staging_folder('my run')
        slots = _private_dirs.private_dir('node-upload-slots')
    finally:
        os.umask(old)
    base = _base(shared_tmp)
    assert staging == str(base / 'my_run' / 'staging') and slots == str(base / 'node-upload-slots')
    for folder in (base, base / 'my_run', base / 'my_run' / 'staging', base / 'node-upload-slots'):
        assert _mode(folder) == 0o700, folder
        assert os.lstat(folder).st_uid == os.getuid()
    assert default_staging_folder('..') == str(base / 'run' / 'staging')  # never a way out of the base


def test_folders_made_for_the_knob_or_a_staging_folder_are_0700_parents_included(tmp_path, monkeypatch):
    """Under umask 000 os.makedirs would leave world-writable parents (where others could rename our folder)."""
    monkeypatch.setenv(_private_dirs.ENV_VAR, str(tmp_path / 'k1' / 'k2' / 'dl'))
    old = os.umask(0)
    try:
        _private_dirs.private_dir('downloads')
        monkeypatch.delenv(_private_dirs.ENV_VAR)
        _private_dirs.state_dir(str(tmp_path / 's1' / 's2' / 'staging'))
    finally:
        os.umask(old)
    for folder in ('k1', 'k1/k2', 'k1/k2/dl', 'k1/k2/dl/downloads', 's1', 's1/s2', 's1/s2/staging'):
        assert _mode(tmp_path / folder) == 0o700, folder
    (machine,) = os.listdir(tmp_path / 's1' / 's2' / 'staging')
    assert machine == f'.dist_logging-{socket.gethostname()}' and _mode(tmp_path / 's1/s2/staging' / machine) == 0o700


@pytest.mark.parametrize('planted', ['symlink', 'open_mode', 'a_file', 'foreign_owner'])
def test_a_planted_base_is_refused_naming_folder_problem_and_way_out(shared_tmp, tmp_path, planted):
    base = _base(shared_tmp)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    if planted == 'symlink':
        os.symlink(elsewhere, base)
        problem = 'it is a symlink'
    elif planted == 'open_mode':
        base.mkdir()
        base.chmod(0o777)
        problem = 'its mode is 0777'
    elif planted == 'a_file':
        base.write_bytes(b'')
        problem = 'it is not a folder'
    else:
        if os.getuid() != 0:
            pytest.skip('needs root to create a folder owned by another user')
        base.mkdir(0o700)
        os.chown(base, 65534, 65534)
        problem = 'it is owned by uid 65534'
    for call in (
        _private_dirs.base_dir,
        lambda: _private_dirs.private_dir('downloads'),
        lambda: default_staging_folder('r'),
        lambda: rate_limit.NodeUploadRate(10),
        lambda: node_slots.NodeUploadSlots(2),
    ):
        with pytest.raises(PermissionError) as info:
            call()
        message = str(info.value)
        assert str(base) in message and problem in message and _private_dirs.ENV_VAR in message, message
    assert os.listdir(elsewhere) == []
    if planted == 'open_mode':
        assert _mode(base) == 0o777 and os.listdir(base) == []  # refused, not "fixed" or written into


def test_a_folder_below_the_base_is_checked_on_every_use(shared_tmp):
    downloads = _private_dirs.private_dir('downloads')
    os.chmod(downloads, 0o755)
    with pytest.raises(PermissionError, match=re.escape(downloads) + '.*mode is 0755'):
        _private_dirs.private_dir('downloads')
    os.chmod(downloads, 0o700)
    assert _private_dirs.private_dir('downloads') == downloads
    with pytest.raises(ValueError, match=r"'\.\.'"):
        _private_dirs.private_dir('..')


def test_private_files_are_never_opened_through_a_symlink(tmp_path):
    folder = tmp_path / 'p'
    folder.mkdir(0o700)
    victim = tmp_path / 'victim.txt'
    victim.write_bytes(b'precious')
    os.symlink(victim, folder / 'schedule.bin')
    with pytest.raises(PermissionError, match='symlink'):
        _private_dirs.open_private_file(str(folder / 'schedule.bin'), os.O_RDWR, create=True)
    with pytest.raises(FileExistsError):
        _private_dirs.create_private_file(str(folder / 'schedule.bin'))
    rate = rate_limit.NodeUploadRate(1000, str(folder), burst_seconds=0)
    with pytest.raises(PermissionError, match='schedule.bin: it is a symlink'):
        rate.reserve(10)
    assert victim.read_bytes() == b'precious'
    old = os.umask(0)
    try:
        fd = _private_dirs.create_private_file(str(folder / 'new'))
    finally:
        os.umask(old)
    os.close(fd)
    assert _mode(folder / 'new') == 0o600


def test_the_knob_moves_everything_and_the_default_base_is_never_made(shared_tmp, tmp_path, monkeypatch):
    """DIST_LOGGING_TMPDIR: staging, caps, download locks and markers, local-bucket locks all go there."""
    chosen = tmp_path / 'mine' / 'dl'
    monkeypatch.setenv(_private_dirs.ENV_VAR, str(chosen))
    monkeypatch.setenv(node_slots.ENV_VAR, '2')
    monkeypatch.setenv(rate_limit.ENV_VAR, '1GB')
    rud = RemoteUploaderDownloader(str(tmp_path / 'bucket'))
    rud.upload_file(State('knob'), 'a.bin', _write(tmp_path / 'a.bin', b'a' * 1000))
    assert rud.wait_for_uploads(60)
    rud.download_file('a.bin', str(tmp_path / 'down' / 'a.bin'), progress_bar=False)
    rud.shutdown()
    assert (tmp_path / 'down' / 'a.bin').read_bytes() == b'a' * 1000
    assert not _base(shared_tmp).exists() and os.listdir(shared_tmp) == []
    assert {'node-upload-slots', 'node-upload-rate', 'downloads'} <= set(os.listdir(chosen))
    assert _mode(chosen) == 0o700 and _mode(chosen / 'downloads') == 0o700
    for entry in os.listdir(chosen / 'downloads'):
        assert _mode(chosen / 'downloads' / entry) == 0o600, entry
    monkeypatch.setenv(_private_dirs.ENV_VAR, 'relative/dir')
    with pytest.raises(ValueError, match='relative/dir'):
        _private_dirs.base_dir()


def test_upload_staging_folder_keeps_the_job_out_of_the_default_base(shared_tmp, tmp_path, monkeypatch):
    """A job that chose its staging folder keeps caps and download coordination next to it, per machine."""
    monkeypatch.setenv(node_slots.ENV_VAR, '2')
    monkeypatch.setenv(rate_limit.ENV_VAR, '1GB')
    _base(shared_tmp).mkdir()
    _base(shared_tmp).chmod(0o777)  # planted: would be refused
    staging = tmp_path / 'staging'
    rud = RemoteUploaderDownloader(str(tmp_path / 'bucket'), upload_staging_folder=str(staging))
    rud.upload_file(State('chosen'), 'a.bin', _write(tmp_path / 'a.bin', b'a'))
    assert rud.wait_for_uploads(60)
    rud.download_file('a.bin', str(tmp_path / 'a-down.bin'), progress_bar=False)
    rud.shutdown()
    assert os.listdir(_base(shared_tmp)) == []
    (machine,) = [e for e in os.listdir(staging) if e.startswith('.dist_logging-')]
    assert {'node-upload-slots', 'node-upload-rate', 'downloads'} <= set(os.listdir(staging / machine))
    assert _mode(staging / machine) == 0o700


def _write(path, data):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize('forged', ['symlink', 'foreign_owner', 'other_file', 'genuine'])
def test_a_marker_that_is_not_ours_or_does_not_match_means_fetch_again(shared_tmp, tmp_path, forged):
    """The "already downloaded" marker is trusted only as a private file of ours describing the very
    file at the destination; anything else is ignored and the object is fetched again."""
    if forged == 'foreign_owner' and os.getuid() != 0:
        pytest.skip('needs root to create a file owned by another user')
    rud = RemoteUploaderDownloader(str(tmp_path / 'bucket'))
    rud.upload_file(State('mark'), 'obj.bin', _write(tmp_path / 'src.bin', b'fresh object'))
    assert rud.wait_for_uploads(60)
    dest = tmp_path / 'dest.bin'
    dest.write_bytes(b'stale file!!')  # same size as the object
    info = os.stat(dest)
    record = {
        'run': 'mark',
        'uri': rud.get_uri_for_file('obj.bin'),
        'ino': info.st_ino,
        'size': info.st_size,
        'mtime_ns': info.st_mtime_ns,
        'time': 0,
    }
    downloads = _private_dirs.private_dir('downloads')
    marker = os.path.join(downloads, hashlib.sha1(str(dest).encode()).hexdigest()[:24] + '.json')
    if forged == 'symlink':
        elsewhere = tmp_path / 'forged.json'
        elsewhere.write_text(json.dumps(record))
        os.symlink(elsewhere, marker)
    elif forged == 'foreign_owner':
        with open(marker, 'w') as handle:
            json.dump(record, handle)
        os.chmod(marker, 0o600)
        os.chown(marker, 65534, 65534)
    else:
        with open(marker, 'w') as handle:
            json.dump(record if forged == 'genuine' else dict(record, ino=record['ino'] + 1), handle)
    rud.download_file('obj.bin', str(dest), overwrite=True, progress_bar=False)
    # the control: a genuine marker of ours is what lets another process of the run reuse the file
    assert dest.read_bytes() == (b'stale file!!' if forged == 'genuine' else b'fresh object')
    rud.shutdown()


def test_a_checkpoint_writer_given_a_staging_folder_stays_out_of_the_default_base(shared_tmp, tmp_path, monkeypatch):
    """The committer's scratch (reading and writing commit markers) lives next to the chosen staging folder,
    also for a folder committed with upload_folder and for drain: a planted default base is never touched."""
    import torch
    import torch.distributed.checkpoint as dcp

    from dist_logging.checkpoint import CheckpointWriter, finish_commits, latest_checkpoint

    _base(shared_tmp).mkdir()
    _base(shared_tmp).chmod(0o777)  # planted: would be refused
    staging = tmp_path / 'staging'
    writer = CheckpointWriter(str(tmp_path / 'bucket'), upload_staging_folder=str(staging))
    dcp.save({'w': torch.arange(4.0)}, checkpoint_id='run/ckpt/step1', storage_writer=writer, no_dist=True)
    writer.close()
    folder = tmp_path / 'hf'
    folder.mkdir()
    (folder / 'config.json').write_text('{}')
    rud = RemoteUploaderDownloader(str(tmp_path / 'bucket'), upload_staging_folder=str(staging))
    rud.upload_folder(State('chosen'), 'run/ckpt/step2', str(folder))
    rud.shutdown()
    finish_commits(str(staging))
    assert os.listdir(_base(shared_tmp)) == []
    (machine,) = [e for e in os.listdir(staging) if e.startswith('.dist_logging-')]
    assert 'checkpoint-scratch' in os.listdir(staging / machine)
    assert _mode(staging / machine / 'checkpoint-scratch') == 0o700
    # latest_checkpoint has no staging folder: it reads markers through the per-user base, which the knob moves.
    with pytest.raises(PermissionError, match='DIST_LOGGING_TMPDIR'):
        latest_checkpoint(str(tmp_path / 'bucket'), 'run/ckpt')
    monkeypatch.setenv(_private_dirs.ENV_VAR, str(tmp_path / 'mine'))
    assert latest_checkpoint(str(tmp_path / 'bucket'), 'run/ckpt') == 'run/ckpt/step2'
