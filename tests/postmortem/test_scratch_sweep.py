"""A capture's scratch folder: removed after the capture, and swept by the next recorder when a kill left it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from dist_logging import Logger
from dist_logging.destinations.remote import RemoteUploaderDownloader
from dist_logging.postmortem.trigger import SCRATCH_PREFIX, sweep_scratch

pytestmark = pytest.mark.timeout(120)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    return child.pid


def _scratch(root, name):
    folder = root / name
    folder.mkdir()
    (folder / 'header.json').write_text('{}')
    return folder


def test_the_next_recorder_sweeps_what_a_killed_capture_left_and_nothing_else(tmp_path, monkeypatch):
    scratch_root = tmp_path / 'tmp'
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(scratch_root))
    killed = _scratch(scratch_root, f'{SCRATCH_PREFIX}3-pid{_dead_pid()}-x1')
    live = _scratch(scratch_root, f'{SCRATCH_PREFIX}1-pid{os.getpid()}-x2')  # a capture running in this process
    foreign = _scratch(scratch_root, f'{SCRATCH_PREFIX}2-abcdef')  # not named with a pid: not ours to judge
    logger = Logger(RemoteUploaderDownloader(str(tmp_path / 'bucket')), run_name='sweep', postmortem=True)
    try:
        assert not killed.exists()
        assert live.exists() and foreign.exists()
        assert logger.capture_postmortem('manual') is not None
        # the capture removed its own scratch folder; what was there stays as it was
        left = sorted(p.name for p in scratch_root.iterdir() if p.name.startswith(SCRATCH_PREFIX))
        assert left == sorted([live.name, foreign.name])
    finally:
        logger.close()


def test_sweep_scratch_returns_what_it_removed_and_tolerates_a_missing_root(tmp_path):
    dead = _dead_pid()
    gone = _scratch(tmp_path, f'{SCRATCH_PREFIX}0-pid{dead}-a')
    odd = _scratch(tmp_path, f'{SCRATCH_PREFIX}0-pidnot-a-number')
    assert sweep_scratch(str(tmp_path)) == [str(gone)]
    assert odd.exists()
    assert sweep_scratch(str(tmp_path / 'missing')) == []
