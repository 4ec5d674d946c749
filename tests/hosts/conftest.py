"""The two-host rig as a pytest fixture, shared by the tests of this folder (see tests/hosts/_rig.py)."""

from __future__ import annotations

import os
import pathlib
import random
import shutil

import pytest

from hosts._rig import Rig
from s3_server import CREDENTIALS


@pytest.fixture
def rig(monkeypatch):
    """Two hosts on a bridge (:class:`~hosts._rig.Rig`) with a fresh bucket (``rig.bucket``) on the rig's S3 and
    a folder the hosts share (``rig.workdir / 'out'``, the scenarios' OUT_DIR). ``RIG_KEEP=1`` keeps the workdir
    (the hosts' logs and outputs) for a look."""
    for key, value in CREDENTIALS.items():  # the test's own S3 reads (the hosts get theirs from Rig.env)
        monkeypatch.setenv(key, value)
    workdir = pathlib.Path(f'/var/tmp/dlrig-{os.getpid()}-{random.randrange(10**6)}')  # /tmp is per host
    try:
        with Rig(workdir) as rig:
            rig.bucket = f'rig-{random.randrange(10**9)}'
            rig.s3.client().create_bucket(Bucket=rig.bucket)
            (workdir / 'out').mkdir()
            yield rig
    finally:
        if not os.environ.get('RIG_KEEP'):
            shutil.rmtree(workdir, ignore_errors=True)
