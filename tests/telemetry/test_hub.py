"""The Logger's telemetry in one process: validation at construction, the port in use, node metrics reaching
rank zero's destinations at batch_end with nothing reduced, the threads ended at close."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip('prometheus_client', reason='pip install "dist-logging[prometheus]"')
pytest.importorskip('psutil', reason='pip install "dist-logging[system]"')

from _telemetry_job import by_rank, scrape  # noqa: E402

from dist_logging import Logger  # noqa: E402
from dist_logging.config import load_config  # noqa: E402
from dist_logging.destinations.in_memory import InMemoryLogger  # noqa: E402
from dist_logging.telemetry import SYSTEM_METRICS, sample_once  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    'kwargs, match',
    [
        ({'system_metrics_every': 0}, 'system_metrics_every'),
        ({'system_metrics_every': 'often'}, 'system_metrics_every'),
        ({'metrics_port': 70000}, 'metrics_port'),
        ({'metrics_port': True}, 'metrics_port'),
        ({'metrics_port': 0, 'metrics_host': ''}, 'metrics_host'),
        ({'gather_summary_above': -1}, 'gather_summary_above'),
    ],
)
def test_bad_values_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Logger(**kwargs)


def test_config_keys_are_checked_at_load():
    config = load_config({'system_metrics_every': 2, 'metrics_port': 9400, 'metrics_host': '127.0.0.1'})
    assert config.logger_kwargs['metrics_port'] == 9400
    with pytest.raises(ValueError, match='^metrics_port: '):
        load_config({'metrics_port': 'x'})


def test_port_in_use_is_an_error_at_construction():
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f'metrics_port={port}.*in use'):
            Logger(metrics_port=port, metrics_host='127.0.0.1')
    assert not [t for t in threading.enumerate() if t.name.startswith('dist_logging-metrics')]


def test_node_metrics_reach_destinations_with_nothing_reduced_and_threads_end_at_close():
    memory = InMemoryLogger()
    logger = Logger(memory, system_metrics_every=0.1, metrics_port=0, metrics_host='127.0.0.1', flush_every=1000)
    host = socket.gethostname()
    deadline = time.monotonic() + 20
    while f'system/{host}/memory_used_bytes' not in memory.data and time.monotonic() < deadline:
        time.sleep(0.05)
        logger.batch_end()
    assert f'system/{host}/cpu_percent' in memory.data
    step, used = memory.data[f'system/{host}/memory_used_bytes'][-1]
    assert used > 0 and step == logger.state.timestamp.batch
    families = scrape(logger.metrics_url)
    assert by_rank(families['dist_logging_step']) == {0: float(logger.state.timestamp.batch)}
    assert families['dist_logging_system_cpu_percent'][0].labels == {'host': host}
    logger.close()
    names = {t.name for t in threading.enumerate()}
    assert not names & {'dist_logging-system-metrics', 'dist_logging-metrics-http'}, names


def test_one_sample_has_the_documented_metrics():
    import psutil

    sample = sample_once(psutil)
    assert {'cpu_percent', 'memory_used_bytes', 'memory_available_bytes'} <= set(sample)
    assert set(sample) <= set(SYSTEM_METRICS)


def test_a_committed_checkpoint_shows_on_the_endpoint(tmp_path):
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from dist_logging.checkpoint import CheckpointWriter
    from dist_logging.destinations import RemoteUploaderDownloader

    logger = Logger(metrics_port=0, metrics_host='127.0.0.1')
    try:
        assert 'dist_logging_last_committed_checkpoint_step' not in scrape(logger.metrics_url)
        remote = RemoteUploaderDownloader(f'file://{tmp_path}/bucket', upload_staging_folder=str(tmp_path / 'staging'))
        writer = CheckpointWriter(remote, logger=logger)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # torch: distributed is disabled (one process)
            dcp.save({'w': torch.ones(10)}, checkpoint_id='run/ck/step000042', storage_writer=writer)
        assert writer.wait_for_commits(30)
        families = scrape(logger.metrics_url)
        assert families['dist_logging_last_committed_checkpoint_step'][0].value == 42.0
        assert 0.0 <= families['dist_logging_last_committed_checkpoint_age_seconds'][0].value < 30
        writer.close()
    finally:
        logger.close()
