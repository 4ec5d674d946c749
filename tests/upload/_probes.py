"""Local stores that report, from inside the worker running the upload, how it ran and how it placed the object.

Import as ``upload._probes`` (``tests/`` is on sys.path); picklable, so they work in worker processes.
"""

from __future__ import annotations

import json
import os
import threading

from dist_logging.object_store import LocalObjectStore
from dist_logging.upload.priority import get_ioprio, thread_nice, thread_policy


class PriorityProbeStore(LocalObjectStore):
    """Writes ``<state_dir>/<name>.json`` with the nice value, scheduling policy and I/O priority of
    the thread that uploads."""

    def __init__(self, root: str, state_dir: str):
        super().__init__(root)
        self.state_dir = state_dir
        os.makedirs(state_dir, exist_ok=True)

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True, owned=False):
        seen = {
            'pid': os.getpid(),
            'tid': threading.get_native_id(),
            'nice': thread_nice(),
            'policy': thread_policy(),
            'ioprio': get_ioprio(),
        }
        with open(os.path.join(self.state_dir, object_name.replace('/', '_') + '.json'), 'w') as handle:
            json.dump(seen, handle)
        return super().upload_object(object_name, filename, callback, overwrite=overwrite, owned=owned)

    def __reduce__(self):
        return (type(self), (self.root, self.state_dir))


class PlacementProbeStore(LocalObjectStore):
    """Records, per object, the inode of the file handed to it, whether ``owned`` was passed, and the
    object's inode right after it landed (while the uploader still holds the file: no race)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.placed: dict[str, dict] = {}
        self._lock = threading.Lock()

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True, owned=False):
        source = os.stat(filename)
        super().upload_object(object_name, filename, callback, overwrite=overwrite, owned=owned)
        landed = os.stat(os.path.join(self.root, object_name))
        with self._lock:
            self.placed[object_name] = {
                'owned': owned,
                'source_ino': source.st_ino,
                'object_ino': landed.st_ino,
                'object_nlink': landed.st_nlink,
            }
