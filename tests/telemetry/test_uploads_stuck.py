"""A bucket that stops answering shows on the endpoint: the oldest pending upload's age rises, and returns
to 0 once the server answers again (a real moto S3 server in a process of its own, SIGSTOPped)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

pytest.importorskip('prometheus_client', reason='pip install "dist-logging[prometheus]"')
pytest.importorskip('moto', reason='pip install "dist-logging[test]"')
pytest.importorskip('boto3', reason='pip install "dist-logging[s3]"')

from _telemetry_job import Background, by_rank, scrape, wait_for  # noqa: E402
from s3_server import CREDENTIALS  # noqa: E402
from torchrun_helper import free_port  # noqa: E402

from dist_logging import Logger  # noqa: E402
from dist_logging.destinations import RemoteUploaderDownloader  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def test_stopped_s3_server_raises_the_oldest_pending_age(tmp_path, monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    endpoint = f'http://127.0.0.1:{port}'
    server = [
        sys.executable,
        '-c',
        'import sys, time; from moto.server import ThreadedMotoServer; '
        f'ThreadedMotoServer(ip_address="127.0.0.1", port={port}, verbose=False).start(); time.sleep(120)',
    ]
    with Background(server, log=tmp_path / 'moto.log') as moto:
        import boto3

        client = boto3.client('s3', endpoint_url=endpoint, region_name='us-east-1')
        wait_for('the S3 server answers', lambda: client.create_bucket(Bucket='telemetry-bucket') or True, 30, moto)
        remote = RemoteUploaderDownloader(
            's3://telemetry-bucket/runs',
            backend_kwargs={'endpoint_url': endpoint},
            upload_staging_folder=str(tmp_path / 'staging'),
        )
        logger = Logger(remote, run_name='stuck', metrics_port=0, metrics_host='127.0.0.1')
        try:
            url = logger.metrics_url
            data = tmp_path / 'data.bin'
            data.write_bytes(b'x' * 1000)
            logger.upload_file('first.bin', data)
            wait_for('the first upload lands', lambda: by_rank(scrape(url)['dist_logging_uploads_pending'])[0] == 0, 20)
            assert by_rank(scrape(url)['dist_logging_oldest_pending_upload_age_seconds']) == {0: 0.0}
            os.kill(moto.proc.pid, signal.SIGSTOP)
            try:
                logger.upload_file('second.bin', data)
                time.sleep(1.0)
                first = scrape(url)
                time.sleep(2.0)
                second = scrape(url)
            finally:
                os.kill(moto.proc.pid, signal.SIGCONT)
            assert by_rank(first['dist_logging_uploads_pending']) == {0: 1.0}
            assert by_rank(first['dist_logging_uploads_pending_bytes']) == {0: 1000.0}
            age1 = by_rank(first['dist_logging_oldest_pending_upload_age_seconds'])[0]
            age2 = by_rank(second['dist_logging_oldest_pending_upload_age_seconds'])[0]
            assert age1 >= 1.0 and age2 >= age1 + 2.0, (age1, age2)
            wait_for(
                'the age returns to 0 after the server resumes',
                lambda: by_rank(scrape(url)['dist_logging_oldest_pending_upload_age_seconds'])[0] == 0.0,
                45,
            )
            assert by_rank(scrape(url)['dist_logging_uploads_pending']) == {0: 0.0}
        finally:
            logger.close()
        assert client.head_object(Bucket='telemetry-bucket', Key='runs/second.bin')['ContentLength'] == 1000
