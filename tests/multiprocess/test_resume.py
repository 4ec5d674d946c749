"""Resume without rewinding history (issue 42): a 2-rank job with the Logger in its DCP state is SIGKILLed, relaunched,
resumes from its latest committed checkpoint, and every destination shows each step once, the newest launch winning.

resume_scenario.py logs ``loss = step + 1000 * launch`` at steps 1, 2, ... and checkpoints every 10 steps; the test
kills the workers by pid (torchrun runs them in sessions of their own) once they report the step to die at.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from torchrun_helper import REPO_ROOT, base_env, torchrun_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

SCENARIO = REPO_ROOT / 'tests' / 'multiprocess' / 'resume_scenario.py'
STEPS = 40


def _launch(work: pathlib.Path, launch: int, die_at=None, mlflow: bool = False) -> None:
    """Run one launch to its end, or (``die_at``) until both workers reach that step, then SIGKILL them by pid."""
    args = [str(work), str(launch), str(STEPS)] + ([str(die_at)] if die_at is not None else [])
    env = base_env(work / 'out', {'DIST_LOGGING_TMPDIR': str(work / 'tmp')})
    if mlflow:
        env['RESUME_MLFLOW'] = '1'
    proc = subprocess.Popen(
        torchrun_command(SCENARIO, 2, args),
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if die_at is not None:
            ready = [work / f'ready-launch{launch}-rank{rank}.json' for rank in (0, 1)]
            deadline = time.monotonic() + 180
            while not all(path.exists() for path in ready):
                assert proc.poll() is None, f'launch {launch} ended before step {die_at}:\n{proc.stdout.read()}'
                assert time.monotonic() < deadline, f'launch {launch} did not reach step {die_at} in 180 s'
                time.sleep(0.1)
            for path in ready:
                os.kill(json.loads(path.read_text())['pid'], signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        for path in work.glob(f'ready-launch{launch}-rank*.json'):
            try:
                os.kill(json.loads(path.read_text())['pid'], signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()
        raise
    if die_at is None:
        assert proc.returncode == 0, f'launch {launch} failed:\n{output[-8000:]}'
    else:
        assert proc.returncode != 0, f'launch {launch} was not killed:\n{output[-4000:]}'


def _tensorboard(work: pathlib.Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(work / 'tb'))
    accumulator.Reload()
    events = accumulator.Scalars('loss')
    steps = [event.step for event in events]
    assert sorted(steps) == sorted(set(steps)), f'steps seen more than once: {steps}'
    return {event.step: event.value for event in events}


def _merged_losses(work: pathlib.Path, *extra: str) -> dict[int, list[tuple[int, float]]]:
    """Rank -> [(step, loss)] in the order ``dist-logging logs`` prints them."""
    out = subprocess.run(
        [sys.executable, '-m', 'dist_logging', 'logs', '--no-collapse', *extra, str(work / 'logs')],
        env=base_env(work / 'out'),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen: dict[int, list[tuple[int, float]]] = {}
    for line in out.stdout.splitlines():
        if 'METRIC [batch=' in line and ' loss: ' in line:
            rank = int(line.split(']')[0].split()[-1])
            step = int(line.split('[batch=')[1].split(']')[0])
            seen.setdefault(rank, []).append((step, float(line.split(' loss: ')[1])))
    return seen


def _winner(step: int, kills: list[tuple[int, int]]) -> float:
    """The value the newest launch logged at ``step``: launch L ran from its resume point on."""
    launch = 0
    for number, (_, resumed_at) in enumerate(kills, start=1):
        if step > resumed_at:
            launch = number
    return float(step + 1000 * launch)


def test_killed_twice_resumes_each_time_and_every_destination_shows_each_step_once(tmp_path):
    """Killed at 27 (resumes from 20), then at 35 (resumes from 30), then runs to the end: three launches serve
    what used to be two tests (killed once, with MLflow: 2 launches; killed twice in a row: 3 launches)."""
    _launch(tmp_path, 0, die_at=27, mlflow=True)
    _launch(tmp_path, 1, die_at=35, mlflow=True)
    _launch(tmp_path, 2, mlflow=True)
    kills = [(27, 20), (35, 30)]
    expected = {step: _winner(step, kills) for step in range(1, STEPS + 1)}
    assert _tensorboard(tmp_path) == expected

    merged = _merged_losses(tmp_path)
    for rank in (0, 1):
        assert merged[rank] == sorted(expected.items()), rank
    everything = _merged_losses(tmp_path, '--all-attempts')
    for rank in (0, 1):  # the killed launches' steps 21..27 and 31..35 are still in the file, shown on request
        assert [step for step, _ in everything[rank]] == list(range(1, 28)) + list(range(21, 36)) + list(range(31, 41))

    for rank in (0, 1):
        markers = [
            line
            for line in (tmp_path / 'logs' / f'rank{rank}.txt').read_text().splitlines()
            if line.startswith('[resume]')
        ]
        assert markers == [
            f'[resume]: ===== resumed at step 20 (resume 1, attempt 0, saved by attempt 0) of run '
            f'resume-demo, rank {rank}: steps >= 21 written above are superseded (21..27) =====',
            # same attempt: told apart by resume
            f'[resume]: ===== resumed at step 30 (resume 2, attempt 0, saved by attempt 0) of run '
            f'resume-demo, rank {rank}: steps >= 31 written above are superseded (31..35) =====',
        ]

    memory = json.loads((tmp_path / 'memory-launch1.json').read_text())  # written at step 35, before the kill
    (info,) = memory['resumes']
    assert (info['step'], info['superseded_from'], info['resume'], info['saved_attempt']) == (20, 21, 1, '0')
    assert [step for step, _ in memory['loss']] == list(range(21, 36))
    memory = json.loads((tmp_path / 'memory-launch2.json').read_text())
    (info,) = memory['resumes']
    assert (info['step'], info['superseded_from'], info['resume'], info['saved_attempt']) == (30, 31, 2, '0')
    assert [step for step, _ in memory['loss']] == list(range(31, STEPS + 1))

    from mlflow.tracking import MlflowClient

    from dist_logging.destinations.mlflow import without_superseded

    client = MlflowClient(f'sqlite:///{tmp_path}/mlflow.db')
    (run,) = client.search_runs([client.get_experiment_by_name('resume').experiment_id])
    tag = json.loads(run.data.tags['dist_logging.resume.1'])
    assert (tag['step'], tag['superseded_from'], tag['resume']) == (20, 21, 1)
    tag = json.loads(run.data.tags['dist_logging.resume.2'])
    assert (tag['step'], tag['superseded_from'], tag['resume']) == (30, 31, 2)
    history = client.get_metric_history(run.info.run_id, 'loss')
    assert len(history) == STEPS + 7 + 5  # MLflow keeps every launch's points: 21..27 and 31..35 twice
    kept = without_superseded(history, run.data.tags)
    assert [(point.step, point.value) for point in kept] == sorted(expected.items())
