"""Files and folders are created with the user's umask (run in a subprocess with the umask set).

* Log files, TensorBoard event files, objects in a local bucket and downloaded files get
  ``0o666 & ~umask`` (folders ``0o777 & ~umask``), like ``cp`` would: a restrictive umask (077)
  makes all of them private, the usual 022 makes them readable by the team.
* The staging snapshots and journal are always private (0o600, in a 0o700 ``files/`` folder):
  they are copies of your checkpoints, by default under the shared system temp dir.
* Nothing is ever more open than the umask allows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reliability._common import TESTS_DIR

pytestmark = pytest.mark.timeout(120)

SCRIPT = r'''
import json, os, stat, sys, threading
root, umask = sys.argv[1], int(sys.argv[2], 8)
os.umask(umask)
from dist_logging import Logger
from dist_logging.destinations import FileLogger, RemoteUploaderDownloader, TensorboardLogger

from dist_logging.object_store import LocalObjectStore

gate = threading.Event()


class GatedStore(LocalObjectStore):
    """Holds uploads until the staging folder was inspected, so the snapshot is surely there."""

    def upload_object(self, *args, **kwargs):
        gate.wait(60)
        return super().upload_object(*args, **kwargs)


rud = RemoteUploaderDownloader(object_store=GatedStore(f'{root}/bucket'), upload_staging_folder=f'{root}/staging')
logger = Logger([FileLogger(f'{root}/logs/{{run_name}}/log.txt'), TensorboardLogger(log_dir=f'{root}/tb'), rud],
                run_name='perm')
with open(f'{root}/ckpt.bin', 'wb') as handle:
    handle.write(b'weights')
os.chmod(f'{root}/ckpt.bin', 0o600)  # the source's own mode must not matter
logger.log_metrics({'loss': 1.0})
logger.upload_file('ckpt/ckpt.bin', f'{root}/ckpt.bin')
modes = {}
def walk(top):
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            modes[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
walk(f'{root}/staging')  # while the upload is held: snapshots and journal
modes['staging'] = stat.S_IMODE(os.stat(f'{root}/staging').st_mode)
gate.set()
logger.batch_end()
logger.close()
rud2 = RemoteUploaderDownloader(f'file://{root}/bucket', upload_staging_folder=f'{root}/staging2')
rud2.download_file('ckpt/ckpt.bin', f'{root}/down/ckpt.bin')
rud2.shutdown()
for top in ('logs', 'tb', 'bucket', 'down', 'staging'):
    walk(f'{root}/{top}')
print(json.dumps(modes))
'''


def _modes(tmp_path, umask):
    root = tmp_path / f'umask{umask}'
    root.mkdir()
    env = dict(os.environ, PYTHONPATH=f'{TESTS_DIR.parent}:{TESTS_DIR}')
    result = subprocess.run(
        [sys.executable, '-c', SCRIPT, str(root), umask], capture_output=True, text=True, env=env, timeout=100
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _is_dir(name, modes):
    return any(other.startswith(name + '/') for other in modes)


def test_restrictive_umask_makes_everything_private(tmp_path):
    modes = _modes(tmp_path, '077')
    assert any(n.startswith('logs/') for n in modes) and any(n.startswith('tb/') for n in modes)
    assert 'bucket/ckpt/ckpt.bin' in modes and 'down/ckpt.bin' in modes
    opened = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert opened == {}, f'more open than the umask 077 allows: {opened}'


def test_usual_umask_gives_what_cp_would(tmp_path):
    modes = _modes(tmp_path, '022')
    for name, mode in modes.items():
        assert not mode & 0o022, f'{name}: {oct(mode)} is more open than umask 022'
        if name.startswith(('logs/', 'tb/', 'bucket/', 'down/')):
            expected = 0o755 if _is_dir(name, modes) or name in ('logs/perm', 'bucket/ckpt') else 0o644
            assert mode == expected, f'{name}: {oct(mode)}, expected {oct(expected)}'
    # staging stays private whatever the umask: snapshots and the journal are 0o600 in a 0o700 folder
    assert modes['staging/rank0/files'] == 0o700
    private = {
        n: oct(m) for n, m in modes.items() if n.startswith('staging/rank0/files/') or n.endswith('journal.jsonl')
    }
    assert private and all(m == oct(0o600) for m in private.values()), private


def test_permissive_umask_keeps_staging_private(tmp_path):
    """Under umask 000 every other file may be world-writable (the user asked for it), but the
    staging folder's rank and ``files/`` folders stay 0o700 and its snapshot, journal and lock 0o600."""
    modes = _modes(tmp_path, '000')
    assert modes['bucket/ckpt/ckpt.bin'] == 0o666  # the umask really was 000
    staging = {n: m for n, m in modes.items() if n.startswith('staging/')}
    assert {'staging/rank0', 'staging/rank0/files', 'staging/rank0/journal.jsonl', 'staging/rank0/.lock'} <= set(
        staging
    )
    assert any(n.startswith('staging/rank0/files/') for n in staging)
    for name, mode in staging.items():
        expected = 0o700 if _is_dir(name, staging) or name.endswith('/files') else 0o600
        assert mode == expected, f'{name}: {oct(mode)} under umask 000, expected {oct(expected)}'
    assert modes['staging'] == 0o700  # created by the uploader: private too
