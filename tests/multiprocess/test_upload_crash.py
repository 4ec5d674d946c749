"""Uploads under real torchrun: SIGKILL with uploads pending then drain; shared downloads."""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import subprocess
import time

import pytest

from dist_logging.upload.drain import drain, list_pending
from torchrun_helper import REPO_ROOT, base_env, read_rank_outputs, run_torchrun, torchrun_command, write_script
from upload._stores import TestStore

pytestmark = pytest.mark.multiprocess

TESTS_DIR = pathlib.Path(__file__).resolve().parents[1]
M = 6

CRASH_SCENARIO = '''
import hashlib, os, sys, time
from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from torchrun_helper import dump_rank_output
from upload._stores import TestStore

mode, root, M = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ['RANK'])
store = TestStore(root + '/bucket', root + '/store-state', delay=0.4)
rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=root + '/staging',
                               use_procs=(mode == 'procs'), num_concurrent_uploads=2)
logger = Logger(rud)
sums = {}
for i in range(M):
    data = os.urandom(200_000 + 1000 * i + rank)
    path = f'{root}/src/rank{rank}-{i}.bin'
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as handle:
        handle.write(data)
    name = f'ckpt/rank{rank}/file{i}.bin'
    logger.upload_file('ckpt/rank{rank}/file%d.bin' % i, path, copy=(i % 2 == 0))
    if i % 2 == 0:
        with open(path, 'wb') as handle:  # copy=True: the caller may rewrite its file at once
            handle.write(b'rewritten after the call')
    sums[name] = hashlib.sha256(data).hexdigest()
dump_rank_output({'sums': sums})
with open(f'{root}/ready-rank{rank}.tmp', 'w') as handle:
    handle.write(str(os.getpid()))
os.replace(f'{root}/ready-rank{rank}.tmp', f'{root}/ready-rank{rank}')
time.sleep(600)  # "training" goes on until the job is killed
'''

DOWNLOAD_SCENARIO = '''
import hashlib, os, sys
from dist_logging import Logger
from dist_logging.destinations import RemoteUploaderDownloader
from torchrun_helper import dump_rank_output
from upload._stores import TestStore

root = sys.argv[1]
store = TestStore(root + '/bucket', root + '/store-state', delay=1.0)
rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=root + '/staging')
logger = Logger(rud)
rud.download_file('shared/weights.bin', root + '/local/weights.bin')
with open(root + '/local/weights.bin', 'rb') as handle:
    digest = hashlib.sha256(handle.read()).hexdigest()
logger.close()
dump_rank_output({'sha': digest})
'''


def _env(out_dir: pathlib.Path) -> dict:
    env = base_env(out_dir)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    return env


@pytest.mark.timeout(240)
@pytest.mark.parametrize('mode', ['threads', 'procs'])
def test_sigkill_with_pending_uploads_then_drain(tmp_path, mode):
    script = write_script(tmp_path, CRASH_SCENARIO)
    out = tmp_path / 'out'
    out.mkdir()
    cmd = torchrun_command(script, 2, [mode, str(tmp_path), str(M)])
    proc = subprocess.Popen(
        cmd,
        env=_env(out),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    ready = [tmp_path / f'ready-rank{r}' for r in (0, 1)]
    try:
        deadline = time.monotonic() + 150
        while not all(path.exists() for path in ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            time.sleep(0.6)  # some uploads land, others are in flight or waiting
    finally:
        # torchrun starts each rank in its own session: SIGKILL the ranks themselves (the crash),
        # then the launcher.
        for path in ready:
            if path.exists():
                try:
                    os.kill(int(path.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate(timeout=60)[0]
    assert all(path.exists() for path in ready), f'ranks never got ready:\n{output[-6000:]}'

    sums = {}
    for output in read_rank_outputs(out).values():
        sums.update(output['sums'])
    assert len(sums) == 2 * M
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'store-state'))
    landed_before = {name for name in sums if store.successes(name)}
    pending = list_pending(str(tmp_path / 'staging'))
    assert {p.remote_name for p in pending} | landed_before == set(sums)
    assert pending, 'the kill came too late: nothing was left pending'
    assert all(p.bucket_uri is None for p in pending)  # queued through a custom store

    report = drain(str(tmp_path / 'staging'), object_store=store, progress_bar=False)
    # Every pending upload lands. One the kill caught between its object landing and the journal
    # recording it is pending and landed: drain confirms it (same size, overwrite=False) without
    # a second put, and reports it as uploaded.
    assert sorted(report.uploaded) == sorted(p.remote_name for p in pending) and not report.failed
    assert set(sums) - landed_before <= set(report.uploaded)
    for name, digest in sums.items():
        assert hashlib.sha256(store.read(name)).hexdigest() == digest, f'{name} is not byte-identical'
        assert store.successes(name) == 1, f'{name} was uploaded {store.successes(name)} times'
    assert list_pending(str(tmp_path / 'staging')) == []


@pytest.mark.timeout(180)
def test_local_ranks_share_one_download(tmp_path):
    data = os.urandom(300_000)
    (tmp_path / 'bucket' / 'shared').mkdir(parents=True)
    (tmp_path / 'bucket' / 'shared' / 'weights.bin').write_bytes(data)
    script = write_script(tmp_path, DOWNLOAD_SCENARIO)
    out = tmp_path / 'out'
    run_torchrun(script, 2, out, args=[str(tmp_path)], env={'PYTHONPATH': _env(out)['PYTHONPATH']}, timeout=150)
    outputs = read_rank_outputs(out)
    assert {o['sha'] for o in outputs.values()} == {hashlib.sha256(data).hexdigest()} and len(outputs) == 2
    store = TestStore(str(tmp_path / 'bucket'), str(tmp_path / 'store-state'))
    assert store.downloads('shared/weights.bin') == 1  # one rank downloaded, the other reused its file
