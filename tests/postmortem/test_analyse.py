"""The analyser of ``dist-logging diagnose`` on synthetic sets (torch's dump layout, as gloo writes it in torch 2.13),
and the command on a local bucket: verdicts, culprits on the first line, exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import pickle

import pytest

from dist_logging.cli import main
from dist_logging.postmortem import RankSet, analyse, object_names, rank_of_path
from dist_logging.postmortem.diagnose import load_dump

USER = '/home/me/train.py'
TORCH = '/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py'


def _entry(seq, op='all_reduce', retired=True, group='0'):
    return {
        'collective_seq_id': seq,
        'profiling_name': f'gloo:{op}',
        'retired': retired,
        'state': 'scheduled',
        'process_group': (group, 'default_pg' if group == '0' else 'undefined'),
        'is_p2p': False,
        'time_created_ns': seq,
        'time_discovered_started_ns': None,
        'time_discovered_completed_ns': None,
    }


def _dump(entries):
    return {
        'version': '2.10',
        'pg_config': {'': {'name': '', 'desc': '', 'ranks': '[]'}},
        'entries': entries,
        'pg_status': {},
    }


def _set(rank, entries=None, reason='hang', error=None, frames=None, world=4):
    header = {
        'rank': rank,
        'host': f'node{rank // 2}',
        'reason': reason,
        'world_size': world,
        'time': 100.0 + rank,
        'flight_recorder': 'on' if entries is not None else 'off',
        'roster': {str(r): [f'node{r // 2}', 1000 + r] for r in range(world)},
        'groups': [{'name': '0', 'desc': 'default_pg', 'ranks': list(range(world))}],
    }
    if error:
        header['exception'] = {'type': error[0], 'message': error[1], 'where': f'{USER}:77 in step'}
    stacks = [
        {
            'ident': 1,
            'name': 'MainThread',
            'main': True,
            'frames': frames
            or [
                {'file': USER, 'line': 10, 'function': '<module>'},
                {'file': TORCH, 'line': 3252, 'function': 'all_reduce'},
            ],
        }
    ]
    return RankSet(rank, header, stacks, None, None if entries is None else _dump(entries))


def _first_line_ranks(line):
    import re

    return {int(n) for n in re.findall(r'(?<!\w)rank (\d+)', line)}


def test_hang_names_the_rank_that_did_not_enter_and_where_it_is():
    waiting = [_entry(1), _entry(2), _entry(3, retired=False)]
    sleeping = [{'file': USER, 'line': 10, 'function': '<module>'}, {'file': USER, 'line': 42, 'function': 'load'}]
    sets = {r: _set(r, waiting) for r in range(3)}
    sets[3] = _set(3, [_entry(1), _entry(2)], frames=sleeping)
    verdict = analyse(sets)
    assert verdict.kind == 'hang' and verdict.culprits == [3] and verdict.code == 1
    assert _first_line_ranks(verdict.line) == {3}
    assert 'rank 3 (host node1)' in verdict.line and f'{USER}:42 in load' in verdict.line
    assert 'all_reduce #3' in verdict.line and 'ranks 0, 1, 2' in verdict.line


def test_desync_names_the_minority_and_both_ops():
    sets = {r: _set(r, [_entry(1), _entry(2, 'all_reduce', retired=False)]) for r in range(3)}
    sets[3] = _set(3, [_entry(1), _entry(2, 'broadcast', retired=False)])
    verdict = analyse(sets)
    assert verdict.kind == 'desync' and verdict.culprits == [3]
    assert _first_line_ranks(verdict.line) == {3}
    assert 'broadcast #2' in verdict.line and 'called all_reduce' in verdict.line


def test_desync_that_completed_is_still_found():
    # broadcast and all_reduce of the same size can pair up in gloo and both retire: the ops still differ.
    sets = {r: _set(r, [_entry(1), _entry(2), _entry(3, retired=False)], reason='manual') for r in range(3)}
    sets[3] = _set(3, [_entry(1), _entry(2, 'broadcast'), _entry(3, retired=False)], reason='manual')
    verdict = analyse(sets)
    assert verdict.kind == 'desync' and verdict.culprits == [3] and 'broadcast #2' in verdict.line


def test_crash_names_the_rank_with_its_own_error_not_the_consequences():
    closed = ('RuntimeError', '[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234')
    sets = {r: _set(r, [_entry(1), _entry(2, retired=False)], reason='exception', error=closed) for r in range(3)}
    sets[3] = _set(3, [_entry(1)], reason='exception', error=('ValueError', 'bad batch'))
    verdict = analyse(sets)
    assert verdict.kind == 'crash' and verdict.culprits == [3]
    assert verdict.line.startswith('crash: rank 3 (host node1) raised ValueError: bad batch')
    assert _first_line_ranks(verdict.line) == {3}


def test_only_culprits_are_written_rank_n_on_the_first_line():
    sets = {r: _set(r, [_entry(1), _entry(2, retired=False)], reason='sigterm') for r in range(3)}
    sets[3] = _set(3, [_entry(1)], reason='exception', error=('AssertionError', 'rank 0 sent a bad shape'))
    verdict = analyse(sets)
    assert _first_line_ranks(verdict.line) == {3} and 'rank=0 sent a bad shape' in verdict.line


def test_sigterm_consequences_and_a_missing_rank():
    # rank 2 was SIGKILLed (no set); the others were waiting for it in all_reduce #2.
    sets = {r: _set(r, [_entry(1), _entry(2, retired=False)], reason='sigterm') for r in (0, 1, 3)}
    verdict = analyse(sets)
    assert verdict.kind == 'missing' and verdict.culprits == [2]
    assert _first_line_ranks(verdict.line) == {2} and 'node1' in verdict.line


def test_all_waiting_in_the_same_collective_cannot_tell():
    sets = {r: _set(r, [_entry(1), _entry(2, retired=False)]) for r in range(4)}
    verdict = analyse(sets)
    assert verdict.code == 2 and verdict.line.startswith('cannot tell') and not _first_line_ranks(verdict.line)


def test_manual_captures_show_nothing_wrong():
    sets = {r: _set(r, [_entry(1), _entry(2)], reason='manual') for r in range(4)}
    verdict = analyse(sets)
    assert verdict.code == 0 and verdict.culprits == [] and not _first_line_ranks(verdict.line)


def test_without_the_recorder_a_hang_is_read_from_the_stacks():
    sleeping = [{'file': USER, 'line': 42, 'function': 'load'}]
    sets = {r: _set(r, None) for r in range(3)}
    sets[3] = _set(3, None, frames=sleeping)
    verdict = analyse(sets)
    assert verdict.kind == 'hang' and verdict.culprits == [3] and 'flight recorder off' in ' '.join(verdict.details)


def test_logging_group_hang_is_read_per_group():
    # The default group is fine; in the Logger's group (name '1'), rank 1 never entered collective #5.
    base = [_entry(1), _entry(2)]
    sets = {r: _set(r, base + [_entry(4, group='1'), _entry(5, group='1', retired=False)]) for r in (0, 2, 3)}
    sets[1] = _set(1, base + [_entry(4, group='1')])
    verdict = analyse(sets)
    assert verdict.culprits == [1] and 'process group 1' in verdict.line


@pytest.mark.parametrize(
    'path, rank',
    [
        ('attempt-0/rank-3/header.json', 3),
        ('attempt-1/fr/fr_trace_rank_12', 12),
        ('x/rank7/stacks.txt', 7),
        ('attempt-0/header.json', None),
    ],
)
def test_rank_of_path(path, rank):
    assert rank_of_path(path) == rank


def test_every_object_name_holds_its_rank():
    for rank in (0, 7, 1023):
        for name in object_names('run', '2', rank).values():
            assert rank_of_path(name) == rank


def test_a_dump_that_refers_to_code_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ('pwned',))

    with pytest.raises(pickle.UnpicklingError):
        load_dump(pickle.dumps({'entries': [Evil()]}))
    assert load_dump(pickle.dumps(_dump([_entry(1)])))['entries'][0]['collective_seq_id'] == 1


def _write_bucket(root, run, sets):
    for rank, rank_set in sets.items():
        names = object_names(run, '0', rank)
        for key, payload in (
            ('header.json', json.dumps(rank_set.header).encode()),
            ('stacks.json', json.dumps(rank_set.stacks).encode()),
            ('fr', pickle.dumps(rank_set.dump)),
        ):
            path = root / names[key]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload)


def _cli(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(['diagnose', *argv])
    return code, out.getvalue()


def test_command_reads_a_local_bucket(tmp_path):
    sets = {r: _set(r, [_entry(1), _entry(2, retired=False)]) for r in range(3)}
    sets[3] = _set(3, [_entry(1)])
    _write_bucket(tmp_path, 'job', sets)
    code, out = _cli(str(tmp_path / 'job'))
    assert code == 1 and out.startswith('hang: rank 3 (host node1)')
    code, out = _cli(str(tmp_path), '--run', 'job', '--json')
    assert code == 1 and json.loads(out)['culprits'] == [3]
    code, out = _cli(str(tmp_path))  # one run with a postmortem in the bucket: found
    assert code == 1
    code, out = _cli(str(tmp_path), '--run', 'other')
    assert code == 0 and out.startswith('no postmortem')
