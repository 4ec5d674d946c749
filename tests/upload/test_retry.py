"""RetryPolicy and the transient/permanent classification."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from dist_logging.upload.retry import Interrupted, RetryPolicy, call_with_retries, is_transient

pytestmark = pytest.mark.timeout(30)


def test_policy_validation_and_frozen():
    with pytest.raises(ValueError, match='num_attempts'):
        RetryPolicy(num_attempts=0)
    with pytest.raises(ValueError, match='jitter'):
        RetryPolicy(jitter=2)
    policy = RetryPolicy()
    with pytest.raises(Exception):
        policy.num_attempts = 5  # type: ignore[misc]


def test_backoff_grows_with_jitter_and_cap():
    policy = RetryPolicy(initial_backoff=1.0, multiplier=2.0, max_backoff=5.0, jitter=0.5)
    assert policy.backoff(1, rng=lambda: 0.0) == 1.0
    assert policy.backoff(2, rng=lambda: 0.0) == 2.0
    assert policy.backoff(3, rng=lambda: 1.0) == 2.0  # 4 s scaled by (1 - 0.5)
    assert policy.backoff(10, rng=lambda: 0.0) == 5.0


class FakeClientError(Exception):
    def __init__(self, code, status):
        super().__init__(code)
        self.response = {'Error': {'Code': code}, 'ResponseMetadata': {'HTTPStatusCode': status}}


FakeClientError.__name__ = 'ClientError'


@pytest.mark.parametrize(
    'exc,transient',
    [
        (ConnectionRefusedError(), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (OSError(errno.ECONNRESET, 'reset'), True),
        (FakeClientError('SlowDown', 503), True),
        (FakeClientError('InternalError', 500), True),
        (FakeClientError('Throttling', 400), True),
        (FakeClientError('AccessDenied', 403), False),
        (FakeClientError('NoSuchBucket', 404), False),
        (PermissionError('denied'), False),
        (FileExistsError('exists'), False),
        (FileNotFoundError('gone'), False),
        (RuntimeError('unknown'), True),
    ],
)
def test_classification(exc, transient):
    assert is_transient(exc) is transient


def test_wrapped_errors_are_classified_by_their_cause():
    try:
        try:
            raise FakeClientError('AccessDenied', 403)
        except Exception:
            raise RuntimeError('Failed to upload')  # like boto3's S3UploadFailedError
    except RuntimeError as exc:
        assert not is_transient(exc)


def test_call_with_retries():
    calls = []

    def flaky(attempt):
        calls.append(attempt)
        if attempt < 3:
            raise ConnectionResetError('reset')
        return 'ok'

    assert call_with_retries(flaky, RetryPolicy(num_attempts=3, initial_backoff=0.01)) == 'ok'
    assert calls == [1, 2, 3]

    calls.clear()

    def denied(attempt):
        calls.append(attempt)
        raise PermissionError('denied')

    with pytest.raises(PermissionError):
        call_with_retries(denied, RetryPolicy(num_attempts=5, initial_backoff=0.01))
    assert calls == [1]  # permanent: no retry


def test_stop_interrupts_backoff():
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()

    def always(attempt):
        raise ConnectionResetError('reset')

    with pytest.raises(Interrupted):
        call_with_retries(always, RetryPolicy(num_attempts=5, initial_backoff=30, jitter=0), stop)
    assert time.monotonic() - start < 5
