"""SaveTiming: one save as a rank saw it (``CheckpointWriter.timings``)."""

from __future__ import annotations

import dataclasses
from typing import Optional

__all__ = ['SaveTiming']


@dataclasses.dataclass
class SaveTiming:
    """One save as this rank saw it.

    Attributes:
        checkpoint_id: the checkpoint's id (its folder in the bucket).
        rank: the global rank.
        started_at: Unix time the save started on this rank (DCP's ``reset``; for a save in torch's
            checkpoint process, when the trainer sent it there).
        local_s: seconds from the start until this rank's shards were written locally and queued
            in the durable upload journal (the moment a SIGKILL no longer loses them).
        bytes_written: this rank's shard bytes.
        commit_s: seconds from the start until the checkpoint was committed in the bucket
            (coordinator only; None elsewhere, and until then).
        error: why the commit failed (coordinator), else None.
    """

    checkpoint_id: str
    rank: int
    started_at: float
    local_s: Optional[float] = None
    bytes_written: int = 0
    commit_s: Optional[float] = None
    error: Optional[BaseException] = None
