import numpy as np

from dist_logging import Logger
from dist_logging.destinations import InMemoryLogger


def test_keeps_everything():
    mem = InMemoryLogger()
    logger = Logger([mem], run_name='r')
    logger.log_hyperparameters({'lr': 0.1, 'opt': {'name': 'adam'}})
    logger.log_metrics({'loss': 2.0}, step=0)
    logger.batch_end()
    logger.log_metrics({'loss': 1.0})  # step defaults to the batch count
    logger.log_traces({'t': 'x'})
    logger.log_table(['a', 'b'], [[1, 2]], name='tbl', step=3)
    logger.log_images(np.zeros((2, 4, 4, 3), dtype=np.uint8), name='img', channels_last=True)
    logger.close()
    assert mem.hyperparameters == {'lr': 0.1, 'opt': {'name': 'adam'}}
    assert mem.data == {'loss': [(0, 2.0), (1, 1.0)]}
    assert mem.most_recent_values == {'loss': 1.0}
    assert mem.traces == {'t': ['x']}
    assert mem.tables == {'tbl': [(3, ['a', 'b'], [[1, 2]])]}
    ((step, batch, masks),) = mem.images['img']
    assert batch.shape == (2, 4, 4, 3) and masks is None


def test_stored_hparams_are_copies():
    mem = InMemoryLogger()
    hparams = {'opt': {'lr': 0.1}}
    Logger([mem], run_name='r').log_hyperparameters(hparams)
    hparams['opt']['lr'] = 99
    assert mem.hyperparameters['opt']['lr'] == 0.1


def test_most_recent_timestamps_and_state():
    mem = InMemoryLogger()
    assert mem.state is None
    logger = Logger([mem], run_name='r')
    assert mem.state is logger.state
    logger.log_metrics({'epoch': 2.2})
    logger.batch_end(samples=1, tokens=1)
    logger.log_metrics({'epoch': 3.3})
    (first_step, first), (second_step, second) = mem.data['epoch']
    assert (first_step, first, second_step, second) == (0, 2.2, 1, 3.3)
    assert mem.most_recent_values['epoch'] == 3.3
    timestamp = mem.most_recent_timestamps['epoch']
    assert (timestamp.batch, timestamp.sample, timestamp.token) == (1, 1, 1)


def test_get_timeseries():
    from dist_logging.state import Timestamp

    mem = InMemoryLogger()
    Logger([mem], run_name='r')
    for i in range(10):
        mem.state.timestamp = Timestamp(batch=i, batch_in_epoch=i % 3)  # as a training loop moves it
        mem.log_metrics({'accuracy/val': i / 3}, step=mem.state.timestamp.batch)
    series = mem.get_timeseries('accuracy/val')
    np.testing.assert_allclose(series['accuracy/val'], [i / 3 for i in range(10)])
    assert series['batch'].tolist() == list(range(10)) == series['step'].tolist()
    assert series['batch_in_epoch'].tolist() == [i % 3 for i in range(10)]
    assert series['epoch'].tolist() == [0] * 10 and len(series['total_wct']) == 10
    with np.testing.assert_raises_regex(ValueError, "'loss' was never logged.*accuracy/val"):
        mem.get_timeseries('loss')
