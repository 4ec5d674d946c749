"""The state the crash-matrix job saves at each step, as plain (unsharded) tensors: the scenario shards
``w`` over the ranks; a test can rebuild the whole state in one process to check a load bit-exactly."""

import torch


def full_state(world: int, step: int) -> dict:
    state = {'w': torch.arange(world * 64 * 3, dtype=torch.float64).reshape(world * 64, 3) * step + 0.25,
             'step': torch.tensor(step)}
    for rank in range(world):
        state[f'opt_rank{rank}'] = torch.full((100,), rank * 1000.0 + step) + torch.arange(100.0) / 7
    return state


def zeros_like_state(world: int) -> dict:
    return {key: torch.zeros_like(value) - (1 if key == 'step' else 0)
            for key, value in full_state(world, 1).items()}
