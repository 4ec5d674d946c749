"""A LocalObjectStore that records every request (to count them and check their order) and can be gated."""

from __future__ import annotations

import threading

from dist_logging.object_store.local import LocalObjectStore


class RecordingStore(LocalObjectStore):
    """Records ``(op, name)`` for upload/download/list/delete/size; uploads of names containing ``block``
    wait for :attr:`gate` (set it to let them through)."""

    def __init__(self, root: str, block: str = ''):
        super().__init__(root)
        self.ops: list[tuple[str, str]] = []
        self.block = block
        self.gate = threading.Event()
        self.fail = ''  # uploads of names containing this fail permanently

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True, owned=False):
        if self.fail and self.fail in object_name:
            raise PermissionError(f'injected: {object_name} is denied')
        if self.block and self.block in object_name:
            assert self.gate.wait(60)
        self.ops.append(('upload', object_name))
        return super().upload_object(object_name, filename, callback, overwrite=overwrite, owned=owned)

    def download_object(self, object_name, filename, overwrite=False, callback=None):
        self.ops.append(('download', object_name))
        return super().download_object(object_name, filename, overwrite, callback)

    def list(self, prefix=''):
        self.ops.append(('list', prefix))
        return super().list(prefix)

    def delete(self, object_name):
        self.ops.append(('delete', object_name))
        return super().delete(object_name)

    def get_object_size(self, object_name):
        self.ops.append(('size', object_name))
        return super().get_object_size(object_name)

    def __reduce__(self):
        raise TypeError('a RecordingStore stays in its process')
