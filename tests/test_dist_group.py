"""LoggingGroup in one process: no-op collectives without a world, and naming missing ranks from the store."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
import torch.distributed as torch_dist

from dist_logging import DistributedLoggingError
from dist_logging.dist import LoggingGroup
from dist_logging._world.watch import HOST, StoreLine, beat_period

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


def _line(world_size, rank=0, store=None):
    """A StoreLine over an in-process store (no clone: a HashStore has no connection to copy)."""
    return StoreLine(
        store if store is not None else torch_dist.HashStore(), rank, world_size, 'p/', clone=False, period=0.5
    )


def _beat(store, rank, count, group_id, sequence, idle=0.0, waiting=False):
    store.set(f'p/beat/{rank}', f'{count} {time.time():.3f} {idle} {int(waiting)} {group_id}:{sequence}')


class _Beating(threading.Thread):
    """Keeps the beats of ``ranks`` moving (those ranks are alive) until stopped."""

    def __init__(self, store, ranks, group_id, sequence, idle=0.0):
        super().__init__(daemon=True)
        self.store, self.ranks, self.args, self.stop = store, ranks, (group_id, sequence, idle), threading.Event()

    def start(self):
        for rank in self.ranks:  # beating before anyone reads
            _beat(self.store, rank, 0, *self.args)
        super().start()

    def run(self):
        count = 0
        while not self.stop.is_set():
            count += 1
            for rank in self.ranks:
                group_id, sequence, idle = self.args
                _beat(self.store, rank, count, group_id, sequence, idle)
            self.stop.wait(0.05)


def test_missing_ranks_are_the_ones_behind_or_without_a_beat(monkeypatch):
    group = LoggingGroup(timeout=1)
    store = torch_dist.HashStore()
    group._line = _line(4, store=store)
    # ranks 0 and 2 reached collective #3; rank 1 is still at #2; rank 3 never beat
    _beat(store, 1, 1, group._id, 2)
    _beat(store, 2, 1, group._id, 3)
    group._sequence = 2
    group._arrive()  # this process is rank 0: in memory only, no store call on this thread
    assert group._sequence == 3 and group._line.sequences[group._id] == 3
    assert group.missing_ranks() == [1, 3]


def test_missing_ranks_unknown_without_a_store():
    group = LoggingGroup()
    group._line = False
    assert group.missing_ranks() is None
    error = group._failure('flush', RuntimeError('Operation timed out!'))
    assert error.missing_ranks == () and 'cannot tell which' in str(error)


def test_each_group_has_its_own_id():
    assert LoggingGroup()._id != LoggingGroup()._id


def test_a_failure_names_who_left_who_is_silent_and_who_is_late_with_their_hosts():
    """Issue 31: left (process ended on this host), a silent host (every rank on it), a silent rank on a
    host whose other rank answers, and a live rank that is late. Rank 2 had reached the collective
    (its last beat says so) before going silent: it is named all the same."""
    ended = subprocess.Popen([sys.executable, '-c', 'pass'])
    ended.wait()  # reaped: its pid names no process now
    store = torch_dist.HashStore()
    group = LoggingGroup(timeout=2)  # beats every 0.5 s: the two reads are 0.75 s apart
    group._line = line = _line(6, store=store)
    group._sequence = 5
    line.roster.update({1: (HOST, ended.pid), 2: ('hostB', 11), 3: ('hostB', 12), 4: ('hostC', 13), 5: ('hostC', 14)})
    _beat(store, 2, 7, group._id, 5)  # arrived, then silent
    _beat(store, 3, 7, group._id, 4)  # never arrived, silent
    _beat(store, 5, 3, group._id, 4)  # silent while rank 4 on the same host answers
    alive = _Beating(store, [4], group._id, 4, idle=40.0)  # alive, not calling for 40 s
    alive.start()
    try:
        t0 = time.monotonic()
        error = group._failure('flush at step 9', None)
        took = time.monotonic() - t0
    finally:
        alive.stop.set()
    assert isinstance(error, DistributedLoggingError)
    assert error.left_ranks == (1,) and error.unreachable_ranks == (2, 3, 5) and error.late_ranks == (4,)
    assert error.missing_ranks == (1, 2, 3, 4, 5)
    assert error.hosts == {1: HOST, 2: 'hostB', 3: 'hostB', 4: 'hostC', 5: 'hostC'}
    text = str(error)
    assert text.startswith('flush at step 9: ') and 'timed out after 2 s' in text
    assert f'rank 1 (pid {ended.pid} on {HOST}, this host) ended' in text
    assert 'host hostB (ranks [2, 3]) silent' in text and 'rank 5 on hostC silent' in text
    assert re.search(r'rank 4 on hostC is alive but has not entered a logging collective for 4\d s', text)
    assert took < 0.75 + 2 * 2.0  # the documented slack: 1.5 beat periods between two reads of at most 2 s each


def test_a_rank_cut_off_from_the_store_says_it_cannot_tell_and_names_a_stopped_local_rank():
    """The store does not answer (its host cut off or frozen): the error comes within the 2 s answer
    limit, says plainly that this rank cannot tell, and still names what /proc shows on this host."""
    stopped = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        group = LoggingGroup(timeout=1)
        group._line = line = _line(3, store=_SilentStore())
        line.roster.update({1: (HOST, stopped.pid), 2: ('hostB', 7)})
        t0 = time.monotonic()
        error = group._failure('flush at step 4', None)
        assert time.monotonic() - t0 < 3
    finally:
        stopped.kill()
        stopped.wait()
    text = str(error)
    assert 'cannot tell which other ranks are missing' in text and f'this host ({HOST}) may be the one cut off' in text
    assert 'hostB: rank 2' in text
    assert f'rank 1 (pid {stopped.pid} on {HOST}, this host) is stopped (SIGSTOP)' in text
    assert error.unreachable_ranks == (1,) and error.late_ranks == () and error.left_ranks == ()


class _SilentStore:
    """A store whose every call blocks, like a TCPStore whose server's host was cut off."""

    def __getattr__(self, name):
        def block(*args, **kwargs):
            threading.Event().wait()

        return block


class _Work:
    """A Work that completes when ``done`` is set, then returns ``outcome`` or raises it."""

    def __init__(self, outcome=True, done=True):
        self.outcome, self.finished = outcome, threading.Event()
        if done:
            self.finished.set()

    def get_future(self):
        return types.SimpleNamespace(done=self.finished.is_set)

    def wait(self, timeout=None):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def test_wait_all_raises_at_the_deadline_even_when_the_store_hangs():
    group = LoggingGroup(timeout=30)
    group._line = _line(2, store=_SilentStore())
    group.wait_all([_Work()], 'flush')  # completed: returns
    t0 = time.monotonic()
    with pytest.raises(DistributedLoggingError, match='flush at step 3: .*cannot tell'):
        group.wait_all([_Work(done=False)], 'flush at step 3', deadline=time.monotonic() + 0.3)
    assert time.monotonic() - t0 < 0.3 + 2 + 0.5  # the deadline, plus the store's answer limit


def test_a_failed_work_raises_named_and_the_group_is_abandoned():
    group = LoggingGroup(timeout=30)
    group._line = False
    with pytest.raises(DistributedLoggingError, match='flush at step 3.*Connection reset by peer'):
        group.wait_all([_Work(RuntimeError('Connection reset by peer'))], 'flush at step 3')
    t0 = time.monotonic()
    with pytest.raises(DistributedLoggingError, match='flush at step 4: the logging group was abandoned'):
        group._collective('flush at step 4', lambda: pytest.fail('a collective was issued'))
    assert time.monotonic() - t0 < 0.1


def test_a_signal_handler_runs_while_a_collective_waits():
    """The wait is Python-side (short sleeps), so FileLogger's SIGTERM handler is not held off."""

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    group = LoggingGroup(timeout=30)
    group._line = False
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            group.wait_all([_Work(done=False)], 'flush')
        assert time.monotonic() - t0 < 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_long_wait_warns_naming_the_late_rank_before_the_timeout():
    """Hang detection: past half the timeout (at most WATCH_AFTER_SECONDS) the waiting rank names a
    rank that is alive but has not called the Logger, with its host and how long, then raises at the timeout."""
    store = torch_dist.HashStore()
    group = LoggingGroup(timeout=3)
    group._line = line = _line(2, store=store)
    line.roster[1] = ('hostB', 5)
    group._sequence = 2
    alive = _Beating(store, [1], group._id, 1, idle=100.0)
    alive.start()
    try:
        with pytest.warns(
            RuntimeWarning,
            match=r'flush at step 8: still waiting after \d s: late: rank 1 on hostB '
            r'is alive but has not entered a logging collective for 1\d\d s',
        ):
            with pytest.raises(DistributedLoggingError, match='late: rank 1 on hostB') as info:
                group.wait_all([_Work(done=False)], 'flush at step 8')
    finally:
        alive.stop.set()
    assert info.value.late_ranks == (1,) and info.value.hosts == {1: 'hostB'}


def test_exit_hook_drops_the_groups_of_loggers_never_closed():
    """At interpreter exit (atexit), a LoggingGroup never destroyed lets go of its dedicated group, so it
    is not freed during finalization (which aborts a gloo process)."""
    from dist_logging._world import group as _group

    group = LoggingGroup()
    group._group = object()
    _group._release_process_groups()
    assert group._group is None


def test_beat_period_is_a_tenth_of_the_timeout_within_bounds():
    assert beat_period(5) == 0.5 and beat_period(30) == 3.0 and beat_period(300) == 5.0 and beat_period(1) == 0.5


def test_a_rank_that_reached_the_collective_and_ended_since_is_not_blamed():
    """Rank 1 reached collective #3, timed out first and exited (it said goodbye); rank 2 never arrived
    and is alive: only rank 2 is named (seen under load in the 4-rank gather scenario)."""
    store = torch_dist.HashStore()
    group = LoggingGroup(timeout=2)
    group._line = line = _line(3, store=store)
    group._sequence = 3
    line.roster.update({1: ('hostB', 7), 2: ('hostB', 8)})
    _beat(store, 1, 9, group._id, 3)
    store.set('p/bye/1', '1')
    alive = _Beating(store, [2], group._id, 2, idle=12.0)
    alive.start()
    try:
        error = group._failure('flush at step 6', None)
    finally:
        alive.stop.set()
    assert error.missing_ranks == (2,) and error.late_ranks == (2,) and error.left_ranks == ()
    assert 'rank 1 reached this collective and ended since' in str(error)


def test_a_closed_connection_from_a_local_rank_that_failed_too_does_not_blame_it():
    """The quick path (a peer closed its connection and ``/proc`` shows a rank on this host ended): rank 1,
    on this host, reached collective #3, raised and exited (no goodbye: ``os._exit``), which closed its
    connection under this rank's wait; rank 2 is alive and never arrived. One store read tells them
    apart: rank 2 is named late, rank 1 is not blamed (seen in the flush-death scenario, 'stops_logging')."""
    ended = subprocess.Popen([sys.executable, '-c', 'pass'])
    ended.wait()
    store = torch_dist.HashStore()
    group = LoggingGroup(timeout=2)
    group._line = line = _line(3, store=store)
    group._sequence = 3
    line.roster.update({1: (HOST, ended.pid), 2: ('hostB', 8)})
    _beat(store, 1, 9, group._id, 3)
    _beat(store, 2, 4, group._id, 2, idle=12.0)
    error = group._failure('flush at step 6', RuntimeError('Connection closed by peer [10.0.0.1]:123'))
    assert error.missing_ranks == (2,) and error.late_ranks == (2,) and error.left_ranks == (), str(error)
    assert 'rank 1 reached this collective and ended since' in str(error)


def test_the_error_keeps_its_details_through_pickling():
    import pickle

    error = DistributedLoggingError(
        'flush: x',
        missing_ranks=[4],
        left_ranks=[1],
        unreachable_ranks=[2, 3],
        late_ranks=[5],
        hosts={2: 'hostB', 3: 'hostB'},
    )
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == 'flush: x' and copy.missing_ranks == (1, 2, 3, 4, 5) and copy.left_ranks == (1,)
    assert copy.unreachable_ranks == (2, 3) and copy.late_ranks == (5,) and copy.hosts == {2: 'hostB', 3: 'hostB'}


def test_a_lent_group_makes_other_threads_wait_until_it_is_given_back():
    group = LoggingGroup(timeout=5)
    borrowed = threading.Event()
    back = threading.Event()
    order = []

    def borrower():
        group.arrive()  # the borrower's own collectives never wait for the lend
        order.append('borrower issued')
        borrowed.set()
        back.wait(5)
        order.append('borrower done')
        group.give_back()

    thread = threading.Thread(target=borrower)
    thread.start()
    group.lend(thread.ident)
    assert borrowed.wait(5)
    waiter = threading.Thread(target=lambda: (group.arrive(), order.append('lender issued')))
    waiter.start()
    time.sleep(0.2)
    assert order == ['borrower issued']  # the lender's next collective waits ...
    back.set()
    waiter.join(5)
    thread.join(5)
    assert order == ['borrower issued', 'borrower done', 'lender issued']  # ... until the group is given back


def test_a_group_never_given_back_fails_the_next_collective_at_the_timeout():
    group = LoggingGroup(timeout=0.3)
    group.lend(-1)  # a thread that will never give it back
    started = time.monotonic()
    with pytest.raises(DistributedLoggingError, match='lent to another thread .* not given back within 0.3 s'):
        group.arrive()
    assert 0.3 <= time.monotonic() - started < 3
    with pytest.raises(DistributedLoggingError, match='lending the logging group'):
        group.lend(-2)  # a second lend waits for the first, too
    group.give_back()
    group.arrive()
