"""torchrun restarts and killed ranks keep every rank's history (issue 21), with FileLogger's defaults.

One launch each (restart_scenario.py):

* ``--max-restarts=1``, rank 1 ``os._exit``s right after ``batch_end`` of step 2 in the first attempt:
  both attempts' metrics are in each rank's local file and in the bucket, the second attempt starts
  after an ``[attempt]`` line, the surviving rank's error says that rank 1 left, the run name stays.
* no restart, rank 1 SIGKILLs itself right after ``batch_end`` of step 2: its file holds every line
  of steps 1 and 2 (the default 64 KiB buffer used to lose them all).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from torchrun_helper import REPO_ROOT, _run, base_env, torchrun_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SCENARIO = REPO_ROOT / 'tests' / 'multiprocess' / 'restart_scenario.py'


def _metric_lines(path: pathlib.Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if '_step' in line or line.startswith('[attempt]')]


def test_restart_keeps_both_attempts_marks_them_and_names_the_rank_that_left(tmp_path):
    cmd = torchrun_command(SCENARIO, 2, [str(tmp_path), 'restart'], max_restarts=1)
    # torchrun stops the survivors as soon as it sees rank 1 gone (every 0.1 s by default): under load
    # that came before rank 0 had written what its flush raised. Give the survivor 3 s to say it.
    cmd.insert(cmd.index('--max_restarts=1'), '--monitor-interval=3')
    _run(cmd, base_env(tmp_path), 180, True, tmp_path)
    done = [json.loads((tmp_path / f'done-attempt1-rank{r}.json').read_text()) for r in (0, 1)]
    run_name = done[0]['run_name']
    assert done[1]['run_name'] == run_name and done[0]['launcher'] == 'torchrun'  # a restart keeps the name
    assert not list(tmp_path.glob('done-attempt0-*'))

    error = json.loads((tmp_path / 'error-attempt0-rank0.json').read_text())
    assert error['left'] == [1] and error['missing'] == [1], error
    assert 'left the job: rank 1 (pid ' in error['message'] and 'timed out' not in error['message'], error

    for rank in (0, 1):
        expected = [f'[metric][batch={s - 1}]: attempt0_step{s}_rank{rank}: {s} ' for s in (1, 2)]
        expected += ['ATTEMPT']
        expected += [f'[metric][batch={s - 1}]: attempt1_step{s}_rank{rank}: {s} ' for s in (1, 2, 3, 4)]
        for where in (tmp_path / 'local' / run_name, tmp_path / 'bucket' / run_name):
            lines = _metric_lines(where / f'rank{rank}.txt')
            marker = lines[2]
            assert marker.startswith(f'[attempt]: ===== attempt 1 (torchrun restart 1) of run {run_name}, rank {rank}')
            assert [('ATTEMPT' if line.startswith('[attempt]') else line) for line in lines] == expected, where
        python_log = (tmp_path / 'py' / f'{run_name}-rank{rank}.log').read_text()
        assert '===== attempt 1 (torchrun restart 1) starts =====' in python_log


def test_rank_sigkilled_after_batch_end_keeps_every_line_of_that_batch(tmp_path):
    cmd = torchrun_command(SCENARIO, 2, [str(tmp_path), 'kill'])
    result = _run(cmd, base_env(tmp_path), 180, False, tmp_path)
    assert result.returncode != 0
    (folder,) = (tmp_path / 'local').iterdir()
    assert _metric_lines(folder / 'rank1.txt') == [
        '[metric][batch=0]: attempt0_step1_rank1: 1 ',
        '[metric][batch=1]: attempt0_step2_rank1: 2 ',
    ]
