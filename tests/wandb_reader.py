"""Read what an offline W&B run wrote, for tests: its ``run-<id>.wandb`` transaction log.

wandb (0.31) writes every record of a run to ``<run dir>/run-<id>.wandb`` and ships no
Python reader for it. The file is a LevelDB-style log:

* a 7-byte file header: ``b':W&B'``, the little-endian uint16 magic ``0xBEE1``, a version byte;
* then 32 KiB blocks, counted from the end of that header. A block holds chunks, each a
  7-byte header (little-endian uint32 CRC-32 of the payload seeded with the CRC-32 of the
  type byte, little-endian uint16 payload length, type byte: 1 full, 2 first, 3 middle,
  4 last) and the payload. A record larger than what is left of a block continues in the
  next one(s). A block tail shorter than a chunk header, or a zero-filled chunk header,
  is padding.
* every record is a serialized ``wandb_internal_pb2.Record``.

The log is complete only after the run finished (``run.finish()``).
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zlib
from typing import Any, Iterator, Optional

__all__ = [
    'FILE_HEADER',
    'BLOCK_SIZE',
    'WandbLogError',
    'iter_chunks_payloads',
    'read_records',
    'find_run_file',
    'RunLog',
    'write_log',
]

MAGIC = 0xBEE1
FILE_HEADER = b':W&B' + struct.pack('<H', MAGIC)  # followed by one version byte
FILE_HEADER_SIZE = 7
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbLogError(ValueError):
    """The file is not a W&B transaction log or is corrupt (says where)."""


def _crc(kind: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF


def iter_chunks_payloads(data: bytes) -> Iterator[bytes]:
    """Yield each record's payload (chunks reassembled), checking the header and every CRC.

    Raises:
        WandbLogError: a bad file header, a CRC mismatch, a chunk running past its block,
            a record split in an impossible order, or a truncated final record.
    """
    if len(data) < FILE_HEADER_SIZE or data[:6] != FILE_HEADER:
        raise WandbLogError(f'not a W&B transaction log: file header {data[:FILE_HEADER_SIZE]!r}')
    body = memoryview(data)[FILE_HEADER_SIZE:]
    pending: Optional[list[bytes]] = None
    block_start = 0
    while block_start < len(body):
        block = body[block_start : block_start + BLOCK_SIZE]
        offset = 0
        while len(block) - offset >= CHUNK_HEADER_SIZE:
            crc, length, kind = struct.unpack_from('<IHB', block, offset)
            if crc == 0 and length == 0 and kind == 0:
                break  # zero-filled: the rest of this block is padding
            start = offset + CHUNK_HEADER_SIZE
            end = start + length
            where = FILE_HEADER_SIZE + block_start + offset
            if end > len(block):
                raise WandbLogError(f'chunk at byte {where}: length {length} runs past its block')
            payload = bytes(block[start:end])
            if _crc(kind, payload) != crc:
                raise WandbLogError(f'chunk at byte {where}: CRC mismatch')
            if kind == FULL:
                if pending is not None:
                    raise WandbLogError(f'chunk at byte {where}: full record inside a split record')
                yield payload
            elif kind == FIRST:
                if pending is not None:
                    raise WandbLogError(f'chunk at byte {where}: first chunk inside a split record')
                pending = [payload]
            elif kind in (MIDDLE, LAST):
                if pending is None:
                    raise WandbLogError(
                        f'chunk at byte {where}: {"middle" if kind == MIDDLE else "last"} chunk without a first one'
                    )
                pending.append(payload)
                if kind == LAST:
                    yield b''.join(pending)
                    pending = None
            else:
                raise WandbLogError(f'chunk at byte {where}: unknown chunk type {kind}')
            offset = end
        block_start += BLOCK_SIZE
    if pending is not None:
        raise WandbLogError('the log ends inside a split record (was the run finished?)')


def write_log(payloads: list[bytes], version: int = 0) -> bytes:
    """Encode ``payloads`` in the same format (to test the reader on records spanning blocks)."""
    out = bytearray(FILE_HEADER + bytes([version]))
    used = 0  # bytes used in the current block
    for payload in payloads:
        rest = memoryview(payload)
        first = True
        while True:
            room = BLOCK_SIZE - used
            if room < CHUNK_HEADER_SIZE:
                out += b'\0' * room
                used = 0
                room = BLOCK_SIZE
            take = min(len(rest), room - CHUNK_HEADER_SIZE)
            last = take == len(rest)
            kind = FULL if first and last else FIRST if first else LAST if last else MIDDLE
            piece = bytes(rest[:take])
            out += struct.pack('<IHB', _crc(kind, piece), take, kind) + piece
            used += CHUNK_HEADER_SIZE + take
            rest = rest[take:]
            first = False
            if last:
                break
    return bytes(out)


def read_records(path: str) -> list[Any]:
    """Every ``Record`` in the transaction log at ``path``, in order.

    Raises:
        WandbLogError: as :func:`iter_chunks_payloads`.
    """
    from wandb.proto import wandb_internal_pb2

    with open(path, 'rb') as f:
        data = f.read()
    records = []
    for payload in iter_chunks_payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def find_run_file(wandb_dir: str, run_id: Optional[str] = None) -> str:
    """The ``run-<id>.wandb`` file of the (only, or the given) run under ``wandb_dir``.

    Raises:
        FileNotFoundError: no such run, or several runs and no ``run_id``.
    """
    pattern = f'run-{run_id}.wandb' if run_id else 'run-*.wandb'
    found = sorted(glob.glob(os.path.join(wandb_dir, '**', pattern), recursive=True))
    if len(found) != 1:
        raise FileNotFoundError(f'expected one {pattern} under {wandb_dir}, found {found}')
    return found[0]


def _value(value_json: str) -> Any:
    return json.loads(value_json)


class RunLog:
    """What one run's transaction log says, decoded: run facts, config, history rows, summary, artifacts."""

    def __init__(self, path: str):
        self.path = path
        self.records = read_records(path)
        self.run: Any = None
        self.config: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.artifacts: list[Any] = []
        self.metrics: list[Any] = []
        self.exit: Any = None
        self.files: list[Any] = []
        for record in self.records:
            kind = record.WhichOneof('record_type')
            if kind == 'run':
                self.run = record.run
                self._update_config(record.run.config)
            elif kind == 'config':
                self._update_config(record.config)
            elif kind == 'history':
                row = {}
                for item in record.history.item:
                    key = '/'.join(item.nested_key) if item.nested_key else item.key
                    row[key] = _value(item.value_json)
                self.history.append(row)
            elif kind == 'summary':
                for item in record.summary.update:
                    key = '/'.join(item.nested_key) if item.nested_key else item.key
                    self.summary[key] = _value(item.value_json)
            elif kind == 'artifact':
                self.artifacts.append(record.artifact)
            elif kind == 'metric':
                self.metrics.append(record.metric)
            elif kind == 'exit':
                self.exit = record.exit
            elif kind == 'files':
                self.files.extend(record.files.files)

    def _update_config(self, config: Any) -> None:
        for item in config.update:
            key = '/'.join(item.nested_key) if item.nested_key else item.key
            self.config[key] = _value(item.value_json)
        for item in config.remove:
            self.config.pop('/'.join(item.nested_key) if item.nested_key else item.key, None)

    @property
    def kinds(self) -> list[str]:
        """The record type of every record, in order."""
        return [r.WhichOneof('record_type') for r in self.records]
