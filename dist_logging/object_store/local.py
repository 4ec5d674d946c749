"""LocalObjectStore: a directory as a bucket (``file:///abs/path`` or a plain path)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from typing import Callable, Optional, Union

from dist_logging.object_store import ObjectStore, check_object_name, download_target
from dist_logging.upload.snapshot import copy_file

__all__ = ['LocalObjectStore']


class LocalObjectStore(ObjectStore):
    """Objects are files under ``root``; names are relative paths under it.

    Writes are atomic: the bytes go to a temporary file in the target directory
    (copied in the kernel), which is then published with ``os.replace``
    (``overwrite=True``) or ``os.link`` (``overwrite=False``: the kernel refuses an
    existing name, so two processes racing for one name cannot both win). Where the
    filesystem has no hard links, ``overwrite=False`` falls back to
    check-then-replace under a ``filelock`` shared by the processes of the machine.

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
            raise ValueError(f'object name {name!r} resolves to {resolved!r}, outside the store root '
                             f'{self.root!r} (through a symbolic link)')
        return path

    def upload_object(self, object_name: str, filename: Union[str, 'os.PathLike[str]'],
                      callback: Optional[Callable[[int, int], None]] = None, *, overwrite: bool = True) -> None:
        name = object_name
        filename = os.fspath(filename)
        path = self._path(name, write=True)
        if not overwrite and os.path.lexists(path):
            raise FileExistsError(f'{self.get_uri(name)} already exists')
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f'.{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp')
        size, _ = copy_file(filename, tmp, mode=0o666)  # objects get the user's umask, like `cp`
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
        lock_dir = os.path.join(tempfile.gettempdir(), 'dist_logging-locks')
        os.makedirs(lock_dir, exist_ok=True)
        with filelock.FileLock(os.path.join(lock_dir, digest + '.lock')):
            if os.path.lexists(path):
                raise FileExistsError(f'{self.get_uri(name)} already exists')
            os.replace(tmp, path)

    def download_object(self, object_name: str, filename: Union[str, 'os.PathLike[str]'], overwrite: bool = False,
                        callback: Optional[Callable[[int, int], None]] = None) -> None:
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

    def get_object_size(self, object_name: str) -> int:
        name = object_name
        path = self._path(name)
        try:
            return os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f'{self.get_uri(name)} does not exist') from None

    def get_uri(self, object_name: str) -> str:
        return 'file://' + os.path.join(self.root, object_name)

    def __reduce__(self):
        return (type(self), (self.root,))
