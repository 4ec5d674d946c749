"""The per-rank journal: appends, torn tails, compaction."""

from __future__ import annotations

import json

import pytest

from dist_logging.upload.journal import Journal, StoreRecord, compact, read_journal

pytestmark = pytest.mark.timeout(30)


def test_queued_done_pending(tmp_path):
    path = str(tmp_path / 'journal.jsonl')
    journal = Journal(path)
    journal.append_store(StoreRecord('s1', 'file:///b', {'endpoint_url': None}))
    journal.append_queued(1, 'a/"quoted"\u00e9.txt', 10, False, 's1')
    journal.append_queued(2, 'b', 20, True, 's1', src='/elsewhere/b')
    journal.append_done(1)
    journal.close()
    for line in open(path, encoding='utf-8'):
        json.loads(line)  # every line is valid JSON
    state = read_journal(path)
    assert list(state.pending) == [2] and state.max_id == 2
    record = state.pending[2]
    assert (record.name, record.size, record.overwrite, record.src) == ('b', 20, True, '/elsewhere/b')
    assert state.stores['s1'].uri == 'file:///b'


def test_torn_last_line_is_ignored_and_not_glued(tmp_path):
    path = str(tmp_path / 'journal.jsonl')
    journal = Journal(path)
    journal.append_queued(1, 'a', 1, False, 's')
    journal.close()
    with open(path, 'a') as handle:
        handle.write('{"op":"q","id":2,"na')  # killed mid-write
    state = read_journal(path)
    assert list(state.pending) == [1] and state.torn_lines == 1
    journal = Journal(path)  # reopening starts a fresh line
    journal.append_queued(3, 'c', 1, False, 's')
    journal.close()
    state = read_journal(path)
    assert sorted(state.pending) == [1, 3]


def test_compact_keeps_only_pending(tmp_path):
    path = str(tmp_path / 'journal.jsonl')
    journal = Journal(path)
    journal.append_store(StoreRecord('s1', 'file:///one'))
    journal.append_store(StoreRecord('s2', 'file:///two'))
    for i in range(1, 6):
        journal.append_queued(i, f'n{i}', i, False, 's1' if i < 5 else 's2')
    for i in (1, 2, 5):
        journal.append_done(i)
    journal.close()
    compact(path, read_journal(path))
    lines = open(path).read().splitlines()
    assert len(lines) == 3  # one store + two records
    state = read_journal(path)
    assert sorted(state.pending) == [3, 4] and set(state.stores) == {'s1'}
    compact(path, read_journal(path).__class__(stores={}, pending={}))
    assert not (tmp_path / 'journal.jsonl').exists()


def test_open_journal_starts_over_when_nothing_is_pending_and_it_grew(tmp_path):
    import os

    from dist_logging.upload import journal as journal_module

    path = str(tmp_path / 'journal.jsonl')
    old = Journal(path)  # an earlier process left upload 1 pending
    old.append_store(StoreRecord('s0', 'file:///old'))
    old.append_queued(1, 'left-over', 5, True, 's0')
    old.close()
    journal = Journal(path, state=read_journal(path))
    journal.append_store(StoreRecord('s1', 'file:///b'))
    sizes = []
    for i in range(2, 3000):  # one upload at a time, as a long run hands them over
        journal.append_queued(i, f'run/step{i}/logs.txt', 100, True, 's1')
        journal.append_done(i)
        sizes.append(os.path.getsize(path))
    # upload 1 (from before) is still pending: the journal may not start over yet
    assert sizes[-1] > journal_module.COMPACT_AT
    assert list(read_journal(path).pending) == [1]
    journal.append_done(1)  # now nothing is pending: it starts over, keeping its store lines
    assert os.path.getsize(path) < 1024
    state = read_journal(path)
    assert state.pending == {} and set(state.stores) == {'s0', 's1'}
    for i in range(3000, 9000):
        journal.append_queued(i, f'run/step{i}/logs.txt', 100, True, 's1')
        if i % 3 == 0:  # two of every three stay pending for a while
            for j in (i - 2, i - 1, i):
                journal.append_done(j)
        sizes.append(os.path.getsize(path))
    journal.append_queued(9000, 'last', 7, False, 's1')  # queued after a restart: refers to s1
    journal.close()
    assert max(sizes[3000:]) < journal_module.COMPACT_AT + 1024  # bounded however long the run
    state = read_journal(path)
    assert list(state.pending) == [8998, 8999, 9000] and state.stores['s1'].uri == 'file:///b' and state.torn_lines == 0
