import pytest

from dist_logging import dist


def test_single_process_defaults():
    assert (dist.get_global_rank(), dist.get_local_rank(), dist.get_world_size(),
            dist.get_local_world_size(), dist.get_node_rank()) == (0, 0, 1, 1, 0)
    assert dist.is_initialized() is False


def test_from_torchrun_env(monkeypatch):
    for key, value in {'RANK': '5', 'LOCAL_RANK': '1', 'WORLD_SIZE': '8', 'LOCAL_WORLD_SIZE': '4',
                       'GROUP_RANK': '1'}.items():
        monkeypatch.setenv(key, value)
    assert (dist.get_global_rank(), dist.get_local_rank(), dist.get_world_size(),
            dist.get_local_world_size(), dist.get_node_rank()) == (5, 1, 8, 4, 1)
    assert dist.get_num_nodes() == 2


def test_node_rank_fallbacks(monkeypatch):
    monkeypatch.setenv('NODE_RANK', '3')
    assert dist.get_node_rank() == 3
    monkeypatch.delenv('NODE_RANK')
    monkeypatch.setenv('RANK', '6')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
    assert dist.get_node_rank() == 3


def test_bad_env_value_names_variable(monkeypatch):
    monkeypatch.setenv('RANK', 'zero')
    with pytest.raises(ValueError, match="RANK='zero'"):
        dist.get_global_rank()
