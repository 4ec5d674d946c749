"""Running ckpt_scenario.py under torchrun with a plan, and checking a bucket's checkpoints."""

from __future__ import annotations

import json
import pathlib
import shutil
import time

from torchrun_helper import read_rank_outputs, run_torchrun

SCENARIO = pathlib.Path(__file__).with_name('ckpt_scenario.py')


def launch(tmp: pathlib.Path, nproc: int, plan: dict, *, expect_kill: bool = False, name: str = 'out') -> dict:
    """One launch; returns rank -> output (empty for a killed job). Raises with the job's output if a job
    expected to succeed failed, or one expected to be killed was not."""
    out = tmp / name
    if out.exists():
        shutil.rmtree(out)
    started = time.monotonic()
    result = run_torchrun(SCENARIO, nproc, out, env={'CKPT_PLAN': json.dumps(plan)}, timeout=150, check=not expect_kill)
    if expect_kill:
        assert result.returncode != 0, f'the job was not killed:\n{result.stdout}\n{result.stderr[-4000:]}'
        assert 'SIGKILL' in result.stderr or 'Signal 9' in result.stderr or '-9' in result.stderr, result.stderr[-4000:]
    print(f'launch {name} ({nproc} ranks, kill={plan.get("kill")}): {time.monotonic() - started:.1f} s')
    return read_rank_outputs(out)
