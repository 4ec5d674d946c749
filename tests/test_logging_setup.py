"""setup_logging: console by rank, errors from every rank, one file per rank, warnings, uncaught exceptions,
uploads with the Logger; and one real 4-rank torchrun job checking all of it together with `dist-logging logs`."""

from __future__ import annotations

import logging
import pathlib
import re
import sys
import threading
import warnings

import pytest
from recording_uploader import RecordingUploader
from torchrun_helper import run_torchrun

from dist_logging import Logger, setup_logging
from dist_logging.cli import main
from dist_logging.logging_setup import PythonLogUploader, teardown_logging

pytestmark = pytest.mark.timeout(60)
SCENARIO = pathlib.Path(__file__).parent / 'multiprocess' / 'logging_scenario.py'
log = logging.getLogger('tests.logging_setup')


@pytest.fixture(autouse=True)
def clean_logging():
    """Each test starts with a bare root logger and default hooks; everything is put back afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, sys.excepthook, threading.excepthook)
    sys.excepthook, threading.excepthook = sys.__excepthook__, threading.__excepthook__
    with warnings.catch_warnings():
        warnings.simplefilter('default')
        yield
        teardown_logging()
    root.handlers, level, sys.excepthook, threading.excepthook = saved[0], saved[1], saved[2], saved[3]
    root.setLevel(level)


def _bare_root() -> logging.Logger:
    """The root logger without pytest's capture handlers (added around each test's call phase)."""
    root = logging.getLogger()
    root.handlers = []
    return root


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


# ---------------------------------------------------------------------------- console
def test_world_of_one_prints_everything_without_prefix(capsys, tmp_path):
    path = setup_logging(file=str(tmp_path / 'py-rank{rank}.log'), run_name='one')
    log.info('plain info')
    log.error('plain error')
    err = capsys.readouterr().err
    assert re.search(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO tests.logging_setup: plain info$', err, re.M)
    assert re.search(r'^\S+ \S+ ERROR tests.logging_setup: plain error$', err, re.M)
    assert '[rank' not in err
    assert path == str(tmp_path / 'py-rank0.log')
    lines = pathlib.Path(path).read_text().splitlines()
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z rank 0 INFO tests.logging_setup: plain info', lines[0])
    assert lines[1].endswith(' rank 0 ERROR tests.logging_setup: plain error')


def test_filtered_rank_prints_only_errors_and_stops_at_the_early_exit(capsys, fake_rank):
    fake_rank(1, 4)
    root = _bare_root()
    setup_logging()
    assert root.level == logging.ERROR and not log.isEnabledFor(logging.WARNING)  # stdlib's early exit
    log.info('hidden')
    log.warning('hidden too')
    log.error('shown\nsecond line')
    err = capsys.readouterr().err
    assert 'hidden' not in err
    assert _lines(err)[0].startswith('[rank 1] ') and _lines(err)[0].endswith('ERROR tests.logging_setup: shown')
    assert _lines(err)[1] == '[rank 1] second line'


def test_filtered_call_builds_no_record(capsys, fake_rank):
    # The cost claim, without timing: below ERROR on a rank that prints nothing and has no file,
    # the call ends at isEnabledFor, before a LogRecord exists (as a disabled level does).
    fake_rank(2, 4)
    _bare_root()
    setup_logging()
    made, factory = [], logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: made.append(args[1]) or factory(*args, **kwargs))
    try:
        log.info('not built')
        log.warning('not built either')
        assert made == []
        log.error('built and printed')
        assert made == [logging.ERROR]
    finally:
        logging.setLogRecordFactory(factory)
    assert 'built and printed' in capsys.readouterr().err


def test_rank_zero_prints_without_prefix_but_errors_with_it(capsys, fake_rank):
    fake_rank(0, 4)
    setup_logging()
    log.info('from zero')
    log.error('bad')
    lines = _lines(capsys.readouterr().err)
    assert not lines[0].startswith('[rank') and lines[0].endswith('INFO tests.logging_setup: from zero')
    assert lines[1].startswith('[rank 0] ')


@pytest.mark.parametrize(
    'rank,console_ranks,printed,prefixed',
    [
        (2, 'all', True, True),
        (2, [0, 2], True, True),
        (3, [3], True, False),
        (1, [3], False, False),
        (2, 'local_zero', True, True),  # 2 nodes of 2 ranks: rank 2 is node 1's local zero
        (1, 'local_zero', False, False),
    ],
)
def test_console_ranks(capsys, fake_rank, rank, console_ranks, printed, prefixed):
    fake_rank(rank, 4, local_world_size=2)
    setup_logging(console_ranks=console_ranks)
    log.info('hello')
    err = capsys.readouterr().err
    assert ('hello' in err) == printed
    if printed:
        assert err.startswith(f'[rank {rank}] ') == prefixed


@pytest.mark.parametrize(
    'kwargs,error,match',
    [
        ({'console_ranks': 'nope'}, ValueError, "unknown console_ranks 'nope'"),
        ({'console_ranks': [0, 4]}, ValueError, 'rank 4, outside this world of 4'),
        ({'console_ranks': ['0']}, TypeError, "must hold ints.*'0'"),
        ({'console_ranks': 3}, TypeError, 'got int 3'),
        ({'level': 'LOUD'}, ValueError, "unknown level 'LOUD'"),
        ({'level': None}, TypeError, 'level must be'),
        ({'file': 'logs/python.log'}, ValueError, 'cannot tell ranks apart'),
        ({'file': 'logs/{rank}-{epoch}.log'}, ValueError, r'unknown placeholder\(s\) \{epoch\}'),
        ({'file': '{run_name}/py-{rank}.log'}, ValueError, 'pass run_name= or logger='),
        ({'logger': 'not a logger'}, TypeError, 'must be a dist_logging.Logger'),
    ],
)
def test_bad_arguments_raise_naming_the_value(fake_rank, kwargs, error, match):
    fake_rank(1, 4)
    root = _bare_root()
    with pytest.raises(error, match=match):
        setup_logging(**kwargs)
    assert root.handlers == []  # nothing half-installed


def test_run_name_derived_like_the_loggers(tmp_path, fake_rank, monkeypatch):
    fake_rank(1, 2)
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'job-7')
    monkeypatch.chdir(tmp_path)
    path = setup_logging(file='{run_name}/py-rank{rank}.log')
    with Logger([], run_name=None) as logger:
        assert path == f'{logger.run_name}/py-rank1.log'


# ---------------------------------------------------------------------------- calling twice, other handlers
def test_second_call_replaces_and_leaves_other_handlers_alone(capsys, tmp_path):
    root = _bare_root()
    other = logging.StreamHandler(sys.stdout)
    root.addHandler(other)
    try:
        file = str(tmp_path / 'py-rank{rank}.log')
        setup_logging(file=file, run_name='r')
        setup_logging(file=file, run_name='r')
        hook = sys.excepthook
        setup_logging(file=file, run_name='r')
        assert sys.excepthook is hook  # chained once, not around itself
        log.info('once')
        captured = capsys.readouterr()
        assert captured.err.count('once') == 1 and captured.out.count('once') == 1
        assert (tmp_path / 'py-rank0.log').read_text().count('once') == 1
        assert len(root.handlers) == 3 and other in root.handlers
        teardown_logging()
        assert root.handlers == [other] and sys.excepthook is sys.__excepthook__
    finally:
        root.removeHandler(other)


def test_other_handlers_keep_the_level_on_a_filtered_rank(fake_rank):
    fake_rank(1, 4)
    root = _bare_root()
    records = []
    collector = logging.Handler()
    collector.emit = records.append
    root.addHandler(collector)
    try:
        setup_logging()
        log.info('for the other handler')
        assert [r.getMessage() for r in records] == ['for the other handler']
    finally:
        root.removeHandler(collector)


# ---------------------------------------------------------------------------- file, warnings, secrets
def test_filtered_rank_with_a_file_records_everything(capsys, tmp_path, fake_rank):
    fake_rank(3, 4)
    path = setup_logging(level='DEBUG', file=str(tmp_path / 'r{rank}.log'))
    log.debug('debug line')
    warnings.warn('watch out', UserWarning)
    try:
        raise KeyError('missing')
    except KeyError:
        log.exception('with traceback')
    assert logging.getLogger().level == logging.DEBUG
    err = capsys.readouterr().err
    assert 'debug line' not in err and 'watch out' not in err  # console: rank 0 only
    assert all(line.startswith('[rank 3] ') for line in _lines(err)) and "KeyError: 'missing'" in err
    text = pathlib.Path(path).read_text()
    assert ' rank 3 DEBUG tests.logging_setup: debug line\n' in text
    assert ' rank 3 WARNING py.warnings: ' in text and 'UserWarning: watch out' in text
    assert ' rank 3 ERROR tests.logging_setup: with traceback\n\tTraceback (most recent call last):\n' in text
    assert "\n\tKeyError: 'missing'\n" in text


def test_warnings_printed_on_console_ranks(capsys):
    setup_logging()
    warnings.warn('deprecated thing', DeprecationWarning)
    err = capsys.readouterr().err
    assert err.count('DeprecationWarning: deprecated thing') == 1 and 'WARNING py.warnings' in err


def test_capture_warnings_false_leaves_warnings_alone(capsys):
    setup_logging(capture_warnings=True)
    setup_logging(capture_warnings=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        warnings.warn('not through logging')
    assert [str(w.message) for w in caught] == ['not through logging']
    assert 'not through logging' not in capsys.readouterr().err


def test_secrets_are_redacted_in_console_and_file(capsys, tmp_path):
    path = setup_logging(file=str(tmp_path / 'r{rank}.log'), run_name='s')
    log.warning(
        'connecting to postgres://alice:s3cr3t@db:5432/x with hf_%s', 'abcdefghijklmnopqrstuvwxyzABCDEFGH'
    )  # a Hugging Face token: 34 letters
    err, text = capsys.readouterr().err, pathlib.Path(path).read_text()
    for where in (err, text):
        assert 'postgres://alice:***@db:5432/x' in where
        assert 's3cr3t' not in where and 'abcdefghijklmnopqrstuvwxyzABCDEFGH' not in where


# ---------------------------------------------------------------------------- uncaught exceptions
def _raise_and_hook(exc):
    try:
        raise exc
    except type(exc):
        sys.excepthook(*sys.exc_info())


def test_uncaught_exception_logged_once_with_traceback(capsys, tmp_path, fake_rank):
    fake_rank(3, 4)
    path = setup_logging(file=str(tmp_path / 'r{rank}.log'))
    _raise_and_hook(RuntimeError('it broke'))
    lines = _lines(capsys.readouterr().err)
    assert lines[0].startswith('[rank 3] ') and 'CRITICAL root: Uncaught exception: RuntimeError: it broke' in lines[0]
    assert all(line.startswith('[rank 3] ') for line in lines)  # the default hook did not print it again
    assert sum('Traceback (most recent call last)' in line for line in lines) == 1
    text = pathlib.Path(path).read_text()
    assert 'CRITICAL root: Uncaught exception: RuntimeError: it broke\n\tTraceback' in text


def test_uncaught_exception_calls_a_custom_previous_hook(capsys):
    seen = []
    sys.excepthook = lambda *info: seen.append(info[1])
    setup_logging()
    _raise_and_hook(ValueError('custom'))
    assert [str(e) for e in seen] == ['custom']
    assert 'Uncaught exception: ValueError: custom' in capsys.readouterr().err


def test_installed_again_over_a_wrapper_of_itself(capsys):
    # As torch.distributed.init_process_group does: wrap the current hook (ours), calling it.
    setup_logging()
    ours, calls = sys.excepthook, []

    def wrapper(*info):
        calls.append(info[1])
        ours(*info)

    sys.excepthook = wrapper
    setup_logging()  # ours goes in front of the wrapper again
    assert sys.excepthook is ours
    _raise_and_hook(RuntimeError('once'))
    err = capsys.readouterr().err
    assert len(calls) == 1, 'the chain is walked once, not in a loop'
    assert err.count('Uncaught exception: RuntimeError: once') == 1 and err.count('Traceback') == 1
    teardown_logging()
    assert sys.excepthook is wrapper  # what was there before the second call
    _raise_and_hook(RuntimeError('after teardown'))  # the wrapper calls ours, which only passes it on
    assert 'after teardown' in capsys.readouterr().err and len(calls) == 2


def test_keyboard_interrupt_is_not_logged(capsys):
    seen = []
    sys.excepthook = lambda *info: seen.append(info[0])
    setup_logging()
    _raise_and_hook(KeyboardInterrupt())
    assert seen == [KeyboardInterrupt] and 'Uncaught' not in capsys.readouterr().err


def test_uncaught_exception_in_a_thread(capsys, fake_rank):
    fake_rank(2, 4)
    setup_logging()
    thread = threading.Thread(target=lambda: 1 / 0, name='loader')
    thread.start()
    thread.join(10)
    lines = _lines(capsys.readouterr().err)
    assert 'Uncaught exception in thread loader: ZeroDivisionError' in lines[0] and lines[0].startswith('[rank 2] ')
    assert all(line.startswith('[rank 2] ') for line in lines)


# ---------------------------------------------------------------------------- uploads with the Logger
def test_file_uploaded_with_the_logger_at_epoch_end_and_close(tmp_path):
    uploader = RecordingUploader()
    logger = Logger([uploader], run_name='up')
    file = str(tmp_path / '{run_name}' / 'python-rank{rank}.log')
    setup_logging(file=file, logger=logger)
    setup_logging(file=file, logger=logger)  # again: still one listener
    assert sum(isinstance(d, PythonLogUploader) for d in logger.active_destinations) == 1
    log.info('during epoch 0')
    logger.epoch_end()
    logger.epoch_end()  # nothing new: no second upload
    assert uploader.names() == ['up/python-rank0.log']
    assert b'during epoch 0' in uploader.objects['up/python-rank0.log']
    log.info('last words')
    logger.close()
    assert uploader.names() == ['up/python-rank0.log'] * 2
    assert b'last words' in uploader.objects['up/python-rank0.log']
    assert all(overwrite for _, _, overwrite in uploader.uploads)


def test_closed_logger_is_refused_before_anything_changes(tmp_path):
    logger = Logger([RecordingUploader()], run_name='c')
    logger.close()
    root = _bare_root()
    with pytest.raises(RuntimeError, match='the Logger is closed'):
        setup_logging(file=str(tmp_path / 'r{rank}.log'), logger=logger)
    assert root.handlers == []


def test_no_upload_without_an_upload_capable_destination(tmp_path):
    with Logger([], run_name='n') as logger:
        setup_logging(file=str(tmp_path / 'r{rank}.log'), logger=logger)
        assert not any(isinstance(d, PythonLogUploader) for d in logger.active_destinations)


# ---------------------------------------------------------------------------- a real job
def _tagged(lines, text):
    return [line for line in lines if text in line]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_four_ranks_under_torchrun(tmp_path, capsys):
    result = run_torchrun(SCENARIO, 4, tmp_path, timeout=200, check=False)
    assert result.returncode != 0, 'rank 3 should have died of its uncaught exception'
    console = result.stderr.splitlines()
    context = f'\nstderr:\n{result.stderr[-6000:]}'
    # Phase 1, console_ranks='zero' and setup_logging called twice: each line once.
    assert len(_tagged(console, 'every rank says hello')) == 1, context
    assert not _tagged(console, 'rank 2 alone says this'), context
    assert len(_tagged(console, 'UserWarning: a warning raised on every rank')) == 1, context
    errors = _tagged(console, 'rank 3 had a problem')
    assert len(errors) == 1 and errors[0].startswith('[rank 3] ') and ' ERROR scenario: ' in errors[0], context
    crash = _tagged(console, 'rank 3 crashed')
    assert crash and all(line.startswith('[rank 3] ') for line in crash), context
    assert _tagged(console, '[rank 3] Traceback (most recent call last):'), context
    assert any('CRITICAL root: Uncaught exception: RuntimeError: rank 3 crashed' in line for line in crash)
    # Phase 2, console_ranks='all': every rank prints, prefixed.
    for rank in range(4):
        lines = (tmp_path / f'console-all-rank{rank}.txt').read_text().splitlines()
        assert len(lines) == (2 if rank == 2 else 1) and all(line.startswith(f'[rank {rank}] ') for line in lines)
        assert lines[0].endswith('INFO scenario: phase two on every rank')
        assert (rank == 2) == any(line.endswith('phase two on rank 2 alone') for line in lines)
    # One file per rank, with every record of that rank.
    files = {rank: (tmp_path / 'python-logs' / f'python-rank{rank}.log').read_text() for rank in range(4)}
    for rank, text in files.items():
        assert text.count(f' rank {rank} INFO scenario: every rank says hello\n') == 1
        assert text.count('UserWarning: a warning raised on every rank') == 1
        assert ('rank 2 alone says this' in text) == (rank == 2)
        assert text.count('phase two on every rank') == 1
    assert ' rank 3 ERROR scenario: rank 3 had a problem\n' in files[3]
    assert '\n\tRuntimeError: rank 3 crashed' in files[3] and 'Uncaught exception' not in files[0]
    # FileLogger(capture_stdout=True): each rank's print in its file, and still on stdout.
    for rank in range(4):
        assert (tmp_path / 'file-logs' / f'logs-rank{rank}.txt').read_text().count(
            f'[stdout]: print from rank {rank}\n'
        ) == 1
        # Four processes share the pipe and print() writes the text and its newline separately,
        # so another rank's line may land between them: look for the text only.
        assert f'print from rank {rank}' in result.stdout

    # dist-logging logs over those files.
    def logs(*options):
        assert main(['logs', str(tmp_path / 'python-logs'), *options]) == 0
        return capsys.readouterr().out.splitlines()

    merged = logs()
    hello = _tagged(merged, 'every rank says hello')
    alone = _tagged(merged, 'rank 2 alone says this')
    assert len(hello) == 1 and hello[0].startswith('[ranks 0-3] ') and ' INFO scenario: ' in hello[0], merged
    assert len(alone) == 1 and alone[0].startswith('[rank 2] '), merged
    assert merged.index(hello[0]) < merged.index(alone[0])
    stamps = [m.group(1) for m in map(re.compile(r'\[ranks? [\d,-]+\] (\S+Z) ').match, merged) if m]
    assert stamps == sorted(stamps) and len(stamps) == 7, merged
    warning = _tagged(merged, 'UserWarning: a warning raised on every rank')
    assert len(warning) == 1 and warning[0].startswith('[ranks 0-3] ')
    selected = logs('--ranks', '2,3')
    assert _tagged(selected, 'every rank says hello')[0].startswith('[ranks 2-3] ')
    assert not [line for line in selected if re.match(r'\[ranks? [\d,-]*[01]\b', line)]
    severe = logs('--level', 'WARNING')
    assert not _tagged(severe, ' INFO ') and len(_tagged(severe, 'UserWarning: a warning raised on every rank')) == 1
    assert _tagged(severe, 'rank 3 had a problem')[0].startswith('[rank 3] ')
    assert _tagged(severe, 'CRITICAL root: Uncaught exception')[0].startswith('[rank 3] ')
    assert len(_tagged(logs('--no-collapse'), 'every rank says hello')) == 4
    assert main(['logs', str(tmp_path / 'file-logs')]) == 0
    prints = capsys.readouterr().out.splitlines()
    for rank in range(4):
        assert _tagged(prints, f'print from rank {rank}')[0].startswith(f'[rank {rank}] ')
