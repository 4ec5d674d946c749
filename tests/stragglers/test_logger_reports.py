"""Rank reports through the Logger in one process: the config key, off by default, the history uploaded
with the run's files and read back by ``dist-logging stragglers`` (summary + PNG heatmap), and a
simulated 4,096-rank world on torch's fake process group (collectives and bytes per report do not grow with N)."""

import json
import time

import pytest
import torch.distributed as torch_dist

from dist_logging import Logger
from dist_logging.destinations import InMemoryLogger, RemoteUploaderDownloader
from dist_logging.dist import LoggingGroup
from dist_logging.errors import DistributedLoggingError
from dist_logging.stragglers import RankReport, RankReportOptions
from dist_logging.stragglers.command import main as stragglers_main
from dist_logging.stragglers.reporter import NullSection


def _steps(logger, count, seconds=0.0005):
    for _ in range(count):
        with logger.section('data'):
            time.sleep(seconds / 2)
        with logger.section('forward'):
            time.sleep(seconds)
        logger.batch_end()


def test_off_by_default_section_checks_names_only():
    logger = Logger(InMemoryLogger(), run_name='ranks-off')
    section = logger.section('forward')
    assert isinstance(section, NullSection)
    with section:
        pass
    with pytest.raises(ValueError, match='reserved'):
        logger.section('busy')
    logger.batch_end()
    assert logger.rank_report() is None
    logger.close()


def test_config_key_and_options(tmp_path):
    sink = InMemoryLogger()
    logger = Logger.from_config(
        {'rank_report_every': 4, 'rank_report_options': {'top_k': 1, 'memory': False}}, run_name='ranks-config'
    )
    logger.close()
    with pytest.raises(ValueError, match=r'^rank_report_every: must be None'):
        Logger.from_config({'rank_report_every': 0})
    with pytest.raises(ValueError, match=r'rank_report_options\.slow_ratio'):
        Logger.from_config({'rank_report_every': 5, 'rank_report_options': {'slow_ratio': 0.5}})
    with pytest.raises(ValueError, match=r'rank_report_options\.k: unknown key'):
        Logger.from_config({'rank_report_options': {'k': 1}})
    with pytest.raises(ValueError, match='rank_report_every'):
        Logger(sink, run_name='x', rank_report_every=True)
    logger = Logger(
        sink, run_name='ranks-config', rank_report_every=4, rank_report_options=RankReportOptions(memory=False)
    )
    _steps(logger, 9)
    report = logger.rank_report()
    assert isinstance(report, RankReport) and report.complete
    # batch 1 is warm-up, so the reports at batches 4 and 8 cover 3 and 4 steps
    assert (report.batch, report.window, report.steps) == (8, 1, 4)
    assert report.series['forward'].median_s >= 0.0005 and report.own.memory_bytes is None
    # busy: the median step's data + forward (sleeps never undersleep; a step also has the Logger's own work)
    assert 0.00075 <= report.own.busy_s < report.own.step_s
    assert [step for step, _ in sink.data['ranks/busy/median_s']] == [4, 8]
    step, columns, rows = sink.tables['rank_report'][-1]
    assert (step, columns[:2], rows[0][:2]) == (8, ['rank', 'host'], [0, report.own.host])
    logger.close()
    assert sink.images['ranks/heatmap'][0][1].shape[1:3] == (64, 2 * 24)  # 1 rank x 2 reports, scaled up


def test_history_is_uploaded_and_the_cli_draws_it(tmp_path, capsys):
    bucket = tmp_path / 'bucket'
    remote = RemoteUploaderDownloader(str(bucket), upload_staging_folder=str(tmp_path / 'staging'))
    logger = Logger([InMemoryLogger(), remote], run_name='ranks-history', rank_report_every=3)
    _steps(logger, 10)
    logger.close()
    uploaded = bucket / 'ranks-history' / 'rank_history.jsonl'
    lines = [json.loads(line) for line in uploaded.read_text().splitlines()]
    assert lines[0]['format'] == 'dist_logging.rank_history' and lines[0]['world_size'] == 1
    assert [line['batch'] for line in lines[1:]] == [3, 6, 9]
    assert set(lines[1]['ms']) == {'busy', 'step', 'data', 'forward'}
    png = tmp_path / 'heat.png'
    assert stragglers_main(['stragglers', str(bucket), '--out', str(png)]) == 0
    out = capsys.readouterr().out
    assert 'run ranks-history: 1 ranks, 3 reports (batches 3-9)' in out and 'no rank was ever slow' in out
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # the run folder works too; a folder without a history is a usage error naming the option
    assert stragglers_main(['stragglers', str(bucket / 'ranks-history'), '--out', str(png)]) == 0
    assert stragglers_main(['stragglers', str(tmp_path / 'staging'), '--out', str(png)]) == 2
    assert 'rank_report_every' in capsys.readouterr().err
    assert stragglers_main(['stragglers', str(uploaded), '--series', 'nope', '--out', str(png)]) == 2


# ---------------------------------------------------------------- a simulated world of 4,096 ranks


@pytest.fixture
def fake_world(monkeypatch):
    """torch's fake process group: one process plays one rank of a large world; collectives are counted."""
    import torch.testing._internal.distributed.fake_pg as fake_pg

    calls = []

    def recording(name):
        real = getattr(torch_dist, name)

        def wrapper(*args, **kwargs):
            tensor = args[1] if name == 'all_gather' else args[0]
            calls.append((name, tensor.numel() * tensor.element_size()))
            return real(*args, **kwargs)

        return wrapper

    for name in ('all_reduce', 'gather', 'all_gather'):
        monkeypatch.setattr(torch_dist, name, recording(name))
    monkeypatch.setattr(LoggingGroup, 'group', lambda self: torch_dist.group.WORLD)

    def init(world_size, rank):
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        torch_dist.init_process_group('fake', store=fake_pg.FakeStore(), rank=rank, world_size=world_size)
        calls.clear()
        return calls

    yield init
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def test_simulated_4096_ranks_report_cost_is_o_of_sections(fake_world):
    per_world = {}
    for world, rank in ((4, 1), (4096, 1), (4096, 0)):
        calls = fake_world(world, rank)
        logger = Logger(
            InMemoryLogger(),
            run_name='ranks-sim',
            rank_report_every=5,
            auto_flush=False,
            rank_report_options={'history': False},
        )
        # The first report (handed over at step 5) agrees on section names and gathers host names.
        _steps(logger, 6, seconds=0)
        assert logger.rank_report().batch == 5  # waits for the report thread
        calls.clear()
        _steps(logger, 3, seconds=0)
        assert calls == []  # nothing between reports
        _steps(logger, 1, seconds=0)  # the report step: the window goes to the report thread
        assert logger.rank_report().batch == 10  # which issued the report's two collectives
        started = list(calls)
        _steps(logger, 1, seconds=0)  # the next step issues nothing
        assert calls == started
        _steps(logger, 4, seconds=0)  # a report handed over at the last step before close ...
        logger.close()  # ... is completed by close()
        assert logger.rank_report().batch == 15
        per_world[(world, rank)] = started
    steady = per_world[(4, 1)]
    assert steady == per_world[(4096, 1)] == per_world[(4096, 0)]
    series = 3 + 2  # busy, step, memory, data, forward
    assert steady == [('all_reduce', 8 * (2 * series + 1)), ('gather', 8 * (6 + 2))]


def test_a_failed_report_reaches_the_training_thread_and_later_reports_go_on(fake_world, monkeypatch):
    fake_world(4, 0)
    logger = Logger(
        InMemoryLogger(),
        run_name='ranks-fail',
        rank_report_every=3,
        auto_flush=False,
        rank_report_options={'history': False},
    )
    _steps(logger, 4, seconds=0)
    assert logger.rank_report().batch == 3  # the first report, made
    real = LoggingGroup.start_all_reduce

    def refuse(*args, **kwargs):
        raise DistributedLoggingError('reducing the rank report: rank 3 left')

    monkeypatch.setattr(LoggingGroup, 'start_all_reduce', refuse)
    _steps(logger, 2, seconds=0)  # the report at step 6 fails on the report thread ...
    deadline = time.monotonic() + 30
    while not logger._ranks._jobs.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(DistributedLoggingError, match='rank 3 left'):
        _steps(logger, 1, seconds=0)  # ... and raises at the next step
    assert logger.rank_report().batch == 3
    monkeypatch.setattr(LoggingGroup, 'start_all_reduce', real)
    _steps(logger, 3, seconds=0)
    report = logger.rank_report()  # the next report is made as usual
    assert report.batch > 6 and report.batch % 3 == 0
    logger.close()


def test_reports_are_built_off_the_training_thread_and_close_stops_the_builder(monkeypatch):
    """The builder thread builds each report; the training thread emits it at a later step (or when asked for
    it); close() emits what is left and stops the thread. A failure in building reaches the training thread."""
    import threading

    import dist_logging.stragglers.reporter as reporter_module

    def builders():  # this test's: other Loggers in this worker process may still have theirs
        return {t for t in threading.enumerate() if t.name.startswith('dist_logging-rank-report')} - before

    before = set()
    before = builders()
    sink = InMemoryLogger()
    logger = Logger(sink, run_name='ranks-builder', rank_report_every=3, rank_report_options={'history': False})
    built_on = []
    real_build = reporter_module.build_report

    def recording(*args, **kwargs):
        built_on.append(threading.current_thread().name)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(reporter_module, 'build_report', recording)
    _steps(logger, 3)  # one process: the report step hands the report over at once
    assert len(builders()) == 1
    assert logger.rank_report().batch == 3  # waits for the builder, and emits
    assert [step for step, _ in sink.data['ranks/busy/median_s']] == [3]
    assert built_on and all(name.startswith('dist_logging-rank-report') for name in built_on)

    def broken(*args, **kwargs):
        raise RuntimeError('report bug')

    monkeypatch.setattr(reporter_module, 'build_report', broken)
    with pytest.raises(RuntimeError, match='report bug'):
        _steps(logger, 3)
        logger.rank_report()
    monkeypatch.setattr(reporter_module, 'build_report', recording)
    _steps(logger, 3)
    logger.close()
    assert builders() == set()
    assert [step for step, _ in sink.data['ranks/busy/median_s']][-1] == 9


def test_own_series_matches_per_step():
    import math

    import numpy as np

    from dist_logging.stragglers.report import own_series, per_step

    layout = ['data', 'forward']
    record = np.array([4.0, 0.8, 0.1, 0.0, 1e9, 0.01, 0.2, math.nan])  # steps, wall, busy, coll., memory, jitter
    expected = [float(v[0]) for v in per_step(record[None, :], layout).values()]
    got = own_series(record, layout)
    assert len(got) == len(expected) and all(
        (a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(got, expected)
    )
    empty = record.copy()
    empty[0] = 0.0  # no step in the window: nothing per step, memory kept
    got = own_series(empty, layout)
    assert all(math.isnan(v) for v in got[:-1]) and got[-1] == 1e9
