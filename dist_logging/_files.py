"""Snapshots of files at the moment of a call: reflink clone, in-kernel copy, or hard link.

``copy_file`` never moves bytes through Python: it tries, in order,

1. a reflink clone (``FICLONE`` ioctl; btrfs, XFS with reflink, bcachefs, ...): O(1),
   copy-on-write, so the caller may rewrite its file at once;
2. ``os.copy_file_range``: the kernel copies (and on NFS/CIFS servers may copy
   server-side);
3. ``os.sendfile``: also in the kernel, for old kernels and odd filesystems.

A method that fails with "not supported here" is remembered per pair of devices
and not tried again, so the common case costs one syscall per step.

``link_file`` is the ``copy=False`` hand-over: a hard link (O(1) at any size).
Across filesystems (``EXDEV``) or where links are not allowed it returns
``None``; the caller then records the original path in place, which is still O(1)
and relies on the caller's promise not to modify or delete the file.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid
from typing import Callable, Optional

__all__ = ['copy_file', 'link_file', 'links_work', 'FICLONE']

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h

# errno values that mean "this method does not work between these files", not "the copy failed".
_UNSUPPORTED = {
    errno.EXDEV,
    errno.EINVAL,
    errno.ENOSYS,
    errno.EOPNOTSUPP,
    errno.ENOTTY,
    errno.EBADF,
    errno.EPERM,
    errno.ETXTBSY,
    getattr(errno, 'ENOTSUP', errno.EOPNOTSUPP),
}
_LINK_UNSUPPORTED = {
    errno.EXDEV,
    errno.EPERM,
    errno.EOPNOTSUPP,
    errno.EMLINK,
    errno.ENOSYS,
    getattr(errno, 'ENOTSUP', errno.EOPNOTSUPP),
}

_no_clone: set[tuple[int, int]] = set()
_no_copy_range: set[tuple[int, int]] = set()
_lock = threading.Lock()

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not Linux/Unix
    _fcntl = None  # type: ignore[assignment]

_HAS_COPY_RANGE = hasattr(os, 'copy_file_range')
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_CLOEXEC', 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, 'O_CLOEXEC', 0)
_PROGRESS_STEP = 8 << 20


def _remember(cache: set, key: tuple[int, int]) -> None:
    with _lock:
        cache.add(key)


def copy_file(
    src: str,
    dst: str,
    *,
    fsync: bool = False,
    dst_dev: Optional[int] = None,
    mode: int = 0o600,
    progress: Optional[Callable[[int, int], None]] = None,
) -> tuple[int, str]:
    """Copy ``src`` to the new file ``dst`` as it is now, without a Python read/write loop.

    Args:
        src: the file to snapshot.
        dst: the new file (must not exist).
        fsync: flush the copy to stable storage before returning.
        dst_dev: ``st_dev`` of the destination's filesystem, when the caller knows it (saves a syscall).
        mode: the new file's permission bits, masked by the process umask (0o600: private
            snapshots; 0o666 gives what ``cp`` would, e.g. for objects in a local bucket).
        progress: called as ``progress(copied_so_far, size)`` after every 8 MiB copied (and once
            for a reflink); the copy then goes in 8 MiB steps, so a slow callback paces it.

    Returns:
        ``(size, method)``: the bytes copied and ``'reflink'``, ``'copy_file_range'`` or ``'sendfile'``.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        FileExistsError: ``dst`` exists.
        OSError: the copy failed (e.g. the disk is full); ``dst`` is removed.
    """
    fin = os.open(src, _READ_FLAGS)
    try:
        stat = os.fstat(fin)
        size = stat.st_size
        fout = os.open(dst, _OPEN_FLAGS, mode)
        try:
            method = _copy_fds(fin, fout, size, stat.st_dev, dst_dev, progress)
            if fsync:
                os.fsync(fout)
        except BaseException:
            os.close(fout)
            try:
                os.unlink(dst)
            except OSError:
                pass
            raise
        os.close(fout)
    finally:
        os.close(fin)
    return size, method


def _copy_fds(
    fin: int,
    fout: int,
    size: int,
    src_dev: int,
    dst_dev: Optional[int],
    progress: Optional[Callable[[int, int], None]] = None,
) -> str:
    if size == 0:
        return 'copy_file_range'
    step = size if progress is None else _PROGRESS_STEP
    key = (src_dev, os.fstat(fout).st_dev if dst_dev is None else dst_dev)
    if _fcntl is not None and key not in _no_clone:
        try:
            _fcntl.ioctl(fout, FICLONE, fin)
            if progress is not None:
                progress(size, size)
            return 'reflink'
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            _remember(_no_clone, key)
    if _HAS_COPY_RANGE and key not in _no_copy_range:
        copied = 0
        try:
            while copied < size:
                n = os.copy_file_range(fin, fout, min(step, size - copied))
                if n == 0:  # the source shrank meanwhile: the snapshot is what was there
                    break
                copied += n
                if progress is not None:
                    progress(copied, size)
            return 'copy_file_range'
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED or copied:
                raise
            _remember(_no_copy_range, key)
    copied = 0
    while copied < size:
        n = os.sendfile(fout, fin, copied, min(step, size - copied))
        if n == 0:
            break
        copied += n
        if progress is not None:
            progress(copied, size)
    return 'sendfile'


def link_file(src: str, dst: str) -> bool:
    """Hard-link ``src`` as ``dst`` (the ``copy=False`` hand-over).

    Returns:
        True when linked; False when the filesystem cannot link them (different
        filesystems, links not permitted), in which case nothing was created.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        FileExistsError: ``dst`` exists.
    """
    try:
        os.link(src, dst)
        return True
    except OSError as exc:
        if exc.errno in _LINK_UNSUPPORTED:
            return False
        raise


def links_work(src_dir: str, dst_dir: str) -> bool:
    """Whether a file in ``src_dir`` can be hard-linked into ``dst_dir`` (same filesystem, links allowed).

    Raises:
        FileNotFoundError: a folder does not exist.
    """
    probe = os.path.join(src_dir, f'.link-probe-{uuid.uuid4().hex[:8]}')
    target = os.path.join(dst_dir, os.path.basename(probe))
    with open(probe, 'wb'):
        pass
    try:
        os.link(probe, target)
    except OSError:
        return False
    else:
        os.unlink(target)
        return True
    finally:
        os.unlink(probe)


def fsync_dir(path: str) -> None:
    """fsync a directory so the names created in it survive a machine crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None
