"""S3ObjectStore: Amazon S3 and S3-compatible servers (MinIO, moto, R2, ...) through boto3."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

try:
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError as _exc:  # the registry turns this into an install hint
    raise ImportError('S3ObjectStore needs boto3: pip install "dist-logging[s3]"', name='boto3') from _exc

from dist_logging.object_store import ObjectStore, check_object_name, download_target

__all__ = ['S3ObjectStore']

MiB = 1024 * 1024
_EXISTS_CODES = {'PreconditionFailed', 'ConditionalRequestConflict'}
_MISSING_CODES = {'404', 'NoSuchKey', 'NotFound'}


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get('Error', {}).get('Code', ''))


class S3ObjectStore(ObjectStore):
    """Objects in an S3 bucket under an optional prefix.

    Large files go up as multipart uploads read from disk part by part, so memory
    stays near ``max_concurrency * multipart_chunksize`` whatever the file size.
    ``overwrite=False`` first checks for the object, then uploads with a conditional
    write (``If-None-Match: *``) so that, on servers that support it (AWS S3 since
    2024, recent MinIO and moto), a writer racing for the same name is refused
    atomically; on servers that ignore the header the check-then-put remains.

    The boto3 client is created lazily, once per process, and is not pickled: an
    instance can be sent to upload worker processes.

    Args:
        bucket: the bucket name.
        prefix: a key prefix (``'runs/exp1'``); object names are joined under it.
        endpoint_url: the S3 endpoint (default: ``AWS_ENDPOINT_URL`` from the environment, else AWS).
        region_name: the region (default: from the environment/config).
        aws_access_key_id, aws_secret_access_key, aws_session_token: explicit
            credentials (default: boto3's usual chain). Never written to staging journals.
        multipart_threshold: files larger than this use multipart uploads.
        multipart_chunksize: the part size.
        max_concurrency: parts in flight per object.
        client_config: extra keyword arguments for ``botocore.config.Config``
            (e.g. ``{'retries': {'total_max_attempts': 1}}``).
    """

    def __init__(self, bucket: str, prefix: str = '', *, endpoint_url: Optional[str] = None,
                 region_name: Optional[str] = None, aws_access_key_id: Optional[str] = None,
                 aws_secret_access_key: Optional[str] = None, aws_session_token: Optional[str] = None,
                 multipart_threshold: int = 16 * MiB, multipart_chunksize: int = 8 * MiB,
                 max_concurrency: int = 4, client_config: Optional[Mapping[str, Any]] = None):
        if not bucket or '/' in bucket:
            raise ValueError(f'S3ObjectStore: bad bucket name {bucket!r}')
        for label, value in (('multipart_threshold', multipart_threshold),
                             ('multipart_chunksize', multipart_chunksize), ('max_concurrency', max_concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'S3ObjectStore: {label} must be a positive int, got {value!r}')
        if multipart_chunksize < 5 * MiB:
            raise ValueError(f'S3ObjectStore: multipart_chunksize must be at least 5 MiB (an S3 limit), '
                             f'got {multipart_chunksize}')
        self.bucket = bucket
        self.prefix = prefix.strip('/')
        self.bucket_uri = f's3://{bucket}/{self.prefix}' if self.prefix else f's3://{bucket}'
        self.endpoint_url = endpoint_url or os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL')
        self.region_name = region_name
        self._credentials = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = multipart_chunksize
        self.max_concurrency = max_concurrency
        self.client_config = dict(client_config or {})
        self._client: Any = None
        self._client_lock = threading.Lock()

    @classmethod
    def from_location(cls, location: str, **kwargs: Any) -> 'S3ObjectStore':
        bucket, _, prefix = location.partition('/')
        return cls(bucket, prefix, **kwargs)

    # ------------------------------------------------------------------ plumbing
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state['_client'] = None
        del state['_client_lock']
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use; thread-safe)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    options: dict[str, Any] = {'retries': {'mode': 'standard', 'total_max_attempts': 3},
                                               'connect_timeout': 10, 'read_timeout': 60,
                                               'max_pool_connections': max(10, 2 * self.max_concurrency)}
                    options.update(self.client_config)
                    key_id, secret, token = self._credentials
                    session = boto3.session.Session()
                    self._client = session.client(
                        's3', endpoint_url=self.endpoint_url, region_name=self.region_name,
                        aws_access_key_id=key_id, aws_secret_access_key=secret, aws_session_token=token,
                        config=Config(**options))
        return self._client

    def _transfer_config(self) -> TransferConfig:
        return TransferConfig(multipart_threshold=self.multipart_threshold,
                              multipart_chunksize=self.multipart_chunksize,
                              max_concurrency=self.max_concurrency, use_threads=True)

    def _key(self, name: str) -> str:
        check_object_name(name)
        return f'{self.prefix}/{name}' if self.prefix else name

    def get_uri(self, name: str) -> str:
        return f's3://{self.bucket}/{self._key(name)}'

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if _error_code(exc) in _MISSING_CODES:
                return False
            raise

    # ------------------------------------------------------------------ primitives
    def upload_object(self, name: str, filename: str, callback: Optional[Callable[[int], None]] = None, *,
                      overwrite: bool = True) -> None:
        key = self._key(name)
        if overwrite:
            self.client.upload_file(filename, self.bucket, key, Callback=callback, Config=self._transfer_config())
            return
        if self._exists(key):
            raise FileExistsError(f'{self.get_uri(name)} already exists')
        try:
            size = os.path.getsize(filename)
            if size <= self.multipart_threshold:
                with open(filename, 'rb') as body:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch='*')
                if callback is not None:
                    callback(size)
            else:
                self._multipart_if_absent(key, filename, size, callback)
        except ClientError as exc:
            status = exc.response.get('ResponseMetadata', {}).get('HTTPStatusCode')
            if _error_code(exc) in _EXISTS_CODES or status == 412:
                raise FileExistsError(f'{self.get_uri(name)} already exists') from exc
            raise

    def _multipart_if_absent(self, key: str, filename: str, size: int,
                             callback: Optional[Callable[[int], None]]) -> None:
        # boto3's managed transfer cannot send If-None-Match on CompleteMultipartUpload, so this
        # is a small multipart loop of its own: each part is read from disk only when its thread
        # sends it, bounding memory by max_concurrency * multipart_chunksize.
        client = self.client
        upload_id = client.create_multipart_upload(Bucket=self.bucket, Key=key)['UploadId']
        chunk = self.multipart_chunksize

        def send(number: int) -> dict[str, Any]:
            offset = (number - 1) * chunk
            with open(filename, 'rb') as handle:
                data = os.pread(handle.fileno(), min(chunk, size - offset), offset)
            etag = client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                      Body=data)['ETag']
            if callback is not None:
                callback(len(data))
            return {'ETag': etag, 'PartNumber': number}

        try:
            count = (size + chunk - 1) // chunk
            with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix='s3-part') as pool:
                parts = list(pool.map(send, range(1, count + 1)))
            client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                             MultipartUpload={'Parts': parts}, IfNoneMatch='*')
        except BaseException:
            try:
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the original error matters; lifecycle rules clean the rest
                pass
            raise

    def download_object(self, name: str, filename: str, overwrite: bool = False,
                        callback: Optional[Callable[[int], None]] = None) -> None:
        key = self._key(name)
        if not overwrite and os.path.lexists(filename):
            raise FileExistsError(f'{filename} exists; pass overwrite=True to replace it')
        self.get_object_size(name)  # FileNotFoundError before any local file is created
        try:
            with download_target(filename, overwrite) as tmp:
                self.client.download_file(self.bucket, key, tmp, Callback=callback, Config=self._transfer_config())
        except ClientError as exc:
            if _error_code(exc) in _MISSING_CODES:
                raise FileNotFoundError(f'{self.get_uri(name)} does not exist') from exc
            raise

    def get_object_size(self, name: str) -> int:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(name))['ContentLength'])
        except ClientError as exc:
            if _error_code(exc) in _MISSING_CODES:
                raise FileNotFoundError(f'{self.get_uri(name)} does not exist') from exc
            raise

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
