"""launch/checkpoint_example.py end to end: a 2-rank FSDP2 job saving with ``dcp.async_save`` through
CheckpointWriter is SIGKILLed, relaunched by launch/checkpoint_run.py, and resumes from the latest committed
checkpoint; an uninterrupted run of the same job is the reference.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchrun_helper import REPO_ROOT, base_env, run_torchrun

pytestmark = pytest.mark.multiprocess

STEPS, EVERY, DIE = 20, 4, 10


def _reports(folder):
    return {(r['rank'], r['attempt']): r for r in (json.loads(p.read_text()) for p in folder.glob('rank*.json'))}


def test_killed_job_resumes_from_latest_committed_checkpoint_bit_exactly(tmp_path):
    work = tmp_path / 'demo'
    args = ['--steps', str(STEPS), '--save-every', str(EVERY)]
    run = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / 'launch' / 'checkpoint_run.py'),
            '--workdir',
            str(work),
            '--die-at-step',
            str(DIE),
            '--',
            *args,
        ],
        env=base_env(tmp_path / 'out'),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-6000:]
    # The reference: the same job, never killed, into its own bucket.
    ref_dir = tmp_path / 'ref'
    run_torchrun(
        REPO_ROOT / 'launch' / 'checkpoint_example.py',
        2,
        tmp_path / 'out-ref',
        timeout=180,
        args=[
            '--bucket',
            (tmp_path / 'ref-bucket').as_uri(),
            '--staging',
            str(tmp_path / 'ref-staging'),
            '--out',
            str(ref_dir),
            '--attempt',
            '0',
            *args,
        ],
    )
    got, ref = _reports(work / 'report'), _reports(ref_dir)
    for rank in (0, 1):
        killed, resumed, clean = got[(rank, 0)], got[(rank, 1)], ref[(rank, 0)]
        assert 'final_step' not in killed  # it really died (the report is written just before SIGKILL)
        assert killed['resumed_from'] is None
        step = resumed['resumed_from']
        # A checkpoint the killed job saved before its death, and the state loaded is the state it saved.
        assert step is not None and step % EVERY == 0 and str(step) in killed['saves'], resumed
        assert resumed['resumed_id'] == f'ckpt-demo/checkpoints/step{step}'
        assert resumed['loaded_digest'] == killed['saves'][str(step)]
        assert killed['saves'][str(step)] == clean['saves'][str(step)]
        # Resuming computes exactly what the uninterrupted job computed: every later save and the end state.
        for later, value in resumed['saves'].items():
            assert int(later) > step and value == clean['saves'][later], later
        assert resumed['final_step'] == STEPS and resumed['final_digest'] == clean['final_digest']
        assert resumed['final_loss'] == clean['final_loss']
        assert resumed['latest_at_end'] == f'ckpt-demo/checkpoints/step{STEPS}'
