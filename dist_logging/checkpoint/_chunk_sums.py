"""Chunked CRC32C of checkpoint files: the encoding recorded in commit markers and the arithmetic to combine sums.

Torch-free (the commit and ``latest_checkpoint`` import it). Every shard file gets one CRC32C per
``CHUNK_BYTES`` chunk, aligned on the file's start, so a reader that loads part of a file verifies every
byte it uses by reading the chunks that cover them. On their way from the writers to the commit they travel in
the checksums dict under ``CHUNKS_KEY + name``; :func:`chunk_entries` splits them out, and the marker records
them as ``'chunk_checksums'`` (relative name -> ``'crc32c/<chunk bytes>:<base64 of the big-endian 4-byte
values, one per chunk, the last one possibly short>'``).
"""

from __future__ import annotations

import base64
import functools
from typing import Mapping

# The one import of the object store's private CRC module by the load path (_ranged, reader): re-pointed once when
# it becomes public (object_store/checksums.py).
from dist_logging.object_store.checksums import ALGORITHM, combine, crc32c, decode, encode, file_crc32c

__all__ = [
    'CHUNK_BYTES',
    'CHUNKS_KEY',
    'times',
    'zeros',
    'fast_combine',
    'encode_chunks',
    'decode_chunks',
    'chunk_entries',
    'crc32c',
    'encode',
    'decode',
    'file_crc32c',
]

CHUNK_BYTES = 1024 * 1024  # one CRC32C per MiB of each shard file: 5.3 bytes of marker per MiB of checkpoint
CHUNKS_KEY = 'chunks:'  # prefix of a file's chunk checksums in the checksums dict (never a file name: no '/')


def times(matrix: tuple[int, ...], vector: int) -> int:
    """The GF(2) product of a CRC operator (32 column ints) and a CRC value."""
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


@functools.lru_cache(maxsize=64)
def zeros(power: int) -> tuple[int, ...]:
    """The GF(2) operator that appends ``2**power`` zero bytes to a CRC32C (cached: 32 ints)."""
    if power == 0:
        return tuple(combine(1 << bit, 0, 1) for bit in range(32))
    half = zeros(power - 1)
    return tuple(times(half, half[row]) for row in range(32))


def fast_combine(first: int, second: int, second_length: int) -> int:
    """:func:`~dist_logging.object_store.checksums.combine` with its operators cached: about 50 us whatever the
    length (the uncached one squares matrices anew each call, ~5 ms for 8 MiB)."""
    power = 0
    while second_length:
        if second_length & 1:
            first = times(zeros(power), first)
        second_length >>= 1
        power += 1
    return first ^ second


def encode_chunks(values: bytes, chunk: int = CHUNK_BYTES) -> str:
    """``'crc32c/<chunk>:<base64>'`` of the concatenated big-endian 4-byte chunk checksums."""
    return f'{ALGORITHM}/{chunk}:{base64.b64encode(values).decode()}'


def decode_chunks(text: str) -> tuple[int, list[int]]:
    """``(chunk bytes, checksums)`` of :func:`encode_chunks`'s text.

    Raises:
        ValueError: another algorithm or a malformed text.
    """
    head, _, encoded = str(text).partition(':')
    algorithm, _, chunk = head.partition('/')
    try:
        raw = base64.b64decode(encoded, validate=True)
        size = int(chunk)
    except ValueError:
        raw, size = b'', 0
    if algorithm != ALGORITHM or size <= 0 or len(raw) % 4:
        raise ValueError(f'malformed chunk checksums {text[:60]!r}')
    return size, [int.from_bytes(raw[i : i + 4], 'big') for i in range(0, len(raw), 4)]


def chunk_entries(checksums: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split a checksums dict into (file -> whole-file checksum, file -> chunk checksums)."""
    whole, chunks = {}, {}
    for key, value in checksums.items():
        if key.startswith(CHUNKS_KEY):
            chunks[key[len(CHUNKS_KEY) :]] = value
        else:
            whole[key] = value
    return whole, chunks
