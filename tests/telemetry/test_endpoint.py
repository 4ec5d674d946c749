"""The Prometheus endpoint of a real 2-rank torchrun job: scraped by a real Prometheus server and parsed
with prometheus_client's parser; a SIGSTOPped rank's progress age rising while rank zero is blocked."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip('prometheus_client', reason='pip install "dist-logging[prometheus]"')
pytest.importorskip('psutil', reason='pip install "dist-logging[system]"')
pytest.importorskip('tensorboard', reason='pip install "dist-logging[tensorboard]"')

from _telemetry_job import (
    PROMETHEUS,
    SKIP_PROMETHEUS,
    Prometheus,
    by_rank,
    scrape,
    start_job,  # noqa: E402
    wait_for,
)
from torchrun_helper import free_port  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _tensorboard_tags(folder) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for root, _, files in os.walk(folder):
        if any(name.startswith('events.out.tfevents') for name in files):
            acc = EventAccumulator(root, size_guidance={'scalars': 0})
            acc.Reload()
            tags |= set(acc.Tags()['scalars'])
    return tags


@pytest.mark.skipif(PROMETHEUS is None, reason=SKIP_PROMETHEUS)
def test_two_ranks_scraped_by_prometheus_and_node_metrics_in_tensorboard(tmp_path):
    port = free_port()
    out = tmp_path / 'job'
    with start_job(out, port) as job, Prometheus(tmp_path / 'prom', [f'127.0.0.1:{port}']) as prom:
        try:

            def both_ranks_progress():
                steps = {r['metric']['rank']: float(r['value'][1]) for r in prom.query('dist_logging_step')}
                return set(steps) == {'0', '1'} and min(steps.values()) > 0

            wait_for('Prometheus has both ranks stepping', both_ranks_progress, 120, job)
            wait_for('Prometheus has node metrics', lambda: prom.query('dist_logging_system_cpu_percent'), 15, job)
            ages = prom.query('dist_logging_last_progress_age_seconds')
            assert {r['metric']['rank'] for r in ages} == {'0', '1'}
            assert all(float(r['value'][1]) < 10 for r in ages), ages  # both ranks are moving
            assert {r['metric']['host'] for r in ages} == {os.uname().nodename}
            assert len(prom.query('dist_logging_uploads_pending')) == 2
            # An alert expression of docs/telemetry.md: nobody is stuck.
            assert prom.query('max(dist_logging_last_progress_age_seconds) > 600') == []

            families = scrape(f'http://127.0.0.1:{port}/metrics')
            assert set(by_rank(families['dist_logging_step'])) == {0, 1}
            assert families['dist_logging_system_memory_used_bytes'][0].value > 0
            assert by_rank(families['dist_logging_oldest_pending_upload_age_seconds']) == {0: 0.0, 1: 0.0}
            wait_for(
                'a rank report', lambda: 'dist_logging_straggler' in scrape(f'http://127.0.0.1:{port}/metrics'), 15, job
            )
            stragglers = by_rank(scrape(f'http://127.0.0.1:{port}/metrics')['dist_logging_straggler'])
            assert set(stragglers) == {0, 1} and set(stragglers.values()) <= {0.0, 1.0}
            gathered = {(s.labels['key'], int(s.labels['rank'])) for s in families['dist_logging_gathered']}
            assert gathered == {('loss', 0), ('loss', 1)}  # summarized for trackers, full on the endpoint
        finally:
            (out / 'stop').touch()
        assert job.wait(40) == 0, job.output()
    host = os.uname().nodename
    tags = _tensorboard_tags(out / 'tb')
    assert {f'system/{host}/cpu_percent', f'system/{host}/memory_used_bytes'} <= tags, tags
    # Above gather_summary_above=1 rank, the tracker gets summaries, the rank-zero file every rank's value.
    assert {'loss/min', 'loss/median', 'loss/p90', 'loss/max', 'loss/argmin_rank', 'loss/argmax_rank'} <= tags
    assert not any(tag.startswith('loss/rank') for tag in tags)
    text = (out / 'file0.txt').read_text()
    assert 'loss/rank0' in text and 'loss/rank1' in text and 'loss/argmax_rank' in text


def _both_past(steps: dict, step: int) -> bool:
    return set(steps) == {0, 1} and min(steps.values()) > step


def test_a_stopped_rank_ages_while_rank_zero_waits_for_it(tmp_path):
    port = free_port()
    out = tmp_path / 'job'
    url = f'http://127.0.0.1:{port}/metrics'
    with start_job(out, port, sync_timeout=20) as job:
        try:
            wait_for(  # both ranks' heartbeats read (rank 1's is published at its watch thread's next beat)
                'both ranks stepping', lambda: _both_past(by_rank(scrape(url)['dist_logging_step']), 3), 120, job
            )  # generous: two ranks importing torch on a loaded 2-core machine
            pid = int((out / 'pid1').read_text())
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(1.0)
                first = scrape(url)
                time.sleep(5.0)
                second = scrape(url)  # rank zero's training thread is blocked in the all_reduce meanwhile
            finally:
                os.kill(pid, signal.SIGCONT)
            age1, age2 = (by_rank(f['dist_logging_last_progress_age_seconds']) for f in (first, second))
            step1, step2 = (by_rank(f['dist_logging_step']) for f in (first, second))
            assert age2[1] >= age1[1] + 4, (age1, age2)  # rank 1's age keeps rising
            assert step2 == step1, (step1, step2)  # nobody progressed: rank zero waits for rank 1
            assert age2[0] >= age1[0] + 4, (age1, age2)  # ... and rank zero's own age rises too
            wait_for(
                'rank 1 progresses again',
                lambda: by_rank(scrape(url)['dist_logging_last_progress_age_seconds'])[1] < 5,
                20,
                job,
            )
        finally:
            (out / 'stop').touch()
        assert job.wait(40) == 0, job.output()
