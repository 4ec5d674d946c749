"""Object stores written the way Composer's are, for tests: only Composer's method names and signatures.

``FolderStore`` is a Composer-style subclass whose only change from a store written for Composer
is its import (``dist_logging.object_store`` instead of ``composer.utils.object_store``): its
``upload_object(object_name, filename, callback=None, **kwargs)`` has no ``overwrite``.
``PlainFolderStore`` drops the ``**kwargs`` (like most hand-written Composer stores), and
``DuckFolderStore`` subclasses nothing of ours at all (no ``close``, its own transient error class).

Writes go straight to the final path (not atomic), and a failing attempt first leaves a partial
object, as a real upload cut off half-way would. Attempt counts live in files, so they are seen
across upload worker processes. Import it as ``object_store._composer_store``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from dist_logging.object_store import ObjectStore, ObjectStoreTransientError


class FolderStore(ObjectStore):
    """Objects are files in ``folder``.

    Args:
        folder: the bucket folder.
        transient_failures: the first this many upload attempts per object write half the file,
            then raise ``ObjectStoreTransientError``.
        chunk: bytes per progress callback.
    """

    transient_error: type = ObjectStoreTransientError

    def __init__(self, folder: str, transient_failures: int = 0, chunk: int = 4):
        self.folder = str(folder)
        self.transient_failures = transient_failures
        self.chunk = chunk
        self.closed = False
        os.makedirs(os.path.join(self.folder, '.attempts'), exist_ok=True)

    # ------------------------------------------------------------------ test helpers
    def attempts(self, object_name: str) -> int:
        try:
            return os.path.getsize(self._counter(object_name))
        except FileNotFoundError:
            return 0

    def read(self, object_name: str) -> bytes:
        with open(self._path(object_name), 'rb') as handle:
            return handle.read()

    def _counter(self, object_name: str) -> str:
        return os.path.join(self.folder, '.attempts', object_name.replace('/', '__'))

    def _path(self, object_name: str) -> str:
        return os.path.join(self.folder, object_name)

    def _copy(
        self, source: str, target: str, callback: Optional[Callable[[int, int], None]], limit: Optional[int] = None
    ) -> None:
        total = os.path.getsize(source)
        done = 0
        os.makedirs(os.path.dirname(target) or '.', exist_ok=True)
        with open(source, 'rb') as src, open(target, 'wb') as dst:
            while limit is None or done < limit:
                data = src.read(self.chunk)
                if not data:
                    break
                dst.write(data)
                done += len(data)
                if callback is not None:
                    callback(done, total)
        if callback is not None and total == 0:
            callback(0, 0)

    # ------------------------------------------------------------------ Composer's ObjectStore
    def get_uri(self, object_name: str) -> str:
        return f'folder://{object_name}'

    def upload_object(
        self, object_name: str, filename: Any, callback: Optional[Callable[[int, int], None]] = None, **kwargs: Any
    ) -> None:
        with open(self._counter(object_name), 'ab') as counter:
            counter.write(b'x')
        if self.attempts(object_name) <= self.transient_failures:
            self._copy(str(filename), self._path(object_name), None, limit=os.path.getsize(filename) // 2)
            raise self.transient_error(f'throttled while uploading {object_name}')
        self._copy(str(filename), self._path(object_name), callback)

    def get_object_size(self, object_name: str) -> int:
        try:
            return os.stat(self._path(object_name)).st_size
        except FileNotFoundError:
            raise FileNotFoundError(f'{self.get_uri(object_name)} not found') from None

    def download_object(
        self,
        object_name: str,
        filename: Any,
        overwrite: bool = False,
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        if os.path.exists(filename) and not overwrite:
            raise FileExistsError(f'{filename} exists')
        self.get_object_size(object_name)
        self._copy(self._path(object_name), str(filename), callback)

    def list_objects(self, prefix: Optional[str] = None) -> list[str]:
        found = []
        for root, dirs, files in os.walk(self.folder):
            dirs[:] = [d for d in dirs if d != '.attempts']
            found += [os.path.relpath(os.path.join(root, f), self.folder).replace(os.sep, '/') for f in files]
        return sorted(n for n in found if n.startswith(prefix or ''))

    def close(self) -> None:
        self.closed = True


class PlainFolderStore(FolderStore):
    """Like FolderStore, with Composer's test-store signature: no ``**kwargs``."""

    def upload_object(
        self,
        object_name: str,
        filename: Any,  # type: ignore[override]
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        super().upload_object(object_name, filename, callback)


# What a store written against Composer raises: not our class, but of Composer's name (as
# composer.utils.object_store.ObjectStoreTransientError would be), which the uploader recognizes.
ForeignTransientError = type('ObjectStoreTransientError', (RuntimeError,), {'__module__': 'composer_like'})


class DuckFolderStore:
    """A Composer-style store that subclasses nothing of ours: four methods, no close()."""

    def __init__(self, folder: str, transient_failures: int = 0):
        self._inner = FolderStore(folder, transient_failures)
        self._inner.transient_error = ForeignTransientError

    def get_uri(self, object_name: str) -> str:
        return self._inner.get_uri(object_name)

    def upload_object(
        self, object_name: str, filename: Any, callback: Optional[Callable[[int, int], None]] = None, **kwargs: Any
    ) -> None:
        self._inner.upload_object(object_name, filename, callback)

    def get_object_size(self, object_name: str) -> int:
        return self._inner.get_object_size(object_name)

    def download_object(
        self,
        object_name: str,
        filename: Any,
        overwrite: bool = False,
        callback: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        self._inner.download_object(object_name, filename, overwrite, callback)

    def attempts(self, object_name: str) -> int:
        return self._inner.attempts(object_name)

    def read(self, object_name: str) -> bytes:
        return self._inner.read(object_name)


__all__ = ['FolderStore', 'PlainFolderStore', 'DuckFolderStore', 'ForeignTransientError']
