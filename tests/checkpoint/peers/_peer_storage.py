"""The one place where the ported peer tests build their storage layer.

PyTorch's ``test/distributed/checkpoint`` tests write with ``FileSystemWriter(path, **options)`` and read
with ``FileSystemReader(path, **options)``; s3torchconnector's with ``S3StorageWriter(region, path,
**options)``. The ports keep each test's state dicts, planners, collectives and assertions, and call
:meth:`Storage.writer` / :meth:`Storage.reader` (or :meth:`Storage.save` / :meth:`Storage.load`) instead,
with the same options. What differs by design (see ``docs/checkpoints.md``, "Differences from torch's
writer"):

* a checkpoint is a ``checkpoint_id`` inside a bucket, passed to ``dcp.save``/``dcp.load``, not a
  directory given to the writer;
* ``dcp.save`` returns once the shards are queued for upload; the checkpoint is committed (and
  readable) after the coordinator's ``wait_for_commits()`` (or ``close()``). :meth:`Storage.save`
  waits for the commit and then meets the other ranks (a barrier), which is where a torch test's
  ``dcp.save`` would have returned.

Constructor signatures of ``CheckpointWriter``/``CheckpointReader`` are used only here.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, Optional

import pytest
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter


class Storage:
    """A bucket (a local folder or a bucket on a moto S3 server) and how to build writers and readers on it.

    Args:
        kind: ``'local'`` or ``'s3'``.
        root: a local folder of the test (the local bucket lives under it, and the caches).
        endpoint: the S3 endpoint (``kind='s3'``).
        bucket: the S3 bucket name (``kind='s3'``).
    """

    def __init__(self, kind: str, root: str, endpoint: Optional[str] = None, bucket: Optional[str] = None):
        if kind not in ('local', 's3'):
            raise ValueError(f'kind must be local or s3, got {kind!r}')
        self.kind = kind
        self.root = root
        if kind == 'local':
            self.uri = os.path.join(root, 'bucket')
            os.makedirs(self.uri, exist_ok=True)
            self.backend_kwargs: Optional[dict] = None
        else:
            self.uri = f's3://{bucket}/peers'
            self.backend_kwargs = {'endpoint_url': endpoint}
        self._writers: dict[str, CheckpointWriter] = {}
        self._readers: dict[str, CheckpointReader] = {}

    def sample(self, combinations: list) -> list:
        """The combinations a many-combination case runs here: all of them on the local bucket; on S3 every
        third (each S3 save and load costs seconds on moto and a shared 2-core VM; what the combinations vary,
        the planner's resharding, does not depend on the store, which the third still exercises)."""
        return combinations if self.kind == 'local' else combinations[::3]

    def fresh_id(self, name: str = 'ckpt') -> str:
        """A checkpoint id no other test used (what ``tempfile.mkdtemp()`` gives torch's tests)."""
        return f'{name}-{uuid.uuid4().hex[:8]}'

    def writer(self, **options: Any) -> CheckpointWriter:
        """A writer with torch's ``FileSystemWriter`` options (``thread_count``, ``overwrite``, ``_extensions``,
        ...)."""
        return CheckpointWriter(self.uri, backend_kwargs=self.backend_kwargs, **options)

    def reader(self, **options: Any) -> CheckpointReader:
        """A reader with torch's ``FileSystemReader`` options (``_extension_registry``)."""
        return CheckpointReader(self.uri, backend_kwargs=self.backend_kwargs, **options)

    def save(
        self, state_dict: Any, checkpoint_id: str, *, planner: Any = None, no_dist: bool = False, **options: Any
    ) -> None:
        """``dcp.save`` through this storage's writer for ``options``; the checkpoint is committed when this
        returns (where torch's save would have returned): the coordinator waits for the commit, then every
        rank meets at a barrier. An error of the save is raised as is.

        One writer per set of options serves every save of a test (torch's tests build a writer per save;
        a writer is reusable, and building one starts upload workers: 0.3-3 s each on a shared 2-core VM).
        :meth:`close` closes them (and raises what failed in the background)."""
        key = repr(sorted(options.items()))
        writer = self._writers.get(key)
        if writer is None:
            # One live writer per process and staging folder (its uploader owns the folder): the writer for
            # other options is closed first.
            self._close_writers()
            writer = self._writers[key] = self.writer(**options)
        dcp.save(state_dict, checkpoint_id=checkpoint_id, storage_writer=writer, planner=planner, no_dist=no_dist)
        writer.wait_for_commits(120)
        if writer.timings and writer.timings[-1].error is not None:
            raise writer.timings[-1].error
        if tdist.is_initialized() and not no_dist:
            tdist.barrier()

    def save_done(self, writer: CheckpointWriter, no_dist: bool = False) -> None:
        """After an ``async_save``'s future: close the writer on every rank (the coordinator's close waits for
        the commit), then a barrier."""
        writer.close()
        if tdist.is_initialized() and not no_dist:
            tdist.barrier()

    def close(self) -> None:
        """Close every reader :meth:`load` and every writer :meth:`save` built (each waits for its uploads and
        commits; raises their errors)."""
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()
        self._close_writers()

    def _close_writers(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()

    def load(
        self, state_dict: Any, checkpoint_id: str, *, planner: Any = None, no_dist: bool = False, **options: Any
    ) -> None:
        """``dcp.load`` through this storage's reader for ``options`` (one per set of options, as for writers)."""
        key = repr(sorted(options.items()))
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = self.reader(**options)
        dcp.load(state_dict, checkpoint_id=checkpoint_id, storage_reader=reader, planner=planner, no_dist=no_dist)

    def object_names(self, checkpoint_id: str) -> list[str]:
        """The names of the objects under the checkpoint's folder, relative to it (a listing, as the peers do)."""
        from dist_logging.checkpoint.latest import open_store

        store, owned = open_store(self.uri, self.backend_kwargs)
        try:
            return sorted(info.name[len(checkpoint_id) + 1 :] for info in store.list(f'{checkpoint_id}/'))
        finally:
            if owned:
                store.close()


@pytest.fixture(params=['local', 's3'])
def storage(request, tmp_path) -> Iterator[Storage]:
    """A :class:`Storage` on a local bucket, then on a fresh bucket of the session's moto S3 server."""
    if request.param == 'local':
        made = Storage('local', str(tmp_path))
    else:
        request.getfixturevalue('aws_credentials')
        server = request.getfixturevalue('_moto_session')
        made = Storage('s3', str(tmp_path), server.endpoint, server.create_bucket())
    yield made
    made.close()


def assert_equal(a: Any, b: Any, where: str = '') -> None:
    """The peers' ``assertEqual`` on state dicts: same nested structure, equal tensors (values, dtype, shape),
    equal other values. (torch's ``TestCase`` needs ``expecttest``, which the wheel does not bring.)

    Raises:
        AssertionError: naming the first key path that differs.
    """
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            raise AssertionError(f'{where or "value"}: {type(a).__name__} vs {type(b).__name__}')
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(f'{where or "tensor"} differs: {a!r} vs {b!r}')
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            raise AssertionError(f'{where or "dict"}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}')
        for key in a:
            assert_equal(a[key], b[key], f'{where}[{key!r}]')
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f'{where or "sequence"}: length {len(a)} vs {len(b)}')
        for n, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f'{where}[{n}]')
    elif a != b:
        raise AssertionError(f'{where or "value"}: {a!r} vs {b!r}')
