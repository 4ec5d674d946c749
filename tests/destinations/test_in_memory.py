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
    (step, batch, masks), = mem.images['img']
    assert batch.shape == (2, 4, 4, 3) and masks is None


def test_stored_hparams_are_copies():
    mem = InMemoryLogger()
    hparams = {'opt': {'lr': 0.1}}
    Logger([mem], run_name='r').log_hyperparameters(hparams)
    hparams['opt']['lr'] = 99
    assert mem.hyperparameters['opt']['lr'] == 0.1
