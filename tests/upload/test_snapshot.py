"""Snapshots: the bytes of the moment of the call, copied in the kernel or hard-linked."""

from __future__ import annotations

import errno
import os

import pytest

from dist_logging import _files as snapshot
from dist_logging._files import copy_file, link_file

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize('size', [0, 1, 4096, 3 * 1024 * 1024 + 7])
def test_copy_is_independent_of_the_source(tmp_path, size):
    src, dst = tmp_path / 'src', tmp_path / 'dst'
    data = os.urandom(size)
    src.write_bytes(data)
    copied, method = copy_file(str(src), str(dst))
    assert copied == size and method in ('reflink', 'copy_file_range', 'sendfile')
    src.write_bytes(b'changed')
    assert dst.read_bytes() == data
    src.unlink()
    assert dst.read_bytes() == data
    assert oct(dst.stat().st_mode & 0o777) == oct(0o600)


def test_copy_refuses_existing_destination_and_missing_source(tmp_path):
    (tmp_path / 'src').write_bytes(b'a')
    (tmp_path / 'dst').write_bytes(b'b')
    with pytest.raises(FileExistsError):
        copy_file(str(tmp_path / 'src'), str(tmp_path / 'dst'))
    assert (tmp_path / 'dst').read_bytes() == b'b'
    with pytest.raises(FileNotFoundError):
        copy_file(str(tmp_path / 'missing'), str(tmp_path / 'other'))


def test_copy_falls_back_to_sendfile(tmp_path, monkeypatch):
    def unsupported(*args, **kwargs):
        raise OSError(errno.EXDEV, 'cross-device')

    monkeypatch.setattr(snapshot.os, 'copy_file_range', unsupported)
    monkeypatch.setattr(snapshot, '_no_copy_range', set())
    monkeypatch.setattr(snapshot, '_no_clone', set())
    (tmp_path / 'src').write_bytes(b'z' * 100000)
    size, method = copy_file(str(tmp_path / 'src'), str(tmp_path / 'dst'))
    assert (size, method) == (100000, 'sendfile')
    assert (tmp_path / 'dst').read_bytes() == b'z' * 100000


def test_failed_copy_leaves_no_partial_file(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, 'no space left')

    monkeypatch.setattr(snapshot.os, 'copy_file_range', disk_full)
    monkeypatch.setattr(snapshot, '_no_clone', {(os.stat(tmp_path).st_dev,) * 2})
    (tmp_path / 'src').write_bytes(b'z' * 10)
    with pytest.raises(OSError):
        copy_file(str(tmp_path / 'src'), str(tmp_path / 'dst'))
    assert not (tmp_path / 'dst').exists()


def test_link_and_its_fallback(tmp_path, monkeypatch):
    src = tmp_path / 'src'
    src.write_bytes(b'payload')
    assert link_file(str(src), str(tmp_path / 'link'))
    src.unlink()  # the hand-over keeps the bytes alive
    assert (tmp_path / 'link').read_bytes() == b'payload'

    def cross_device(a, b):
        raise OSError(errno.EXDEV, 'Invalid cross-device link')

    monkeypatch.setattr(snapshot.os, 'link', cross_device)
    assert link_file(str(tmp_path / 'link'), str(tmp_path / 'other')) is False
    assert not (tmp_path / 'other').exists()
