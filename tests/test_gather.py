"""MetricGatherer, FlushSchedule and check_hyperparameters in one process: world size one,
a fake world of threads whose group reduces in memory, the device-native packing with CPU
stand-ins, and a simulated 4,096-rank world on torch's fake process group (the real thing
runs under torchrun in tests/multiprocess/test_gather.py)."""

import datetime
import gc
import math
import re
import threading
import types

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist

from dist_logging import DistributedLoggingError, Logger
from dist_logging._logger import gather as _gather
from dist_logging._logger.consistency import canonical_json, check_hyperparameters
from dist_logging._logger.gather import MetricGatherer
from dist_logging.destinations.in_memory import InMemoryLogger
from dist_logging.dist import LoggingGroup

REAL_GROUP_LOOKUP = LoggingGroup.group  # the fake_process_group fixture replaces it

pytestmark = pytest.mark.timeout(60)


class FakeWorld:
    """``size`` ranks as threads; all_gather meets at a barrier (which times out instead of hanging)."""

    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=5)
        self.slots = [None] * size

    def exchange(self, rank, item):
        self.barrier.wait()
        self.slots[rank] = item
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def run(self, fn):
        """Run ``fn(rank, group)`` on every rank; return (results, exceptions) by rank."""
        results, errors = [None] * self.size, [None] * self.size

        def target(rank):
            try:
                results[rank] = fn(rank, self.groups[rank])
            except BaseException as exc:  # noqa: BLE001
                errors[rank] = exc
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return results, errors

    @property
    def groups(self):
        if not hasattr(self, '_groups'):
            self._groups = [FakeGroup(self, r) for r in range(self.size)]
        return self._groups


class _Done:
    def wait(self, timeout=None):
        return True


class FakeGroup:
    """The LoggingGroup interface over a FakeWorld: collectives complete when issued."""

    active = True
    timeout = 5.0

    def __init__(self, world, rank):
        self.world, self.rank, self.collective_count = world, rank, 0
        self.calls = []  # (kind, op, number of elements)

    def reduction_target(self):
        return None, torch.device('cpu')

    def arrive(self):
        pass

    def _exchange(self, tensor, what):
        self.collective_count += 1
        try:
            items = self.world.exchange(self.rank, tensor.clone())
        except threading.BrokenBarrierError:
            raise DistributedLoggingError(f'{what}: broken', ()) from None
        assert len({tuple(t.shape) for t in items}) == 1, 'gloo would abort: sizes differ'
        return items

    def start_all_reduce(self, tensor, op, group, what):
        self.calls.append(('all_reduce', str(op), tensor.numel()))
        stacked = torch.stack(self._exchange(tensor, what))
        tensor.copy_(stacked.sum(0) if op == torch_dist.ReduceOp.SUM else stacked.max(0).values)
        return _Done()

    def start_gather(self, tensor, group, what, dst=0):
        self.calls.append(('gather', None, tensor.numel()))
        items = self._exchange(tensor, what)
        return _Done(), (items if self.rank == dst else [])

    def wait_all(self, works, what, deadline=None):
        for work in works:
            work.wait()

    def destroy(self):
        pass

    def all_gather(self, tensor, what, group=None):
        self.calls.append(('all_gather', None, tensor.numel()))
        return self._exchange(tensor, what)

    def all_gather_bytes(self, payload, length, lengths, what, group=None, device=None):
        padded = torch.zeros(max(length, 1), dtype=torch.uint8)
        padded[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
        gathered = [g.numpy().tobytes() for g in self.all_gather(padded, what)]
        return [g.rstrip(b'\0') for g in gathered] if lengths is None else [g[:n] for g, n in zip(gathered, lengths)]


def as_dict(results):
    """Flatten flush results to {name: (value, step)}."""
    return {k: (v, step) for metrics, step, _level in results for k, v in metrics.items()}


# ---------------------------------------------------------------- world size one


def test_world_of_one_reductions_and_repeats():
    g = MetricGatherer(LoggingGroup())
    g.add({'m': 1.0}, 3, 'mean')
    # a key logged twice between flushes: all its values count
    g.add({'m': 3.0}, 7, 'mean')
    g.add({'s': 1}, 3, 'sum')
    g.add({'s': 2, 's2': torch.tensor(4.0)}, None, 'sum')
    g.add({'lo2': np.float32(2.0)}, None, 'min')
    g.add({'lo2': 1}, None, 'min')
    g.add({'hi2': torch.tensor([9])}, None, 'max')
    g.add({'gg': 1.0}, None, 'gather')
    g.add({'gg': 2.0}, 4, 'gather')  # last value wins for gather
    out = as_dict(g.flush())
    assert out['m'] == (2.0, 7)  # the largest step given
    assert out['s'] == (3.0, 3)
    assert out['s2'] == (4.0, None)
    assert out['lo2'] == (1.0, None) and out['hi2'] == (9.0, None)
    assert out['gg/rank0'] == (2.0, 4)
    assert g.flush() == [] and g.pending_keys() == []


def test_nan_and_inf_pass_through():
    g = MetricGatherer(LoggingGroup())
    g.add({'a': math.nan, 'b': math.inf, 'c': 1.0}, None, 'mean')
    g.add({'c': math.nan}, None, 'mean')
    g.add({'d': 1.0}, None, 'min')
    g.add({'d': math.nan}, None, 'min')
    g.add({'e': -math.inf}, None, 'max')
    out = as_dict(g.flush())
    assert math.isnan(out['a'][0]) and out['b'][0] == math.inf and math.isnan(out['c'][0])
    assert math.isnan(out['d'][0]) and out['e'][0] == -math.inf


def test_validation_at_the_call_is_atomic():
    g = MetricGatherer(LoggingGroup())
    with pytest.raises(TypeError, match="'bad'"):
        g.add({'ok': 1.0, 'bad': 'text'}, None, 'mean')
    with pytest.raises(ValueError, match="'vec'"):
        g.add({'vec': torch.ones(3)}, None, 'mean')
    with pytest.raises(TypeError, match='step'):
        g.add({'ok': 1.0}, 1.5, 'mean')
    assert g.pending_keys() == []  # nothing from a failed call was buffered
    g.add({'k': 1.0}, None, 'mean')
    with pytest.raises(ValueError, match="'k'.*reduce='mean'"):
        g.add({'k': 1.0}, None, 'max')


def test_world_size_without_process_group_raises_at_the_call(fake_rank):
    fake_rank(rank=1, world_size=2)
    g = MetricGatherer(LoggingGroup())
    with pytest.raises(RuntimeError, match='init_process_group'):
        g.add({'a': 1.0}, None, 'mean')
    assert g.flush() == []  # nothing buffered: flushing is harmless


def test_device_tensors_are_copied_once_per_device_and_dtype(monkeypatch):
    g = MetricGatherer(LoggingGroup())
    calls = []
    real_stack = torch.stack
    monkeypatch.setattr(_gather.torch, 'stack', lambda ts, *a, **k: calls.append(len(ts)) or real_stack(ts, *a, **k))
    # CPU tensors are read at the call; stand-ins for device tensors go through the batched path.
    buffered = {
        f'k{i}': [None, 0, None, ('mean', 3), [torch.tensor(float(i)), torch.tensor(float(i + 1))]] for i in range(50)
    }
    buffered['h'] = [None, 0, None, ('mean', 3), [torch.tensor(1, dtype=torch.int64)]]
    g._materialize(buffered)
    assert sorted(calls) == [1, 100]  # one stack per (device, dtype), not one per key
    assert buffered['k3'][:2] == [7.0, 2] and buffered['h'][:2] == [1.0, 1]


def test_logger_flush_emits_on_rank_zero_with_levels():
    sink = InMemoryLogger()
    with Logger(sink, run_name='r') as logger:
        logger.log_metrics({'loss': torch.tensor(2.0)}, step=5, reduce='mean')
        logger.log_metrics({'tput': 10}, step=5, reduce='gather')
        logger.log_metrics({'rare': 1.0}, reduce='max', level='verbose')
        assert sink.data == {}  # only buffered
        logger.flush()
    assert sink.data['loss'] == [(5, 2.0)]
    assert sink.data['tput/rank0'] == [(5, 10.0)]
    assert 'rare' in sink.data  # InMemoryLogger takes every level by default
    quiet = InMemoryLogger(log_level='batch')
    with Logger(quiet, run_name='r') as logger:
        logger.log_metrics({'rare': 1.0}, reduce='max', level='verbose')
        logger.flush()
    assert quiet.data == {}


# ---------------------------------------------------------------- a fake world of threads


def rank_values(rank, n_keys=3):
    return {f'k{i}': float(rank * 10 + i) for i in range(n_keys)}


@pytest.mark.parametrize('size', [2, 4])
def test_fake_world_exact_reductions(size):
    world = FakeWorld(size)

    def scenario(rank, group):
        g = MetricGatherer(group)
        out = []
        for op in ('mean', 'sum', 'min', 'max', 'gather'):
            g.add({f'{op}': rank + 0.5}, 10 + rank, op)
        g.add({'only_odd': float(rank)}, None, 'mean') if rank % 2 else None
        out.append(as_dict(g.flush(1)))
        return out, group.collective_count

    results, errors = world.run(scenario)
    assert errors == [None] * size
    values = [r + 0.5 for r in range(size)]
    first, count = results[0][0][0], results[0][1]
    assert first['mean'] == (sum(values) / size, 10 + size - 1)
    assert first['sum'][0] == sum(values)
    assert first['min'][0] == min(values) and first['max'][0] == max(values)
    assert {k: v for k, (v, _) in first.items() if k.startswith('gather/')} == {
        f'gather/rank{r}': values[r] for r in range(size)
    }
    odd = [float(r) for r in range(size) if r % 2]
    assert first['only_odd'] == (sum(odd) / len(odd), None)  # over the ranks that logged it
    # first flush, empty layout: the header MAX, agreeing on the names, then SUM + MAX + gather of the new keys
    assert count == 5
    assert all(out == [{}] and c == count for out, c in results[1:])  # only rank zero emits


def test_fake_world_steady_state_costs_and_key_set_changes():
    world = FakeWorld(3)

    def scenario(rank, group):
        g = MetricGatherer(group)
        counts, outs, sizes = [], [], []
        plan = [
            [f'k{i}' for i in range(1000)],  # 1000 new keys
            [f'k{i}' for i in range(1000)],  # same keys: steady state
            ['k1', 'k2'] if rank == 0 else [],  # a subset on one rank: still fits
            [],  # nothing anywhere
            ['new'] if rank == 2 else ['k5'],  # a new key on one rank
            ['new', 'k5'],  # steady again
        ]
        for step, keys in enumerate(plan):
            before, calls = group.collective_count, len(group.calls)
            g.add({k: float(rank) for k in keys}, step, 'sum')
            outs.append(as_dict(g.flush(step)))
            counts.append(group.collective_count - before)
            sizes.append(group.calls[calls:])
        return counts, outs, sizes

    results, errors = world.run(scenario)
    assert errors == [None] * 3
    counts, outs, sizes = results[0]
    # steady state: SUM of [sums | counts] and MAX of [header | -header | steps | levels]; new keys add
    # one all_gather of their names and one SUM + MAX over the new keys alone
    assert counts == [4, 2, 2, 2, 5, 2]
    assert sizes[1] == [('all_reduce', 'RedOpType.SUM', 2000), ('all_reduce', 'RedOpType.MAX', 8 + 2000)]
    assert outs[1]['k999'] == (3.0, 1) and len(outs[1]) == 1000
    assert outs[2] == {'k1': (0.0, 2), 'k2': (0.0, 2)}
    assert outs[3] == {}
    assert outs[4] == {'new': (2.0, 4), 'k5': (1.0, 4)}
    assert outs[5] == {'new': (3.0, 5), 'k5': (3.0, 5)}
    assert all(r[1] == [{}] * 6 and r[0] == counts for r in results[1:])  # same collectives, no results


def test_fake_world_skipped_flush_names_the_rank():
    world = FakeWorld(3)

    def scenario(rank, group):
        g = MetricGatherer(group)
        g.add({'a': 1.0}, None, 'mean')
        g.flush(0)
        g.add({'a': 1.0}, None, 'mean')
        # rank 1 skipped the flush at step 1: its flush at step 2 meets the others' at step 1
        with pytest.raises(DistributedLoggingError) as info:
            g.flush(2 if rank == 1 else 1)
        before = group.collective_count
        g.add({'a': float(rank)}, None, 'mean')
        after = as_dict(g.flush(3))  # the gatherers resynchronized identically (the layout starts over)
        return info.value, after, group.collective_count - before

    results, errors = world.run(scenario)
    assert errors == [None] * 3
    for rank, (error, after, cost) in enumerate(results):
        assert error.missing_ranks == (1,)
        assert 'step 1' in str(error) and 'ranks [1]' in str(error)
        assert after == ({'a': (1.0, None)} if rank == 0 else {}) and cost == 4


def test_fake_world_conflicting_reduce_is_dropped_with_a_warning():
    world = FakeWorld(2)

    def scenario(rank, group):
        g = MetricGatherer(group)
        g.add({'x': 1.0, 'y': 2.0}, None, 'mean' if rank == 0 else 'max')
        g.add({'z': 1.0}, None, 'sum')
        return as_dict(g.flush(0))

    with pytest.warns(RuntimeWarning, match=r"\['x', 'y'\].*different reduce="):  # catch_warnings is per process
        results, errors = world.run(scenario)
    assert errors == [None, None]
    assert results == [{'z': (2.0, None)}, {}]


def test_fake_world_conflict_with_the_layout_in_the_same_flush():
    world = FakeWorld(2)

    def scenario(rank, group):
        g = MetricGatherer(group)
        g.add({'x': float(rank)}, None, 'mean')
        g.flush(0)
        # rank 1 changes x to max while rank 0 still logs it as mean: dropped from this flush
        g.add({'x': 5.0, 'w': 1.0}, None, 'mean' if rank == 0 else 'max')
        second = as_dict(g.flush(1))
        g.add({'x': float(rank)}, None, 'max')
        return second, as_dict(g.flush(2))

    with pytest.warns(RuntimeWarning, match=r"\['w', 'x'\]"):
        results, errors = world.run(scenario)
    assert errors == [None, None]
    assert results[0] == ({}, {'x': (1.0, None)})  # the layout took the new reduce


def test_fake_world_reduce_may_change_between_flushes():
    world = FakeWorld(2)

    def scenario(rank, group):
        g = MetricGatherer(group)
        g.add({'x': float(rank)}, None, 'mean')
        first = as_dict(g.flush(0))
        g.add({'x': float(rank)}, None, 'max', 2)
        second = g.flush(1)
        return first, second

    results, errors = world.run(scenario)
    assert errors == [None, None]
    assert results[0] == ({'x': (0.5, None)}, [({'x': 1.0}, None, 2)])


def test_fake_world_idle_keys_leave_the_layout(monkeypatch):
    monkeypatch.setattr(_gather, 'IDLE_FLUSHES_BEFORE_DROP', 2)
    world = FakeWorld(2)

    def scenario(rank, group):
        g = MetricGatherer(group)
        g.add({'old': 1.0}, None, 'mean')
        g.flush(0)
        for step in (1, 2):
            g.add({'other': 1.0}, None, 'mean')
            g.flush(step)
        return g._layout.keys

    results, errors = world.run(scenario)
    assert errors == [None, None]
    assert results == [['other'], ['other']]


def test_fake_world_hyperparameter_divergence():
    world = FakeWorld(3)

    class Obj:
        pass

    def scenario(rank, group):
        hparams = {'lr': 0.1 if rank != 1 else 0.2, 'same': [1, 2], 'obj': Obj(), 'seed': rank}
        if rank == 2:
            hparams['extra'] = True
        first = check_hyperparameters(hparams, group)
        count = group.collective_count
        agreed = check_hyperparameters({'a': {'b': 1, 'c': 2}} if rank else {'a': {'c': 2, 'b': 1}}, group)
        return first, count, agreed, group.collective_count - count

    results, errors = world.run(scenario)
    assert errors == [None] * 3
    diff, count, agreed, cost = results[0]
    assert set(diff) == {'lr', 'seed', 'extra'}
    assert diff['lr'] == [{'ranks': [0, 2], 'value': '0.1'}, {'ranks': [1], 'value': '0.2'}]
    assert diff['extra'] == [{'ranks': [0, 1], 'value': None}, {'ranks': [2], 'value': 'true'}]
    assert count == 2 and agreed is None and cost == 1
    assert results[1][0] is None  # only rank zero reports


def test_canonical_json_ignores_order_and_addresses():
    assert canonical_json({'b': 1, 'a': [1.0]}) == canonical_json({'a': [1.0], 'b': 1})
    assert canonical_json(object()) == canonical_json(object())
    assert canonical_json(torch.tensor([1, 2])) == '"[1, 2]"'


def test_world_of_one_fast_path_matches_the_collective_path():
    def fill(g):
        g.add({'m': 1.0, 'n': math.nan}, 3, 'mean')
        g.add({'m': 4.0}, 9, 'mean')
        g.add({'s': 2.0, 't': math.inf}, None, 'sum')
        g.add({'lo': 5.0}, 2, 'min', level=2)
        g.add({'hi': -1.0}, None, 'max', level=4)
        g.add({'g': 7.0}, 3, 'gather')

    local = MetricGatherer(LoggingGroup())
    fill(local)
    expected = local.flush()

    def scenario(rank, group):
        g = MetricGatherer(group)
        fill(g)
        return g.flush(0)

    results, errors = FakeWorld(1).run(scenario)
    assert errors == [None]
    got = results[0]
    assert [(step, level) for _, step, level in got] == [(step, level) for _, step, level in expected]
    for (metrics, _, _), (reference, _, _) in zip(got, expected):
        assert metrics.keys() == reference.keys()
        for key in metrics:
            assert metrics[key] == reference[key] or (math.isnan(metrics[key]) and math.isnan(reference[key]))


# ---------------------------------------------------------------- device-native packing (CPU stand-ins)


def _kept(*values, dtype=torch.float64):
    return [torch.tensor(v, dtype=dtype) for v in values]


def _fill_with_kept_tensors(g, rank):
    """Entries as log_metrics leaves them for tensors on a device: kept, not read."""
    g._buffer.update(
        {
            'm': [1.0, 1, 3, ('mean', 3), _kept(2.0 + rank) + _kept(3, dtype=torch.int64)],  # a float and two tensors
            's': [None, 0, None, ('sum', 3), _kept(0.5, dtype=torch.float32)],
            'hi': [None, 0, 7, ('max', 4), _kept(float(rank), -1.0)],
            'lo': [None, 0, None, ('min', 3), _kept(math.nan if rank == 1 else 1.0, 4.0)],
            'g': [None, 0, 2, ('gather', 3), _kept(rank + 0.25)],
        }
    )


def test_device_native_packing_matches_the_host_path():
    """The scatter of kept tensors into the packed vectors (what runs on the GPU) gives the same
    results as reading them on the host first; only the placement differs."""

    def scenario(rank, group):
        host = MetricGatherer(group)
        _fill_with_kept_tensors(host, rank)
        on_host = host.flush(0)
        device = MetricGatherer(group)
        device._device, device._keep_tensors = torch.device('cpu'), True  # the CUDA path, on the CPU
        _fill_with_kept_tensors(device, rank)
        return on_host, device.flush(0)

    results, errors = FakeWorld(2).run(scenario)
    assert errors == [None, None]
    on_host, on_device = (as_dict(r) for r in results[0])
    assert on_device.keys() == on_host.keys()
    for key in on_host:
        a, b = on_host[key], on_device[key]
        assert a[1] == b[1] and (a[0] == b[0] or (math.isnan(a[0]) and math.isnan(b[0]))), key
    assert on_device['m'] == ((1 + 2 + 3 + 1 + 3 + 3) / 6, 3)
    assert on_device['s'] == (1.0, None) and on_device['hi'] == (1.0, 7)
    assert math.isnan(on_device['lo'][0])
    assert on_device['g/rank0'] == (0.25, 2) and on_device['g/rank1'] == (1.25, 2)


def test_reduction_device_selection(monkeypatch):
    from dist_logging.dist import select_reduction_device

    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 1)
    assert select_reduction_device('nccl', True) == torch.device('cuda', 1)
    for backend, cuda in (('nccl', False), ('gloo', True), ('gloo', False), ('fake', True)):
        assert select_reduction_device(backend, cuda) == torch.device('cpu')


def test_nccl_default_group_reduces_in_it_without_a_gloo_group(monkeypatch):
    monkeypatch.setattr(torch_dist, 'get_backend', lambda group=None: 'nccl')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    monkeypatch.setattr(torch_dist, 'new_group', lambda *a, **k: pytest.fail('a gloo group was created'))
    group, device = LoggingGroup().reduction_target()
    assert group is torch_dist.group.WORLD and device == torch.device('cuda', 0)


def test_log_metrics_keeps_device_tensors_unread():
    """A tensor on another device is buffered as is: reading it (.item()) would synchronize."""
    logger = Logger(InMemoryLogger(), run_name='r')
    value = torch.tensor(2.0, device='meta')  # .item() on a meta tensor raises
    logger.log_metrics({'loss': value}, reduce='mean')
    entry = logger._gatherer._buffer['loss']
    assert entry[_gather.TENSORS][0].device.type == 'meta' and entry[_gather.COUNT] == 0
    logger._gatherer._buffer.clear()
    logger.close()


# ---------------------------------------------------------------- the flush schedule


@pytest.mark.parametrize('bad', [0, -1, 2.5, '3', True, None])
def test_flush_every_is_validated_at_construction(bad):
    with pytest.raises(ValueError, match=re.escape(f'got {bad!r}')):
        Logger(InMemoryLogger(), run_name='r', flush_every=bad)


def test_world_of_one_flushes_every_flush_every_batches():
    sink = InMemoryLogger()
    with Logger(sink, run_name='r', flush_every=3) as logger:
        for batch in range(1, 8):
            logger.log_metrics({'x': float(batch)}, step=batch, reduce='mean')
            logger.batch_end()
            assert list(sink.data.get('x', [])) == [(s, (s - 2 + s - 1 + s) / 3) for s in range(3, batch + 1, 3)]
        logger.epoch_end()  # always flushes
        assert sink.data['x'][-1] == (7, 7.0)


def run_logger_in_fake_world(size, fn, **kwargs):
    """Run ``fn(rank, logger)`` on a Logger per rank whose collectives go through a FakeWorld."""
    world = FakeWorld(size)

    def scenario(rank, group):
        sink = InMemoryLogger()
        logger = Logger(sink, run_name='r', **kwargs)
        logger._group, logger._gatherer = group, MetricGatherer(group)
        logger._is_global_zero = rank == 0
        return fn(rank, logger, group, sink)

    return world.run(scenario)


def test_idle_batches_back_off_to_a_handful_of_collectives():
    def scenario(rank, logger, group, sink):
        flushed_at = []
        for batch in range(1, 1001):
            before = logger._gatherer.flushes_issued
            logger.batch_end()
            if logger._gatherer.flushes_issued > before:
                flushed_at.append(batch)
        logger.close()
        return flushed_at, group.collective_count

    results, errors = run_logger_in_fake_world(2, scenario)
    assert errors == [None, None]
    flushed_at, collectives = results[0]
    # the gap doubles after each idle flush once its result is known (at the next checkpoint)
    assert flushed_at == [1, 3, 7, 15, 31, 63, 127, 255, 511]
    assert collectives == len(flushed_at) <= 24  # one MAX of the 8-number header each


def test_flush_every_ten_with_data_every_batch_and_the_reset_after_idle():
    def scenario(rank, logger, group, sink):
        flushed_at = []
        for batch in range(1, 431):
            if batch <= 100 or batch == 400:
                logger.log_metrics({'loss': float(rank + batch)}, step=batch, reduce='mean')
            before = logger._gatherer.flushes_issued
            logger.batch_end()
            if logger._gatherer.flushes_issued > before:
                flushed_at.append(batch)
        logger.close()  # completes the flush in flight
        return flushed_at, sink.data

    results, errors = run_logger_in_fake_world(2, scenario, flush_every=10)
    assert errors == [None, None]
    flushed_at, data = results[0]
    # every 10 batches while there is data; idle: the gap doubles (20, 40, 80, 160) once each idle
    # result is known; the flush at 410 finds data again, so the next one is 10 batches later
    assert flushed_at == list(range(10, 101, 10)) + [110, 130, 170, 250, 410, 420]
    losses = dict(data['loss'])
    # each flush emits the mean of every value both ranks logged since the last one: exact
    assert [losses[s] for s in range(10, 101, 10)] == [
        sum(r + b for r in (0, 1) for b in range(s - 9, s + 1)) / 20 for s in range(10, 101, 10)
    ]
    assert losses[400] == 400.5 and len(losses) == 11
    assert results[1][1] == {}


# ---------------------------------------------------------------- a simulated world of 4,096 ranks


@pytest.fixture
def fake_process_group(monkeypatch):
    """torch's fake process group: one process plays a rank of a large world (no data moves)."""
    import torch.testing._internal.distributed.fake_pg as fake_pg

    calls = []

    def recording(name):
        real = getattr(torch_dist, name)

        def wrapper(*args, **kwargs):
            tensor = args[0] if name != 'all_gather' else args[1]
            calls.append((name, str(kwargs.get('op', '')), tensor.numel() * tensor.element_size()))
            return real(*args, **kwargs)

        return wrapper

    for name in ('all_reduce', 'gather', 'all_gather'):
        monkeypatch.setattr(torch_dist, name, recording(name))
    # the fake group stands in for the gloo group too (a real gloo group cannot be built for 4,096 ranks here)
    monkeypatch.setattr(LoggingGroup, 'group', lambda self: torch_dist.group.WORLD)

    def init(world_size, rank=0):
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        torch_dist.init_process_group('fake', store=fake_pg.FakeStore(), rank=rank, world_size=world_size)
        calls.clear()
        return calls

    yield init
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def test_simulated_4096_rank_flush_costs_o_of_k(fake_process_group):
    keys = {f'metric/k{i:03d}': float(i) for i in range(100)}
    per_world = {}
    for world_size, rank in ((4, 0), (4096, 0), (4096, 17)):
        calls = fake_process_group(world_size, rank)
        sink = InMemoryLogger()
        logger = Logger(sink, run_name='sim', flush_every=1)
        logger.log_metrics(keys, step=1, reduce='mean')
        logger.log_metrics({'tput': 3.0}, step=1, reduce='gather')
        logger.flush()  # new keys: the slow path, once
        calls.clear()
        for step in (2, 3):
            logger.log_metrics(keys, step=step, reduce='mean')
            logger.log_metrics({'tput': 3.0}, step=step, reduce='gather')
            logger.batch_end()  # asynchronous: issued here, completed at the next one
        logger.flush()
        per_world[(world_size, rank)] = list(calls)
        if rank == 0:  # the fake group leaves each tensor as this rank's own: the "reduction" of one rank
            assert dict(sink.data['metric/k042'])[3] == 42.0 and dict(sink.data['tput/rank0'])[3] == 3.0
        logger.close()
    steady = per_world[(4096, 17)]
    assert steady == per_world[(4, 0)] == per_world[(4096, 0)]  # the same collectives and bytes whatever N
    assert [name for name, _, _ in steady] == ['all_reduce', 'all_reduce', 'gather'] * 3
    assert sum(nbytes for _, _, nbytes in steady[:3]) == 8 * (2 * 100 + 8 + 2 * 101 + 3)


def _reaches(root, target) -> bool:
    """Whether ``target`` is reachable from ``root`` through object references (not through
    modules, classes or functions, which reach everything)."""
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return False


def test_the_logger_runs_in_a_group_of_its_own_and_never_holds_the_default_group(fake_process_group, monkeypatch):
    """Issue 31: even when the training group is gloo, the Logger's collectives run in a gloo group of
    their own whose timeout is sync_timeout, so abandoning it after a failure leaves the user's group
    untouched and work left in flight ends by itself. The default group is never referenced: a
    reference kept past the user's destroy_process_group() has gloo's threads torn down at
    interpreter exit, which aborts the process."""
    monkeypatch.setattr(LoggingGroup, 'group', REAL_GROUP_LOOKUP)
    monkeypatch.setattr(torch_dist, 'get_backend', lambda group=None: 'gloo')  # the default group is gloo
    fake_process_group(2, 0)
    created = []
    real_new_group = torch_dist.new_group

    def new_group(backend=None, timeout=None, **kwargs):
        created.append((backend, timeout))
        return real_new_group(backend='fake', timeout=timeout)  # a real group of torch's fake backend

    monkeypatch.setattr(torch_dist, 'new_group', new_group)
    world = torch_dist.group.WORLD
    logger = Logger(InMemoryLogger(), run_name='held', flush_every=1, sync_timeout=42)
    logger.log_metrics({'loss': 1.0}, reduce='mean')
    logger.flush()
    assert created == [('gloo', datetime.timedelta(seconds=42))]
    assert logger._group.group() is not world
    assert logger._gatherer.flushes_issued == 1 and not _reaches(logger, world)
    for _ in range(3):
        logger.log_metrics({'loss': 1.0}, reduce='mean')
        logger.batch_end()  # issued asynchronously: the flush in flight holds its group until completed
    assert logger._gatherer.in_flight
    logger.close()
    assert not _reaches(logger, world) and len(created) == 1


def test_flush_every_from_config():
    from dist_logging.config import load_config

    with pytest.raises(ValueError, match=r"^flush_every: .*got 0"):
        load_config({'flush_every': 0, 'destinations': [{'type': 'in_memory'}]})
    logger = Logger.from_config({'flush_every': 25, 'run_name': 'cfg', 'destinations': [{'type': 'in_memory'}]})
    assert logger._schedule.flush_every == 25
    logger.close()


def test_close_completes_the_flush_in_flight_and_raises_after_closing_destinations():
    """A rank that never arrives: the flush issued by batch_end fails when close() completes it."""

    class Unreachable(FakeGroup):
        def wait_all(self, works, what, deadline=None):
            raise DistributedLoggingError(f'{what}: ranks [1] did not reach it within 5 s', [1])

    def scenario(rank, group):
        sink = InMemoryLogger()
        logger = Logger(sink, run_name='r')
        unreachable = Unreachable(group.world, rank)
        logger._group, logger._gatherer = unreachable, MetricGatherer(unreachable)
        logger.log_metrics({'loss': 1.0}, reduce='mean')
        logger.batch_end()  # issued, not waited for
        assert logger._gatherer.in_flight
        with pytest.raises(DistributedLoggingError, match=r'ranks \[1\]') as info:
            logger.close()
        return info.value.missing_ranks, logger._closed

    results, errors = FakeWorld(1).run(scenario)
    assert errors == [None] and results == [((1,), True)]


def test_values_without_a_step_keep_the_batch_of_their_call():
    """A value logged during the second batch (step 1, as an unreduced value logged there), flushed at
    batch 2 and completed at batch 4, is emitted with step 1, not 2 or 4."""

    def scenario(rank, logger, group, sink):
        for batch in range(1, 5):
            if batch == 2:
                logger.log_metrics({'tput': 10.0 + rank}, reduce='sum')  # no step
            logger.batch_end()
        logger.close()
        return sink.data

    results, errors = run_logger_in_fake_world(2, scenario, flush_every=2)
    assert errors == [None, None]
    assert results[0]['tput'] == [(1, 21.0)]
