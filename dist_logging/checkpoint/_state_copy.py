"""The CPU copy that ``dcp.async_save`` stages the state into, kept for the next save of the same layout.

torch's own cache (``FileSystemWriter(cache_staged_state_dict=True)``) pins its buffers, which fails
on a machine without an accelerator, and never checks that the previous save stopped reading them.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Optional

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.tensor import DTensor

__all__ = ['StagingBuffers']

# How long ``stage`` waits for the thread of the previous save to end (it ends right after the save's
# future is done) before it stages into fresh memory instead.
_PREVIOUS_SAVE_JOIN_S = 1.0


class StagingBuffers:
    """CPU buffers ``CheckpointWriter.stage`` copies the state into, reused while the state keeps its layout.

    The first ``async_save`` allocates them (pinned where an accelerator is available, so the
    device-to-host copy runs at full speed); the next ones copy into the same memory, which skips the
    allocation and first touch of a whole copy of the state on every save. A save reads its staged copy
    until its write is done, so the buffers are handed out again only once the thread that ran (or, with
    the process checkpointer, sent) the previous save has ended; until then, and for a state that changed
    shape or holds something this class cannot describe, ``stage`` copies into fresh memory, as torch
    does without a cache (warning once when a save was still running: wait for each ``async_save``
    future before the next save).
    """

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse  # False: a fresh copy every save (torch's staging without a cache)
        self._lock = threading.Lock()
        self._buffers: Optional[dict] = None
        self._layout: Any = None
        self._pending = False  # handed out, and the thread of its save has not claimed it yet
        self._reader: Optional[threading.Thread] = None
        self._warned = False

    def stage(self, state_dict: dict) -> dict:
        """A CPU copy of ``state_dict`` (tensors copied, other values by reference)."""
        if not self.reuse:
            return _fresh_copy(state_dict)
        layout = _layout_of(state_dict)
        busy = self._previous_save_running()
        with self._lock:
            busy = busy or self._pending
            if busy and not self._warned:
                self._warned = True
                warnings.warn(
                    'CheckpointWriter: the previous async_save of this writer may still be reading its '
                    'staged copy; this one is staged into fresh memory. Wait for each async_save future '
                    'before the next save',
                    RuntimeWarning,
                    stacklevel=4,
                )
            if busy or layout is None:
                return _fresh_copy(state_dict)
            if self._buffers is None or layout != self._layout:
                self._buffers = None  # free the old copy before allocating the new one
                self._buffers = _allocate(state_dict)
                self._layout = layout
            staged = _copy_state_dict(state_dict, self._buffers, type_check=False)
            self._pending, self._reader = True, None
            return staged

    def claim(self) -> None:
        """Record the calling thread as the one that runs (or sends) the save of the last staged copy."""
        with self._lock:
            if self._pending:
                self._pending, self._reader = False, threading.current_thread()

    def release(self) -> None:
        """Drop the buffers (the writer is closed)."""
        with self._lock:
            self._buffers = self._layout = None

    def _previous_save_running(self) -> bool:
        with self._lock:
            reader = self._reader
        if reader is None or reader is threading.current_thread():
            return False
        reader.join(_PREVIOUS_SAVE_JOIN_S)
        return reader.is_alive()


def _fresh_copy(state_dict: dict) -> dict:
    """A CPU copy of ``state_dict`` in newly allocated memory (torch's staging without a cache)."""
    return _copy_state_dict(state_dict, _create_cpu_state_dict(state_dict), type_check=False)


def _allocate(state_dict: dict) -> dict:
    """CPU buffers shaped like ``state_dict``: pinned where an accelerator is available and pinning
    succeeds (page-locked memory can run out where pageable memory does not), pageable otherwise."""
    if _accelerator_available():
        try:
            return _create_cpu_state_dict(state_dict, pin_memory=True)
        except RuntimeError as exc:
            warnings.warn(
                f'CheckpointWriter: could not pin the staging buffers ({exc}); using pageable memory',
                RuntimeWarning,
                stacklevel=5,
            )
    return _create_cpu_state_dict(state_dict)


def _accelerator_available() -> bool:
    accelerator = getattr(torch, 'accelerator', None)  # torch >= 2.6
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def _layout_of(value: Any) -> Any:
    """What the buffers must match to be reused: structure, keys, tensor types, shapes and dtypes (None:
    something the buffers cannot be reused for, e.g. a ``ShardedTensor``)."""
    if isinstance(value, DTensor):
        local = value.to_local()
        return ('dtensor', tuple(value.shape), value.dtype, tuple(local.shape), tuple(value.placements))
    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        return ('tensor', tuple(value.shape), value.dtype)
    if isinstance(value, torch.Tensor):
        return None  # ShardedTensor and other subclasses: a fresh copy each time
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            inner = _layout_of(item)
            if inner is None:
                return None
            items.append((key, inner))
        return ('dict', tuple(items))
    if isinstance(value, (list, tuple)):
        inner_list = [_layout_of(item) for item in value]
        return None if any(x is None for x in inner_list) else (type(value).__name__, tuple(inner_list))
    return ('value',)  # copied by reference: any value fits
