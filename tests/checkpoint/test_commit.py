"""The commit rule, un-commit, deletion order, latest_checkpoint and retention, on the store level."""

from __future__ import annotations

import pytest

from dist_logging.checkpoint import apply_retention, latest_checkpoint, list_checkpoints
from dist_logging.checkpoint._layout import METADATA_NAME, MARKER_RE
from dist_logging.checkpoint.commit import NotLanded, commit_checkpoint, delete_checkpoint
from _recording import RecordingStore

pytestmark = pytest.mark.timeout(60)


def put(store, tmp_path, name, data: bytes):
    src = tmp_path / 'src.bin'
    src.write_bytes(data)
    store.upload_object(name, str(src))


def make(store, tmp_path, cid, files, *, commit=True, time_ns=None):
    for rel, data in files.items():
        put(store, tmp_path, f'{cid}/{rel}', data)
    meta = tmp_path / 'meta.bin'
    meta.write_bytes(b'metadata of ' + cid.encode())
    if commit:
        scratch = tmp_path / 'scratch'
        scratch.mkdir(exist_ok=True)
        return commit_checkpoint(
            store,
            cid,
            {rel: len(d) for rel, d in files.items()},
            str(scratch),
            metadata_file=str(meta),
            time_ns=time_ns,
        )


def markers(store, cid):
    return [i.name for i in store.list(f'{cid}/') if MARKER_RE.match(i.name)]


def test_commit_needs_every_file_with_its_size(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    (tmp_path / 'scratch').mkdir()
    put(store, tmp_path, 'c/s1/a.distcp', b'aaa')
    with pytest.raises(NotLanded) as missing:
        commit_checkpoint(store, 'c/s1', {'a.distcp': 3, 'b.distcp': 2}, str(tmp_path / 'scratch'))
    assert missing.value.missing == {'c/s1/b.distcp': 'missing'}
    put(store, tmp_path, 'c/s1/b.distcp', b'b')  # landed, but not whole
    with pytest.raises(NotLanded, match='size 1, expected 2'):
        commit_checkpoint(store, 'c/s1', {'a.distcp': 3, 'b.distcp': 2}, str(tmp_path / 'scratch'))
    assert markers(store, 'c/s1') == [] and latest_checkpoint(store, 'c') is None  # nothing changed: invisible
    put(store, tmp_path, 'c/s1/b.distcp', b'bb')
    store.ops.clear()
    meta = tmp_path / 'm'
    meta.write_bytes(b'M' * 7)
    marker = commit_checkpoint(
        store, 'c/s1', {'a.distcp': 3, 'b.distcp': 2}, str(tmp_path / 'scratch'), metadata_file=str(meta)
    )
    writes = [op for op in store.ops if op[0] in ('upload', 'delete')]
    assert writes == [('upload', f'c/s1/{METADATA_NAME}'), ('upload', marker)]  # the marker is the last write
    assert latest_checkpoint(store, 'c') == 'c/s1'


def test_resave_keeps_the_committed_version_readable_until_the_new_commit(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    make(store, tmp_path, 'c/s1', {'__0_aaaa_0.distcp': b'old0', '__1_aaaa_0.distcp': b'old1'})
    # A second save of the same id (same job restarted, or another job): new names, the old files stay.
    for rel, data in {'__0_bbbb_0.distcp': b'new00', '__1_bbbb_0.distcp': b'new11'}.items():
        put(store, tmp_path, f'c/s1/{rel}', data)
    assert latest_checkpoint(store, 'c') == 'c/s1'
    names = {i.name for i in store.list('c/s1/')}
    assert {'c/s1/__0_aaaa_0.distcp', 'c/s1/__1_aaaa_0.distcp', f'c/s1/{METADATA_NAME}'} <= names
    store.ops.clear()
    meta = tmp_path / 'm2'
    meta.write_bytes(b'new metadata')
    new_marker = commit_checkpoint(
        store,
        'c/s1',
        {'__0_bbbb_0.distcp': 5, '__1_bbbb_0.distcp': 5},
        str(tmp_path / 'scratch'),
        metadata_file=str(meta),
    )
    writes = [op for op in store.ops if op[0] in ('upload', 'delete')]
    # un-commit (old marker) before the new .metadata replaces the old; old-only files deleted after the commit
    assert writes[0][0] == 'delete' and MARKER_RE.match(writes[0][1])
    assert writes[1] == ('upload', f'c/s1/{METADATA_NAME}') and writes[2] == ('upload', new_marker)
    assert sorted(writes[3:]) == [('delete', 'c/s1/__0_aaaa_0.distcp'), ('delete', 'c/s1/__1_aaaa_0.distcp')]
    assert markers(store, 'c/s1') == [new_marker]


def test_delete_uncommits_first_then_metadata_then_shards(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    make(store, tmp_path, 'c/s1', {'x.distcp': b'x', 'y.distcp': b'yy'})
    store.ops.clear()
    delete_checkpoint(store, 'c/s1', store.list('c/'))
    deletes = [name for op, name in store.ops if op == 'delete']
    assert MARKER_RE.match(deletes[0]) and deletes[1] == f'c/s1/{METADATA_NAME}'
    assert sorted(deletes[2:]) == ['c/s1/x.distcp', 'c/s1/y.distcp']
    assert store.list('c/') == []


def test_latest_skips_uncommitted_foreign_and_partial_with_bounded_requests(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    make(store, tmp_path, 'run/ck/step1', {'a.distcp': b'1'}, time_ns=1_000)
    make(store, tmp_path, 'run/ck/step2', {'a.distcp': b'22'}, time_ns=2_000)
    make(store, tmp_path, 'run/ck/step3', {'a.distcp': b'333'}, commit=False)  # being written
    put(store, tmp_path, 'run/ck/notes/readme.txt', b'foreign')  # not a checkpoint
    put(store, tmp_path, 'run/ck/step9/.committed-garbage.json', b'{}')  # not a marker name
    for i in range(20):  # more checkpoints do not mean more requests
        make(store, tmp_path, f'run/ck/old{i}', {'a.distcp': b'o'}, time_ns=100 + i)
    store.ops.clear()
    assert latest_checkpoint(store, 'run/ck') == 'run/ck/step2'
    assert [op for op, _ in store.ops] == ['list', 'download']  # one listing, one read
    # A committed checkpoint whose shard vanished (deleted by hand) is skipped, never returned.
    store.delete('run/ck/step2/a.distcp')
    assert latest_checkpoint(store, 'run/ck') == 'run/ck/step1'
    assert latest_checkpoint(store, 'nothing/here') is None
    assert list_checkpoints(store, 'run/ck')[-2:] == ['run/ck/step1', 'run/ck/step2']
    with pytest.raises(TypeError):
        latest_checkpoint(object(), 'run')


def test_retention_counts_only_committed_and_deletes_oldest_first(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    for step in (1, 2, 3):
        make(store, tmp_path, f'r/step{step}', {'a.distcp': b'a' * step}, time_ns=step * 1000)
    make(store, tmp_path, 'r/step4', {'a.distcp': b'x'}, commit=False)  # uncommitted: never counted or touched
    make(store, tmp_path, 'r/step5', {'a.distcp': b'a' * 5}, time_ns=5000)
    store.ops.clear()
    assert apply_retention(store, 'r', 2) == ['r/step1', 'r/step2']
    assert list_checkpoints(store, 'r') == ['r/step3', 'r/step5']
    assert [i.name for i in store.list('r/step4/')] == ['r/step4/a.distcp']
    deleted = [name for op, name in store.ops if op == 'delete']
    assert deleted.index('r/step1/a.distcp') < deleted.index([d for d in deleted if d.startswith('r/step2/')][0])
    assert apply_retention(store, 'r', 1) == ['r/step3']  # the newest committed is never deleted
    assert list_checkpoints(store, 'r') == ['r/step5']
    with pytest.raises(ValueError, match='keep_last'):
        apply_retention(store, 'r', 0)


def test_a_landed_upload_wakes_the_committer_for_its_next_look_at_once(tmp_path, monkeypatch):
    import time

    from dist_logging.checkpoint import _committer
    from dist_logging.checkpoint._intents import write_intent
    from dist_logging.destinations.remote import RemoteUploaderDownloader

    # Without a nudge the committer's next look at the bucket would be ten minutes away.
    monkeypatch.setattr(_committer, '_POLL_MIN', 600.0)
    bucket = tmp_path / 'bucket'
    store = RecordingStore(str(bucket), block='c/s1/b.distcp')
    results = []
    (tmp_path / 'scratch').mkdir()
    committer = _committer.Committer(store, str(tmp_path / 'scratch'), 1200.0, dict, lambda *a: results.append(a))
    uploader = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'))
    uploader.add_landed_listener(committer.nudge)
    try:
        put(store, tmp_path, 'c/s1/a.distcp', b'aaa')
        intent = write_intent(
            str(tmp_path / 'intents'),
            'c/s1',
            {'a.distcp': 3, 'b.distcp': 2},
            time.time_ns(),
            metadata=None,
            bucket_uri=None,
            kind='folder',
        )
        committer.submit(intent)
        src = tmp_path / 'b.bin'
        src.write_bytes(b'bb')
        uploader.upload_file(None, 'c/s1/b.distcp', str(src))
        assert not committer.wait(0.3)  # b has not landed: the first look failed, the next is far away
        lists_before = sum(op == ('list', 'c/s1/') for op in store.ops)
        store.gate.set()  # b lands: its landing wakes the committer, which commits on its next look
        assert committer.wait(60), 'the landed upload did not wake the committer'
        assert results and results[0][1] is None, results
        assert latest_checkpoint(store, 'c') == 'c/s1'
        assert sum(op == ('list', 'c/s1/') for op in store.ops) >= lists_before + 1
    finally:
        uploader.remove_landed_listener(committer.nudge)
        uploader.shutdown()
        committer.close()
