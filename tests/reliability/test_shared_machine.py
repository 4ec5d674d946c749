"""A shared machine, with real users: throwaway accounts made with ``useradd`` (root only).

* Two users, one after the other, upload with the machine caps (``DIST_LOGGING_UPLOAD_BYTES_PER_S``,
  ``DIST_LOGGING_NODE_UPLOAD_SLOTS``) and download the same object: both succeed, and each one's
  folder in the shared temp dir is separate, 0o700 and owned by that user (files in it 0o600).
* A hostile third user plants the victim's base (0o777) before the victim's first job: symlinks
  to a file in the victim's home in place of every file the package makes there, a 0o600 lock
  file only she can open and a forged "already downloaded" marker. The victim's default job is
  refused with an error naming the folder and the problem; with ``upload_staging_folder=`` or
  ``DIST_LOGGING_TMPDIR`` it works from a private place; the download either fails naming the
  cause or fetches the object fresh (never keeps the stale file silently); no file outside the
  package's own folders changes, and nothing of the hostile tree is touched.

The jobs run as the users with ``subprocess.run(user=..., group=..., extra_groups=[])`` (no root
group left) and a copy of the package in a folder they can read. The interpreter is this test's
own, or the system's Python of the same version with this venv's site-packages, whichever the
user can run (a probe job decides); if none can (e.g. the venv under a 0o700 home), the test
skips saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Optional

import pytest

from reliability._common import TESTS_DIR, file_sha256

# One worker runs the module (make test: --dist loadgroup), so the throwaway users and code copy are made once.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group('shared_machine_users')]

JOB = TESTS_DIR / 'reliability' / '_shared_machine_job.py'
CAPS = {'DIST_LOGGING_UPLOAD_BYTES_PER_S': '50MB', 'DIST_LOGGING_NODE_UPLOAD_SLOTS': '2'}
SLOTS = 2


class Machine:
    """Throwaway users, a shared area every user can traverse, and how to run a job as a user."""

    def __init__(self, area: str):
        self.area = area
        self.users: dict[str, pwd.struct_passwd] = {}
        self.python: Optional[str] = None
        self.pythonpath = ''

    def add_user(self, name: str) -> pwd.struct_passwd:
        _account_command(['useradd', '-M', '-N', '-s', '/usr/sbin/nologin', '-d', os.path.join(self.area, name), name])
        entry = pwd.getpwnam(name)
        self.users[name] = entry
        home = os.path.join(self.area, name)
        os.mkdir(home, 0o700)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        return entry

    def owned_dir(self, path: str, user: str, mode: int) -> str:
        os.makedirs(path, exist_ok=True)
        os.chown(path, self.users[user].pw_uid, self.users[user].pw_gid)
        os.chmod(path, mode)
        return path

    def run(
        self, user: str, argv: list[str], env: Optional[dict] = None, umask: int = 0o022, timeout: float = 180
    ) -> subprocess.CompletedProcess:
        entry = self.users[user]
        full_env = {
            'PATH': '/usr/bin:/bin',
            'HOME': entry.pw_dir,
            'USER': user,
            'LOGNAME': user,
            'LANG': 'C.UTF-8',
            'PYTHONPATH': self.pythonpath,
            'PYTHONDONTWRITEBYTECODE': '1',
            **(env or {}),
        }
        return subprocess.run(
            [self.python, *argv],
            user=entry.pw_uid,
            group=entry.pw_gid,
            extra_groups=[],
            umask=umask,
            env=full_env,
            cwd=entry.pw_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def job(self, user: str, steps: list[dict], env: dict) -> dict:
        config = {'home': self.users[user].pw_dir, 'steps': steps}
        result = self.run(user, [os.path.join(self.area, 'code', JOB.name), json.dumps(config)], env)
        assert result.returncode == 0, f'{user} job died:\n{result.stderr[-4000:]}'
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report['uid'] == self.users[user].pw_uid
        return report


def _account_command(argv: list[str]) -> None:
    """useradd/userdel, retried while another process (e.g. a parallel test worker) holds /etc/passwd's lock."""
    for _ in range(20):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if result.returncode == 0:
            return
        if 'lock' not in result.stderr:
            break
        time.sleep(0.5)
    raise RuntimeError(f'{" ".join(argv)} failed ({result.returncode}): {result.stderr.strip()}')


def _interpreters() -> list[str]:
    version = f'{sys.version_info.major}.{sys.version_info.minor}'
    found = []
    for candidate in (sys.executable, f'/usr/bin/python{version}', f'/usr/local/bin/python{version}'):
        if os.path.exists(candidate) and os.path.realpath(candidate) not in [os.path.realpath(f) for f in found]:
            found.append(candidate)
    return found


def _pick_interpreter(machine: Machine, user: str) -> Optional[str]:
    """The first interpreter the user can run that imports the package copy and its dependencies;
    None (and the reasons in ``machine.reasons``) when none can."""
    code = os.path.join(machine.area, 'code')
    paths = [code] + list(dict.fromkeys([sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]))
    machine.pythonpath = os.pathsep.join(paths)
    reasons = []
    probe = 'import dist_logging.destinations.remote, filelock; print(dist_logging.__file__)'
    for python in _interpreters():
        machine.python = python
        try:
            result = machine.run(user, ['-c', probe], timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            reasons.append(f'{python}: {type(exc).__name__}: {exc}')
            continue
        out = result.stdout.strip()
        if result.returncode == 0 and out.startswith(code + os.sep):
            return python
        tail = (result.stderr.strip().splitlines() or [out or f'exit {result.returncode}'])[-1]
        reasons.append(f'{python}: {tail}')
    machine.reasons = reasons  # type: ignore[attr-defined]
    return None


@pytest.fixture(scope='module')
def machine():
    if not hasattr(os, 'geteuid') or os.geteuid() != 0:
        pytest.skip('needs root: the test creates throwaway users with useradd')
    if shutil.which('useradd') is None or shutil.which('userdel') is None:
        pytest.skip('useradd/userdel not found (package passwd)')
    # Not the suite's sandbox TMPDIR (0700, root's): a folder every user can traverse, like /tmp.
    area = tempfile.mkdtemp(prefix='dist_logging-users-', dir='/tmp')
    os.chmod(area, 0o755)
    created = Machine(area)
    try:
        code = os.path.join(area, 'code')
        shutil.copytree(
            TESTS_DIR.parent / 'dist_logging',
            os.path.join(code, 'dist_logging'),
            ignore=shutil.ignore_patterns('__pycache__'),
        )
        shutil.copy(JOB, code)
        for dirpath, dirs, files in os.walk(code):
            os.chmod(dirpath, 0o755)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644)
        tag = f'{os.getpid() % 100000}'
        for role in ('a', 'b', 'c'):
            created.add_user(f'dlt{tag}{role}')
        created.a, created.b, created.c = (f'dlt{tag}{role}' for role in 'abc')  # type: ignore[attr-defined]
        if _pick_interpreter(created, created.a) is None:  # type: ignore[attr-defined]
            pytest.skip(
                f'no Python that user {created.a} can run with a readable dist_logging and its '  # type: ignore[attr-defined]
                f'dependencies: {"; ".join(created.reasons)}'
            )  # type: ignore[attr-defined]
        yield created
    finally:
        for name in created.users:  # jobs are bounded by their timeout (subprocess.run kills them)
            try:
                _account_command(['userdel', name])
            except RuntimeError as exc:
                print(f'warning: {exc}', file=sys.stderr)
        shutil.rmtree(area, ignore_errors=True)


def _shared_tmp(machine: Machine, name: str) -> str:
    path = os.path.join(machine.area, name)
    os.mkdir(path)
    os.chmod(path, 0o1777)  # like /tmp: everyone may create, only owners may remove
    return path


def _public_object(machine: Machine) -> tuple[str, bytes]:
    """A local bucket every user can read, holding ``models/model.bin`` (made once per machine)."""
    bucket = os.path.join(machine.area, 'public-bucket')
    if os.path.exists(bucket):
        with open(os.path.join(bucket, 'models', 'model.bin'), 'rb') as handle:
            return bucket, handle.read()
    os.makedirs(os.path.join(bucket, 'models'))
    data = os.urandom(300_000)
    with open(os.path.join(bucket, 'models', 'model.bin'), 'wb') as handle:
        handle.write(data)
    for path in (bucket, os.path.join(bucket, 'models')):
        os.chmod(path, 0o755)
    os.chmod(os.path.join(bucket, 'models', 'model.bin'), 0o644)
    return bucket, data


def _tree(top: str) -> dict[str, tuple]:
    """Every entry under ``top``: owner, mode, and symlink target or content digest."""
    found = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                what = file_sha256(path)
            else:
                what = 'dir'
            found[os.path.relpath(path, top)] = (info.st_uid, stat.S_IMODE(info.st_mode), what)
    return found


def _assert_private_tree(top: str, uid: int) -> None:
    for dirpath, dirs, files in os.walk(top):
        info = os.lstat(dirpath)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o700), (dirpath, oct(info.st_mode))
        for name in files:
            info = os.lstat(os.path.join(dirpath, name))
            assert stat.S_ISREG(info.st_mode) and info.st_uid == uid, os.path.join(dirpath, name)
            assert stat.S_IMODE(info.st_mode) == 0o600, (os.path.join(dirpath, name), oct(info.st_mode))


def test_two_users_upload_with_the_caps_and_download_on_one_machine(machine):
    shared = _shared_tmp(machine, 'tmp-two-users')
    public, data = _public_object(machine)
    expected = hashlib.sha256(data).hexdigest()
    bases = {}
    for user in (machine.a, machine.b):  # B after A: A's folders are already there
        bucket = machine.owned_dir(os.path.join(machine.area, f'bucket-{user}'), user, 0o700)
        home = machine.users[user].pw_dir
        report = machine.job(
            user,
            [
                {
                    'do': 'upload',
                    'name': 'up',
                    'bucket': f'file://{bucket}',
                    'run': 'shared-run',
                    'files': 3,
                    'size': 200_000,
                },
                {
                    'do': 'download',
                    'name': 'down',
                    'bucket': f'file://{public}',
                    'object': 'models/model.bin',
                    'dest': os.path.join(home, 'model.bin'),
                    'run': 'shared-run',
                },
            ],
            env={'TMPDIR': shared, **CAPS},
        )
        assert report['up'] == {
            'ok': True,
            'staging_dir': os.path.join(shared, f'dist_logging-{user}', 'shared-run', 'staging', 'rank0'),
        }, report
        assert report['down'] == {'ok': True, 'sha256': expected}, report
        assert sorted(os.listdir(os.path.join(bucket, 'up'))) == ['0.bin', '1.bin', '2.bin']
        bases[user] = os.path.join(shared, f'dist_logging-{user}')
    assert sorted(os.listdir(shared)) == sorted(os.path.basename(b) for b in bases.values())
    for user, base in bases.items():
        entries = set(os.listdir(base))
        assert {'node-upload-rate', 'node-upload-slots', 'downloads'} <= entries, entries
        assert 'schedule.bin' in os.listdir(os.path.join(base, 'node-upload-rate'))
        assert any(n.endswith('.json') for n in os.listdir(os.path.join(base, 'downloads')))
        _assert_private_tree(base, machine.users[user].pw_uid)


def _plant(machine: Machine, shared: str, victim: str, dest: str, public: str, precious: str) -> str:
    """As the hostile user: the victim's base, 0o777, with a trap in place of every file."""
    base = os.path.join(shared, f'dist_logging-{victim}')
    key = hashlib.sha1(dest.encode()).hexdigest()[:24]
    bucket_object = os.path.join(machine.area, f'bucket-{victim}', 'v', '0.bin')
    script = r'''
import hashlib, json, os, sys
base, precious, dest, key, uri, obj, slots = sys.argv[1:8]
os.umask(0)
folders = ['node-upload-rate', 'node-upload-slots', 'downloads', 'locks', 'scratch',
           'victim-run', 'victim-run/staging', 'victim-run/staging/rank0', 'victim-run/staging/rank0/files']
os.mkdir(base, 0o777)
for folder in folders:
    os.mkdir(os.path.join(base, folder), 0o777)
traps = ['node-upload-rate/schedule.bin', 'node-upload-rate/schedule.lock',
         'victim-run/staging/rank0/journal.jsonl', 'victim-run/staging/rank0/.lock',
         'locks/' + hashlib.sha1(obj.encode()).hexdigest()[:20] + '.lock']
traps += [f'node-upload-slots/slot-{i}.lock' for i in range(int(slots))]
traps += [f'victim-run/staging/rank0/files/{i}' for i in range(1, 5)]
traps += [f'downloads/{key}.json.{pid}.tmp' for pid in range(300, 310)]
for trap in traps:
    os.symlink(precious, os.path.join(base, trap))
lock = os.path.join(base, 'downloads', key + '.lock')  # only she can open it
os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
info = os.stat(dest)  # the victim's stale file is in a folder others can read
with open(os.path.join(base, 'downloads', key + '.json'), 'w') as handle:
    json.dump({'run': 'victim-run', 'uri': uri, 'ino': info.st_ino, 'size': info.st_size,
               'mtime_ns': info.st_mtime_ns, 'time': 0}, handle)
'''
    uri = f'file://{public}/models/model.bin'
    result = machine.run(machine.c, ['-c', script, base, precious, dest, key, uri, bucket_object, str(SLOTS)])
    assert result.returncode == 0, result.stderr[-3000:]
    return base


def test_a_hostile_user_cannot_redirect_block_or_fool_the_victims_job(machine):
    shared = _shared_tmp(machine, 'tmp-hostile')
    public, data = _public_object(machine)
    fresh = hashlib.sha256(data).hexdigest()
    victim, hostile = machine.b, machine.c
    victim_uid, hostile_uid = machine.users[victim].pw_uid, machine.users[hostile].pw_uid
    home = machine.users[victim].pw_dir
    precious = os.path.join(home, 'precious.txt')
    with open(precious, 'wb') as handle:
        handle.write(b'the victim\'s notes\n' * 100)
    os.chown(precious, victim_uid, machine.users[victim].pw_gid)
    os.chmod(precious, 0o600)
    before = file_sha256(precious)
    pub = machine.owned_dir(os.path.join(machine.area, f'pub-{victim}'), victim, 0o755)
    dest = os.path.join(pub, 'model.bin')
    stale = b'S' * len(data)  # same size as the object: only the marker could tell them apart
    with open(dest, 'wb') as handle:
        handle.write(stale)
    os.chown(dest, victim_uid, machine.users[victim].pw_gid)
    stale_sha = hashlib.sha256(stale).hexdigest()
    bucket = machine.owned_dir(os.path.join(machine.area, f'bucket-{victim}'), victim, 0o700)
    base = _plant(machine, shared, victim, dest, public, precious)
    planted = _tree(base)
    assert all(entry[0] == hostile_uid for entry in planted.values())

    upload = {'do': 'upload', 'bucket': f'file://{bucket}', 'run': 'victim-run', 'files': 2, 'size': 100_000}
    download = {
        'do': 'download',
        'bucket': f'file://{public}',
        'object': 'models/model.bin',
        'dest': dest,
        'overwrite': True,
        'run': 'victim-run',
    }
    staging = os.path.join(home, 'staging')
    default = machine.job(
        victim,
        [
            dict(upload, name='v'),  # default staging: in the planted base
            dict(download, name='down', run=None),  # default download coordination: in the planted base
            dict(upload, name='s', staging=staging),  # the way out the error names...
            dict(download, name='sdown', staging=staging, dest=os.path.join(pub, 'copy.bin')),  # ...downloads too
        ],
        env={'TMPDIR': shared, **CAPS},
    )
    for step in ('v', 'down'):
        error = default[step]['error']
        assert default[step]['ok'] is False and error.startswith('PermissionError: '), default
        assert f'will not use {base}: it is owned by uid {hostile_uid}' in error and 'DIST_LOGGING_TMPDIR' in error
    assert 'upload_staging_folder=' in default['v']['error']
    assert default['s'] == {'ok': True, 'staging_dir': os.path.join(staging, 'rank0')}, default
    assert default['sdown'] == {'ok': True, 'sha256': fresh}, default
    assert file_sha256(dest) == stale_sha  # not fetched, and the job was told why (above)
    machine_dir = os.path.join(staging, f'.dist_logging-{socket.gethostname()}')
    assert {'node-upload-rate', 'node-upload-slots', 'downloads'} <= set(os.listdir(machine_dir))
    _assert_private_tree(machine_dir, victim_uid)

    knob = os.path.join(home, 'dl-tmp')  # the one knob: everything moves there
    moved = machine.job(
        victim,
        [dict(upload, name='k'), dict(download, name='kdown')],
        env={'TMPDIR': shared, 'DIST_LOGGING_TMPDIR': knob, **CAPS},
    )
    assert moved['k'] == {'ok': True, 'staging_dir': os.path.join(knob, 'victim-run', 'staging', 'rank0')}, moved
    assert moved['kdown'] == {'ok': True, 'sha256': fresh}, moved  # fetched fresh: the forged marker is not read
    assert {'node-upload-rate', 'node-upload-slots', 'downloads'} <= set(os.listdir(knob))
    _assert_private_tree(knob, victim_uid)
    assert sorted(os.listdir(os.path.join(bucket, 'k'))) == ['0.bin', '1.bin']
    assert sorted(os.listdir(os.path.join(bucket, 's'))) == ['0.bin', '1.bin']

    assert file_sha256(precious) == before  # nothing written through a planted symlink
    assert _tree(base) == planted  # the hostile tree untouched: nothing read into, created in or removed
    assert os.listdir(shared) == [os.path.basename(base)]
