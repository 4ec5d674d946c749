"""PyTorch's single-process DCP storage tests, ported with the storage layer swapped.

Sources (pytorch/pytorch ``test/distributed/checkpoint``): ``test_file_system_checkpoint_cpu.py``
(plain, Rot13 and ZStandard round trips at 1 and 2 writer threads), ``test_fsspec.py`` and
``e2e/test_e2e_save_and_load.py`` (``overwrite``; stateful and non-stateful loads; ``no_dist``; in-place
loading of ``get_state_dict`` dicts). Each case runs against a local bucket and a moto S3 bucket.
``FileSystemWriter(path, **options)`` / ``FileSystemReader(path, **options)`` became
``storage.save(..., checkpoint_id, **options)`` / ``storage.load(...)`` (``_peer_storage.py``); state
dicts and assertions are the peers'. Not ported: ``test_dtype_mismatch_casting`` (its
``DefaultLoadPlanner(allow_unsafe_types=...)`` is newer than torch 2.13).
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.testing._internal.distributed.checkpoint_utils import Rot13Example, get_test_extension_registry

from _peer_storage import assert_equal, storage  # noqa: F401 - fixture
from s3_server import _moto_session, aws_credentials  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(90)


class Module5(torch.nn.Module):
    """test_file_system_checkpoint_cpu's module: two linears and an embedding bag."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(5, 5)
        self.linear_2 = torch.nn.Linear(5, 1)
        self.emb = torch.nn.EmbeddingBag(5, 10)


class Blob:
    """A Stateful holding bytes (the peers' BlobState)."""

    def __init__(self, value: bytes) -> None:
        self.state = {'blob': value}

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state_dict: dict) -> None:
        self.state = state_dict

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and self.state == other.state


def same_state(a: dict, b: dict) -> bool:
    """The peers' assert_state_dict_equal as a predicate: same keys, equal tensors, equal statefuls."""
    if set(a) != set(b):
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor):
            if not torch.equal(value, other):
                return False
        elif value != other:
            return False
    return True


@pytest.mark.parametrize('thread_count', [1, 2])
def test_read_write_only_tensor(storage, thread_count):
    saved = Module5().state_dict()
    cid = storage.fresh_id()
    storage.save(saved, cid, no_dist=True, thread_count=thread_count)
    target = Module5().state_dict()
    assert not same_state(target, saved)
    storage.load(target, cid, no_dist=True)
    assert same_state(target, saved)


@pytest.mark.parametrize('thread_count', [1, 2])
def test_read_write_tensor_and_blob_rot13(storage, thread_count):
    saved = dict(Module5().state_dict(), test_blob=Blob(b'SomeBlobForTesting'))
    cid = storage.fresh_id()
    storage.save(saved, cid, thread_count=thread_count, _extensions=[Rot13Example()])
    target = dict(Module5().state_dict(), test_blob=Blob(b''))
    assert not same_state(target, saved)
    # No extension named for the load: the reader finds it in the metadata, in the registry it is given.
    storage.load(target, cid, _extension_registry=get_test_extension_registry())
    assert same_state(target, saved)


@pytest.mark.parametrize('thread_count', [1, 2])
def test_read_write_zstandard(storage, thread_count):
    pytest.importorskip('zstandard')
    saved = dict(Module5().state_dict(), test_blob=Blob(b'SomeBlobForTesting'))
    cid = storage.fresh_id()
    storage.save(saved, cid, thread_count=thread_count, _extensions=[ZStandard()])
    target = dict(Module5().state_dict(), test_blob=Blob(b''))
    assert not same_state(target, saved)
    storage.load(target, cid)  # ZStandard is in torch's default registry
    assert same_state(target, saved)


def test_overwrite_fsspec(storage):
    """test_fsspec.TestFSSpec.test_overwrite (and s3torchconnector's test_overwrite, the same facts)."""
    t1, t2 = torch.randn(10), torch.randn(10)
    cid = storage.fresh_id()
    storage.save({'random': t1}, cid, overwrite=False)
    storage.save({'random': t2}, cid, overwrite=True)
    loaded = {'random': torch.zeros(10)}
    storage.load(loaded, cid)
    torch.testing.assert_close(loaded['random'], t2)
    with pytest.raises(CheckpointException, match='Checkpoint already exists'):
        storage.save({'random': t2}, cid, overwrite=False)


def test_overwrite_e2e(storage):
    """e2e TestCheckpointOrderingAndOverwrite.test_overwrite: the first save with the default writer."""
    t1, t2 = torch.randn(10), torch.randn(10)
    cid = storage.fresh_id()
    storage.save({'random': t1}, cid)
    storage.save({'random': t2}, cid, overwrite=True)
    loaded = {'random': torch.zeros(10)}
    storage.load(loaded, cid)
    assert torch.allclose(loaded['random'], t2)
    with pytest.raises(CheckpointException, match='Checkpoint already exists'):
        storage.save({'random': t2}, cid, overwrite=False)


def test_stateful_and_non_stateful_loads(storage):
    class Recording(dict):
        def __init__(self) -> None:
            super().__init__()
            self.set_item_called = False

        def __setitem__(self, key, value) -> None:
            self.set_item_called = True
            super().__setitem__(key, value)

    class Foo(Stateful):
        def __init__(self) -> None:
            self.loaded = False

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state_dict) -> None:
            self.loaded = True

    cid = storage.fresh_id()
    foo = Foo()
    sd = Recording()
    sd['foo'] = foo
    sd.set_item_called = False
    storage.save(sd, cid)
    storage.load(sd, cid)
    assert foo.loaded  # a Stateful is loaded in place...
    assert not sd.set_item_called  # ...not replaced in the state dict

    sd = Recording()
    sd['foo'] = {'replicated': torch.rand(10, 10), 'bytes': [1, 2, 3, 4]}
    sd.set_item_called = False
    storage.save(sd, cid)
    storage.load(sd, cid)
    assert sd.set_item_called  # a plain dict entry is replaced by what was loaded


def test_no_dist(storage):
    cid = storage.fresh_id()
    storage.save({}, cid)
    storage.load({}, cid)


class DummyModel(torch.nn.Module):
    """e2e's TestDummyModel (seeded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net1 = torch.nn.Linear(8, 16)
        self.net2 = torch.nn.Linear(16, 32)
        self.net3 = torch.nn.Linear(32, 64)
        self.net4 = torch.nn.Linear(64, 8)


def test_init_state_dict(storage):
    model = DummyModel()
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    cid = storage.fresh_id()
    storage.save({'model': get_model_state_dict(model), 'optimizer': get_optimizer_state_dict(model, optim)}, cid)

    torch.manual_seed(0)
    model_2 = DummyModel()
    optim_2 = torch.optim.Adam(model_2.parameters(), lr=0.2)  # a learning rate the load must replace
    msd = get_model_state_dict(model_2)
    osd = get_optimizer_state_dict(model_2, optim_2)
    to_load = {'model': msd, 'optimizer': osd}
    storage.load(to_load, cid)
    assert to_load['model'] is msd and to_load['optimizer'] is osd  # DCP loads in place
    set_state_dict(model_2, optim_2, model_state_dict=to_load['model'], optim_state_dict=to_load['optimizer'])
    assert_equal(msd, get_model_state_dict(model_2))
    assert_equal(osd, get_optimizer_state_dict(model_2, optim_2))
    assert optim_2.param_groups[0]['lr'] == 0.1


@pytest.mark.parametrize('thread_count', [1, 2, 4, 8, 16])
def test_s3torchconnector_writer_thread_count(storage, thread_count):
    """s3torchconnector tst/unit/dcp/test_s3_storage_writer.py: the writer keeps the thread count it is given."""
    writer = storage.writer(thread_count=thread_count)
    try:
        assert writer.thread_count == thread_count
    finally:
        writer.close()


def test_s3torchconnector_writer_thread_count_defaults_to_one(storage):
    writer = storage.writer()
    try:
        assert writer.thread_count == 1
    finally:
        writer.close()


def test_s3torchconnector_save_load_list(storage):
    """s3torchconnector e2e ``_test_rename_internal``/``load_data`` in one process: save three tensors, list the
    checkpoint (``thread_count`` files and the ``.metadata``, plus the commit marker here), load them back."""
    data = {'tensor1': torch.randn(10, 10), 'tensor2': torch.randn(5, 5), 'scalar': torch.tensor(3.14)}
    cid = storage.fresh_id()
    storage.save(data, cid, overwrite=False)
    names = storage.object_names(cid)
    assert '.metadata' in names
    assert sum(name.endswith('.distcp') for name in names) == 1
    loaded = {k: torch.empty_like(v) for k, v in data.items()}
    storage.load(loaded, cid)
    assert set(loaded) == set(data)
    for key in loaded:
        assert torch.allclose(loaded[key], data[key]), key


def test_byte_io_round_trip(storage):
    """e2e's TestTrainState keeps its losses as a BytesIO: a byte item written and read back as bytes."""
    losses = io.BytesIO()
    torch.save([0.5, 0.25], losses)
    cid = storage.fresh_id()
    storage.save({'losses': losses, 'step': torch.tensor(3)}, cid)
    target = {'losses': io.BytesIO(), 'step': torch.tensor(0)}
    storage.load(target, cid)
    target['losses'].seek(0)
    assert torch.load(target['losses']) == [0.5, 0.25] and int(target['step']) == 3
