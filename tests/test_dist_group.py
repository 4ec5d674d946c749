"""LoggingGroup in one process: no-op collectives without a world, and naming missing ranks from the store."""

import pytest
import torch
import torch.distributed as torch_dist

from dist_logging import DistributedLoggingError
from dist_logging.dist import LoggingGroup

pytestmark = pytest.mark.timeout(30)


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match='sync_timeout'):
        LoggingGroup(0)


def test_without_a_world_collectives_return_at_once():
    group = LoggingGroup()
    assert not group.active and group.rank == 0
    t = torch.ones(3)
    assert group.all_gather(t, 'x') == [t]
    assert group.all_reduce(t, torch_dist.ReduceOp.SUM, 'x') is t
    assert group.all_gather_object({'a': 1}, 'x') == [{'a': 1}]
    assert group.all_gather_bytes(b'abc', 3, [3], 'x') == [b'abc']
    assert group.broadcast_object(5, 'x') == 5
    group.barrier('x')
    assert group.collective_count == 0


def test_missing_ranks_are_the_ones_whose_arrival_mark_differs(monkeypatch):
    group = LoggingGroup(timeout=1)
    store = torch_dist.HashStore()
    group._store = store
    monkeypatch.setattr(torch_dist, 'get_world_size', lambda group=None: 4)
    # ranks 0 and 2 reached collective #3; rank 1 is still at #2; rank 3 never wrote a mark
    store.set(f'{group._prefix}1', '2')
    store.set(f'{group._prefix}2', '3')
    group._sequence = 2
    group._arrive()  # this process is rank 0
    assert group._sequence == 3 and store.get(f'{group._prefix}0') == b'3'
    assert group.missing_ranks() == [1, 3]
    error = group._failure('flush at step 7', RuntimeError('Operation timed out!'))
    assert isinstance(error, DistributedLoggingError)
    assert error.missing_ranks == (1, 3)
    assert 'flush at step 7' in str(error) and '[1, 3]' in str(error)


def test_missing_ranks_unknown_without_a_store():
    group = LoggingGroup()
    group._store = False
    assert group.missing_ranks() is None
    error = group._failure('flush', RuntimeError('Operation timed out!'))
    assert error.missing_ranks == () and 'not every rank arrived' in str(error)


def test_each_group_has_its_own_store_prefix():
    assert LoggingGroup()._prefix != LoggingGroup()._prefix


class _Work:
    def __init__(self, outcome):
        self.outcome, self.timeouts = outcome, []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def test_wait_all_waits_until_the_deadline_and_never_without_a_timeout():
    import datetime
    import time

    group = LoggingGroup(timeout=30)
    group._store = False
    done, late = _Work(True), _Work(True)
    group.wait_all([done], 'flush', deadline=time.monotonic() + 10)
    assert 9 < done.timeouts[0].total_seconds() <= 10
    group.wait_all([late], 'flush', deadline=time.monotonic() - 5)  # past: still a positive timeout
    assert late.timeouts[0] == datetime.timedelta(milliseconds=1)  # timedelta(0) would mean "forever" to c10d
    for outcome in (RuntimeError('Operation timed out!'), False):
        with pytest.raises(DistributedLoggingError, match='flush at step 3'):
            group.wait_all([_Work(outcome)], 'flush at step 3')


def test_exit_hook_drops_the_groups_of_loggers_never_closed():
    """At interpreter exit (atexit), a LoggingGroup never destroyed lets go of its dedicated group
    and store, so they are not freed during finalization (which aborts a gloo process)."""
    from dist_logging.dist import _group as dist

    group = LoggingGroup()
    dedicated, store = object(), object()
    group._group, group._store = dedicated, store
    dist._release_process_groups()
    assert group._group is None and group._store is None


def test_a_failed_collective_names_the_ranks_that_left(monkeypatch):
    """Issue 21: rank 1 (this host, process ended) left; rank 2 (another host) does not answer the roll
    call; rank 3 (another host) answers: it is a survivor, not named."""
    import subprocess
    import sys

    from dist_logging.dist import _group as dist

    ended = subprocess.Popen([sys.executable, '-c', 'pass'])
    ended.wait()  # reaped: its pid names no process now
    group = LoggingGroup(timeout=30)
    store = torch_dist.HashStore()
    group._store = store
    monkeypatch.setattr(torch_dist, 'get_world_size', lambda group=None: 4)
    monkeypatch.setattr(dist, '_ROLL_CALL_SECONDS', 0.5)
    group._announce()  # rank 0, this process
    store.set(f'{dist._PROC_PREFIX}1', f'{dist._HOST} {ended.pid}')
    store.set(f'{dist._PROC_PREFIX}2', 'other-host 4242')
    store.set(f'{dist._PROC_PREFIX}3', 'third-host 4343')
    store.set(f'{group._prefix}rollcall{group._sequence}/3', '1')
    error = group._failure('flush at step 2', RuntimeError('Read error [10.0.0.2]:4802: Connection reset by peer'))
    assert isinstance(error, DistributedLoggingError)
    assert error.left_ranks == (1,) and error.missing_ranks == (1, 2)
    assert f'rank(s) [1] left the job (their process ended: rank 1: pid {ended.pid} on {dist._HOST})' in str(error)
    assert 'rank(s) [2] on other hosts did not answer' in str(error) and 'within' in str(error)
    assert 'not every rank arrived' not in str(error)


def test_a_live_rank_on_this_host_is_not_said_to_have_left(monkeypatch):
    import os

    from dist_logging.dist import _group as dist

    group = LoggingGroup(timeout=30)
    store = torch_dist.HashStore()
    group._store = store
    monkeypatch.setattr(torch_dist, 'get_world_size', lambda group=None: 2)
    store.set(f'{dist._PROC_PREFIX}1', f'{dist._HOST} {os.getppid()}')  # alive
    error = group._failure('flush', RuntimeError('Connection closed by peer [127.0.0.1]:1'))
    assert error.left_ranks == () and 'a rank left or failed' in str(error)


def test_a_rank_that_arrived_and_ended_after_a_timeout_is_not_blamed(monkeypatch):
    """Rank 1 reached the collective, timed out first and exited; rank 3 never arrived: a timeout names
    rank 3 (from the arrival marks), not rank 1 (seen under load: the 4-rank gather scenario)."""
    import subprocess
    import sys

    from dist_logging.dist import _group as dist

    ended = subprocess.Popen([sys.executable, '-c', 'pass'])
    ended.wait()
    group = LoggingGroup(timeout=3)
    store = torch_dist.HashStore()
    group._store = store
    monkeypatch.setattr(torch_dist, 'get_world_size', lambda group=None: 4)
    group._announce()
    group._arrive()  # this rank (0) reached collective 1
    store.set(f'{dist._PROC_PREFIX}1', f'{dist._HOST} {ended.pid}')
    for rank in (1, 2):
        store.set(f'{group._prefix}{rank}', str(group._sequence))
    error = group._failure('flush at step 0', RuntimeError('[../third_party/gloo/...] Timed out waiting 3000ms'))
    assert error.left_ranks == ()
    assert error.missing_ranks == (3,), str(error)
    assert 'left the job' not in str(error)
