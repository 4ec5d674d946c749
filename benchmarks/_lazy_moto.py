"""moto's S3 server with ranged GETs served as S3 serves them: only the requested bytes are read.

moto 5.x answers ``GetObject`` with ``Range`` by copying the whole object out of its backing
``SpooledTemporaryFile`` (in memory up to 5 MiB - 1 KiB, ``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``; a temporary file
on local disk above that) and slicing the copy: each range costs in proportion to its object's size, not its
own (a 256 MiB object on a loaded 2-core VM: a 1 MiB range 0.89 s, an 8 MiB one 0.77 s, the whole object
3.67 s), so on plain moto a reader's load time counts how many ranges it asks for, which real S3 does not
charge. :func:`patch` makes a ranged ``GetObject`` hand moto's range code a lazy view of the object that
reads only the slice asked for from the object's backing buffer (the same ranges: 0.13 s each). Everything
else (listing, PUT, HEAD, whole GETs) is moto's own.

Used by the benchmarks' ``--s3-server moto-ranges`` (see ``_common.start_s3_server``).
"""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()


class LazyValue:
    """An object's bytes, read from its backing buffer only for the slice asked for."""

    def __init__(self, key: Any):
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, where: slice) -> bytes:
        start, stop, _ = where.indices(len(self))
        with self.key.lock:
            buffer = self.key._value_buffer
            buffer.seek(start)
            return buffer.read(max(0, stop - start))

    def __bytes__(self) -> bytes:
        return self[:]


def patch() -> None:
    """Make moto's ranged GETs read only the range (idempotent)."""
    from moto.s3 import models, responses

    if getattr(responses.S3Response, '_dist_logging_lazy', False):
        return
    value = models.FakeKey.value

    def lazy_value(key: Any) -> Any:
        if getattr(_local, 'ranged', False):
            return LazyValue(key)
        return value.fget(key)

    models.FakeKey.value = property(lazy_value, value.fset)  # type: ignore[assignment]
    get_object = responses.S3Response.get_object
    key_response = responses.S3Response.key_response

    def lazy_get_object(self: Any) -> Any:
        _local.ranged = bool(self.headers.get('range'))
        try:
            return get_object(self)
        finally:
            _local.ranged = False

    def whole_if_lazy(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        status, response_headers, content = key_response(self, request, full_url, headers)
        if isinstance(content, LazyValue):  # a Range header moto treats as a plain GET
            content = bytes(content)
        return status, response_headers, content

    responses.S3Response.get_object = lazy_get_object
    responses.S3Response.key_response = whole_if_lazy
    responses.S3Response._dist_logging_lazy = True
