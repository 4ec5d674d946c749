"""PyTorch's and s3torchconnector's multi-process DCP tests, ported with the storage layer swapped; run under
torchrun by ``test_peer_distributed.py`` (one launch per world size runs every case of that size, on a local
bucket and on a moto S3 bucket, so the suite pays for two launches, not one per case).

Each case is a peer test's body: its state dicts, meshes, placements and assertions, with
``FileSystemWriter(path)``/``FileSystemReader(path)`` replaced by ``S.save``/``S.load``/``S.writer``/``S.reader``
(``_peer_storage.py``). Sources (pytorch/pytorch ``test/distributed/checkpoint``):

* ``test_file_system_checkpoint_cpu.py``: ShardedTensor save/load, reshard on load with other shard plans,
  bytes, switching between a ShardedTensor and a tensor (world 2);
* ``test_dtensor_resharding.py``: DTensor placements 1-D/2-D and mesh changes (world 4; torch's CI runs them
  on GPUs only, nothing in them needs one);
* ``e2e/test_e2e_save_and_load.py``: train / save / load / train again for a DDP and an FSDP model, with
  ``dcp.save`` and ``dcp.async_save`` (thread, thread with a cached stage, process), different key orders on
  different ranks, ``overwrite``, partial loads (world 4);
* s3torchconnector ``tst/e2e/dcp/test_e2e_s3_file_system.py``: multi-process save, list, load (world 2 here).

$PEER_PLAN (JSON): ``{"root": folder, "endpoint": url, "bucket": name, "cases": [names] | null}``. Every rank
writes ``{case-kind: "ok" | traceback, ...}`` with ``dump_rank_output``.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import time
import traceback
from typing import Callable

import torch
import torch.distributed as tdist

CASES: dict[str, tuple[int, Callable]] = {}  # name -> (world size, body(S, rank, world))


def case(world: int) -> Callable:
    def register(fn: Callable) -> Callable:
        CASES[fn.__name__] = (world, fn)
        return fn

    return register


def check(condition: bool, message: str = '') -> None:
    if not condition:
        raise AssertionError(message)


# ------------------------------------------------------------------ test_file_system_checkpoint_cpu (world 2)
def _chunk(*ranks: int):
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    return ChunkShardingSpec(dim=0, placements=[f'rank:{r}' for r in ranks])


def _enumerable(*shards: tuple[list, list, int]):
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata

    return EnumerableShardingSpec(
        shards=[ShardMetadata(shard_offsets=o, shard_sizes=s, placement=f'rank:{r}') for o, s, r in shards]
    )


def _gathered(tensor) -> torch.Tensor:
    """The whole ShardedTensor on rank 0 (None elsewhere)."""
    full = torch.zeros(tensor.shape) if tdist.get_rank() == 0 else None
    tensor.gather(out=full)
    return full


def _sharded_model(spec):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharded_tensor import state_dict_hook

    class Model(torch.nn.Module):  # MyShardedModel1's layout: a ShardedTensor, a parameter, a submodule's ST
        def __init__(self) -> None:
            super().__init__()
            self.sharded_tensor1 = sharded_tensor.rand(spec, 10, 20, init_rrefs=False)
            self.random_tensor1 = torch.nn.Parameter(torch.rand(2, 2))
            self.submodule = torch.nn.Module()
            self.submodule.sharded_tensor2 = sharded_tensor.rand(spec, 5, init_rrefs=False)

    model = Model()
    model._register_state_dict_hook(state_dict_hook)
    return model


def _same_local_shards(a: dict, b: dict) -> bool:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    for key, value in a.items():
        other = b[key]
        if isinstance(value, ShardedTensor):
            if not all(torch.equal(x.tensor, y.tensor) for x, y in zip(value.local_shards(), other.local_shards())):
                return False
        elif isinstance(value, torch.Tensor) and not torch.equal(value, other):
            return False
    return True


def _read_write_shard_tensor(S, thread_count: int) -> None:
    cid = _shared_id(S)
    spec = _chunk(0, 1)
    saved = _sharded_model(spec).state_dict()
    S.save(saved, cid, thread_count=thread_count)
    target = _sharded_model(spec).state_dict()
    tdist.barrier()
    check(not _same_local_shards(target, saved), 'fresh model equals the saved one')
    S.load(target, cid)
    check(_same_local_shards(target, saved), 'loaded shards differ')
    tdist.barrier()


@case(2)
def read_write_shard_tensor_t1(S, rank, world):
    _read_write_shard_tensor(S, 1)


@case(2)
def read_write_shard_tensor_t2(S, rank, world):
    _read_write_shard_tensor(S, 2)


def _shard_plans():
    return [
        _chunk(0, 1),
        _chunk(0, 1, 1, 0),
        _enumerable(
            ([0, 0], [2, 20], 0), ([2, 0], [1, 20], 1), ([3, 0], [3, 20], 0), ([6, 0], [3, 20], 1), ([9, 0], [1, 20], 0)
        ),
        _enumerable(([0, 0], [8, 20], 1), ([8, 0], [2, 20], 0)),
    ]


@case(2)
def load_with_different_shard_plan(S, rank, world):
    from torch.distributed._shard import sharded_tensor

    cid = _shared_id(S)
    plans = _shard_plans()
    for s0, s1 in S.sample([(a, b) for a in plans for b in plans if a != b]):
        saved = {'sharded_tensor': sharded_tensor.rand(s0, 10, 20, init_rrefs=False)}
        S.save(saved, cid)
        target = {'sharded_tensor': sharded_tensor.zeros(s1, 10, 20, init_rrefs=False)}
        S.load(target, cid)
        before, after = _gathered(saved['sharded_tensor']), _gathered(target['sharded_tensor'])
        if rank == 0:
            check(torch.allclose(before, after), f'{s0} vs {s1}')


@case(2)
def save_load_bytes(S, rank, world):
    cid = _shared_id(S)
    S.save({'bytes0': [1], 'bytes1': 'string'}, cid)
    target = {'bytes0': [2], 'bytes1': 'other'}
    S.load(target, cid)
    check(target == {'bytes0': [1], 'bytes1': 'string'}, repr(target))


@case(2)
def switch_between_sharded_tensor_to_tensor(S, rank, world):
    from torch.distributed._shard import sharded_tensor

    size = 32
    plans = [
        _chunk(0, 1),
        _chunk(0, 1, 1, 0),
        _enumerable(([0], [8], 1), ([8], [size - 8], 0)),
        _enumerable(([0], [10], 0), ([10], [size - 10], 1)),
    ]
    cid = _shared_id(S)
    for save_spec, load_spec in S.sample([(a, b) for a in plans for b in plans]):
        saved = {'sharded': sharded_tensor.rand(save_spec, size), 'replicated': torch.rand(size)}
        tdist.broadcast(saved['replicated'], src=0)
        S.save(saved, cid)
        target = {'sharded': torch.zeros(size), 'replicated': sharded_tensor.zeros(load_spec, size)}
        S.load(target, cid)
        whole, replicated = _gathered(saved['sharded']), _gathered(target['replicated'])
        if rank == 0:
            check(torch.allclose(whole, target['sharded']), f'sharded: {save_spec} -> {load_spec}')
            check(torch.allclose(saved['replicated'], replicated), f'replicated: {save_spec} -> {load_spec}')


@case(2)
def s3torchconnector_multi_process_save_list_load(S, rank, world):
    """test_dcp_when_multi_process (small tensor; single and multi thread): save, list, load back."""
    for thread_count in (1, 4):
        torch.manual_seed(thread_count)  # the same data on every rank, as mp.spawn passes one test_data
        data = {'tensor1': torch.randn(3, 2), 'tensor2': torch.randn(5, 5), 'scalar': torch.tensor(3.14)}
        cid = _shared_id(S)
        S.save(data, cid, thread_count=thread_count, overwrite=True)
        loaded = {k: torch.empty_like(v) for k, v in data.items()}
        S.load(loaded, cid)
        check(set(loaded) == set(data))
        for key in loaded:
            check(torch.allclose(loaded[key], data[key]), key)
        names = [n for n in S.object_names(cid) if not n.startswith('.committed-')]
        # The peer asserts world_size * thread_count + 1 objects: torch writes one file per thread per rank,
        # empty ones included (the DCP planner puts each replicated item on one rank only, so most are empty).
        check(len(names) == world * thread_count + 1, f'{thread_count} threads: {names}')


# ------------------------------------------------------------------ test_dtensor_resharding (world 4)
def _placements():
    from torch.distributed.tensor import Replicate, Shard

    one_d = [[Shard(0)], [Replicate()]]
    two_d = [[Replicate(), Replicate()], [Replicate(), Shard(0)], [Shard(0), Replicate()], [Shard(0), Shard(0)]]
    return one_d, two_d


def _reshard(S, save_mesh, save_placement, load_mesh, load_placement, cid, save=True) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor, zeros

    global_tensor = torch.arange(16, dtype=torch.float).view(4, 4)
    if save:
        S.save({'dtensor': distribute_tensor(global_tensor, save_mesh, placements=save_placement)}, cid)
    target = {'dtensor': zeros([4, 4], device_mesh=load_mesh, placements=load_placement)}
    S.load(target, cid)
    whole = target['dtensor'].redistribute(load_mesh, placements=[Replicate()] * load_mesh.ndim)
    check(torch.equal(global_tensor, whole.to_local()), f'{save_placement} -> {load_placement}')
    if load_mesh is save_mesh:  # back to the saved placement: the same local shard as saved
        back = whole.redistribute(save_mesh, placements=save_placement)
        check(torch.equal(distribute_tensor(global_tensor, save_mesh, save_placement).to_local(), back.to_local()))


@case(4)
def dtensor_1d_to_1d_reshard_placement_change(S, rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    one_d, _ = _placements()
    mesh = init_device_mesh('cpu', (world,))
    for original, new in ((one_d[1], one_d[0]), (one_d[0], one_d[1])):
        _reshard(S, mesh, original, mesh, new, _shared_id(S))


@case(4)
def dtensor_2d_to_2d_reshard_placement_change(S, rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    _, two_d = _placements()
    mesh = init_device_mesh('cpu', (2, world // 2))
    for original, new in S.sample([(a, b) for a in two_d for b in two_d if a != b]):
        _reshard(S, mesh, original, mesh, new, _shared_id(S))


@case(4)
def dtensor_1d_to_2d_reshard_mesh_change(S, rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    one_d, two_d = _placements()
    mesh_1d, mesh_2d = init_device_mesh('cpu', (world,)), init_device_mesh('cpu', (2, world // 2))
    cid = _shared_id(S)  # one checkpoint id for every save, as the peer saves into one directory
    for placement_1d in one_d:
        for n, placement_2d in enumerate(two_d):
            _reshard(S, mesh_1d, placement_1d, mesh_2d, placement_2d, cid, save=n == 0)


@case(4)
def dtensor_2d_to_1d_reshard_mesh_change(S, rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    one_d, two_d = _placements()
    mesh_1d, mesh_2d = init_device_mesh('cpu', (world,)), init_device_mesh('cpu', (2, world // 2))
    cid = _shared_id(S)
    for placement_2d in two_d:
        for n, placement_1d in enumerate(one_d):
            _reshard(S, mesh_2d, placement_2d, mesh_1d, placement_1d, cid, save=n == 0)


# ------------------------------------------------------------------ e2e/test_e2e_save_and_load (world 4)
class DummyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net1 = torch.nn.Linear(8, 16)
        self.net2 = torch.nn.Linear(16, 32)
        self.net3 = torch.nn.Linear(32, 64)
        self.net4 = torch.nn.Linear(64, 8)

    def forward(self, x):
        for net in (self.net1, self.net2, self.net3, self.net4):
            x = torch.nn.functional.relu(net(x))
        return x


class StatefulObj:
    def __init__(self) -> None:
        self.data = torch.rand(10, 10)

    def state_dict(self):
        return {'data': self.data}

    def load_state_dict(self, state_dict):
        self.data = state_dict['data']

    def __eq__(self, other):
        return torch.equal(self.data, other.data)


class TrainState:
    def __init__(self) -> None:
        self.step, self.current_loss, self.losses = 0, -1.0, []

    def state_dict(self):
        buffer = io.BytesIO()
        torch.save(self.losses, buffer)
        return {
            'step': torch.tensor(self.step, dtype=torch.int32),
            'current_loss': torch.tensor(self.current_loss, dtype=torch.float32),
            'losses': buffer,
        }

    def load_state_dict(self, state_dict):
        self.step = state_dict['step'].item()
        self.current_loss = state_dict['current_loss'].item()
        state_dict['losses'].seek(0)
        self.losses = torch.load(state_dict['losses'])

    def __eq__(self, other):
        return (self.step, self.current_loss, self.losses) == (other.step, other.current_loss, other.losses)


def _create_model(kind: str, world: int):
    from torch.distributed.checkpoint.state_dict import _patch_model_state_dict, _patch_optimizer_state_dict

    model = DummyModel()
    if kind == 'fsdp':
        # torch's e2e test wraps with FSDP1 (FullyShardedDataParallel), which needs an accelerator; on CPU the
        # same sharding is FSDP2's fully_shard (what torch's own e2e/test_fsdp.py uses)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(model, mesh=init_device_mesh('cpu', (world,)))
    elif kind == 'ddp':
        model = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    if kind != 'none':
        _patch_model_state_dict(model)
        _patch_optimizer_state_dict(model, optimizers=optim)
    return model, optim


def _train(model, optim, steps: int):
    torch.manual_seed(0)
    loss, state = None, TrainState()
    for _ in range(steps):
        loss = model(torch.rand(8, 8)).sum()
        loss.backward()
        state.step += 1
        state.current_loss = torch.rand(1).item()
        state.losses.append(state.current_loss)
        optim.step()
        optim.zero_grad()
    return loss, state


def _verify_msd(reference: dict, dist_msd: dict) -> None:
    from torch.distributed._state_dict_utils import _gather_state_dict

    whole = _gather_state_dict(dist_msd)
    check(set(whole) == set(reference), f'{sorted(whole)} vs {sorted(reference)}')
    for fqn, value in reference.items():
        check(torch.allclose(value, whole[fqn]), f'{fqn} differs')


def _e2e(S, world: int, kind: str, async_type: str = '', cache: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    model, optim = _create_model('none', world)
    _train(model, optim, 2)
    dist_model, dist_optim = _create_model(kind, world)
    _, train_state = _train(dist_model, dist_optim, 2)
    stateful = StatefulObj()
    tdist.broadcast(stateful.data, src=0)  # every rank's obj must match what the coordinator wrote
    sd = {'model': dist_model, 'optimizer': dist_optim, 's': stateful, 'train_state': train_state}
    cid = _shared_id(S)
    if async_type:
        writer = S.writer(cache_staged_state_dict=cache)
        checkpointer = AsyncCheckpointerType.PROCESS if async_type == 'process' else AsyncCheckpointerType.THREAD
        future = dcp.async_save(sd, checkpoint_id=cid, storage_writer=writer, async_checkpointer_type=checkpointer)
        future.result(timeout=120)
        S.save_done(writer)
    else:
        S.save(sd, cid)
    loaded_obj, loaded_state = StatefulObj(), TrainState()
    dist_model, dist_optim = _create_model(kind, world)
    S.load({'model': dist_model, 'optimizer': dist_optim, 's': loaded_obj, 'train_state': loaded_state}, cid)
    check(stateful == loaded_obj, 'stateful object')
    check(train_state == loaded_state, 'train state')
    loss, _ = _train(model, optim, 1)
    dist_loss, _ = _train(dist_model, dist_optim, 1)
    check(torch.allclose(loss, dist_loss), f'loss after the load: {loss} vs {dist_loss}')
    dist_msd, _ = get_state_dict(dist_model, optimizers=dist_optim)
    model_sd, _ = get_state_dict(model, optimizers=optim)
    _verify_msd(model_sd, dist_msd)


@case(4)
def e2e_ddp(S, rank, world):
    _e2e(S, world, 'ddp')


@case(4)
def e2e_fsdp(S, rank, world):
    _e2e(S, world, 'fsdp')


@case(4)
def e2e_async_thread(S, rank, world):
    _e2e(S, world, 'fsdp', async_type='thread')


@case(4)
def e2e_async_thread_cached(S, rank, world):
    _e2e(S, world, 'fsdp', async_type='thread', cache=True)


@case(4)
def e2e_async_process(S, rank, world):
    _e2e(S, world, 'fsdp', async_type='process')


@case(4)
def different_ordered_state_dict_keys(S, rank, world):
    class Foo:
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            gathered = [torch.ones(2, dtype=torch.int64) for _ in range(world)]
            tdist.all_gather(gathered, torch.arange(2, dtype=torch.int64) + 1 + 2 * rank)

    class Bar:
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            tdist.all_reduce(torch.arange(2, dtype=torch.int64) + 1 + 2 * rank)

    sd = {'A': Foo(), 'B': Bar()} if rank == 0 else {'B': Bar(), 'A': Foo()}
    cid = _shared_id(S)
    S.save(sd, cid)
    S.load(sd, cid)  # would deadlock if the key order mattered


@case(4)
def overwrite(S, rank, world):
    from torch.distributed.checkpoint import CheckpointException

    torch.manual_seed(1)
    t1, t2 = torch.randn(10), torch.randn(10)
    cid = _shared_id(S)
    S.save({'random': t1}, cid)
    S.save({'random': t2}, cid, overwrite=True)
    loaded = {'random': torch.zeros(10)}
    S.load(loaded, cid)
    check(torch.allclose(loaded['random'], t2))
    try:
        S.save({'random': t2}, cid, overwrite=False)
    except CheckpointException as exc:
        check('Checkpoint already exists' in str(exc), str(exc))
    else:
        raise AssertionError('overwrite=False saved over a committed checkpoint')


@case(4)
def partial_load(S, rank, world):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    model, optim = _create_model('none', world)
    _train(model, optim, 2)
    dist_model, dist_optim = _create_model('fsdp', world)
    _train(dist_model, dist_optim, 2)
    cid = _shared_id(S)
    S.save({'model': dist_model, 'optimizer': dist_optim}, cid)
    dist_model, _ = _create_model('fsdp', world)
    S.load({'model': dist_model}, cid)
    _verify_msd(get_model_state_dict(model), get_model_state_dict(dist_model))
    with S.reader() as reader:
        loaded = _load_state_dict_from_keys('model', checkpoint_id=cid, storage_reader=reader)['model']
    _verify_msd(get_model_state_dict(model), loaded)
    with S.reader() as reader:
        optim_state = _load_state_dict_from_keys('optimizer.state', checkpoint_id=cid, storage_reader=reader)[
            'optimizer'
        ]['state']
    check('param_groups' not in optim_state)
    from torch.distributed._state_dict_utils import _gather_state_dict

    whole = _gather_state_dict(dist_optim.state_dict()['state'])
    for key, value in whole.items():
        for name in ('exp_avg', 'exp_avg_sq', 'step'):
            check(torch.allclose(optim_state[key][name].float(), value[name].float()), f'{key}.{name}')


# ------------------------------------------------------------------ running
_ids = {'n': 0}


def _shared_id(S) -> str:
    """A checkpoint id the same on every rank (the peers broadcast a tempfile.mkdtemp())."""
    _ids['n'] += 1
    return f'{S.kind}/{os.environ["PEER_RUN"]}/c{_ids["n"]}'


def main() -> None:
    from torchrun_helper import dump_rank_output
    from _peer_storage import Storage

    plan = json.loads(os.environ['PEER_PLAN'])
    tdist.init_process_group('gloo', timeout=datetime.timedelta(seconds=30))
    rank, world = tdist.get_rank(), tdist.get_world_size()
    wanted = plan.get('cases')
    results: dict = {}
    storages = {kind: Storage(kind, plan['root'], plan['endpoint'], plan['bucket']) for kind in ('local', 's3')}
    for name, (size, body) in CASES.items():
        if size != world or (wanted and name not in wanted):
            continue
        for kind, S in storages.items():
            started = time.monotonic()
            torch.manual_seed(0)  # as torch's multi-process harness seeds every rank alike
            try:
                try:
                    body(S, rank, world)
                finally:
                    S.close()
                results[f'{name}-{kind}'] = 'ok'
            except BaseException:  # noqa: BLE001 - recorded for the test to report
                results[f'{name}-{kind}'] = traceback.format_exc()[-3000:]
            results[f'{name}-{kind}-seconds'] = round(time.monotonic() - started, 2)
            dump_rank_output(results)  # a later hang or crash keeps what ran so far
            try:
                tdist.barrier()
            except RuntimeError:  # a rank failed between two collectives: the group cannot go on
                results['desynchronized_after'] = f'{name}-{kind}'
                dump_rank_output(results)
                os._exit(1)
    tdist.barrier()
    tdist.destroy_process_group()


if __name__ == '__main__':
    main()
