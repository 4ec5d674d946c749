"""A lean S3-compatible sink for the benchmarks: it receives uploads and throws the bytes away.

What it is: a stand-in for a remote S3 endpoint on 127.0.0.1 whose CPU cost per byte is
as low as Python allows (request bodies go into one reused 1 MiB buffer per connection with
``readinto`` and are discarded: no hashing, no storing), so that a server sharing the
benchmarked machine's cores takes as little from the job as possible: 0.35 CPU seconds per
GiB received over http, about 1.0 over https (TLS decryption is most of it), where moto, which
parses and keeps every byte, takes 10-16. It keeps per-object metadata
only (size, an ETag, last-modified) and serves what boto3 sends for the calls the benchmarks
make, path-style (``https://127.0.0.1:PORT/bucket/key``), any credentials accepted (no
signature check): CreateBucket, HeadBucket, PutObject, HeadObject, DeleteObject,
DeleteObjects, ListObjectsV2, CopyObject (sizes only), CreateMultipartUpload, UploadPart,
CompleteMultipartUpload and AbortMultipartUpload; ``If-None-Match: *`` on PutObject and CompleteMultipartUpload.

https or http: given a certificate and key (:func:`make_certificate` writes a throwaway
self-signed one), the listening socket is wrapped in TLS and the client does what it does
against real S3, which is served over https: botocore (1.36+) sends PutObject and UploadPart
bodies unsigned (``x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER``) as
``Content-Encoding: aws-chunked`` (``<hex size>\\r\\n<data>\\r\\n ... 0\\r\\n<trailers>\\r\\n\\r\\n``,
1 MiB chunks, the CRC32 in an ``x-amz-checksum-crc32`` trailer) inside ``Transfer-Encoding:
chunked`` (128 KiB chunks), and pays for TLS. Over plain http botocore signs every payload with
SHA-256 instead and sends its CRC32 in a header, with a Content-Length; measured on a machine
with SHA and AES instructions, the client's CPU per GiB is about the same either way (SHA-256
and a second read of the file over http; TLS encryption and aws-chunked copies over https).
Both framings are decoded here: the object's size is the decoded size, checked against
``x-amz-decoded-content-length`` (400 ``IncompleteBody`` when they differ); chunk signatures and
the checksum trailer are not checked (the trailer named in ``x-amz-trailer`` must be present).
``Expect: 100-continue`` (PutObject, UploadPart) is answered.

What it is not: an S3 emulator. GetObject is not served (no bytes are kept; no benchmark
reads an object back), ETags are not MD5s, and anything else is answered 501 with the
operation named. Tests keep using moto (tests/s3_server.py), which checks what the sink does not.

Started by :func:`_common.start_s3_server` in a child process (at the lowest CPU and I/O
priority by default): ``SinkServer(port, certfile, keyfile).serve_forever()``.
"""

from __future__ import annotations

import datetime
import email.utils
import http.server
import ipaddress
import itertools
import os
import shutil
import ssl
import subprocess
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
_MAX_LINE = 8192  # a chunk-size line or a trailer line


def make_certificate(folder: str) -> tuple[str, str]:
    """A throwaway self-signed certificate for ``127.0.0.1`` (IP SAN) and ``localhost``, valid for two days.

    Written to ``folder`` as ``cert.pem`` and ``key.pem`` (RSA 2048, like the certificates real S3
    endpoints present) with the ``cryptography`` package, or the ``openssl`` command when that is
    not importable. The certificate is its own CA: clients trust it through ``AWS_CA_BUNDLE``
    (or ``verify=``) set to the ``cert.pem`` path. Returns (certificate path, key path).
    """
    cert_path, key_path = os.path.join(folder, 'cert.pem'), os.path.join(folder, 'key.pem')
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which('openssl') is None:
            raise RuntimeError('an https S3 sink needs the cryptography package or the openssl command') from None
        subprocess.run(
            [
                'openssl',
                'req',
                '-x509',
                '-newkey',
                'rsa:2048',
                '-nodes',
                '-days',
                '2',
                '-subj',
                '/CN=127.0.0.1',
                '-addext',
                'subjectAltName=IP:127.0.0.1,DNS:localhost',
                '-addext',
                'basicConstraints=critical,CA:TRUE',
                '-keyout',
                key_path,
                '-out',
                cert_path,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return cert_path, key_path
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, '127.0.0.1')])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address('127.0.0.1')), x509.DNSName('localhost')]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    with open(key_path, 'wb') as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            )
        )
    with open(cert_path, 'wb') as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


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


class _Framing(Exception):
    """A request body whose framing does not parse: the connection cannot be read further."""


def _chunk_size(line: bytes, framing: str) -> int:
    """The size in a chunk-size line (``<hex>[;extensions]``) of ``framing``; raises _Framing if it is not one."""
    try:
        size = int(line.split(b';', 1)[0], 16)
    except ValueError:
        raise _Framing(f'bad chunk-size line {line[:40]!r} in {framing}') from None
    if size < 0:
        raise _Framing(f'bad chunk size {size} in {framing}')
    return size


class _Body:
    """A request body as the client framed it: ``length`` bytes (its Content-Length), or, when
    ``length`` is None, ``Transfer-Encoding: chunked`` decoded (chunk extensions and trailers dropped)."""

    def __init__(self, rfile, length: Optional[int]):  # noqa: ANN001 - a buffered socket file
        self.rfile = rfile
        self.chunked = length is None
        self.left = 0 if length is None else length  # bytes left in the current chunk, or in the body
        self.started = False  # a chunk was read (its data is followed by CRLF)
        self.done = not self.chunked and self.left == 0

    def _line(self) -> bytes:
        line = self.rfile.readline(_MAX_LINE)
        if not line:
            raise ConnectionError('the client closed the connection mid-body')
        if not line.endswith(b'\n'):
            raise _Framing('an over-long line in a chunked body')
        return line

    def _next_chunk(self) -> None:
        """Read the next chunk's size line (and, after the last chunk, the trailer section)."""
        if self.started and self._line() not in (b'\r\n', b'\n'):
            raise _Framing('no CRLF after a chunk of Transfer-Encoding: chunked')
        self.started = True
        size = _chunk_size(self._line(), 'Transfer-Encoding: chunked')
        if size == 0:
            while self._line() not in (b'\r\n', b'\n'):
                pass  # trailer fields: dropped
            self.done = True
        self.left = size

    def readinto(self, view: memoryview) -> int:
        """Up to ``len(view)`` decoded bytes into ``view`` (fewer at a chunk's end); 0 at the body's end."""
        if not self.left:
            if self.done or not self.chunked:
                self.done = True
                return 0
            self._next_chunk()
            if self.done:
                return 0
        n = self.rfile.readinto(view[: min(len(view), self.left)])
        if not n:
            raise ConnectionError('the client closed the connection mid-body')
        self.left -= n
        return n

    def readline(self) -> bytes:
        """A decoded line (up to ``_MAX_LINE`` bytes; it may span chunks); b'' at the body's end."""
        parts: list[bytes] = []
        limit = _MAX_LINE
        while limit > 0:
            if not self.left:
                if self.done or not self.chunked:
                    break
                self._next_chunk()
                continue
            piece = self.rfile.readline(min(limit, self.left))
            if not piece:
                raise ConnectionError('the client closed the connection mid-body')
            self.left -= len(piece)
            limit -= len(piece)
            parts.append(piece)
            if piece.endswith(b'\n'):
                break
        return b''.join(parts)


class SinkServer(http.server.ThreadingHTTPServer):
    """The listening server and the metadata of every bucket, object and multipart upload."""

    daemon_threads = True
    request_queue_size = 128  # bursts of new connections from every rank's upload threads

    def __init__(self, port: int, certfile: Optional[str] = None, keyfile: Optional[str] = None):
        """Listen on 127.0.0.1:``port`` (0: a free one), over TLS when given a certificate (and its key,
        unless in the same file); ``serve_forever`` serves."""
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, _Object]] = {}
        self.uploads: dict[str, _Upload] = {}
        self.serial = itertools.count(1)  # ETags and upload ids
        super().__init__(('127.0.0.1', port), _Handler)
        self.tls = certfile is not None
        if certfile is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            # The handshake is made by the connection's own thread (_Handler.setup), not by accept():
            # one slow handshake must not hold up every other connection.
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a connection that failed (a reset, a failed TLS handshake) is the client's business

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
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(30)
            self.request.do_handshake()
            self.request.settimeout(None)
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
            if not bucket:
                raise self._unsupported(f'{self.command} / (ListBuckets)')
            operation = getattr(self, f'_{self.command.lower()}_{"object" if key else "bucket"}')
            operation(bucket, key, query)
        except (S3Error, _Framing) as exc:
            if isinstance(exc, _Framing):
                self.close_connection = True  # where the next request starts is unknown
                exc = S3Error(400, 'IncompleteBody', f'the request body is malformed: {exc}')
            if not self.body_read and not self.close_connection:
                try:  # the operation did not get to it: read it to keep the connection usable
                    self._discard_body()
                except (S3Error, _Framing):
                    self.close_connection = True
            body = (
                b''
                if self.command == 'HEAD'
                else (
                    f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{exc.code}</Code>'
                    f'<Message>{escape(exc.message)}</Message><Resource>{escape(url.path)}</Resource></Error>'
                ).encode()
            )
            self._respond(exc.status, body=body)

    def _respond(
        self, status: int, headers: Optional[dict[str, str]] = None, body: bytes = b'', length: Optional[int] = None
    ) -> None:
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

    def _body(self) -> _Body:
        """The request body, decoded from ``Transfer-Encoding: chunked`` if so sent (marked as read)."""
        self.body_read = True
        if 'chunked' in self.headers.get('Transfer-Encoding', '').lower():
            return _Body(self.rfile, None)
        return _Body(self.rfile, int(self.headers.get('Content-Length') or 0))

    def _aws_chunked(self) -> bool:
        encodings = self.headers.get('Content-Encoding', '').lower().split(',')
        return 'aws-chunked' in (encoding.strip() for encoding in encodings)

    def _discard_body(self) -> int:
        """Read the request body into the reused buffer and drop it; returns the object's size (the
        decoded size of an ``aws-chunked`` body)."""
        body = self._body()
        if self._aws_chunked():
            return self._discard_aws_chunked(body)
        size = 0
        buffer = self.buffer
        while True:
            n = body.readinto(buffer)
            if not n:
                return size
            size += n

    def _discard_aws_chunked(self, body: _Body) -> int:
        """Decode ``Content-Encoding: aws-chunked`` (``<hex size>[;chunk-signature=...]\\r\\n<data>\\r\\n``
        ... ``0\\r\\n<trailers>\\r\\n``), dropping the data; returns the decoded size, checked against
        ``x-amz-decoded-content-length``."""
        declared = self.headers.get('x-amz-decoded-content-length')
        size = 0
        buffer = self.buffer
        while True:
            line = body.readline()
            if not line.endswith(b'\n'):
                raise _Framing(f'the aws-chunked body ends in a chunk-size line ({line[:40]!r})')
            chunk = _chunk_size(line, 'an aws-chunked body')
            if chunk == 0:
                break
            left = chunk
            while left:
                n = body.readinto(buffer[: min(left, _BUFFER)])
                if not n:
                    raise _Framing(f'the aws-chunked body ends inside a chunk ({left} of {chunk} bytes missing)')
                left -= n
            size += chunk
            if body.readline() not in (b'\r\n', b'\n'):
                raise _Framing('no CRLF after an aws-chunked chunk')
        trailers = set()
        while True:
            line = body.readline()
            if line in (b'\r\n', b'\n'):
                break
            if not line.endswith(b'\n'):
                raise _Framing('the aws-chunked body ends in its trailer section')
            trailers.add(line.split(b':', 1)[0].strip().decode('latin-1').lower())
        if body.readinto(buffer[:1]):
            raise _Framing('bytes after the end of the aws-chunked body')
        if declared is None:
            raise S3Error(
                411, 'MissingContentLength', 'an aws-chunked body needs an x-amz-decoded-content-length header'
            )
        if not declared.strip().isdigit() or int(declared) != size:
            raise S3Error(
                400,
                'IncompleteBody',
                f'x-amz-decoded-content-length is {declared}, but the aws-chunked body decoded to {size} bytes',
            )
        announced = {name.strip().lower() for name in self.headers.get('x-amz-trailer', '').split(',') if name.strip()}
        if announced - trailers:
            raise S3Error(
                400,
                'MalformedTrailerError',
                f'x-amz-trailer announced {sorted(announced - trailers)}, the body\'s trailer had {sorted(trailers)}',
            )
        return size

    def _xml_body(self) -> ET.Element:
        if self._aws_chunked():
            raise self._unsupported('an aws-chunked XML request body')
        body = self._body()
        data = bytearray()
        while len(data) <= _MAX_XML_BODY:
            n = body.readinto(self.buffer)
            if not n:
                break
            data += self.buffer[:n]
        else:
            self._discard_body_rest(body)
            raise S3Error(
                400, 'MaxMessageLengthExceeded', f'an XML request body of over {_MAX_XML_BODY} bytes is too large'
            )
        try:
            root = ET.fromstring(bytes(data))
        except ET.ParseError as exc:
            raise S3Error(400, 'MalformedXML', f'the XML request body does not parse: {exc}') from None
        for element in root.iter():
            element.tag = element.tag.rpartition('}')[2]  # drop the namespace, if any
        return root

    def _discard_body_rest(self, body: _Body) -> None:
        while body.readinto(self.buffer):
            pass

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
        # encoding-type=url (botocore always asks) is not echoed, so botocore takes the keys as sent.
        prefix = query.get('prefix', '')
        delimiter = query.get('delimiter', '')  # s3fs asks with '/' (exists, info, ls)
        after = max(query.get('continuation-token', ''), query.get('start-after', ''))
        max_keys = min(int(query.get('max-keys', 1000)), 1000)
        with self.server.lock:
            listed = sorted(
                (name, obj)
                for name, obj in self.server.objects(bucket).items()
                if name.startswith(prefix) and name > after
            )
        entries: list[tuple[str, Optional[_Object]]] = []  # (key, object) or (common prefix, None)
        for name, obj in listed:
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                entries.append((name, obj))
            elif not entries or entries[-1][0] != name[: cut + len(delimiter)]:
                entries.append((name[: cut + len(delimiter)], None))
        page, truncated = entries[:max_keys], len(entries) > max_keys
        parts = [
            f'<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>'
            f'<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>'
        ]
        if delimiter:
            parts.append(f'<Delimiter>{escape(delimiter)}</Delimiter>')
        if 'continuation-token' in query:
            parts.append(f'<ContinuationToken>{escape(query["continuation-token"])}</ContinuationToken>')
        if truncated:
            # Past every key under the last common prefix of the page, or past the last key.
            last, last_obj = page[-1]
            parts.append(
                f'<NextContinuationToken>{escape(last if last_obj else last + chr(0x10FFFF))}</NextContinuationToken>'
            )
        for name, obj in page:
            if obj is None:
                parts.append(f'<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>')
                continue
            modified = time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(obj.modified))
            parts.append(
                f'<Contents><Key>{escape(name)}</Key><LastModified>{modified}</LastModified>'
                f'<ETag>{escape(obj.etag)}</ETag><Size>{obj.size}</Size>'
                f'<StorageClass>STANDARD</StorageClass></Contents>'
            )
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
            if 'uploadId' in query or query:
                raise self._unsupported('UploadPartCopy' if 'uploadId' in query else f'{self.command} {self.path}')
            self._copy_object(bucket, key)
            return
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

    def _copy_object(self, bucket: str, key: str) -> None:
        """CopyObject (metadata only: no bytes are kept). DCP's fsspec and s3torchconnector writers publish
        ``.metadata`` by writing ``.metadata.tmp`` and renaming it, which on S3 is a copy and a delete."""
        source = unquote(self.headers['x-amz-copy-source'].split('?', 1)[0]).lstrip('/')
        src_bucket, _, src_key = source.partition('/')
        self._discard_body()
        with self.server.lock:
            obj = self.server.objects(src_bucket).get(src_key)
            if obj is None:
                raise S3Error(404, 'NoSuchKey', f'the copy source {source!r} does not exist')
            objects = self.server.objects(bucket)
            self._if_none_match(objects, key)
            copied = objects[key] = _Object(obj.size, self.server.new_etag())
        modified = datetime.datetime.fromtimestamp(copied.modified, datetime.timezone.utc)
        self._xml(
            'CopyObjectResult',
            f'<LastModified>{modified.strftime("%Y-%m-%dT%H:%M:%S.000Z")}</LastModified>'
            f'<ETag>{escape(copied.etag)}</ETag>',
        )

    def _head_object(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if query:
            raise self._unsupported(f'{self.command} {self.path}')
        with self.server.lock:
            obj = self.server.objects(bucket).get(key)
        if obj is None:
            raise S3Error(404, 'NoSuchKey', f'the key {key!r} does not exist')
        self._respond(
            200,
            {
                'ETag': obj.etag,
                'Last-Modified': email.utils.formatdate(obj.modified, usegmt=True),
                'Content-Type': 'binary/octet-stream',
            },
            length=obj.size,
        )

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
            self._xml(
                'InitiateMultipartUploadResult',
                f'<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId>',
            )
        elif 'uploadId' in query:
            root = self._xml_body()
            listed = [
                (int(part.findtext('PartNumber', '0')), part.findtext('ETag', '')) for part in root.findall('Part')
            ]
            with self.server.lock:
                upload = self.server.uploads.get(query['uploadId'])
                if upload is None or (upload.bucket, upload.key) != (bucket, key):
                    raise S3Error(404, 'NoSuchUpload', f'no multipart upload {query["uploadId"]!r} of {key!r}')
                if not listed or [n for n, _ in listed] != sorted({n for n, _ in listed}):
                    raise S3Error(400, 'InvalidPartOrder', 'the part list is empty or not in ascending order')
                for number, etag in listed:
                    # The AWS CRT (s3torchconnector) sends the ETags it was given without their quotes.
                    if number not in upload.parts or upload.parts[number].etag.strip('"') != etag.strip('"'):
                        raise S3Error(400, 'InvalidPart', f'part {number} with ETag {etag} was not uploaded')
                objects = self.server.objects(bucket)
                self._if_none_match(objects, key)
                del self.server.uploads[query['uploadId']]
                obj = objects[key] = _Object(
                    sum(upload.parts[n].size for n, _ in listed), self.server.new_etag(f'-{len(listed)}')
                )
            self._xml(
                'CompleteMultipartUploadResult',
                f'<Location>/{escape(bucket)}/{escape(key)}</Location><Bucket>{escape(bucket)}</Bucket>'
                f'<Key>{escape(key)}</Key><ETag>{escape(obj.etag)}</ETag>',
            )
        else:
            raise self._unsupported(f'{self.command} {self.path}')
