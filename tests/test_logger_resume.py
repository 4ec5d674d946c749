"""Logger.state_dict / load_state_dict / resume_at (issue 42) in one process: the state, the first superseded step,
what InMemoryLogger, FileLogger, TensorboardLogger and ``dist-logging logs`` do with a resume. The 2-rank job that
is SIGKILLed and relaunched is tests/multiprocess/test_resume.py.
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from dist_logging import Logger
from dist_logging._cli_logs.merge import merge_logs
from dist_logging.destinations import FileLogger, InMemoryLogger


def _train(logger: Logger, start: int, stop: int, offset: float, *, log_first: bool) -> dict:
    """Log ``loss = step + offset``: before ``batch_end`` (Composer: a batch's data at the count before it ends,
    steps 0..) or after it (steps 1..); return the state saved at batch count 20."""
    saved = None
    for _ in range(start, stop):
        if not log_first:
            logger.batch_end()
        logger.log_metrics({'loss': logger.state.timestamp.batch + offset})
        if log_first:
            logger.batch_end()
        if logger.state.timestamp.batch == 20:
            saved = logger.state_dict()
    return saved


def test_state_dict_is_plain_stable_and_round_trips_through_torch_save():
    logger = Logger(InMemoryLogger(), run_name='r1')
    template = logger.state_dict()
    for _ in range(3):
        logger.batch_end(samples=8, tokens=100)
    logger.epoch_end()
    saved = logger.state_dict()
    assert saved.keys() == template.keys() and saved['timestamp'].keys() == template['timestamp'].keys()
    assert saved == {
        'format': 1,
        'run_name': 'r1',
        'attempt': '0',
        'resumes': 0,
        'timestamp': {
            'epoch': 1,
            'batch': 3,
            'batch_in_epoch': 0,
            'sample': 24,
            'sample_in_epoch': 0,
            'token': 300,
            'token_in_epoch': 0,
        },
    }
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    other = Logger(InMemoryLogger(), run_name='r1')
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert other.state.timestamp.batch == 3 and other.state.timestamp.sample == 24
    assert other.state_dict()['resumes'] == 1
    logger.close()
    other.close()


def test_load_state_dict_names_what_is_wrong():
    logger = Logger(run_name='r')
    good = logger.state_dict()
    with pytest.raises(TypeError, match='expected a mapping'):
        logger.load_state_dict([1])
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['extra'\], missing key\(s\) \['resumes'\]"):
        logger.load_state_dict({**{k: v for k, v in good.items() if k != 'resumes'}, 'extra': 1})
    with pytest.raises(ValueError, match='timestamp.batch must be an int >= 0'):
        logger.load_state_dict({**good, 'timestamp': {**good['timestamp'], 'batch': -1}})
    with pytest.raises(ValueError, match='step must be an int >= 0'):
        logger.resume_at(-3)
    with pytest.warns(RuntimeWarning, match="saved by run 'other', this Logger is run 'r'"):
        logger.load_state_dict({**good, 'run_name': 'other'})
    logger.close()
    with pytest.raises(RuntimeError, match='closed'):
        logger.load_state_dict(good)


@pytest.mark.parametrize('log_first', [True, False], ids=['composer-convention', 'steps-from-1'])
def test_in_memory_drops_superseded_steps_whichever_step_convention(log_first):
    memory = InMemoryLogger()
    logger = Logger(memory, run_name='r')
    saved = _train(logger, 0, 27, 0.0, log_first=log_first)
    logger.load_state_dict(saved)
    _train(logger, 20, 40, 1000.0, log_first=log_first)
    first = 0 if log_first else 1
    assert memory.data['loss'] == [
        (s, float(s) + (1000.0 if s >= 20 + (not log_first) else 0.0)) for s in range(first, first + 40)
    ]
    (info,) = memory.resumes
    assert (info.step, info.superseded_from, info.resume) == (20, 20 if log_first else 21, 1)
    assert memory.most_recent_values['loss'] == first + 39 + 1000.0
    logger.close()


def test_resume_with_nothing_beyond_it_purges_nothing(tmp_path):
    """Killed right after the checkpoint at 20: nothing to supersede; every destination shows 1..40 once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dist_logging.destinations import TensorboardLogger

    def build():
        return Logger(
            [
                TensorboardLogger(log_dir=str(tmp_path / 'tb'), flush_interval=1),
                FileLogger(str(tmp_path / 'logs-rank{rank}.txt')),
            ],
            run_name='r',
        )

    first = build()
    first.log_hyperparameters({'lr': 0.1})
    saved = _train(first, 0, 20, 0.0, log_first=False)
    first.close()
    second = build()
    second.load_state_dict(saved)
    _train(second, 20, 40, 1000.0, log_first=False)
    second.close()
    accumulator = EventAccumulator(str(tmp_path / 'tb'))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars('loss')] == [
        (s, s + (1000.0 if s > 20 else 0.0)) for s in range(1, 41)
    ]
    text = (tmp_path / 'logs-rank0.txt').read_text()
    assert (
        '[resume]: ===== resumed at step 20 (resume 1, attempt 0, saved by attempt 0) of run r, rank 0: '
        'steps >= 21 written above are superseded (none found) ====='
    ) in text
    out = io.StringIO()
    merge_logs([str(tmp_path / 'logs-rank0.txt')], out, collapse=False)
    steps = [int(line.split('[batch=')[1].split(']')[0]) for line in out.getvalue().splitlines() if 'loss' in line]
    assert steps == list(range(1, 41))


def test_tensorboard_writer_opened_before_the_load_is_replaced_and_its_empty_file_removed(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dist_logging.destinations import TensorboardLogger

    first = Logger(TensorboardLogger(log_dir=str(tmp_path / 'tb')), run_name='r')
    saved = _train(first, 0, 27, 0.0, log_first=False)
    first.close()
    second = Logger(TensorboardLogger(log_dir=str(tmp_path / 'tb')), run_name='r')
    assert len(list((tmp_path / 'tb').iterdir())) == 2  # the new writer's file, opened before the load
    second.load_state_dict(saved)
    _train(second, 20, 40, 1000.0, log_first=False)
    second.close()
    files = sorted(p.name for p in (tmp_path / 'tb').iterdir())
    assert len(files) == 2  # the header-only file is gone; the purging file sorts last
    accumulator = EventAccumulator(str(tmp_path / 'tb'))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars('loss')] == [
        (s, s + (1000.0 if s > 20 else 0.0)) for s in range(1, 41)
    ]


@pytest.mark.parametrize('fmt', ['text', 'jsonl'])
def test_logs_view_leaves_out_lines_superseded_by_later_markers(tmp_path, fmt):
    """27 -> 20, 35 -> 30, then a resume back to 10 (a newer checkpoint was lost): each marker supersedes
    the lines above it from its step on, the lowest below winning; the markers stay visible."""
    path = str(tmp_path / 'logs-rank0.txt')
    memory = InMemoryLogger()

    def launch(saved, start, stop, offset):
        logger = Logger([FileLogger(path, format=fmt), memory], run_name='r')
        if saved is not None:
            logger.load_state_dict(saved)
        states = {}
        for _ in range(start, stop):
            logger.batch_end()
            logger.log_metrics({'loss': logger.state.timestamp.batch + offset})
            if logger.state.timestamp.batch % 10 == 0:
                states[logger.state.timestamp.batch] = logger.state_dict()
        logger.close()
        return states

    s1 = launch(None, 0, 27, 0.0)
    s2 = launch(s1[20], 20, 35, 1000.0)
    s3 = launch(s2[30], 30, 33, 2000.0)
    launch(s1[10], 10, 15, 3000.0)
    out = io.StringIO()
    merge_logs([path], out, collapse=False)
    lines = out.getvalue().splitlines()
    if fmt == 'text':
        got = [
            (int(line.split('[batch=')[1].split(']')[0]), float(line.split('loss: ')[1]))
            for line in lines
            if 'loss' in line
        ]
    else:
        got = [
            (int(line.split('[step=')[1].split(']')[0]), float(line.split('loss: ')[1]))
            for line in lines
            if 'loss' in line
        ]
    assert got == [(s, float(s)) for s in range(1, 11)] + [(s, s + 3000.0) for s in range(11, 16)]
    assert sum('RESUME' in line for line in lines) == 3
    everything = io.StringIO()
    assert merge_logs([path], everything, collapse=False, all_attempts=True) > len(lines)
    assert s3 == {} and [info.resume for info in memory.resumes] == [1, 2, 1]  # the resume count travels with the state
    if fmt == 'jsonl':
        records = [json.loads(line) for line in open(path) if '"resume"' in line]
        assert [(r['data']['step'], r['data']['superseded_from'], r['data']['superseded_to']) for r in records] == [
            (20, 21, 27),
            (30, 31, 35),
            (10, 11, 35),
        ]


def test_console_says_where_the_resumed_lines_start():
    from dist_logging.destinations import ConsoleLogger

    stream = io.StringIO()
    logger = Logger(ConsoleLogger(stream=stream), run_name='r')
    logger.resume_at(20)
    logger.batch_end()
    logger.log_metrics({'loss': 1.0})
    logger.close()
    assert (
        '[resume]: resumed at step 20 (resume 1, attempt 0); steps >= 21 printed before this line are superseded'
    ) in stream.getvalue()


def test_a_resume_waits_for_its_first_step_on_every_logging_path():
    """log_metrics with a level, log_table and a gathered metric's emission each settle a waiting resume first,
    with their own step; traces neither settle it nor are held back."""
    memory = InMemoryLogger()
    logger = Logger(memory, run_name='r')
    logger.resume_at(5)
    logger.log_traces({'note': 'x'})
    assert memory.traces == {'note': ['x']} and memory.resumes == []
    logger.log_metrics({'loss': 1.0}, level='epoch')
    assert [(i.step, i.superseded_from) for i in memory.resumes] == [(5, 5)]
    logger.resume_at(7)
    logger.log_table(['a'], [[1]], name='t', step=9)
    logger.resume_at(7)
    logger.log_metrics({'m': 2.0}, reduce='mean')
    logger.flush()
    assert [(i.step, i.superseded_from, i.resume) for i in memory.resumes] == [(5, 5, 1), (7, 8, 2), (7, 7, 3)]
    assert memory.data['m'] == [(7, 2.0)]
    logger.close()
