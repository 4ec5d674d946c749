"""A lean S3-compatible sink for the benchmarks: it receives uploads and throws the bytes away.

What it is: a stand-in for a remote S3 endpoint on 127.0.0.1 whose CPU cost per byte is
as low as Python allows (request bodies go into one reused 1 MiB buffer per connection with
``readinto`` and are discarded: no hashing, no storing), so that a server sharing the
benchmarked machine's cores takes as little from the job as possible: 0.2-0.3 CPU seconds per
GiB received, where moto, which parses and keeps every byte, takes 10-16. It keeps per-object metadata
only (size, an ETag, last-modified) and serves what boto3 sends for the calls the benchmarks
make, path-style (``http://127.0.0.1:PORT/bucket/key``), any credentials accepted (no
signature check): CreateBucket, HeadBucket, PutObject, HeadObject, DeleteObject,
DeleteObjects, ListObjectsV2, CreateMultipartUpload, UploadPart, CompleteMultipartUpload and
AbortMultipartUpload; ``If-None-Match: *`` on PutObject and CompleteMultipartUpload. Bodies are
plain, with a Content-Length (over http:// botocore signs the payload and sends its CRC32 in a
header, with ``Expect: 100-continue`` on PutObject and UploadPart; it sends ``aws-chunked``
bodies over HTTPS only).

What it is not: an S3 emulator. GetObject is not served (no bytes are kept; no benchmark
reads an object back), ETags are not MD5s, and anything else is answered 501 with the
operation named. Tests keep using moto (tests/s3_server.py), which checks what the sink does not.

Started by :func:`_common.start_s3_server` in a child process (at the lowest CPU and I/O
priority by default): ``SinkServer(port).serve_forever()``.
"""

from __future__ import annotations

import email.utils
import http.server
import itertools
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

_NS = 'http://s3.amazonaws.com/doc/2006-03-01/'
_BUFFER = 1 << 20
_MAX_XML_BODY = 1 << 20  # DeleteObjects (1000 keys) and CompleteMultipartUpload (10000 parts) fit


@dataclass
class _Object:
    size: int
    etag: str
    modified: float = field(default_factory=time.time)


@dataclass
class _Upload:
    bucket: str
    key: str
    parts: dict[int, _Object] = field(default_factory=dict)


class S3Error(Exception):
    """An S3 error response: HTTP status, S3 error code, message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class SinkServer(http.server.ThreadingHTTPServer):
    """The listening server and the metadata of every bucket, object and multipart upload."""

    daemon_threads = True
    request_queue_size = 128  # bursts of new connections from every rank's upload threads

    def __init__(self, port: int):
        """Listen on 127.0.0.1:``port`` (0: a free one); ``serve_forever`` serves."""
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, _Object]] = {}
        self.uploads: dict[str, _Upload] = {}
        self.serial = itertools.count(1)  # ETags and upload ids
        super().__init__(('127.0.0.1', port), _Handler)

    def new_etag(self, suffix: str = '') -> str:
        return f'"{next(self.serial):032x}{suffix}"'

    def objects(self, bucket: str) -> dict[str, _Object]:
        """The objects of ``bucket`` (hold :attr:`lock`)."""
        if bucket not in self.buckets:
            raise S3Error(404, 'NoSuchBucket', f'the bucket {bucket!r} does not exist')
        return self.buckets[bucket]


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection; each request goes to ``_<method>_bucket`` or ``_<method>_object``."""

    protocol_version = 'HTTP/1.1'  # keep-alive; Expect: 100-continue is answered by parse_request
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: SinkServer

    def setup(self) -> None:
        super().setup()
        self.buffer = memoryview(bytearray(_BUFFER))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    # ------------------------------------------------------------------ HTTP plumbing

    def do_HEAD(self) -> None:
        self._dispatch()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        bucket, _, key = unquote(url.path).lstrip('/').partition('/')
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.body_read = False
        try:
            if 'chunked' in self.headers.get('Transfer-Encoding', ''):
                self.close_connection = True  # its body is not read
                raise self._unsupported('Transfer-Encoding: chunked (send a Content-Length)')
            if 'aws-chunked' in self.headers.get('Content-Encoding', ''):
                raise self._unsupported('Content-Encoding: aws-chunked (botocore sends it over HTTPS only)')
            if not bucket:
                raise self._unsupported(f'{self.command} / (ListBuckets)')
            operation = getattr(self, f'_{self.command.lower()}_{"object" if key else "bucket"}')
            operation(bucket, key, query)
        except S3Error as exc:
            if not self.body_read and not self.close_connection:
                self._discard_body()  # the operation did not get to it: read it to keep the connection usable
            body = b'' if self.command == 'HEAD' else (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{exc.code}</Code>'
                f'<Message>{escape(exc.message)}</Message><Resource>{escape(url.path)}</Resource></Error>').encode()
            self._respond(exc.status, body=body)

    def _respond(self, status: int, headers: Optional[dict[str, str]] = None, body: bytes = b'',
                 length: Optional[int] = None) -> None:
        """Status, headers and body; ``length`` is the Content-Length of a HEAD answer (no body sent)."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body:
            self.send_header('Content-Type', 'application/xml')
        if status != 204:
            self.send_header('Content-Length', str(len(body) if length is None else length))
        if self.close_connection:
            self.send_header('Connection', 'close')
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _xml(self, root: str, inner: str) -> None:
        body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{_NS}">{inner}</{root}>'
        self._respond(200, body=body.encode())

    def _discard_body(self) -> int:
        """Read the request body into the reused buffer and drop it; returns its size."""
        size = left = int(self.headers.get('Content-Length') or 0)
        self.body_read = True
        while left:
            n = self.rfile.readinto(self.buffer[:min(left, _BUFFER)])
            if not n:
                raise ConnectionError('the client closed the connection mid-body')
            left -= n
        return size

    def _xml_body(self) -> ET.Element:
        length = int(self.headers.get('Content-Length') or 0)
        if length > _MAX_XML_BODY:
            raise S3Error(400, 'MaxMessageLengthExceeded', f'an XML request body of {length} bytes is too large')
        self.body_read = True
        try:
            root = ET.fromstring(self.rfile.read(length))
        except ET.ParseError as exc:
            raise S3Error(400, 'MalformedXML', f'the XML request body does not parse: {exc}') from None
        for element in root.iter():
            element.tag = element.tag.rpartition('}')[2]  # drop the namespace, if any
        return root

    def _if_none_match(self, objects: dict[str, _Object], key: str) -> None:
        """412 when ``If-None-Match: *`` is sent and ``key`` exists (hold the lock)."""
        condition = self.headers.get('If-None-Match')
        if condition is None:
            return
        if condition.strip() != '*':
            raise self._unsupported(f'If-None-Match: {condition} (only *)')
        if key in objects:
            raise S3Error(412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did not hold')

    @staticmethod
    def _unsupported(operation: str) -> S3Error:
        return S3Error(501, 'NotImplemented', f'{operation} is not supported by the benchmark S3 sink')

    # ------------------------------------------------------------------ bucket operations

    def _put_bucket(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if query:
            raise self._unsupported(f'{self.command} {self.path}')
        self._discard_body()  # a CreateBucketConfiguration, if any
        with self.server.lock:
            self.server.buckets.setdefault(bucket, {})  # us-east-1 answers 200 to the owner's repeat too
        self._respond(200, {'Location': f'/{bucket}'})

    def _head_bucket(self, bucket: str, key: str, query: dict[str, str]) -> None:
        with self.server.lock:
            self.server.objects(bucket)
        self._respond(200)

    def _get_bucket(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if query.get('list-type') != '2':
            raise self._unsupported(f'GET {self.path} (the sink lists with ListObjectsV2 only)')
        if query.get('delimiter'):
            raise self._unsupported('ListObjectsV2 with a delimiter')
        # encoding-type=url (botocore always asks) is not echoed, so botocore takes the keys as sent.
        prefix = query.get('prefix', '')
        after = max(query.get('continuation-token', ''), query.get('start-after', ''))
        max_keys = min(int(query.get('max-keys', 1000)), 1000)
        with self.server.lock:
            listed = sorted((name, obj) for name, obj in self.server.objects(bucket).items()
                            if name.startswith(prefix) and name > after)
        page, truncated = listed[:max_keys], len(listed) > max_keys
        parts = [f'<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>'
                 f'<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>']
        if 'continuation-token' in query:
            parts.append(f'<ContinuationToken>{escape(query["continuation-token"])}</ContinuationToken>')
        if truncated:
            parts.append(f'<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>')
        for name, obj in page:
            modified = time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(obj.modified))
            parts.append(f'<Contents><Key>{escape(name)}</Key><LastModified>{modified}</LastModified>'
                         f'<ETag>{escape(obj.etag)}</ETag><Size>{obj.size}</Size>'
                         f'<StorageClass>STANDARD</StorageClass></Contents>')
        self._xml('ListBucketResult', ''.join(parts))

    def _post_bucket(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if 'delete' not in query:
            raise self._unsupported(f'{self.command} {self.path}')
        root = self._xml_body()
        names = [element.findtext('Key', '') for element in root.findall('Object')]
        quiet = root.findtext('Quiet', 'false').strip().lower() == 'true'
        with self.server.lock:
            objects = self.server.objects(bucket)
            for name in names:
                objects.pop(name, None)
        deleted = '' if quiet else ''.join(f'<Deleted><Key>{escape(name)}</Key></Deleted>' for name in names)
        self._xml('DeleteResult', deleted)

    def _delete_bucket(self, bucket: str, key: str, query: dict[str, str]) -> None:
        raise self._unsupported('DeleteBucket')

    # ------------------------------------------------------------------ object operations

    def _put_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if 'x-amz-copy-source' in self.headers:
            raise self._unsupported('UploadPartCopy' if 'uploadId' in query else 'CopyObject')
        if 'uploadId' in query:
            number = int(query.get('partNumber', 0))
            if not 1 <= number <= 10000:
                raise S3Error(400, 'InvalidArgument', f'partNumber {query.get("partNumber")!r} is not in 1..10000')
            size = self._discard_body()
            with self.server.lock:
                upload = self.server.uploads.get(query['uploadId'])
                if upload is None or (upload.bucket, upload.key) != (bucket, key):
                    raise S3Error(404, 'NoSuchUpload', f'no multipart upload {query["uploadId"]!r} of {key!r}')
                part = upload.parts[number] = _Object(size, self.server.new_etag())
            self._respond(200, {'ETag': part.etag})
            return
        if query:
            raise self._unsupported(f'{self.command} {self.path}')
        size = self._discard_body()
        with self.server.lock:
            objects = self.server.objects(bucket)
            self._if_none_match(objects, key)
            obj = objects[key] = _Object(size, self.server.new_etag())
        self._respond(200, {'ETag': obj.etag})

    def _head_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if query:
            raise self._unsupported(f'{self.command} {self.path}')
        with self.server.lock:
            obj = self.server.objects(bucket).get(key)
        if obj is None:
            raise S3Error(404, 'NoSuchKey', f'the key {key!r} does not exist')
        self._respond(200, {'ETag': obj.etag, 'Last-Modified': email.utils.formatdate(obj.modified, usegmt=True),
                            'Content-Type': 'binary/octet-stream'}, length=obj.size)

    def _get_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        raise self._unsupported('GetObject (the sink keeps no bytes)')

    def _delete_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        with self.server.lock:
            if 'uploadId' in query:
                if self.server.uploads.pop(query['uploadId'], None) is None:
                    raise S3Error(404, 'NoSuchUpload', f'no multipart upload {query["uploadId"]!r}')
            elif query:
                raise self._unsupported(f'{self.command} {self.path}')
            else:
                self.server.objects(bucket).pop(key, None)
        self._respond(204)

    def _post_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if 'uploads' in query:
            self._discard_body()
            with self.server.lock:
                self.server.objects(bucket)
                upload_id = f'{next(self.server.serial):016x}'
                self.server.uploads[upload_id] = _Upload(bucket, key)
            self._xml('InitiateMultipartUploadResult', f'<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>'
                                                       f'<UploadId>{upload_id}</UploadId>')
        elif 'uploadId' in query:
            root = self._xml_body()
            listed = [(int(part.findtext('PartNumber', '0')), part.findtext('ETag', ''))
                      for part in root.findall('Part')]
            with self.server.lock:
                upload = self.server.uploads.get(query['uploadId'])
                if upload is None or (upload.bucket, upload.key) != (bucket, key):
                    raise S3Error(404, 'NoSuchUpload', f'no multipart upload {query["uploadId"]!r} of {key!r}')
                if not listed or [n for n, _ in listed] != sorted({n for n, _ in listed}):
                    raise S3Error(400, 'InvalidPartOrder', 'the part list is empty or not in ascending order')
                for number, etag in listed:
                    if number not in upload.parts or upload.parts[number].etag != etag:
                        raise S3Error(400, 'InvalidPart', f'part {number} with ETag {etag} was not uploaded')
                objects = self.server.objects(bucket)
                self._if_none_match(objects, key)
                del self.server.uploads[query['uploadId']]
                obj = objects[key] = _Object(sum(upload.parts[n].size for n, _ in listed),
                                             self.server.new_etag(f'-{len(listed)}'))
            self._xml('CompleteMultipartUploadResult',
                      f'<Location>/{escape(bucket)}/{escape(key)}</Location><Bucket>{escape(bucket)}</Bucket>'
                      f'<Key>{escape(key)}</Key><ETag>{escape(obj.etag)}</ETag>')
        else:
            raise self._unsupported(f'{self.command} {self.path}')
