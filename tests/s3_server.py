"""A real S3-compatible server for tests: moto's server mode over HTTP on 127.0.0.1.

Import the fixtures into a test module (``from s3_server import s3_server, s3_bucket``)
or use :class:`MotoS3` directly. boto3 talks to it through ``endpoint_url`` like to
any S3 endpoint; nothing in boto3 is mocked.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Iterator, Optional

import pytest

CREDENTIALS = {
    'AWS_ACCESS_KEY_ID': 'testing',
    'AWS_SECRET_ACCESS_KEY': 'testing',
    'AWS_SESSION_TOKEN': 'testing',
    'AWS_DEFAULT_REGION': 'us-east-1',
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class MotoS3:
    """A ThreadedMotoServer on a free port (of loopback, or of ``ip``) that can be stopped and started again.

    Objects survive a stop/start (moto keeps its state in this process), so a test can
    take the server away mid-upload and bring it back.
    """

    def __init__(self, port: Optional[int] = None, ip: str = '127.0.0.1'):
        self.ip, self.port = ip, port or _free_port()
        self.endpoint = f'http://{ip}:{self.port}'
        self._server = None

    def start(self) -> 'MotoS3':
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=self.ip, port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (new connections are refused)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            inner = getattr(server, '_server', None)
            if inner is not None:
                inner.server_close()

    @property
    def running(self) -> bool:
        return self._server is not None

    def client(self):
        import boto3

        return boto3.client(
            's3',
            endpoint_url=self.endpoint,
            region_name='us-east-1',
            aws_access_key_id='testing',
            aws_secret_access_key='testing',
        )

    def create_bucket(self, name: Optional[str] = None) -> str:
        name = name or f'bucket-{uuid.uuid4().hex[:12]}'
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture
def aws_credentials(monkeypatch) -> None:
    """Fake credentials in the environment, so boto3 never looks for real ones."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv('AWS_PROFILE', raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL_S3', raising=False)


@pytest.fixture(scope='session')
def _moto_session() -> Iterator[MotoS3]:
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)
    server = MotoS3().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_server(aws_credentials) -> Iterator[MotoS3]:
    """A moto S3 server of its own for this test (so it may stop and restart it)."""
    server = MotoS3().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(aws_credentials, _moto_session) -> Iterator[tuple[str, str]]:
    """``(endpoint_url, bucket)``: a fresh bucket on the session's shared moto server."""
    yield _moto_session.endpoint, _moto_session.create_bucket()
