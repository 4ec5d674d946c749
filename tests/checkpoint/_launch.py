"""Running ckpt_scenario.py under torchrun: a chain of launches as the attempts of one job."""

from __future__ import annotations

import json
import pathlib
import shutil
import time

from torchrun_helper import read_rank_outputs, run_torchrun

SCENARIO = pathlib.Path(__file__).with_name('ckpt_scenario.py')


def _killed(stderr: str) -> bool:
    return 'SIGKILL' in stderr or 'Signal 9' in stderr or '-9' in stderr


def launch_attempts(tmp: pathlib.Path, nproc: int, plans: list[dict], *, name: str = 'out') -> list[dict]:
    """A chain of launches as one torchrun job with ``--max_restarts=len(plans) - 1``: attempt k runs
    ``plans[k]``. Every plan but the last must arm a kill: its attempt ends by that SIGKILL and torchrun
    restarts the worker group, which resumes from the bucket as a new job would (one torchrun start per
    chain instead of one per launch). The last plan may arm a kill (the job then fails) or not (it must
    succeed). Returns, per attempt, rank -> output. Raises with the job's output if an attempt was not
    killed as its plan says, or the job did not end as the last plan says."""
    assert all(plan.get('kill') for plan in plans[:-1]), 'every attempt but the last must be killed'
    out = tmp / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    last_killed = bool(plans[-1].get('kill'))
    started = time.monotonic()
    result = run_torchrun(
        SCENARIO,
        nproc,
        out,
        env={'CKPT_PLAN': json.dumps({'attempts': plans})},
        timeout=120 * len(plans) + 60,
        check=not last_killed,
        max_restarts=len(plans) - 1,
    )
    job = f'{result.stdout[-2000:]}\n{result.stderr[-6000:]}'
    for attempt, plan in enumerate(plans):
        if plan.get('kill'):  # a rank reached the kill point and SIGKILLed itself, ending this attempt
            assert list((out / f'attempt{attempt}').glob('sigkill-rank*')), f'attempt {attempt} was not killed:\n{job}'
    if last_killed:
        assert result.returncode != 0 and _killed(result.stderr), f'the job was not killed:\n{job}'
    kills = [plan.get('kill') for plan in plans]
    print(f'job {name} ({nproc} ranks, {len(plans)} attempts, kills={kills}): {time.monotonic() - started:.1f} s')
    return [read_rank_outputs(out / f'attempt{attempt}') for attempt in range(len(plans))]
