import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

_RANK_VARS = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'NODE_RANK',
              'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID', 'DIST_LOGGING_RUN_NAME')


@pytest.fixture(autouse=True)
def single_process_env(monkeypatch):
    """Every in-process test starts as a single process, whatever the shell exported."""
    for name in _RANK_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_rank(monkeypatch):
    """Pretend to be a given torchrun rank (environment only; no process group)."""

    def apply(rank=0, world_size=1, local_rank=None, local_world_size=None, node_rank=None):
        local_world_size = local_world_size or world_size
        monkeypatch.setenv('RANK', str(rank))
        monkeypatch.setenv('WORLD_SIZE', str(world_size))
        monkeypatch.setenv('LOCAL_RANK', str(rank % local_world_size if local_rank is None else local_rank))
        monkeypatch.setenv('LOCAL_WORLD_SIZE', str(local_world_size))
        monkeypatch.setenv('GROUP_RANK', str(rank // local_world_size if node_rank is None else node_rank))

    return apply
