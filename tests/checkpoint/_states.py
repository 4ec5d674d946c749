"""The state the crash-matrix job saves at each step, as plain (unsharded) tensors: the scenario shards
``w`` over the ranks; a test can rebuild the whole state in one process to check a load bit-exactly."""

import torch


def full_state(world: int, step: int) -> dict:
    state = {
        'w': torch.arange(world * 64 * 3, dtype=torch.float64).reshape(world * 64, 3) * step + 0.25,
        'step': torch.tensor(step),
    }
    for rank in range(world):
        state[f'opt_rank{rank}'] = torch.full((100,), rank * 1000.0 + step) + torch.arange(100.0) / 7
    return state


def zeros_like_state(world: int) -> dict:
    return {key: torch.zeros_like(value) - (1 if key == 'step' else 0) for key, value in full_state(world, 1).items()}


def sharded_state(mesh, rank: int, step: int) -> dict:
    """This rank's view of the state at ``step`` in a job: ``w`` sharded over ``mesh`` (one shard per
    rank), the rank's own optimizer tensor and the step."""
    from torch.distributed.tensor import Shard, distribute_tensor

    world = mesh.size()
    full = full_state(world, step)
    return {
        'w': distribute_tensor(full['w'], mesh, [Shard(0)]),
        f'opt_rank{rank}': full[f'opt_rank{rank}'],
        'step': full['step'],
    }


def blank_sharded_state(mesh, rank: int) -> dict:
    """What a rank loads into: the layout of :func:`sharded_state`, all zeros (step -1)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    zero = torch.zeros(mesh.size() * 64, 3, dtype=torch.float64)
    return {
        'w': distribute_tensor(zero, mesh, [Shard(0)]),
        f'opt_rank{rank}': torch.zeros(100),
        'step': torch.tensor(-1),
    }


def same_sharded_state(a: dict, b: dict, rank: int) -> bool:
    """Whether two of a rank's sharded states are bit-exactly equal."""
    return (
        torch.equal(a['w'].to_local(), b['w'].to_local())
        and torch.equal(a[f'opt_rank{rank}'], b[f'opt_rank{rank}'])
        and int(a['step']) == int(b['step'])
    )
