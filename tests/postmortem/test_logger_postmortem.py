"""The Logger's postmortem API in one process: ``capture_postmortem``, validation, the config key, and the
process-ending triggers (an uncaught exception, SIGTERM) in a real child process, hooks chained."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from dist_logging import Logger
from dist_logging.destinations.remote import RemoteUploaderDownloader
from dist_logging.postmortem import analyse, rank_of_path

pytestmark = pytest.mark.timeout(180)

REPO = pathlib.Path(__file__).resolve().parents[2]

CHILD = '''
import sys, time
from dist_logging import Logger
from dist_logging.destinations.remote import RemoteUploaderDownloader
mode, bucket = sys.argv[1], sys.argv[2]
logger = Logger(RemoteUploaderDownloader(bucket), run_name='child', postmortem=True)
logger.batch_end()
print('ready', flush=True)
if mode == 'raise':
    raise KeyError('no such column')
if mode == 'fatal':  # handed over, not awaited; then the exit after a fatal error (os._exit) must wait for it
    logger.capture_postmortem('manual')
    from dist_logging import dist
    dist.note_fatal_error(RuntimeError('the job is ending'))
    sys.exit(0)
time.sleep(60)
'''


def _env(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]),
        DIST_LOGGING_TMPDIR=str(tmp_path / 'state'),
    )
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'DIST_LOGGING_RUN_NAME'):
        env.pop(key, None)
    return env


def test_capture_postmortem_on_demand_once(tmp_path):
    bucket = tmp_path / 'bucket'
    logger = Logger(RemoteUploaderDownloader(str(bucket)), run_name='demand', postmortem=False)
    try:
        logger.batch_end()
        prefix = logger.capture_postmortem('checking', wait=30)
        assert prefix == 'demand/postmortem/attempt-0/rank-0/'
        assert logger.capture_postmortem('again') is None  # once per rank per attempt
        with pytest.raises(ValueError, match='reason'):
            logger.capture_postmortem('no/slashes')
    finally:
        logger.close()
    header = json.loads((bucket / prefix / 'header.json').read_text())
    assert header['reason'] == 'checking' and header['rank'] == 0 and header['pid'] == os.getpid()
    assert json.loads((bucket / prefix / 'events.json').read_text())['timestamp']['batch'] == 1
    assert 'test_capture_postmortem_on_demand_once' in (bucket / prefix / 'stacks.txt').read_text()
    assert (bucket / 'demand/postmortem/attempt-0/fr/fr_trace_rank_0').exists()
    assert all(rank_of_path(str(p.relative_to(bucket / 'demand'))) == 0 for p in bucket.rglob('*') if p.is_file())
    with pytest.raises(RuntimeError):
        logger.capture_postmortem('late')


def test_nothing_is_written_when_nothing_is_wrong(tmp_path):
    bucket = tmp_path / 'bucket'
    logger = Logger(RemoteUploaderDownloader(str(bucket)), run_name='quiet', postmortem=True)
    for _ in range(3):
        logger.batch_end()
    logger.close()
    assert not (bucket / 'quiet' / 'postmortem').exists()


@pytest.mark.parametrize('value', [0, -1.0, 'ten', True])
def test_bad_hang_timeout_is_refused_at_construction(tmp_path, value):
    with pytest.raises(ValueError, match='hang_timeout'):
        Logger(RemoteUploaderDownloader(str(tmp_path)), run_name='bad', hang_timeout=value)


def test_config_key(tmp_path):
    from dist_logging.config import load_config

    with pytest.raises(ValueError, match='hang_timeout'):
        load_config({'hang_timeout': -3, 'upload': str(tmp_path)})
    assert load_config({'hang_timeout': 600, 'upload': str(tmp_path)}).logger_kwargs['hang_timeout'] == 600


def _child(tmp_path, mode, **env):
    bucket = tmp_path / 'bucket'
    proc = subprocess.Popen(
        [sys.executable, '-c', CHILD, mode, str(bucket)],
        env={**_env(tmp_path), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == 'ready'
        if mode == 'sigterm':
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return bucket / 'child' / 'postmortem' / 'attempt-0' / 'rank-0', proc.returncode, stderr


def test_uncaught_exception_captures_then_the_previous_hook_runs(tmp_path):
    folder, code, stderr = _child(tmp_path, 'raise')
    assert code == 1
    assert "KeyError: 'no such column'" in stderr  # the default hook still printed the traceback
    header = json.loads((folder / 'header.json').read_text())
    assert header['reason'] == 'exception' and header['exception']['type'] == 'KeyError'
    assert 'no such column' in (folder / 'exception.txt').read_text()


def test_sigterm_captures_then_ends_the_process_by_sigterm(tmp_path):
    folder, code, _ = _child(tmp_path, 'sigterm')
    assert code == -signal.SIGTERM
    header = json.loads((folder / 'header.json').read_text())
    assert header['reason'] == 'sigterm'
    from dist_logging.postmortem import RankSet

    verdict = analyse({0: RankSet(0, header)})
    assert verdict.code == 0 and verdict.culprits == []


def test_the_exit_after_a_fatal_error_waits_for_a_set_being_uploaded(tmp_path):
    """A set handed over (not awaited) just before the process ends after a fatal error: the bounded exit
    (``os._exit(1)``) waits for it to land first (uploads slowed to ~1.5 kB/s: the set takes seconds)."""
    folder, code, stderr = _child(tmp_path, 'fatal', DIST_LOGGING_UPLOAD_BYTES_PER_S='1500')
    assert code == 1, stderr  # the exit after a fatal error
    assert 'ending this process (exit status 1) after a fatal error' in stderr
    for leaf in ('header.json', 'stacks.txt', 'stacks.json', 'events.json'):
        assert (folder / leaf).exists(), leaf
    assert json.loads((folder / 'header.json').read_text())['reason'] == 'manual'


RECORDER_CHILD = '''
import json, os, sys
import torch, torch.distributed as torch_dist
from dist_logging import Logger, dist
from dist_logging.destinations.remote import RemoteUploaderDownloader
dist.init_process_group_from_env(backend='gloo', timeout=60)
logger = Logger(RemoteUploaderDownloader(sys.argv[1]), run_name='fr')
torch_dist.all_reduce(torch.ones(2))
prefix = logger.capture_postmortem('manual', wait=30)
logger.close()
print(json.dumps({'variable': os.environ.get('TORCH_FR_BUFFER_SIZE'), 'prefix': prefix}))
'''


@pytest.mark.parametrize('setting', [None, '0'])
def test_recorder_on_by_default_and_a_user_setting_is_kept(tmp_path, setting):
    from torchrun_helper import free_port

    env = _env(tmp_path)
    env.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))
    env.pop('TORCH_FR_BUFFER_SIZE', None)
    if setting is not None:
        env['TORCH_FR_BUFFER_SIZE'] = setting
    bucket = tmp_path / 'bucket'
    result = subprocess.run(
        [sys.executable, '-c', RECORDER_CHILD, str(bucket)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    header = json.loads((bucket / report['prefix'] / 'header.json').read_text())
    assert (bucket / report['prefix'] / 'stacks.txt').exists()
    if setting is None:
        assert report['variable'] == '2000' and header['flight_recorder'] == 'on'
        with open(bucket / 'fr/postmortem/attempt-0/fr/fr_trace_rank_0', 'rb') as handle:
            from dist_logging.postmortem.diagnose import load_dump

            names = [e['profiling_name'] for e in load_dump(handle.read())['entries']]
        assert 'gloo:all_reduce' in names
    else:
        assert report['variable'] == '0' and header['flight_recorder'] == 'off'


UNREACHABLE = '''
import contextlib, io, json, pathlib, sys
from dist_logging import Logger
from dist_logging.cli import main
from dist_logging.destinations.remote import RemoteUploaderDownloader
from dist_logging.errors import UploadError

tmp_path = pathlib.Path(sys.argv[1])
blocker = tmp_path / 'bucket'
blocker.write_text('a file where the bucket should be')  # every upload fails (not a directory)
remote = RemoteUploaderDownloader(
    str(blocker / 'store'), num_attempts=1, upload_staging_folder=str(tmp_path / 'staging')
)
logger = Logger(remote, run_name='far', postmortem=True)
prefix = logger.capture_postmortem('cut_off', wait=10)
assert prefix == 'far/postmortem/attempt-0/rank-0/', prefix
try:
    logger.close()
except UploadError:
    pass
else:
    raise AssertionError('close() did not raise UploadError for the sets that could not land')
blocker.unlink()
(blocker / 'store').mkdir(parents=True)  # the bucket is back
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    assert main(['drain', str(tmp_path / 'staging'), '--no-progress']) == 0
header = json.loads((blocker / 'store/far/postmortem/attempt-0/rank-0/header.json').read_text())
assert header['reason'] == 'cut_off', header
assert (blocker / 'store/far/postmortem/attempt-0/fr/fr_trace_rank_0').exists()
print('ok')
'''


def _in_fresh_process(tmp_path, script):
    """Run ``script`` in an interpreter of its own: the process-wide hooks and once-per-process state of other
    tests' Loggers (in the same pytest worker) cannot leak into it."""
    done = subprocess.run(
        [sys.executable, '-c', script, str(tmp_path)], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith('ok'), done.stdout + done.stderr


def test_unreachable_bucket_keeps_the_set_in_staging_for_drain(tmp_path):
    _in_fresh_process(tmp_path, UNREACHABLE)


def test_a_failed_logging_collective_captures_in_the_background(tmp_path):
    from dist_logging.errors import DistributedLoggingError

    bucket = tmp_path / 'bucket'
    logger = Logger(RemoteUploaderDownloader(str(bucket)), run_name='lerr', postmortem=True)
    try:
        # What a collective of the Logger's group does when it fails: abandon the group with the named error
        # (the failure listeners run then; a real failure needs a peer that does not arrive).
        logger._group._abandon(DistributedLoggingError('flush: rank 1 did not arrive within 5 s'))
        deadline = time.monotonic() + 60
        header = bucket / 'lerr/postmortem/attempt-0/rank-0/header.json'
        while not header.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        logger.close()
    data = json.loads(header.read_text())
    assert data['reason'] == 'logging_error' and data['exception']['type'] == 'DistributedLoggingError'


CLOSE_RESTORES = '''
import pathlib, signal as signals, sys, threading
from dist_logging import Logger
from dist_logging.destinations.remote import RemoteUploaderDownloader

tmp_path = pathlib.Path(sys.argv[1])
before = (signals.getsignal(signals.SIGTERM), sys.excepthook, threading.excepthook)
logger = Logger(RemoteUploaderDownloader(str(tmp_path / 'bucket')), run_name='hooks', postmortem=True)
assert signals.getsignal(signals.SIGTERM) is not before[0] and sys.excepthook is not before[1]
logger.close()
assert (signals.getsignal(signals.SIGTERM), sys.excepthook, threading.excepthook) == before
assert signals.set_wakeup_fd(-1) == -1
assert not [t.name for t in threading.enumerate() if t.name.startswith('dist_logging-postmortem')]
print('ok')
'''


def test_close_restores_the_hooks_and_ends_the_threads(tmp_path):
    _in_fresh_process(tmp_path, CLOSE_RESTORES)
