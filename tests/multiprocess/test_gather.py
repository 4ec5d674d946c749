"""Gathering metrics across ranks under real torchrun (gloo, CPU): exact reductions, partial and
changing key sets, collective counts and bytes (counted by wrapping torch.distributed's functions),
the flush schedule (idle back-off, flush_every), hyperparameter divergence, a skipped automatic
flush, a missing rank.

One torchrun launch per world size runs every scenario in order (each launch costs seconds);
the scenario that breaks the group (a rank that never arrives) runs last, on its own Logger.
"""

import math
import pathlib

import pytest

from torchrun_helper import read_rank_outputs, run_torchrun, write_script

pytestmark = pytest.mark.multiprocess

TESTS_DIR = str(pathlib.Path(__file__).resolve().parents[1])
MISSING_TIMEOUT = 3.0

SCENARIO = '''
import datetime, os, sys, time, warnings
import numpy as np
import torch
import torch.distributed as torch_dist
sys.path.insert(0, os.environ['TESTS_DIR'])
from torchrun_helper import dump_rank_output
from dist_logging import DistributedLoggingError, Logger
from dist_logging.destinations import InMemoryLogger

torch_dist.init_process_group('gloo')
r, W = torch_dist.get_rank(), torch_dist.get_world_size()

# Count every collective and its bytes (this rank's input) by wrapping torch.distributed's functions.
calls = []

def counting(name):
    real = getattr(torch_dist, name)

    def wrapper(*args, **kwargs):
        tensor = args[1] if name == 'all_gather' else args[0]
        calls.append([name, tensor.numel() * tensor.element_size()])
        return real(*args, **kwargs)
    return wrapper

for name in ('all_reduce', 'all_gather', 'gather', 'broadcast', 'reduce', 'all_gather_into_tensor'):
    setattr(torch_dist, name, counting(name))

sink = InMemoryLogger()
logger = Logger(sink, run_name='gather-test', sync_timeout=60)
costs = {}

def flush(name):
    before = len(calls)
    logger.flush()
    costs[name] = [c[0] for c in calls[before:]]

# A: every reduction, rank-dependent values; partial keys; a key logged twice; NaN
logger.log_metrics({'loss': torch.tensor(float(r + 1))}, step=1, reduce='mean')
logger.log_metrics({'samples': 10 * (r + 1)}, step=1, reduce='sum')
logger.log_metrics({'lo': r * 1.5}, step=1, reduce='min')
logger.log_metrics({'hi': np.float64(-r)}, step=1, reduce='max')
logger.log_metrics({'tput': 100 + r}, step=1, reduce='gather')
if r % 2:
    logger.log_metrics({'odd_only': float(r)}, step=1, reduce='mean')
if r == 0:
    logger.log_metrics({'rank0_only': 7}, step=1, reduce='sum')
logger.log_metrics({'twice': float(r)}, step=1, reduce='mean')
logger.log_metrics({'twice': float(r + 2)}, step=3, reduce='mean')
logger.log_metrics({'nan': float('nan') if r == 1 else 1.0}, step=1, reduce='max')
flush('A')
# B: the same keys again (steady state: one collective)
logger.log_metrics({'loss': torch.tensor(float(r + 1))}, step=2, reduce='mean')
logger.log_metrics({'samples': 10 * (r + 1)}, step=2, reduce='sum')
logger.log_metrics({'lo': r * 1.5}, step=2, reduce='min')
logger.log_metrics({'hi': np.float64(-r)}, step=2, reduce='max')
logger.log_metrics({'tput': 100 + r}, step=2, reduce='gather')
flush('B')
# C: the key set changes: a new key on the last rank only
logger.log_metrics({'loss': float(r)}, step=4, reduce='mean')
if r == W - 1:
    logger.log_metrics({'new_key': 5.0}, step=4, reduce='sum')
flush('C')
# D: nothing buffered anywhere
flush('D')
# E: 1, 10 and 1000 keys, each flushed twice (new keys, then steady state)
for n in (1, 10, 1000):
    for repeat in (0, 1):
        logger.log_metrics({f'n{n}/k{i}': float(i + r + repeat) for i in range(n)}, step=100 * n + repeat,
                           reduce='mean')
        flush(f'n{n}.{repeat}')

# hyperparameters: ranks disagree on lr (rank 1) and seed (every rank)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    logger.log_hyperparameters({'lr': 0.2 if r == 1 else 0.1, 'seed': r, 'batch': 32}, check_consistency=True)
hparam_warnings = [str(w.message) for w in caught if 'differ' in str(w.message)]

# idle: 1,000 batch_end calls with nothing reduced
idle = Logger(InMemoryLogger(), run_name='gather-test', sync_timeout=60)
before = len(calls)
for _ in range(1000):
    idle.batch_end()
idle.close()
idle_calls = calls[before:]

# flush_every=10: K keys reduced every batch (rank-dependent), 100 batches
K = 20
every_sink = InMemoryLogger()
every = Logger(every_sink, run_name='gather-test', sync_timeout=60, flush_every=10)
before = len(calls)
steady = None
for batch in range(1, 101):
    every.log_metrics({f'e/k{i}': float(batch * (r + 1) + i) for i in range(K)}, step=batch, reduce='mean')
    mark = len(calls)
    every.batch_end()
    if batch == 50:
        steady = calls[mark:]  # a steady-state flush: its collectives and their bytes
every_flushes = every._gatherer.flushes_issued
every.close()  # completes the flush issued at batch 100
every_calls = calls[before:]

# a rank skips the automatic flush at batch 2: every rank raises at the flush that pairs wrongly, naming it
skip = {}
for batch in range(1, 5):
    logger.log_metrics({'x': 1.0}, reduce='mean')
    if r == W - 1:
        logger.auto_flush = batch != 2  # the last rank skips the flush at batch 2
    t0 = time.monotonic()
    try:
        # the others' flush at batch 2 meets the last rank's at batch 3; each side sees it when
        # completing that flush (the others at batch 3, the last rank at batch 4)
        logger.batch_end()
    except DistributedLoggingError as exc:
        skip = {'missing': list(exc.missing_ranks), 'message': str(exc), 'seconds': time.monotonic() - t0,
                'batch': batch}
        break

out = {'costs': costs, 'skip': skip, 'hparam_warnings': hparam_warnings, 'idle_calls': idle_calls,
       'every_flushes': every_flushes, 'every_calls': every_calls, 'steady': steady}
if r == 0:
    out['data'] = sink.data
    out['traces'] = sink.traces.get('hyperparameter_mismatch')
    out['every_data'] = every_sink.data

# last: the last rank never reaches the flush; the others must raise within the timeout
short = Logger(InMemoryLogger(), run_name='gather-test', sync_timeout=float(os.environ['MISSING_TIMEOUT']))
short.log_metrics({'y': 1.0}, reduce='sum')
short.flush()  # everyone, so that the group is in use before the failure
from torch.distributed.distributed_c10d import _get_default_store
store = _get_default_store()
if r == W - 1:
    dump_rank_output(out)
    # stay alive (a live rank that stops logging) until the others have raised: no sleep to guess
    store.wait([f'gather-test/done{i}' for i in range(W - 1)], datetime.timedelta(seconds=120))
    os._exit(0)
short.log_metrics({'y': 1.0}, reduce='sum')
t0 = time.monotonic()
try:
    short.flush()
    out['missing'] = {'error': None}
except DistributedLoggingError as exc:
    out['missing'] = {'ranks': list(exc.missing_ranks), 'message': str(exc), 'seconds': time.monotonic() - t0}
dump_rank_output(out)
store.set(f'gather-test/done{r}', '1')
os._exit(0)  # the group is broken now; skip the teardown collectives
'''


def series(data, key):
    return {step: value for step, value in data[key]}


@pytest.mark.timeout(240)
@pytest.mark.parametrize('nproc', [2, 4])
def test_gather_under_torchrun(tmp_path, nproc):
    script = write_script(tmp_path, SCENARIO)
    run_torchrun(
        script,
        nproc,
        tmp_path / 'out',
        timeout=200,
        env={'TESTS_DIR': TESTS_DIR, 'MISSING_TIMEOUT': str(MISSING_TIMEOUT)},
    )
    outputs = read_rank_outputs(tmp_path / 'out')
    assert sorted(outputs) == list(range(nproc))
    W, ranks = nproc, range(nproc)
    data = outputs[0]['data']

    # exact reductions over rank-dependent inputs
    assert series(data, 'loss')[1] == sum(r + 1 for r in ranks) / W
    assert series(data, 'samples') == {1: sum(10 * (r + 1) for r in ranks), 2: sum(10 * (r + 1) for r in ranks)}
    assert series(data, 'lo') == {1: 0.0, 2: 0.0}
    assert series(data, 'hi') == {1: 0.0, 2: 0.0} and min(-r for r in ranks) == -(W - 1)
    for r in ranks:
        assert series(data, f'tput/rank{r}') == {1: 100.0 + r, 2: 100.0 + r}  # one series per rank
    odd = [r for r in ranks if r % 2]
    assert series(data, 'odd_only') == {1: sum(odd) / len(odd)}  # over the ranks that logged it
    assert series(data, 'rank0_only') == {1: 7.0}
    assert series(data, 'twice') == {3: sum(2 * r + 2 for r in ranks) / (2 * W)}  # every value; largest step
    assert math.isnan(series(data, 'nan')[1])
    # a changed key set, then an empty flush
    assert series(data, 'loss')[4] == sum(ranks) / W
    assert series(data, 'new_key') == {4: 5.0}
    # 1, 10, 1000 keys
    for n in (1, 10, 1000):
        for repeat in (0, 1):
            step = 100 * n + repeat
            values = [series(data, f'n{n}/k{i}')[step] for i in range(n)]
            assert values == [i + repeat + (W - 1) / 2 for i in range(n)]
    assert len(data) == 8 + W + 1 + 1011 + 1  # nothing else was emitted ('x': the skip scenario's first flush)

    # the collectives per flush: SUM + MAX all_reduce (+ a gather to rank zero while the layout has
    # 'gather' keys); new keys add an all_gather of their names and a SUM/MAX/gather over them alone
    steady = ['all_reduce', 'all_reduce', 'gather']
    new_keys = ['all_gather', 'all_reduce', 'all_reduce']
    for r, out in outputs.items():
        assert out['costs'] == {
            'A': ['all_reduce'] + new_keys + ['gather'],
            'B': steady,
            'C': steady + new_keys,
            'D': steady,
            'n1.0': steady + new_keys,
            'n1.1': steady,
            'n10.0': steady + new_keys,
            'n10.1': steady,
            'n1000.0': steady + new_keys,
            'n1000.1': steady,
        }, r

    # idle: 1,000 batch_end calls, at most 24 collectives (the gap doubles: batches 1, 3, 7, ..., 511)
    for r, out in outputs.items():
        assert [name for name, _ in out['idle_calls']] == ['all_reduce'] * 9, r
        assert all(nbytes == 64 for _, nbytes in out['idle_calls'])  # the 8-number header

    # flush_every=10, K = 20 keys every batch: 10 flushes, exact values, no collective in between
    K = 20
    every = outputs[0]['every_data']
    for i in range(K):
        got = dict(every[f'e/k{i}'])
        assert sorted(got) == list(range(10, 101, 10))
        for step in got:  # the mean over every value logged by every rank since the previous flush
            values = [b * (r + 1) + i for r in ranks for b in range(step - 9, step + 1)]
            assert got[step] == sum(values) / len(values)
    for r, out in outputs.items():
        assert out['every_flushes'] == 10
        names = [name for name, _ in out['every_calls']]
        assert names == ['all_reduce'] + new_keys + ['all_reduce', 'all_reduce'] * 9, names
        # bytes per collective: [sums | counts] and [header | steps | levels]: O(K), no term in W
        assert out['steady'] == [['all_reduce', 8 * 2 * K], ['all_reduce', 8 * (8 + 2 * K)]], out['steady']

    # hyperparameter divergence: the differing keys and ranks, reported on rank zero
    traces = outputs[0]['traces']
    assert traces is not None and len(traces) == 1
    assert set(traces[0]) == {'lr', 'seed'}
    assert traces[0]['lr'] == [{'ranks': [r for r in ranks if r != 1], 'value': '0.1'}, {'ranks': [1], 'value': '0.2'}]
    assert len(outputs[0]['hparam_warnings']) == 1
    assert all(not out['hparam_warnings'] for r, out in outputs.items() if r)

    # a skipped flush: every rank raises (at its next flush), naming the rank and the step
    for r, out in outputs.items():
        assert out['skip']['missing'] == [W - 1], out['skip']
        assert 'step 2' in out['skip']['message']
        assert out['skip']['batch'] == (4 if r == W - 1 else 3)
        assert out['skip']['seconds'] < 30

    # a rank that never arrives: the others raise within the timeout (+ scheduling slack), naming it
    for r in range(W - 1):
        missing = outputs[r]['missing']
        assert missing.get('ranks') == [W - 1], missing
        # alive (its store line beats) but not calling: named as late, with its host (issue 31)
        assert f'late: rank {W - 1} on ' in missing['message'], missing
        assert 'is alive but has not entered a logging collective' in missing['message'], missing
        assert MISSING_TIMEOUT - 0.5 < missing['seconds'] < MISSING_TIMEOUT + 10


DEVICE_SCENARIO = '''
import os, sys, torch
import torch.distributed as torch_dist
sys.path.insert(0, os.environ['TESTS_DIR'])
from torchrun_helper import dump_rank_output
from dist_logging import Logger
from dist_logging.destinations import InMemoryLogger

r = int(os.environ['LOCAL_RANK'])
torch.cuda.set_device(r)
torch_dist.init_process_group('nccl', device_id=torch.device('cuda', r))
W = torch_dist.get_world_size()
sink = InMemoryLogger()
logger = Logger(sink, run_name='device-test', sync_timeout=60, flush_every=2)
for batch in range(1, 5):
    loss = torch.full((), float(r + batch), device='cuda')  # a CUDA tensor: never read at the call
    logger.log_metrics({'loss': loss, 'lr': 0.5}, step=batch, reduce='mean')
    logger.log_metrics({'peak': loss * 2}, step=batch, reduce='max')
    logger.log_metrics({'low': loss}, step=batch, reduce='min')
    logger.log_metrics({'tput': loss + 100}, step=batch, reduce='gather')
    logger.batch_end()
logger.flush()
out = {'gloo_group_created': logger._group._group is not None,
       'device': str(logger._gatherer._device)}
if r == 0:
    out['data'] = sink.data
logger.close()
dump_rank_output(out)
torch_dist.destroy_process_group()
'''


@pytest.mark.timeout(240)
@pytest.mark.skipif(
    not __import__('torch').cuda.is_available() or __import__('torch').cuda.device_count() < 2,
    reason='the device-native path needs 2 CUDA devices (NCCL)',
)
def test_device_native_reduction_under_torchrun_nccl(tmp_path):
    script = write_script(tmp_path, DEVICE_SCENARIO)
    run_torchrun(script, 2, tmp_path / 'out', timeout=200, env={'TESTS_DIR': TESTS_DIR})
    outputs = read_rank_outputs(tmp_path / 'out')
    for out in outputs.values():
        assert out['gloo_group_created'] is False and out['device'].startswith('cuda')
    data = outputs[0]['data']
    for step in (2, 4):  # flushes at batches 2 and 4: the values of batches step-1 and step, both ranks
        values = [r + b for r in (0, 1) for b in (step - 1, step)]
        assert dict(data['loss'])[step] == sum(values) / 4 and dict(data['lr'])[step] == 0.5
        assert dict(data['peak'])[step] == 2 * max(values) and dict(data['low'])[step] == min(values)
        assert dict(data['tput/rank1'])[step] == 100 + 1 + step  # gather: the last value logged
