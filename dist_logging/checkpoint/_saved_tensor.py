"""Where a DCP-saved tensor's raw bytes lie in its item, read from the item's first bytes (torch.save's zip layout).

DCP's ``FileSystemWriter`` stores every tensor item as one ``torch.save`` of the tensor: an uncompressed zip whose
records are ``<archive>/data.pkl`` (the pickle: dtype, size, stride, storage offset and the storage's key and
size), a few small ones (``.format_version``, ``.storage_alignment``, ``byteorder``), then ``<archive>/data/<key>``
(the storage's bytes, 64-byte aligned), then ``version``, ``.data/serialization_id`` and the central directory.
:func:`saved_layout` parses the local headers in the item's head (the first :data:`HEAD_BYTES`), rebuilds a small
zip of the records before the storage (the storage record empty) and lets ``torch.load(map_location='meta')``
unpickle it, so the tensor's layout comes from torch's own unpickler (weights only) without its bytes. Anything
unexpected (compression, a data descriptor, a header longer than the head, a second storage) gives None: the
caller then loads the item the general way.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
import zipfile
from typing import Optional

import torch

__all__ = ['HEAD_BYTES', 'TAIL_BYTES', 'SavedLayout', 'saved_layout']

HEAD_BYTES = 64 * 1024  # torch.save's records before the storage: about 640 bytes for a tensor of a few dims
TAIL_BYTES = 64 * 1024  # the records and the central directory after it: about 1 KiB
_LOCAL = struct.Struct('<4s5H3I2H')  # a zip local file header (30 bytes)
_SIGNATURE = b'PK\x03\x04'
_DESCRIPTOR = b'PK\x07\x08'


@dataclasses.dataclass(frozen=True)
class SavedLayout:
    """A saved tensor item's storage bytes: ``offset`` (from the item's start) and ``nbytes``, and the tensor on
    ``meta`` (dtype, size, stride, storage offset)."""

    offset: int
    nbytes: int
    tensor: torch.Tensor

    def holds_exactly(self, target: torch.Tensor, length: int) -> bool:
        """Whether the saved storage is exactly ``target``'s bytes (same dtype and size, contiguous, from the
        storage's start) and ends within the item's ``length`` bytes: then it may be read straight into ``target``."""
        nbytes = target.numel() * target.element_size()
        return (
            self.tensor.dtype == target.dtype
            and self.tensor.size() == target.size()
            and self.tensor.is_contiguous()
            and self.tensor.storage_offset() == 0
            and self.nbytes == nbytes
            and self.offset + nbytes <= length
        )


def _records(head: bytes) -> Optional[list[tuple[str, int, int]]]:
    """``(name, data offset, size)`` of the uncompressed records in ``head`` up to the first storage record
    (``<archive>/data/<key>``, whose size is not known here: -1); None when the layout is not torch.save's.

    torch's writer streams: each local header has the data-descriptor flag and zero sizes, and each record's size
    follows its data (a data descriptor: signature, CRC, sizes), found as the descriptor whose size is its distance
    from the record's start and which is followed by the next local header.
    """
    found = []
    position = 0
    while position + _LOCAL.size <= len(head):
        signature, _, flags, method, _, _, _, csize, _, name_len, extra_len = _LOCAL.unpack_from(head, position)
        if signature != _SIGNATURE or method != 0:
            return None
        begin = position + _LOCAL.size
        start = begin + name_len + extra_len
        if start > len(head):
            return None
        name = head[begin : begin + name_len].decode('utf-8', 'replace')
        if _is_storage(name):
            found.append((name, start, -1))
            return found
        if flags & 0x8:
            described = _described_size(head, start)
            if described is None:
                return None
            csize, position = described
        else:
            position = start + csize
        found.append((name, start, csize))
    return None


def _is_storage(name: str) -> bool:
    folder, _, key = name.rpartition('/')
    return folder.endswith('/data') and folder.count('/') == 1 and bool(key)


def _described_size(head: bytes, start: int) -> Optional[tuple[int, int]]:
    """The size of the record whose data starts at ``start``, and where the next local header starts, from the
    data descriptor after the data (32- or 64-bit sizes)."""
    search = start
    while True:
        found = head.find(_DESCRIPTOR, search)
        if found < 0:
            return None
        size = found - start
        for width, fmt in ((4, '<II'), (8, '<QQ')):
            end = found + 8 + 2 * width
            if end + 4 <= len(head) and struct.unpack_from(fmt, head, found + 8) == (size, size):
                if head[end : end + 4] == _SIGNATURE:
                    return size, end
        search = found + 1


def saved_layout(head: bytes) -> Optional[SavedLayout]:
    """The layout of the tensor a torch.save item holds, from its first bytes; None if it cannot be told safely.

    Args:
        head: the item's first bytes (at least its records before the storage; :data:`HEAD_BYTES` is plenty).

    Returns:
        The storage's offset in the item and its size, and the tensor on ``meta``; None for anything but one
        tensor over one uncompressed storage saved in this machine's byte order.
    """
    records = _records(head)
    if not records:
        return None
    storage_name, storage_offset, _ = records[-1]
    archive = storage_name.split('/', 1)[0]
    small = {name: head[start : start + size] for name, start, size in records[:-1]}
    if f'{archive}/data.pkl' not in small:
        return None
    if small.get(f'{archive}/byteorder', sys.byteorder.encode()).decode('ascii', 'replace') != sys.byteorder:
        return None
    buffer = io.BytesIO()
    try:
        with zipfile.ZipFile(buffer, 'w', zipfile.ZIP_STORED) as rebuilt:
            for name, data in small.items():
                if not name.endswith('/.format_version'):  # torch would compute storage offsets for its own layout
                    rebuilt.writestr(name, data)
            rebuilt.writestr(storage_name, b'')
            rebuilt.writestr(f'{archive}/version', b'3\n')
        buffer.seek(0)
        tensor = torch.load(buffer, map_location='meta', weights_only=True)
    except Exception:  # noqa: BLE001 - not a layout we can read straight: the general path loads it
        return None
    if type(tensor) is not torch.Tensor or tensor.device.type != 'meta':
        return None
    return SavedLayout(storage_offset, tensor.untyped_storage().nbytes(), tensor)
