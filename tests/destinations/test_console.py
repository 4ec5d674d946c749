import io
import json
import re

import pytest

from dist_logging import Logger
from dist_logging.destinations import ConsoleLogger
from dist_logging.state import State, Timestamp


def run(console, batches=4):
    logger = Logger([console], run_name='r', redact=True)
    logger.log_hyperparameters({'lr': 0.5, 'token': 'secret-value'})
    for i in range(batches):
        logger.log_metrics({'loss': float(i)})
        logger.batch_end()
    logger.close()


def train_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith('Train ')]


def test_prints_every_interval_in_composers_layout_and_hides_secrets():
    out = io.StringIO()
    run(ConsoleLogger(log_interval=2, stream=out))
    text = out.getvalue()
    assert 'lr: 0.5' in text and 'secret-value' not in text and 'token: ***' in text
    # The first batch is always printed, then every second batch: a progress line, then one line per metric.
    assert '[epoch=1][batch=1]:\n\t Train loss: 0.0\n' in text
    assert '[epoch=1][batch=2]:\n\t Train loss: 1.0\n' in text
    assert train_lines(text) == ['Train loss: 0.0', 'Train loss: 1.0', 'Train loss: 3.0']


def test_a_value_that_arrives_after_its_batch_says_which_batch_it_belongs_to():
    # As an automatic flush completed a batch later delivers a reduced value: step 0 at the end of batch 2.
    out = io.StringIO()
    logger = Logger([ConsoleLogger(log_interval=2, stream=out)], run_name='r')
    logger.log_metrics({'loss': 1.0})
    logger.batch_end()
    logger.log_metrics({'rank_loss': 2.0})
    logger.log_metrics({'loss': 0.5}, step=0)
    logger.batch_end()
    logger.close()
    assert '[epoch=1][batch=2]:\n\t Train rank_loss: 2.0\n\t Train loss: 0.5 (batch 0)\n' in out.getvalue()


@pytest.mark.parametrize('interval,expected', [('1ba', 4), ('2ba', 3), (3, 3), ('1ep', 2), ('2ep', 2)])
def test_interval_units(interval, expected):
    # 2 epochs of 2 batches. 'ep' prints at epoch ends only; the first batch/epoch is always printed.
    out = io.StringIO()
    console = ConsoleLogger(log_interval=interval, stream=out)
    logger = Logger([console], run_name='r')
    for _ in range(2):
        for _ in range(2):
            logger.log_metrics({'loss': 1.0})
            logger.batch_end()
        logger.epoch_end()
    logger.fit_end()
    logger.close()
    assert len(train_lines(out.getvalue())) == expected


def test_pending_values_printed_at_fit_end_and_close():
    out = io.StringIO()
    console = ConsoleLogger(log_interval='100ba', stream=out)
    logger = Logger([console], run_name='r')
    logger.batch_end()  # the first batch prints (nothing pending yet)
    logger.log_metrics({'a': 1.0})
    logger.batch_end()
    logger.fit_end()
    assert '\t Train a: 1.0' in out.getvalue()
    logger.log_metrics({'b': 2.0})
    logger.close()
    assert '\t Train b: 2.0' in out.getvalue()


def test_progress_bar():
    out = io.StringIO()
    console = ConsoleLogger(log_interval=1, progress_bar=True, total_batches=3, stream=out)
    logger = Logger([console], run_name='r')
    logger.epoch_start()
    for i in range(3):
        logger.log_metrics({'loss': float(i)})
        logger.batch_end()
    logger.epoch_end()
    logger.close()
    assert '3/3' in out.getvalue()


@pytest.mark.parametrize('interval', [0, -1, 1.5, True, '0ba', '2sp', 'ep', ''])
def test_bad_interval(interval):
    with pytest.raises(ValueError, match='log_interval'):
        ConsoleLogger(log_interval=interval)


def test_stream_names(capsys):
    ConsoleLogger(stream='stderr').log_to_console({'x': 1}, State('r'))
    assert 'x: 1' in capsys.readouterr().err
    with pytest.raises(ValueError, match="'nowhere'"):
        ConsoleLogger(stream='nowhere')


def test_table_kept_as_json_and_printed_once_at_the_next_print():
    out = io.StringIO()
    console = ConsoleLogger(stream=out)
    columns, rows = ['prompt', 'generation'], [['p0', 'g0'], ['p1', 'g1']]
    console.log_table(columns, rows, name='test_table')
    assert json.loads(console.tables['test_table']) == {'columns': columns, 'data': rows}
    state = State('r', Timestamp(batch=3, batch_in_epoch=3))
    console.log_to_console({}, state)
    console.log_to_console({'loss': 0.5}, state, prefix='Train ')
    printed = [re.match(r'\s*test_table: (.*)', line) for line in out.getvalue().splitlines()]
    tables = [json.loads(m.group(1)) for m in printed if m]
    assert tables == [{'columns': columns, 'data': rows}]  # once, not at every print
    assert out.getvalue().splitlines()[-2:] == ['[epoch=1][batch=3]:', '\t Train loss: 0.5']


def test_traces_in_composers_format():
    out = io.StringIO()
    logger = Logger([ConsoleLogger(stream=out, log_traces=True)], run_name='r')
    logger.log_traces({'algo/trace': 1})
    assert '[trace]: algo/trace:1\n' in out.getvalue()


def test_epoch_end_progress_shows_the_finished_epoch_complete():
    out = io.StringIO()
    logger = Logger([ConsoleLogger(log_interval='1ep', stream=out)], run_name='r')
    for _ in range(3):
        logger.log_metrics({'loss': 1.0})
        logger.batch_end()
    logger.epoch_end()
    logger.close()
    assert '[epoch=1][batch=3]:\n\t Train loss: 1.0' in out.getvalue()
