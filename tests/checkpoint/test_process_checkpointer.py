"""CheckpointWriter with dcp.async_save's PROCESS checkpointer: the checkpoint process writes the files, the
trainer's writer hands them over and commits; failed and missing process saves are named at close; a restarted
writer adopts what a killed one left in its hand-off folder."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint, list_checkpoints
from dist_logging.object_store.checksums import file_crc32c
from dist_logging.checkpoint import _shards
from dist_logging.checkpoint._process_side import ProcessSideWriter
from dist_logging.errors import UploadError
from _recording import RecordingStore
from torchrun_helper import REPO_ROOT, read_rank_outputs, run_torchrun

pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings('ignore:torch.distributed is disabled')]
SCENARIO = pathlib.Path(__file__).with_name('process_scenario.py')


def state(step: int) -> dict:
    return {'w': torch.arange(500, dtype=torch.float32) * step, 'b': torch.full((4, 3), float(step))}


def left_in(folder: pathlib.Path) -> list[str]:
    """Files left under ``folder``, except the machine's own state (.dist_logging-<host>: commit scratch)."""
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file() and '.dist_logging-' not in str(p)
    )


@pytest.mark.multiprocess
def test_process_checkpointer_two_ranks_commits_loads_exactly_and_leaves_nothing(tmp_path):
    root = tmp_path / 'job'
    root.mkdir()
    # The job's own TMPDIR, short (not in the suite's nested sandbox): torch hands tensors to its checkpoint
    # process through a Unix socket made there (multiprocessing's resource sharer), whose path is limited to
    # 107 bytes. Removed below.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='dlp-', dir='/tmp' if os.path.isdir('/tmp') else None))
    plan = {'root': str(root), 'bucket': str(tmp_path / 'bucket')}
    try:
        run_torchrun(
            SCENARIO, 2, tmp_path / 'out', env={'CKPT_PLAN': json.dumps(plan), 'TMPDIR': str(tmp)}, timeout=200
        )
        # Nothing left in the job's TMPDIR: no file at all, and no folder but torch's own (torchrun's log folder,
        # inductor's cache folder made at import) and dist_logging's per-user base (latest_checkpoint's scratch).
        assert [str(p) for p in tmp.rglob('*') if not p.is_dir()] == []
        assert [
            p.name for p in tmp.iterdir() if not p.name.startswith(('torchelastic_', 'torchinductor_', 'dist_logging-'))
        ] == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    outputs = read_rank_outputs(tmp_path / 'out')
    assert sorted(outputs) == [0, 1]
    ids = [f'run/ckpt/step{step}' for step in (1, 2, 3, 4)]  # 1, 3, 4: PROCESS; 2: THREAD; 5 failed
    for rank, out in outputs.items():
        # step5 failed in rank 1's checkpoint process: every rank's future raised; each close() names it (rank 1:
        # its failure manifest; rank 0: DCP's finish never ran), without waiting for a timeout
        assert 'disk full' in out['step5_error'], out['step5_error']
        close_error = out['close_error'] or ''
        assert close_error.startswith('UploadError: 1 upload(s) failed:') and 'run/ckpt/step5' in close_error
        assert ('disk full' if rank == 1 else 'finish never ran') in close_error, close_error
        assert out['checkpoint_process_pid'] not in (None, out['pid'])  # torch's checkpoint process did save
        assert out['latest'] == 'run/ckpt/step4' and out['committed'] == ids
        assert out['exact'] == {'1': True, '2': True, '3': True, '4': True}, out['exact']
        # rank 0 wrote and queued its step5 shards (as a thread save would): timed, never committed. Timings are
        # recorded as each save's hand-over ends, so a process save (step1) may come after the thread save (step2)
        timed = ids + (['run/ckpt/step5'] if rank == 0 else [])
        assert sorted(t['id'] for t in out['timings']) == timed
        assert all(t['local_s'] is not None and t['local_s'] > 0 and t['bytes'] > 0 for t in out['timings'])
        assert all((t['commit_s'] is not None) == (rank == 0 and t['id'] in ids) for t in out['timings'])
    # Process saves' markers record each file's CRC32C (taken in the checkpoint process as it wrote), as thread
    # saves' do, and the landed files hold those bytes.
    for cid in ids:
        [marker] = (tmp_path / 'bucket' / cid).glob('.committed-*.json')
        record = json.loads(marker.read_text())
        assert set(record['checksums']) == set(record['files']), cid
        for relative, checksum in record['checksums'].items():
            assert file_crc32c(marker.parent / relative) == checksum, (cid, relative)
        assert out['local_s_metrics'] == len(timed) and out['commit_s_metrics'] == (4 if rank == 0 else 0)
    staging = root / 'staging'
    assert left_in(staging) == []  # shards uploaded, hand-off folders (step5's too) and intents gone
    assert not (staging / 'checkpoint-process').exists()


def writer_for(tmp_path, store, **kwargs) -> CheckpointWriter:
    from dist_logging.destinations import RemoteUploaderDownloader

    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'), num_attempts=1)
    return CheckpointWriter(rud, **kwargs)


def as_checkpoint_process(writer: CheckpointWriter, save) -> None:
    """What torch does for one PROCESS save: a thread of its own pickles the writer (and waits for the checkpoint
    process); here the save runs on that thread too, on the unpickled copy, and the thread ends with it."""

    def run():
        side = pickle.loads(pickle.dumps(writer))
        assert isinstance(side, ProcessSideWriter)
        try:
            save(side)
        except BaseException:  # noqa: BLE001 - the async_save future's error; the test checks close()
            pass

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)


def test_failed_and_missing_process_saves_are_named_at_close_and_stay_uncommitted(tmp_path, monkeypatch):
    store = RecordingStore(str(tmp_path / 'bucket'))
    writer = writer_for(tmp_path, store)  # commit_timeout 600 s: close() must not wait for it
    as_checkpoint_process(writer, lambda side: dcp.save(state(1), checkpoint_id='r/ck/s1', storage_writer=side))
    assert writer.wait_for_commits(30) and latest_checkpoint(store, 'r/ck') == 'r/ck/s1'

    real = _shards._write_files_from_queue

    def failing(*args, **kwargs):
        raise OSError('injected: disk full')

    monkeypatch.setattr(_shards, '_write_files_from_queue', failing)
    as_checkpoint_process(writer, lambda side: dcp.save(state(2), checkpoint_id='r/ck/s2', storage_writer=side))
    monkeypatch.setattr(_shards, '_write_files_from_queue', real)

    as_checkpoint_process(writer, lambda side: side.reset('r/ck/s3'))  # the process died after reset
    as_checkpoint_process(writer, lambda side: None)  # ... or before it: no id recorded

    def finish_never_runs(self, metadata, results):
        raise RuntimeError('injected: rank 1 failed its write')  # what the coordinator sees: no finish

    monkeypatch.setattr(ProcessSideWriter, 'finish', finish_never_runs)
    as_checkpoint_process(writer, lambda side: dcp.save(state(5), checkpoint_id='r/ck/s5', storage_writer=side))
    monkeypatch.undo()

    with pytest.raises(UploadError) as raised:
        writer.close()
    failures = raised.value.failures
    assert sorted(failures) == ['<process save #4, no checkpoint id recorded>', 'r/ck/s2', 'r/ck/s3', 'r/ck/s5']
    assert 'disk full' in str(failures['r/ck/s2']) and 'stays uncommitted' in str(failures['r/ck/s2'])
    assert 'before its files were written' in str(failures['r/ck/s3'])
    assert "finish never ran" in str(failures['r/ck/s5'])
    assert 'did not reach the hand-over' in ''.join(raised.value.__notes__)
    assert list_checkpoints(store, 'r/ck') == ['r/ck/s1']
    writer.uploader.shutdown()  # a shared uploader is its owner's to close
    assert left_in(tmp_path / 'staging') == []  # the failed saves' partial files are gone too


def test_staging_bound_holds_a_process_save_before_it_is_sent(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='.distcp')  # shard uploads wait for the gate
    writer = writer_for(tmp_path, store, max_staged_bytes=1)
    as_checkpoint_process(writer, lambda side: dcp.save(state(1), checkpoint_id='r/s1', storage_writer=side))
    sent = threading.Event()

    def second():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            side = pickle.loads(pickle.dumps(writer))  # torch's sending thread: waits while staging is full
        sent.caught = caught
        sent.set()
        dcp.save(state(2), checkpoint_id='r/s2', storage_writer=side)

    thread = threading.Thread(target=second)
    thread.start()
    assert not sent.wait(0.5)  # s1's shards are staged, not uploaded: s2 is not sent yet
    store.gate.set()
    assert sent.wait(30)
    thread.join(60)
    assert any('max_staged_bytes' in str(w.message) for w in sent.caught)
    writer.close()
    writer.uploader.shutdown()
    assert list_checkpoints(store, 'r') == ['r/s1', 'r/s2']


CHILD = '''
import os, pickle, signal, sys
import torch
import torch.distributed.checkpoint as dcp
from dist_logging.checkpoint import CheckpointWriter
from dist_logging.checkpoint._handoff import HandOff

HandOff._watch = lambda self: None  # killed before its watcher hands anything over
HandOff.poll = lambda self, timed_out=False: None
writer = CheckpointWriter(sys.argv[1], upload_staging_folder=sys.argv[2])
side = pickle.loads(pickle.dumps(writer))
dcp.save({'w': torch.arange(500, dtype=torch.float32) * 7, 'b': torch.full((4, 3), 7.0)},
         checkpoint_id='r/ck/s7', storage_writer=side)   # complete: files, manifest and commit record
pickle.loads(pickle.dumps(writer)).reset('r/ck/s8')       # started, never written
os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.parametrize('recovery', ['restart', 'drain'])
def test_a_restarted_writer_or_drain_takes_over_what_a_killed_trainer_left(tmp_path, recovery):
    bucket, staging = str(tmp_path / 'bucket'), str(tmp_path / 'staging')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get('PYTHONPATH', '')]))
    child = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(CHILD), bucket, staging],
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert child.returncode == -9, child.stderr[-3000:]
    left = left_in(pathlib.Path(staging) / 'checkpoint-process')
    assert any(name.endswith('commit.json') for name in left) and any(name.endswith('.distcp') for name in left)
    assert latest_checkpoint(bucket, 'r/ck') is None

    if recovery == 'restart':
        with CheckpointWriter(bucket, upload_staging_folder=staging) as writer:  # the restarted job
            dcp.save(state(9), checkpoint_id='r/ck/s9', storage_writer=writer)  # starts it: adopts, then saves
        expected = ['r/ck/s7', 'r/ck/s9']  # s8 was never written: removed, not committed
    else:
        drained = subprocess.run(
            [sys.executable, '-m', 'dist_logging', 'drain', staging, '--no-progress'],
            env=env,
            timeout=120,
            capture_output=True,
            text=True,
        )
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert 'committed checkpoint r/ck/s7' in drained.stdout, drained.stdout
        expected = ['r/ck/s7']
    assert list_checkpoints(bucket, 'r/ck') == expected
    got = state(0)
    with CheckpointReader(bucket) as reader:
        dcp.load(got, checkpoint_id='r/ck/s7', storage_reader=reader)
    assert torch.equal(got['w'], torch.arange(500, dtype=torch.float32) * 7) and torch.equal(
        got['b'], torch.full((4, 3), 7.0)
    )
    assert not (pathlib.Path(staging) / 'checkpoint-process').exists()
    assert left_in(pathlib.Path(staging)) == []
