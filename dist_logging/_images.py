"""Validation and normalisation of images given as arrays or tensors."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ['to_image_batch', 'to_uint8']


def _as_numpy(image: Any) -> np.ndarray:
    if isinstance(image, torch.Tensor):
        return image.detach().cpu().numpy()
    if isinstance(image, np.ndarray):
        return image
    raise ValueError(f'expected an image as a numpy array or a torch tensor, got {type(image).__name__}')


def to_image_batch(images: Any, channels_last: bool = False) -> np.ndarray:
    """Return ``images`` as one NHWC numpy batch (channels 1, 3 or 4).

    Accepts a single image (HW, CHW or HWC), a batch (NCHW or NHWC), or a sequence
    of single images of equal shape; ``channels_last`` says where the channels are.
    dtype must be uint8 (0-255), bool, or floating point (values in [0, 1]).

    Raises:
        ValueError: a shape, channel count or dtype that is not an image, saying what was expected.
    """
    if isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
        if len(images) == 0:
            raise ValueError('expected at least one image, got an empty sequence')
        singles = [_as_numpy(image) for image in images]
        shapes = {s.shape for s in singles}
        if len(shapes) != 1:
            raise ValueError(f'images in a sequence must share one shape, got {sorted(shapes)}')
        if singles[0].ndim not in (2, 3):
            raise ValueError(f'each image in a sequence must be HW, CHW or HWC, got shape {singles[0].shape}')
        array = np.stack(singles)
    else:
        array = _as_numpy(images)
        if array.ndim in (2, 3):
            array = array[None]
    if array.ndim == 3:  # a batch of HW images
        array = array[..., None]
        channels_last = True
    if array.ndim != 4:
        raise ValueError(f'expected an image (HW, CHW, HWC) or a batch (NCHW, NHWC), got shape {tuple(array.shape)}')
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    if array.shape[-1] not in (1, 3, 4):
        layout = 'HWC/NHWC' if channels_last else 'CHW/NCHW'
        raise ValueError(f'expected 1, 3 or 4 channels in {layout} layout, got shape {tuple(array.shape)} '
                         f'({array.shape[-1]} channels); set channels_last={not channels_last} if the layout is the other one')
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise ValueError(f'images must have a non-zero height and width, got shape {tuple(array.shape)}')
    if not (array.dtype == np.uint8 or array.dtype == np.bool_ or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f'expected image dtype uint8, bool or floating point in [0, 1], got {array.dtype}')
    return array


def to_uint8(batch: np.ndarray) -> np.ndarray:
    """An NHWC batch from :func:`to_image_batch` as uint8 (floats clipped to [0, 1] then scaled)."""
    if batch.dtype == np.uint8:
        return batch
    if batch.dtype == np.bool_:
        return batch.astype(np.uint8) * 255
    return (np.clip(np.nan_to_num(batch.astype(np.float32)), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
