"""Retries: one frozen :class:`RetryPolicy`, and which errors are worth retrying.

Backoff sleeps happen on upload workers, never on the training thread, and
wait on an event so that aborting a close interrupts them.
"""

from __future__ import annotations

import errno
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ['RetryPolicy', 'is_transient', 'call_with_retries', 'Interrupted']

_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EAGAIN,
    errno.EBUSY,
}
# Builtin errors that say the request itself is wrong: retrying cannot help.
_PERMANENT_TYPES = (
    FileExistsError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    NotImplementedError,
    ImportError,
)
# botocore / urllib3 / requests exceptions, by class name so this module never imports them.
_TRANSIENT_NAMES = {
    'EndpointConnectionError',
    'ConnectionClosedError',
    'ReadTimeoutError',
    'ConnectTimeoutError',
    'ConnectionError',
    'HTTPClientError',
    'ProxyConnectionError',
    'ResponseStreamingError',
    'IncompleteReadError',
    'ProtocolError',
    'RemoteDisconnected',
    'IncompleteRead',
    'Timeout',
    'ReadTimeout',
    'ConnectTimeout',
    'ChunkedEncodingError',
}
_PERMANENT_NAMES = {
    'NoCredentialsError',
    'PartialCredentialsError',
    'ParamValidationError',
    'InvalidRegionError',
    'UnknownServiceError',
    'NoRegionError',
}
_TRANSIENT_CODES = {
    'Throttling',
    'ThrottlingException',
    'ThrottledException',
    'SlowDown',
    'RequestTimeout',
    'RequestTimeoutException',
    'RequestLimitExceeded',
    'TooManyRequestsException',
    'ProvisionedThroughputExceededException',
    'InternalError',
    'ServiceUnavailable',
    'BandwidthLimitExceeded',
    'EC2ThrottledException',
    'PriorRequestNotComplete',
}


class Interrupted(Exception):
    """An upload given up because its uploader was told to stop (e.g. Ctrl-C during close)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How an upload is retried.

    Attempt ``n`` (1-based) that fails with a transient error is followed, after a
    delay, by attempt ``n + 1``, up to ``num_attempts``. The delay before attempt
    ``n + 1`` is ``min(max_backoff, initial_backoff * multiplier ** (n - 1))`` scaled by
    a random factor in ``[1 - jitter, 1]`` so that ranks that failed together do not
    retry together.

    Args:
        num_attempts: total attempts per upload (>= 1).
        initial_backoff: seconds before the second attempt.
        multiplier: growth of the delay per attempt (>= 1).
        max_backoff: cap on one delay, in seconds.
        jitter: fraction of each delay that is randomized (0 to 1).

    Raises:
        ValueError: a value out of range (names it).
    """

    num_attempts: int = 3
    initial_backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.num_attempts, bool) or not isinstance(self.num_attempts, int) or self.num_attempts < 1:
            raise ValueError(f'num_attempts must be an int >= 1, got {self.num_attempts!r}')
        for name in ('initial_backoff', 'max_backoff'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f'{name} must be a number >= 0, got {value!r}')
        if not isinstance(self.multiplier, (int, float)) or self.multiplier < 1:
            raise ValueError(f'multiplier must be a number >= 1, got {self.multiplier!r}')
        if not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter <= 1:
            raise ValueError(f'jitter must be between 0 and 1, got {self.jitter!r}')

    def backoff(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        delay = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return delay * (1.0 - self.jitter * rng())


def _classify_one(exc: BaseException) -> Optional[bool]:
    name = type(exc).__name__
    if name == 'ObjectStoreTransientError':  # ours or Composer's: the store says "retry me"
        return True
    # botocore raises subclasses of ClientError named after the error code (NoSuchBucket, ...).
    if hasattr(exc, 'response') and any(cls.__name__ == 'ClientError' for cls in type(exc).__mro__):
        response: Any = getattr(exc, 'response', {}) or {}
        code = str(response.get('Error', {}).get('Code', ''))
        status = response.get('ResponseMetadata', {}).get('HTTPStatusCode') or 0
        if code in _TRANSIENT_CODES or status == 429 or (isinstance(status, int) and status >= 500):
            return True
        if code.isdigit() and (int(code) >= 500 or int(code) == 429):
            return True
        return False  # AccessDenied, NoSuchBucket, InvalidAccessKeyId, 4xx ...
    if name in _PERMANENT_NAMES:
        return False
    if name in _TRANSIENT_NAMES or isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return None


def is_transient(exc: BaseException, store: Any = None) -> bool:
    """Whether retrying the operation that raised ``exc`` may succeed.

    Transient: :class:`~dist_logging.object_store.ObjectStoreTransientError` (ours or
    Composer's), connection refused/reset/aborted, timeouts, HTTP 5xx, throttling
    (429, ``SlowDown``, ``Throttling``...). Permanent: access denied, no such bucket,
    other HTTP 4xx, missing credentials, ``FileExistsError``/``FileNotFoundError``/
    ``PermissionError``/``ValueError``. Wrapped errors (``__cause__``/``__context__``,
    e.g. boto3's ``S3UploadFailedError``) are classified by what they wrap. The store's
    :meth:`~dist_logging.object_store.ObjectStore.is_transient_error` has the first say;
    anything unrecognized is treated as transient (retried up to ``num_attempts``).
    """
    classify = getattr(store, 'is_transient_error', None)  # a Composer-written store has none
    if classify is not None:
        verdict = classify(exc)
        if verdict is not None:
            return bool(verdict)
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _classify_one(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return True


def call_with_retries(
    fn: Callable[[int], Any],
    policy: RetryPolicy,
    stop: Optional[threading.Event] = None,
    store: Any = None,
    on_retry: Optional[Callable[[int, BaseException, float], None]] = None,
) -> Any:
    """Call ``fn(attempt)`` until it succeeds, fails permanently, or attempts run out.

    Raises:
        The last exception (a note says how many attempts were made), or
        :class:`Interrupted` when ``stop`` is set during a backoff.
    """
    attempt = 1
    while True:
        try:
            return fn(attempt)
        except Exception as exc:  # noqa: BLE001 - classified below
            if attempt >= policy.num_attempts or not is_transient(exc, store):
                if attempt > 1:
                    exc.add_note(f'gave up after {attempt} attempts')
                raise
            delay = policy.backoff(attempt)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise Interrupted(f'stopped while waiting to retry after: {type(exc).__name__}: {exc}') from exc
            elif delay:
                threading.Event().wait(delay)
            attempt += 1
