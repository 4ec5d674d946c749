import io

import pytest

from dist_logging import Logger
from dist_logging.destinations import ConsoleLogger


def run(console, batches=4):
    logger = Logger([console], run_name='r', redact=True)
    logger.log_hyperparameters({'lr': 0.5, 'token': 'secret-value'})
    for i in range(batches):
        logger.log_metrics({'loss': float(i)})
        logger.batch_end()
    logger.close()


def test_prints_every_interval_and_hides_secrets():
    out = io.StringIO()
    run(ConsoleLogger(log_interval=2, stream=out))
    text = out.getvalue()
    assert 'lr: 0.5' in text and 'secret-value' not in text and 'token: ***' in text
    lines = [line for line in text.splitlines() if line.startswith('[batch]')]
    assert lines == ['[batch][epoch=0][batch=2]: loss: 1.0', '[batch][epoch=0][batch=4]: loss: 3.0']


def test_pending_values_printed_at_epoch_end_and_close():
    out = io.StringIO()
    console = ConsoleLogger(log_interval=100, stream=out)
    logger = Logger([console], run_name='r')
    logger.log_metrics({'a': 1.0})
    logger.batch_end()
    logger.epoch_end()
    logger.log_metrics({'b': 2.0})
    logger.close()
    assert '[epoch][epoch=0][batch=1]: a: 1.0' in out.getvalue()
    assert 'b: 2.0' in out.getvalue()


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


@pytest.mark.parametrize('interval', [0, -1, 1.5, True])
def test_bad_interval(interval):
    with pytest.raises(ValueError, match='log_interval'):
        ConsoleLogger(log_interval=interval)


def test_table_printed():
    out = io.StringIO()
    logger = Logger([ConsoleLogger(stream=out)], run_name='r')
    logger.log_table(['name', 'score'], [['a', 1], ['bb', 22]], name='results')
    assert '[table results]' in out.getvalue() and 'bb   | 22' in out.getvalue()
