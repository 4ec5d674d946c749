"""The core rank policy under real torchrun launches (gloo, CPU)."""

import pathlib

import pytest

from torchrun_helper import read_rank_outputs, run_torchrun, run_two_nodes

SCENARIO = pathlib.Path(__file__).with_name('core_scenario.py')
pytestmark = pytest.mark.multiprocess


def check(outputs, world_size, local_world_size):
    assert sorted(outputs) == list(range(world_size))
    run_names = {o['run_name'] for o in outputs.values()}
    assert len(run_names) == 1, run_names
    for rank, out in outputs.items():
        local_rank = rank % local_world_size
        node_rank = rank // local_world_size
        assert out['facts'] == [rank, local_rank, world_size, local_world_size, node_rank]
        # hyperparameters once per run, from global rank zero, redacted
        expected_hparams = {'lr': 0.01, 'world': world_size, 'password': '***'} if rank == 0 else {}
        assert out['zero']['hparams'] == expected_hparams
        assert out['all']['hparams'] == expected_hparams
        assert out['local_zero']['hparams'] == expected_hparams
        losses = [[i, float(i + 10 * rank)] for i in range(3)]
        assert out['zero']['loss'] == (losses if rank == 0 else None)
        assert out['local_zero']['loss'] == (losses if local_rank == 0 else None)
        assert out['all']['loss'] == losses
        # one file per rank, with this rank's own values and rank-distinct names
        log_file = pathlib.Path(out['cwd']) / out['log_file']
        assert log_file.name == f'logs-node{node_rank}-local{local_rank}-rank{rank}.txt'
        assert log_file.parent.name == out['run_name']
        text = log_file.read_text()
        assert f'loss: {float(2 + 10 * rank)}' in text
        assert ('password: ***' in text) == (rank == 0) and ('[hyperparameter]' in text) == (rank == 0)
    files = {o['log_file'] for o in outputs.values()}
    assert len(files) == world_size


@pytest.mark.timeout(180)
@pytest.mark.parametrize('nproc,extra', [(2, []), (4, ['--no-pg'])])
def test_single_node(tmp_path, nproc, extra):
    run_torchrun(SCENARIO, nproc, tmp_path, args=extra, timeout=150)
    check(read_rank_outputs(tmp_path), nproc, nproc)


@pytest.mark.timeout(240)
def test_two_nodes_on_one_machine(tmp_path):
    run_two_nodes(SCENARIO, 2, tmp_path, timeout=200)
    outputs = read_rank_outputs(tmp_path)
    check(outputs, 4, 2)
    local_zero_ranks = [r for r, o in outputs.items() if o['local_zero']['loss'] is not None]
    assert local_zero_ranks == [0, 2]  # once per node
