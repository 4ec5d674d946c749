"""Helpers shared by the reliability tests: files with known digests, bucket listings, staging sizes."""

from __future__ import annotations

import hashlib
import os
import pathlib
import threading
from typing import Iterable, Optional

TESTS_DIR = pathlib.Path(__file__).resolve().parents[1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: os.PathLike | str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def write(path: pathlib.Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def bucket_objects(root: os.PathLike | str) -> dict[str, str]:
    """Object name -> sha256 of every object under a LocalObjectStore root (temp files excluded)."""
    root = pathlib.Path(root)
    found = {}
    for path in root.rglob('*'):
        if path.is_file() and not (path.name.startswith('.') and path.name.endswith('.tmp')):
            found[path.relative_to(root).as_posix()] = file_sha256(path)
    return found


def temp_leftovers(root: os.PathLike | str) -> list[str]:
    return sorted(p.name for p in pathlib.Path(root).rglob('.*.tmp'))


def tree_bytes(folder: os.PathLike | str) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


class PeakSampler:
    """Samples the bytes under some folders on a thread; ``peak`` is the largest total seen."""

    def __init__(self, folders: Iterable[str], interval: float = 0.005):
        self.folders = list(folders)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> 'PeakSampler':
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(tree_bytes(f) for f in self.folders))
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
