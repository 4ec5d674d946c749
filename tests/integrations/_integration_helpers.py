"""Shared by the framework scenarios (run inside the launched processes) and their tests."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Iterator

from dist_logging.object_store.local import LocalObjectStore

# Every torch.distributed function that communicates (or creates a group, itself a collective).
COLLECTIVES = (
    'all_reduce',
    'all_gather',
    'all_gather_object',
    'all_gather_into_tensor',
    'broadcast',
    'broadcast_object_list',
    'barrier',
    'monitored_barrier',
    'reduce',
    'reduce_scatter',
    'reduce_scatter_tensor',
    'gather',
    'gather_object',
    'scatter',
    'scatter_object_list',
    'all_to_all',
    'all_to_all_single',
    'send',
    'recv',
    'isend',
    'irecv',
    'new_group',
)


class CollectiveCounter:
    """Wraps torch.distributed's collectives; counts the calls made while :meth:`counting` is active."""

    def __init__(self) -> None:
        import torch.distributed as torch_dist

        self.calls: list[str] = []
        self._active = 0
        for name in COLLECTIVES:
            original = getattr(torch_dist, name, None)
            if original is not None:
                setattr(torch_dist, name, self._wrap(name, original))

    def _wrap(self, name, original):
        def wrapper(*args, **kwargs):
            if self._active:
                self.calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1


class RecordingLocalStore(LocalObjectStore):
    """A local bucket that also appends ``{"rank", "name", "size"}`` per upload to
    ``$OUT_DIR/uploads-rank{RANK}.jsonl``.

    The upload workers run in the uploading process, so the rank in the record is the rank that uploaded.
    """

    def upload_object(self, object_name, filename, callback=None, *, overwrite=True, **kwargs):
        super().upload_object(object_name, filename, callback=callback, overwrite=overwrite, **kwargs)
        from dist_logging import dist

        rank = dist.get_global_rank()
        record = {'rank': rank, 'name': object_name, 'overwrite': overwrite}
        out = pathlib.Path(os.environ['OUT_DIR']) / f'uploads-rank{rank}.jsonl'
        with open(out, 'a') as handle:
            handle.write(json.dumps(record) + '\n')


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def upload_records(out_dir: pathlib.Path) -> list[dict]:
    records = []
    for path in sorted(out_dir.glob('uploads-rank*.jsonl')):
        records += read_jsonl(path)
    return records


def _recording_remote_class():
    from dist_logging.destinations.remote import RemoteUploaderDownloader

    class RecordingRemote(RemoteUploaderDownloader):
        """A RemoteUploaderDownloader onto a :class:`RecordingLocalStore`, usable from a YAML config
        as ``type: '_integration_helpers:RecordingRemote'``."""

        def __init__(self, bucket: str, upload_staging_folder: str = None, ranks: str = 'all'):
            super().__init__(
                object_store=RecordingLocalStore(bucket), upload_staging_folder=upload_staging_folder, ranks=ranks
            )

    return RecordingRemote


RecordingRemote = _recording_remote_class()


def _stateful_destination_class():
    from dist_logging.destination import LoggerDestination, check_state

    class StatefulDestination(LoggerDestination):
        """A tracker-like destination for configs (``type: '_integration_helpers:StatefulDestination'``): it
        opens a run at init (a new id unless a state was loaded) and saves the id in its state."""

        opened: list = []  # (run id, resumed?) per init, across instances

        def __init__(self):
            super().__init__()
            self.run_id = None
            self._saved = None

        def init(self, state, logger):
            self.run_id = self._saved or f'run-{len(self.opened)}'
            self.opened.append((self.run_id, self._saved is not None))

        def state_dict(self):
            return {'run_id': self.run_id}

        def load_state_dict(self, state):
            self._saved = check_state(self, state, ('run_id',)).get('run_id')

    return StatefulDestination


StatefulDestination = _stateful_destination_class()
