"""The analyser's partition / silent verdict on synthetic sets, and what a rank's header records of a Logger error.

The rig's test (tests/hosts/test_postmortem_across_hosts.py) runs the real partition; these pin the rule: ranks
that other ranks' Logger errors named silent, that were alive (each left a set) and whose own Logger error named
nobody silent, are the culprits; ``partition`` when they could not read the rendezvous store either.
"""

from __future__ import annotations

import json

from dist_logging.errors import DistributedLoggingError
from dist_logging.postmortem import RankSet, analyse
from dist_logging.postmortem.capture import write_set

NEAR_ERROR = 'flush at step 4 (flush #4): silent: host host2 (ranks [2, 3]) silent for 6 s: cut off, frozen, ...'
FAR_ERROR = (
    'flush at step 4 (flush #4): cannot tell which other ranks are missing: the rendezvous store did not answer '
    '(...), so this host (host2) may be the one cut off; the other ranks are host1: ranks [0, 1]'
)


def _set(rank, message, named=None):
    exception = {'type': 'DistributedLoggingError', 'message': message}
    if named:
        exception['named'] = named
    header = {
        'rank': rank,
        'host': f'host{rank // 2 + 1}',
        'reason': 'logging_error',
        'world_size': 4,
        'time': 100.0 + rank,
        'flight_recorder': 'on',
        'roster': {str(r): [f'host{r // 2 + 1}', 1000 + r] for r in range(4)},
        'exception': exception,
    }
    entries = [{'collective_seq_id': 4, 'profiling_name': 'gloo:all_gather', 'retired': False, 'is_p2p': False,
                'process_group': ('1', 'undefined')}]  # fmt: skip
    return RankSet(rank, header, [], None, {'entries': entries})


def _partition(far_message=FAR_ERROR):
    sets = {r: _set(r, NEAR_ERROR, {'unreachable': [2, 3]}) for r in (0, 1)}
    sets[0].header['exception']['named'] = {'unreachable': [1, 2, 3]}  # a host mate that ended, named silent too
    sets.update({r: _set(r, far_message) for r in (2, 3)})
    return sets


def test_the_cut_off_side_is_named_when_every_rank_left_a_set():
    verdict = analyse(_partition())
    assert verdict.kind == 'partition' and verdict.culprits == [2, 3] and verdict.code == 1, verdict.as_json()
    assert verdict.line.startswith('partition: rank 2 (host host2), rank 3 (host host2) went silent to ranks 0, 1')
    assert 'rank 1 ' not in verdict.line  # named silent by its host mate, but it named host2 itself: a witness
    assert verdict.facts['witnesses'] == [0, 1]
    assert verdict.details[0].startswith('rank 2 captured at +2.0 s: DistributedLoggingError: ')  # times, to judge


def test_alive_but_able_to_read_the_store_is_silent_not_partition():
    verdict = analyse(_partition(far_message='flush: timed out after 5 s'))
    assert verdict.kind == 'silent' and verdict.culprits == [2, 3], verdict.as_json()


def test_before_the_far_sides_sets_land_they_are_missing():
    sets = _partition()
    del sets[2], sets[3]
    verdict = analyse(sets)
    assert verdict.kind == 'missing' and verdict.culprits == [2, 3], verdict.as_json()


def test_the_header_records_the_ranks_a_logger_error_names(tmp_path):
    error = DistributedLoggingError('flush: silent', unreachable_ranks=[3, 2], late_ranks=[1], hosts={2: 'host2'})
    kwargs = dict(rank=0, world_size=4, attempt=0, run_name='run', roster={}, exception=error)
    write_set(str(tmp_path), reason='logging_error', **kwargs)
    header = json.loads((tmp_path / 'header.json').read_text())
    assert header['exception']['named'] == {'unreachable': [2, 3], 'late': [1]}
    other = tmp_path / 'other'
    other.mkdir()
    write_set(str(other), reason='exception', **{**kwargs, 'exception': ValueError('boom')})
    assert 'named' not in json.loads((other / 'header.json').read_text())['exception']
