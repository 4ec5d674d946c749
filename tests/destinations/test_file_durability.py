"""FileLogger keeps history across crashes and restarts (issue 21): lines reach the operating system at
every batch end and on SIGTERM; restarted attempts append after a marker; ``{attempt}`` names a file per attempt.

The crash cases under real torchrun (a rank SIGKILLed after ``batch_end``, a restart after ``os._exit``)
are in tests/multiprocess/test_restart.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from dist_logging import Logger, setup_logging
from dist_logging.destinations import FileLogger
from dist_logging.logging_setup import teardown_logging
from torchrun_helper import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


def test_lines_reach_the_os_at_batch_end_not_only_at_flush(tmp_path):
    destination = FileLogger(str(tmp_path / '{run_name}-rank{rank}.txt'), flush_interval=100)
    with Logger(destination, run_name='d') as logger:
        path = tmp_path / 'd-rank0.txt'
        logger.log_metrics({'loss': 1.5})
        logger.log_table(columns=['a'], rows=[[1]], name='t')
        assert 'loss' not in path.read_text()  # still in the 64 KiB buffer
        logger.batch_end()  # batch 1 of 100: no flush, but the OS has the lines
        assert '[metric][batch=0]: loss: 1.5 \n' in path.read_text()
        assert (tmp_path / 'd-rank0' / 'tables' / 't.jsonl').read_text() == '{"_step": 0, "a": 1}\n'


@pytest.mark.parametrize('fmt', ['text', 'jsonl'])
def test_restart_appends_after_an_attempt_marker(tmp_path, monkeypatch, fmt):
    template = str(tmp_path / '{run_name}-rank{rank}.log')
    with Logger(FileLogger(template, format=fmt), run_name='r') as logger:
        logger.log_metrics({'loss': 1.0})
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    with Logger(FileLogger(template, format=fmt), run_name='r') as logger:
        logger.log_metrics({'loss': 2.0})
    lines = (tmp_path / 'r-rank0.log').read_text().splitlines()
    assert len(lines) == 3
    if fmt == 'text':
        assert lines[0] == '[metric][batch=0]: loss: 1.0 '
        assert lines[1].startswith('[attempt]: ===== attempt 1 (torchrun restart 1) of run r, rank 0, started ')
        assert lines[2] == '[metric][batch=0]: loss: 2.0 '
    else:
        records = [json.loads(line) for line in lines]
        assert [r['kind'] for r in records] == ['metric', 'attempt', 'metric']
        assert records[1]['data'] == {'attempt': '1', 'restarts': 1, 'requeues': 0, 'run_name': 'r', 'rank': 0}


def test_attempt_placeholder_gives_a_file_per_attempt(tmp_path, monkeypatch):
    template = str(tmp_path / 'rank{rank}-attempt{attempt}.log')
    with Logger(FileLogger(template, buffer_size=1), run_name='p') as logger:
        logger.log_metrics({'x': 1})
    monkeypatch.setenv('SLURM_RESTART_COUNT', '2')  # a SLURM requeue
    with Logger(FileLogger(template, buffer_size=1), run_name='p') as logger:
        logger.log_metrics({'x': 2})
    assert (tmp_path / 'rank0-attempt0.log').read_text() == '[metric][batch=0]: x: 1 \n'
    second = (tmp_path / 'rank0-attempt2.log').read_text().splitlines()
    assert second[0].startswith('[attempt]: ===== attempt 2 (SLURM requeue 2)')
    assert second[1] == '[metric][batch=0]: x: 2 '


def test_setup_logging_file_marks_the_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    path = setup_logging(file=str(tmp_path / 'py-rank{rank}-{attempt}.log'), run_name='s')
    try:
        import logging

        logging.getLogger('x').info('hello')
        setup_logging(file=str(tmp_path / 'py-rank{rank}-{attempt}.log'), run_name='s')  # again: no second marker
    finally:
        teardown_logging()
    assert path.endswith('py-rank0-1.log')
    text = open(path).read()
    assert text.count('===== attempt 1 (torchrun restart 1) starts =====') == 1
    assert text.index('attempt 1') < text.index('hello')


SIGTERM_SCRIPT = '''
import os, signal, sys
from dist_logging import Logger
from dist_logging.destinations import FileLogger

chain = sys.argv[2]
if chain == 'python':
    def previous(signum, frame):
        open(sys.argv[1] + '.previous', 'w').write('called')
        os._exit(7)
    signal.signal(signal.SIGTERM, previous)
logger = Logger(FileLogger(sys.argv[1] + '/rank{rank}.txt', flush_interval=100), run_name='t')
for batch in range(3):
    logger.log_metrics({'loss': batch})
    logger.batch_end()
logger.log_metrics({'after_last_batch': 1})   # not handed over yet: only SIGTERM's handler can
os.kill(os.getpid(), signal.SIGTERM)
import time; time.sleep(30)
print('SIGTERM did not end the process')
'''


@pytest.mark.parametrize('chain', ['default', 'python'])
def test_sigterm_flushes_then_keeps_the_previous_behaviour(tmp_path, chain):
    script = tmp_path / 'term.py'
    script.write_text(textwrap.dedent(SIGTERM_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), chain],
        capture_output=True,
        text=True,
        timeout=60,
        env={'PYTHONPATH': str(REPO_ROOT), 'PATH': '/usr/bin:/bin'},
    )
    text = (tmp_path / 'rank0.txt').read_text()
    assert '[metric][batch=2]: loss: 2 \n' in text and 'after_last_batch: 1' in text, proc.stderr
    if chain == 'default':
        assert proc.returncode == -signal.SIGTERM, proc.stderr  # killed by SIGTERM, as without the handler
    else:
        assert proc.returncode == 7, proc.stderr  # the handler that was there before ran after ours
        assert open(str(tmp_path) + '.previous').read() == 'called'


def test_sigterm_handler_is_removed_with_the_last_file_logger(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    first = Logger(FileLogger(str(tmp_path / 'a{rank}.txt')), run_name='x')
    second = Logger(FileLogger(str(tmp_path / 'b{rank}.txt')), run_name='x')
    installed = signal.getsignal(signal.SIGTERM)
    assert installed is not before
    first.close()
    assert signal.getsignal(signal.SIGTERM) is installed
    second.close()
    assert signal.getsignal(signal.SIGTERM) is before
