"""Object stores for upload tests: a real LocalObjectStore wrapped to be slow, flaky, or deadly.

Everything that must be seen across processes (attempt counts, completed uploads)
is kept in files under ``state_dir``, so the wrapper works the same in upload worker
processes and torchrun ranks. Import it as ``upload._stores`` (``tests/`` is on sys.path).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from typing import Callable, Optional

from dist_logging.object_store import LocalObjectStore, ObjectStore


def _key(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:16]


class TestStore(ObjectStore):
    """A LocalObjectStore at ``root`` with test hooks.

    Args:
        root: the bucket directory.
        state_dir: where attempt counters and the upload log live.
        fail_first: the first this many attempts per name fail with ``error``.
        error: ``'reset'`` (ConnectionResetError, transient), ``'denied'`` (PermissionError,
            permanent), ``'exit'`` (SystemExit: kills a worker thread), ``'kill'`` (SIGKILLs the
            process running the upload: only for worker processes).
        delay: seconds each attempt sleeps before uploading.
        gate: a path; while it exists, attempts wait (up to 60 s) before uploading.
        fail_prefix: only names starting with this are subject to ``fail_first``.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        root: str,
        state_dir: str,
        *,
        fail_first: int = 0,
        error: str = 'reset',
        delay: float = 0.0,
        gate: Optional[str] = None,
        fail_prefix: str = '',
    ):
        self.inner = LocalObjectStore(root)
        self.root = self.inner.root
        self.state_dir = state_dir
        self.fail_first = fail_first
        self.error = error
        self.delay = delay
        self.gate = gate
        self.fail_prefix = fail_prefix
        os.makedirs(state_dir, exist_ok=True)

    # ---- bookkeeping shared across processes
    def _bump(self, kind: str, name: str) -> int:
        path = os.path.join(self.state_dir, f'{kind}-{_key(name)}')
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b'x')
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def count(self, kind: str, name: str) -> int:
        try:
            return os.path.getsize(os.path.join(self.state_dir, f'{kind}-{_key(name)}'))
        except FileNotFoundError:
            return 0

    def attempts(self, name: str) -> int:
        return self.count('attempt', name)

    def successes(self, name: str) -> int:
        return self.count('landed', name)

    def downloads(self, name: str) -> int:
        return self.count('download', name)

    # ---- ObjectStore
    def upload_object(
        self, name: str, filename: str, callback: Optional[Callable[[int], None]] = None, *, overwrite: bool = True
    ) -> None:
        attempt = self._bump('attempt', name)
        started = time.time()
        if self.delay:
            time.sleep(self.delay)
        deadline = time.monotonic() + 60
        while self.gate and os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        if attempt <= self.fail_first and name.startswith(self.fail_prefix):
            if self.error == 'reset':
                raise ConnectionResetError(f'connection reset (attempt {attempt})')
            if self.error == 'denied':
                raise PermissionError(f'access denied (attempt {attempt})')
            if self.error == 'exit':
                raise SystemExit(f'worker exits (attempt {attempt})')
            if self.error == 'kill':
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(self.error)
        self.inner.upload_object(name, filename, callback, overwrite=overwrite)
        self._bump('landed', name)
        with open(os.path.join(self.state_dir, 'intervals'), 'a') as log:  # one short line: atomic append
            log.write(f'{started} {time.time()}\n')

    def max_concurrency(self) -> int:
        """The most uploads that were ever in ``upload_object`` at once (from the interval log)."""
        events = []
        with open(os.path.join(self.state_dir, 'intervals')) as log:
            for line in log:
                start, end = map(float, line.split())
                events += [(start, 1), (end, -1)]
        running = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            running += delta
            peak = max(peak, running)
        return peak

    def download_object(
        self, name: str, filename: str, overwrite: bool = False, callback: Optional[Callable[[int], None]] = None
    ) -> None:
        self._bump('download', name)
        if self.delay:
            time.sleep(self.delay)
        self.inner.download_object(name, filename, overwrite, callback)

    def get_object_size(self, name: str) -> int:
        return self.inner.get_object_size(name)

    def get_uri(self, name: str) -> str:
        return self.inner.get_uri(name)

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.root, name), 'rb') as handle:
            return handle.read()
