"""PyTorch's ``test_format_utils.py`` (no-dist cases), ported with the storage layer swapped.

``dcp_to_torch_save(dir, file)`` and ``torch_save_to_dcp(file, dir)`` hard-code torch's file system reader
and writer; each is two calls over DCP's own planners (``_EmptyStateDictLoadPlanner`` to read every key of a
checkpoint, a plain ``dcp.save`` of a ``torch.load``-ed dict), made here through ``CheckpointReader`` /
``CheckpointWriter``. The model and the assertions are the peers'. Not ported:
``test_online_torch_save_to_dcp`` (reads a ``torch.save`` file, no DCP storage layer; accelerators only).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from _peer_storage import assert_equal, storage  # noqa: F401 - fixture
from s3_server import _moto_session, aws_credentials  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(90)


class SimpleModelUneven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net1 = torch.nn.Linear(5, 10)
        self.net2 = torch.nn.Linear(10, 15)
        self.net3 = torch.nn.Linear(15, 30)
        self.net4 = torch.nn.Linear(30, 5)

    def forward(self, x):
        return self.net4(F.relu(self.net3(F.relu(self.net2(F.relu(self.net1(x)))))))


def test_dcp_to_torch_save(storage, tmp_path):
    model = SimpleModelUneven()
    cid = storage.fresh_id()
    storage.save({'model': model}, cid)

    # dcp_to_torch_save, with the bucket's reader in place of FileSystemReader(dir): torch's
    # _load_state_dict never calls reset(), so the reader is pointed at the checkpoint first.
    everything: dict = {}
    with storage.reader() as reader:
        reader.reset(cid)
        _load_state_dict(everything, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    torch_path = tmp_path / 'model.pt'
    torch.save(everything, torch_path)

    assert_equal(torch.load(torch_path), {'model': model.state_dict()})


def test_torch_save_to_dcp(storage, tmp_path):
    model = SimpleModelUneven()
    sd = {'model': model.state_dict()}
    torch_path = tmp_path / 'model.pt'
    torch.save(sd, torch_path)

    # torch_save_to_dcp, with the bucket's writer in place of FileSystemWriter(dir)
    cid = storage.fresh_id()
    storage.save(torch.load(torch_path, weights_only=False), cid, no_dist=True)

    model = SimpleModelUneven()
    storage.load({'model': model}, cid)
    assert_equal({'model': model.state_dict()}, sd)
