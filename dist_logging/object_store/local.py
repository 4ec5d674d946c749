"""LocalObjectStore: a directory as a bucket (``file:///abs/path`` or a plain path)."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import uuid
from typing import Any, Callable, Optional, Union

from dist_logging import _private_dirs
from dist_logging._files import copy_file
from dist_logging.object_store.base import ObjectInfo, ObjectStore, check_object_name, check_prefix, download_target
from dist_logging.object_store.checksums import ALGORITHM, file_crc32c

__all__ = ['LocalObjectStore']

# The CRC32C of an object's bytes, taken when it was written (read back from the page cache), kept with its inode.
CHECKSUM_XATTR = 'user.dist_logging.crc32c'


class LocalObjectStore(ObjectStore):
    """Objects are files under ``root``; names are relative paths under it.

    Writes are atomic: the bytes go to a temporary file in the target directory
    (copied in the kernel), which is then published with ``os.replace``
    (``overwrite=True``) or ``os.link`` (``overwrite=False``: the kernel refuses an
    existing name, so two processes racing for one name cannot both win). Where the
    filesystem has no hard links, ``overwrite=False`` falls back to
    check-then-replace under a ``filelock`` shared by the processes of the machine.

    ``upload_object(..., owned=True)`` (used by the uploader for its own ``copy=True``
    snapshots) places the file by hard link instead of copying its bytes again, when the file
    is on the bucket's filesystem: the caller hands the file over and deletes its own name
    afterwards, so the object ends as the inode's only name. The link gets the mode, owner
    and group a fresh copy would get here (``0o666 & ~umask``, a setgid folder's group); where
    that cannot be matched (a default ACL on the folder, another owner), or across
    filesystems, the bytes are copied in the kernel as usual.

    Args:
        root: the directory (created if missing).

    Raises:
        ValueError: (at upload/download) a name that escapes ``root``, also through a symbolic
            link inside it (nothing is ever written outside ``root``).
    """

    def __init__(self, root: str):
        self.root = os.path.abspath(os.fspath(root))
        self.bucket_uri = 'file://' + self.root

    @classmethod
    def from_location(cls, location: str, **kwargs) -> 'LocalObjectStore':
        if kwargs:
            raise TypeError(f'LocalObjectStore takes no backend_kwargs, got {sorted(kwargs)}')
        return cls(location)

    def _path(self, name: str, *, write: bool = False) -> str:
        check_object_name(name)
        path = os.path.normpath(os.path.join(self.root, name))
        if os.path.commonpath([self.root, path]) != self.root or path == self.root:
            raise ValueError(f'object name {name!r} escapes the store root {self.root!r}')
        # A symbolic link inside the root must not lead a write (or a read) outside it. Writes
        # resolve the parent folder (the object itself is replaced, never followed); reads resolve
        # the object too. Missing folders are created below the checked one as real folders.
        real_root = os.path.realpath(self.root)
        resolved = os.path.realpath(os.path.dirname(path) if write else path)
        if os.path.commonpath([real_root, resolved]) != real_root:
            raise ValueError(
                f'object name {name!r} resolves to {resolved!r}, outside the store root '
                f'{self.root!r} (through a symbolic link)'
            )
        return path

    def upload_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        callback: Optional[Callable[[int, int], None]] = None,
        *,
        overwrite: bool = True,
        owned: bool = False,
    ) -> None:
        """See :meth:`ObjectStore.upload_object`.

        Args:
            owned: the caller owns ``filename`` and gives it up: nobody writes to it any more and
                the caller deletes it after this returns. The object may then share its inode
                (a hard link, no bytes copied). Never pass it for a file someone else may still
                modify or replace in place.
        """
        name = object_name
        filename = os.fspath(filename)
        path = self._path(name, write=True)
        if not overwrite and os.path.lexists(path):
            raise FileExistsError(f'{self.get_uri(name)} already exists')
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f'.{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp')
        size = _link_as_new_file(filename, tmp) if owned else None
        if size is None:
            # Objects get the user's umask, like `cp`; progress in steps when someone listens.
            size, _ = copy_file(filename, tmp, mode=0o666, progress=callback)
        _record_checksum(tmp)
        try:
            if overwrite:
                os.replace(tmp, path)
            else:
                self._publish_exclusive(tmp, path, name)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
        if callback is not None:
            callback(size, size)

    def object_checksum(self, object_name: str) -> Optional[str]:
        """The CRC32C of the object's bytes taken when it was written (``'crc32c:<base64>'``), kept in the
        file's extended attribute ``user.dist_logging.crc32c``: no byte is read here. None where the
        filesystem keeps no user extended attributes, or for a file this store did not write.

        Raises:
            FileNotFoundError: no such object.
        """
        path = self._path(object_name)
        try:
            value = os.getxattr(path, CHECKSUM_XATTR, follow_symlinks=False).decode()
        except FileNotFoundError:
            raise FileNotFoundError(f'{self.get_uri(object_name)} does not exist') from None
        except (OSError, UnicodeDecodeError):  # no such attribute, or none on this filesystem
            return None
        return value if value.startswith(f'{ALGORITHM}:') else None

    def _publish_exclusive(self, tmp: str, path: str, name: str) -> None:
        try:
            os.link(tmp, path)
            return
        except FileExistsError:
            raise FileExistsError(f'{self.get_uri(name)} already exists') from None
        except OSError:
            pass  # no hard links here: fall back to a lock every process of this machine shares
        import filelock

        digest = hashlib.sha1(path.encode()).hexdigest()[:20]
        # Per user (a private folder, see dist_logging._private_dirs): a lock folder shared with
        # other users would let them block or redirect our uploads.
        lock_dir = _private_dirs.private_dir('locks')
        with filelock.FileLock(os.path.join(lock_dir, digest + '.lock'), mode=0o600):
            if os.path.lexists(path):
                raise FileExistsError(f'{self.get_uri(name)} already exists')
            os.replace(tmp, path)

    def download_object(
        self,
        object_name: str,
        filename: Union[str, 'os.PathLike[str]'],
        overwrite: bool = False,
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        name = object_name
        filename = os.fspath(filename)
        path = self._path(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f'{self.get_uri(name)} does not exist')
        if not overwrite and os.path.lexists(filename):
            raise FileExistsError(f'{filename} exists; pass overwrite=True to replace it')
        with download_target(filename, overwrite) as tmp:
            size, _ = copy_file(path, tmp, mode=0o666)  # the user's umask decides, like `cp`
        if callback is not None:
            callback(size, size)

    def read_range(self, object_name: str, offset: int, buffer: Any) -> None:
        """``pread`` ``len(buffer)`` bytes from ``offset`` into ``buffer`` (see :meth:`ObjectStore.read_range`)."""
        view = memoryview(buffer).cast('B')
        if offset < 0:
            raise ValueError(f'read_range: negative offset {offset}')
        path = self._path(object_name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, 'O_CLOEXEC', 0))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(f'{self.get_uri(object_name)} does not exist') from None
        try:
            done = 0
            while done < len(view):
                count = os.preadv(fd, [view[done:]], offset + done)
                if not count:
                    raise EOFError(
                        f'{self.get_uri(object_name)} ends before byte {offset + len(view)} (at {offset + done})'
                    )
                done += count
        finally:
            os.close(fd)

    def get_object_size(self, object_name: str) -> int:
        name = object_name
        path = self._path(name)
        try:
            return os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f'{self.get_uri(name)} does not exist') from None

    def get_uri(self, object_name: str) -> str:
        return 'file://' + os.path.join(self.root, object_name)

    def list(self, prefix: str = '') -> 'list[ObjectInfo]':
        check_prefix(prefix)
        # Walk only below the deepest folder the prefix names (a whole bucket is not scanned for one run).
        folder = prefix.rsplit('/', 1)[0] if '/' in prefix else ''
        start = os.path.normpath(os.path.join(self.root, folder))
        if os.path.commonpath([self.root, start]) != self.root:
            raise ValueError(f'prefix {prefix!r} escapes the store root {self.root!r}')
        found = []
        for directory, subfolders, files in os.walk(start):
            subfolders.sort()
            relative = os.path.relpath(directory, self.root)
            for entry in files:
                if being_written(entry):
                    continue
                name = entry if relative == '.' else f'{relative}/{entry}'.replace(os.sep, '/')
                if not name.startswith(prefix):
                    continue
                try:
                    info = os.lstat(os.path.join(directory, entry))
                except FileNotFoundError:
                    continue  # deleted while we listed
                if stat.S_ISREG(info.st_mode):
                    found.append(ObjectInfo(name, info.st_size))
        return sorted(found)

    def delete(self, object_name: str) -> None:
        path = self._path(object_name, write=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            raise ValueError(f'{self.get_uri(object_name)} is a folder, not an object') from None
        # Folders exist only to hold objects: drop the ones this left empty (as a bucket has none).
        folder = os.path.dirname(path)
        while folder != self.root and os.path.commonpath([self.root, folder]) == self.root:
            try:
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)

    def __reduce__(self):
        return (type(self), (self.root,))


def being_written(entry: str) -> bool:
    """Whether the file name ``entry`` is one this store writes before publishing (never listed as an object).

    Uploads go to ``.<name>.<hex>.tmp`` and are renamed into place; a link's attribute probe is
    ``.<name>.<hex>.tmp.probe``. The one rule :meth:`LocalObjectStore.list` (hence ``list_objects``) applies.
    """
    return entry.startswith('.') and entry.endswith(('.tmp', '.probe'))


_LINK_FALLBACK = {
    errno.EXDEV,
    errno.EPERM,
    errno.EACCES,
    errno.EMLINK,
    errno.ENOSYS,
    errno.EOPNOTSUPP,
    getattr(errno, 'ENOTSUP', errno.EOPNOTSUPP),
}


def _link_as_new_file(src: str, tmp: str) -> Optional[int]:
    """Hard-link ``src`` as ``tmp`` with the mode, owner and group a new file created at ``tmp`` gets.

    A probe file is created next to ``tmp`` the way a copy would be (``0o666`` through the umask,
    the folder's default ACL and setgid group), and the link is given the probe's attributes, so
    an object placed by link cannot be told from a copied one. Returns the size, or None when a
    link cannot stand for a copy here (another filesystem, links not allowed, a default ACL, a
    different owner, a group that cannot be set): the caller copies then.
    """
    if not hasattr(os, 'link'):
        return None
    probe = tmp + '.probe'
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_CLOEXEC', 0), 0o666)
    except OSError:
        return None
    try:
        want = os.fstat(fd)
        acl = False
        if hasattr(os, 'listxattr'):
            try:
                acl = any(attr.startswith('system.posix_acl') for attr in os.listxattr(fd))
            except OSError:
                acl = False
    finally:
        os.close(fd)
        os.unlink(probe)
    src_stat = os.stat(src)
    if acl or src_stat.st_uid != want.st_uid:
        return None
    try:
        os.link(src, tmp)
    except OSError as exc:
        if exc.errno in _LINK_FALLBACK:
            return None
        raise
    try:
        if src_stat.st_gid != want.st_gid:
            os.chown(tmp, -1, want.st_gid)
        os.chmod(tmp, stat.S_IMODE(want.st_mode))
    except OSError:
        os.unlink(tmp)
        return None
    return src_stat.st_size


def _record_checksum(path: str) -> None:
    """Keep the CRC32C of the file just written at ``path`` in its extended attribute (before it is published,
    so an object is never seen without it). Where user extended attributes are not supported, nothing is kept:
    :meth:`LocalObjectStore.object_checksum` then answers None and checkpoints are checked when loaded."""
    try:
        os.setxattr(path, CHECKSUM_XATTR, file_crc32c(path).encode(), follow_symlinks=False)
    except OSError:
        pass
