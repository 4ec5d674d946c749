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
