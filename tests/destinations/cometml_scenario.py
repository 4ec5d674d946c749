"""One CometMLLogger run in an offline Comet experiment, for tests/destinations/test_cometml.py.

Run in its own process: importing comet_ml installs import hooks and handlers process-wide,
which must not leak into the test worker. Usage: ``python cometml_scenario.py <offline_dir>``.
Prints one JSON line: what the test needs to check against the archive.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def _refuse(*args, **kwargs):
    raise OSError(f'cometml scenario: no network (tried {args[:1]!r})')


socket.create_connection = _refuse  # offline must not try comet.com
socket.getaddrinfo = _refuse

import numpy as np  # noqa: E402

from dist_logging import Logger  # noqa: E402
from dist_logging.destinations import CometMLLogger  # noqa: E402


def main(offline_dir: str) -> None:
    destination = CometMLLogger(
        workspace='ws',
        project_name='proj',
        name='{run_name}-exp',
        exp_kwargs={
            'offline_directory': offline_dir,
            'display_summary_level': 0,
            'log_env_details': False,
            'log_git_metadata': False,
            'log_git_patch': False,
            'auto_output_logging': None,
            'parse_args': False,
            'log_env_host': False,
            'log_env_gpu': False,
            'log_env_cpu': False,
        },
    )
    assert destination.online is False
    rng = np.random.default_rng(0)
    image = rng.random((3, 5, 6), dtype=np.float32)
    returned_in = {}
    with Logger(destination, run_name='round-trip') as logger:
        logger.log_hyperparameters({'lr': 0.1, 'optim': {'momentum': 0.9}, 'api_key': 'sk-do-not-store'})
        logger.log_metrics({'loss': 1.0}, step=1)
        logger.log_metrics({'loss': 0.5, 'acc': 0.75}, step=2)
        logger.log_table(['prompt', 'generation'], [['p0', 'g0'], ['p1', 2]], name='samples', step=2)
        logger.log_images(image, name='inputs', step=2, masks={'pred': rng.integers(0, 3, (5, 6))})
        logger.log_images(np.linspace(0, 1, 4, dtype=np.float32), name='line', step=2)  # 1-D, as Composer's takes
        logger.batch_end()
        logger.batch_end()
        logger.batch_end()
        logger.log_traces({'algo/Event.INIT': True, 'note': 'hello', 'client_secret': 'trace-do-not-store'})
        logger.log_table(['service', 'password'], [['db', 'hunter2-do-not-store']], name='creds', step=3)
        # Hold the background thread: a log call must return without waiting for Comet.
        gate, held = threading.Event(), []
        destination._worker.submit(lambda: held.append(gate.wait(30)))  # False if the call below waited for it
        start = time.perf_counter()
        logger.log_metrics({'loss': 0.25}, step=3)
        returned_in['log_metrics'] = time.perf_counter() - start
        gate.set()
    assert held == [True], 'a log call waited for the background thread'
    assert destination.experiment.ended and destination.name == 'round-trip-exp'

    # The experiment key, saved the Composer way and loaded before the Logger opens a new destination:
    # the new one continues the saved experiment (an ExistingOfflineExperiment, in its own folder here).
    saved = destination.state_dict()
    restored = CometMLLogger(
        workspace='ws',
        project_name='proj',
        exp_kwargs={**destination.exp_kwargs, 'offline_directory': offline_dir + '-resumed'},
    )
    restored.load_state_dict(saved)
    with Logger(restored, run_name='resumed') as logger:
        logger.log_metrics({'loss': 0.125}, step=4)
    # Used on its own, as Composer's tests use Composer's (whose experiment exists from its constructor):
    # the first call opens the experiment; after post_close() a call is refused.
    alone = CometMLLogger(exp_kwargs={'offline_directory': offline_dir + '-alone'})
    alone.log_metrics({'alone': 1.0}, step=1)
    alone.post_close()
    try:
        alone.log_metrics({'alone': 2.0}, step=2)
        refused_after_close = False
    except RuntimeError:
        refused_after_close = True
    print(
        json.dumps(
            {
                'experiment_key': destination.experiment.get_key(),
                'returned_in': returned_in,
                'alone_key': alone.experiment.get_key(),
                'alone_refused_after_close': refused_after_close,
                'saved': saved,
                'restored_key': restored.experiment.get_key(),
                'restored_type': type(restored.experiment).__name__,
                'image': (np.clip(np.moveaxis(image, 0, -1), 0, 1) * 255 + 0.5).astype(np.uint8).tolist(),
            }
        )
    )


if __name__ == '__main__':
    main(sys.argv[1])
