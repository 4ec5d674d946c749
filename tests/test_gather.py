"""MetricGatherer and check_hyperparameters in one process: world size one, and a fake
world of threads whose group all-gathers in memory (the real thing runs under torchrun
in tests/multiprocess/test_gather.py)."""

import math
import threading

import numpy as np
import pytest
import torch

from dist_logging import DistributedLoggingError, Logger
from dist_logging import _gather
from dist_logging._consistency import canonical_json, check_hyperparameters
from dist_logging._gather import MetricGatherer
from dist_logging.destinations.in_memory import InMemoryLogger
from dist_logging.dist import LoggingGroup

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


class FakeGroup:
    active = True

    def __init__(self, world, rank):
        self.world, self.rank, self.collective_count = world, rank, 0

    def all_gather(self, tensor, what):
        self.collective_count += 1
        try:
            items = self.world.exchange(self.rank, tensor.clone())
        except threading.BrokenBarrierError:
            raise DistributedLoggingError(f'{what}: broken', ()) from None
        assert len({tuple(t.shape) for t in items}) == 1, 'gloo would abort: sizes differ'
        return items

    def all_gather_bytes(self, payload, length, lengths, what):
        padded = torch.zeros(max(length, 1), dtype=torch.uint8)
        padded[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
        return [g[:n].numpy().tobytes() for g, n in zip(self.all_gather(padded, what), lengths)]


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
    buffered = {f'k{i}': [None, 0, None, ('mean', 3), [torch.tensor(float(i)), torch.tensor(float(i + 1))]]
                for i in range(50)}
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
    for out, count in results:
        first = out[0]
        assert first['mean'] == (sum(values) / size, 10 + size - 1)
        assert first['sum'][0] == sum(values)
        assert first['min'][0] == min(values) and first['max'][0] == max(values)
        assert {k: v for k, (v, _) in first.items() if k.startswith('gather/')} == {
            f'gather/rank{r}': values[r] for r in range(size)}
        odd = [float(r) for r in range(size) if r % 2]
        assert first['only_odd'] == (sum(odd) / len(odd), None)  # over the ranks that logged it
        assert count == 2  # first flush: the data collective + agreeing on the new keys


def test_fake_world_steady_state_is_one_collective_and_key_set_changes():
    world = FakeWorld(3)

    def scenario(rank, group):
        g = MetricGatherer(group)
        counts, outs = [], []
        plan = [
            [f'k{i}' for i in range(1000)],       # 1000 new keys
            [f'k{i}' for i in range(1000)],       # same keys: steady state
            ['k1', 'k2'] if rank == 0 else [],    # a subset on one rank: still fits
            [],                                   # nothing anywhere
            ['new'] if rank == 2 else ['k5'],     # a new key on one rank
            ['new', 'k5'],                        # steady again
        ]
        for step, keys in enumerate(plan):
            before = group.collective_count
            g.add({k: float(rank) for k in keys}, step, 'sum')
            outs.append(as_dict(g.flush(step)))
            counts.append(group.collective_count - before)
        return counts, outs

    results, errors = world.run(scenario)
    assert errors == [None] * 3
    counts, outs = results[0]
    assert counts == [2, 1, 1, 1, 2, 1]
    assert outs[1]['k999'] == (3.0, 1) and len(outs[1]) == 1000
    assert outs[2] == {'k1': (0.0, 2), 'k2': (0.0, 2)}
    assert outs[3] == {}
    assert outs[4] == {'new': (2.0, 4), 'k5': (1.0, 4)}
    assert outs[5] == {'new': (3.0, 5), 'k5': (3.0, 5)}
    assert all(r[1] == outs for r in results)  # every rank computes the same result


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
        after = as_dict(g.flush(3))  # the gatherers resynchronized identically
        return info.value, after, group.collective_count - before

    results, errors = world.run(scenario)
    assert errors == [None] * 3
    for error, after, cost in results:
        assert error.missing_ranks == (1,)
        assert 'step 1' in str(error) and 'ranks [1]' in str(error)
        assert after == {'a': (1.0, None)} and cost == 2


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
    assert results == [{'z': (2.0, None)}] * 2


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


def test_world_of_one_fast_path_matches_the_vectorized_reduction():
    g = MetricGatherer(LoggingGroup())
    g.add({'m': 1.0, 'n': math.nan}, 3, 'mean')
    g.add({'m': 4.0}, 9, 'mean')
    g.add({'s': 2.0, 't': math.inf}, None, 'sum')
    g.add({'lo': 5.0}, 2, 'min', level=2)
    g.add({'hi': -1.0}, None, 'max', level=4)
    g.add({'g': 7.0}, 3, 'gather')
    buffered = g._buffer
    layout = _gather._Layout({key: entry[_gather._SPEC] for key, entry in buffered.items()}, shared=False)
    data = np.array([[[e[_gather._ACC], e[_gather._COUNT], np.nan if e[_gather._STEP] is None else e[_gather._STEP]]
                      for e in buffered.values()]], dtype=np.float64)
    expected = _gather._results(layout, data)
    got = g.flush()
    assert [(step, level) for _, step, level in got] == [(step, level) for _, step, level in expected]
    for (metrics, _, _), (reference, _, _) in zip(got, expected):
        assert metrics.keys() == reference.keys()
        for key in metrics:
            assert metrics[key] == reference[key] or (math.isnan(metrics[key]) and math.isnan(reference[key]))
