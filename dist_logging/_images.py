"""Validation and normalisation of images given as arrays or tensors."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import torch

__all__ = [
    'FLOAT_RANGE_WARNING',
    'to_image_batch',
    'to_uint8',
    'to_rgb',
    'to_mask_batch',
    'validate_masks',
    'overlay_masks',
    'snapshot_images',
    'encode_png',
    'write_png',
]


# Floating dtypes numpy has; others (bfloat16, the float8 types) are widened to float32 first.
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def _as_numpy(image: Any) -> np.ndarray:
    if isinstance(image, torch.Tensor):
        image = image.detach()
        if image.is_floating_point() and image.dtype not in _NUMPY_FLOATS:
            image = image.to(torch.float32)
        return image.cpu().numpy()
    if isinstance(image, np.ndarray):
        return image
    raise ValueError(f'expected an image as a numpy array or a torch tensor, got {type(image).__name__}')


#: Warned (UserWarning) when a floating-point image holds values outside [0, 1], which are clipped when drawn.
#: The first sentence is Composer's, so filters written for its loggers match.
FLOAT_RANGE_WARNING = (
    'Image value range is not in the expected range of [0.0, 1.0] or [0, 255]. Floating-point '
    'images are drawn from [0, 1] and values outside it are clipped (integer images: 0-255); '
    'undo `transforms.Normalize` or scale the images before logging them.'
)


def to_image_batch(images: Any, channels_last: bool = False) -> np.ndarray:
    """Return ``images`` as one NHWC numpy batch (channels 1, 3 or 4).

    Accepts a single image (HW, CHW or HWC; a 1-D array is one row of grey pixels, 1 x W),
    a batch (NCHW or NHWC), or a sequence of single images of equal shape; ``channels_last``
    says where the channels are.
    dtype must be uint8 (0-255), another integer type holding 0-255, bool, or floating point (values in [0, 1];
    others are clipped when drawn, with a :data:`FLOAT_RANGE_WARNING`).

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
        if singles[0].ndim not in (1, 2, 3):
            raise ValueError(f'each image in a sequence must be W, HW, CHW or HWC, got shape {singles[0].shape}')
        if singles[0].ndim == 1:
            singles = [single[None] for single in singles]
        array = np.stack(singles)
    else:
        array = _as_numpy(images)
        if array.ndim == 1:  # one row of grey pixels, as Comet draws a 1-D array Composer's logger hands it
            array = array[None, None]
        elif array.ndim in (2, 3):
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
        raise ValueError(
            f'expected 1, 3 or 4 channels in {layout} layout, got shape {tuple(array.shape)} '
            f'({array.shape[-1]} channels); set channels_last={not channels_last} '
            'if the layout is the other one'
        )
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise ValueError(f'images must have a non-zero height and width, got shape {tuple(array.shape)}')
    if np.issubdtype(array.dtype, np.integer) and array.dtype != np.uint8:
        # Another integer type holding 0-255 (torch.randint(0, 256, ...) is int64), as Composer's loggers take it.
        low, high = (int(array.min()), int(array.max())) if array.size else (0, 0)
        if low < 0 or high > 255:
            raise ValueError(
                f'integer images must hold values 0-255 (as uint8), got {array.dtype} values {low}..{high}'
            )
    elif np.issubdtype(array.dtype, np.floating):
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            # One fixed text from one place: Python's default warning filter shows it once per process, not
            # at every step, nor once more for each destination that draws the same batch.
            warnings.warn(FLOAT_RANGE_WARNING, UserWarning)
    elif not (array.dtype == np.uint8 or array.dtype == np.bool_):
        raise ValueError(
            f'expected image dtype uint8, another integer type with values 0-255, bool or floating '
            f'point in [0, 1], got {array.dtype}'
        )
    return array


def to_uint8(batch: np.ndarray) -> np.ndarray:
    """An NHWC batch from :func:`to_image_batch` as uint8 (integers as they are, floats clipped to [0, 1] then
    scaled)."""
    if batch.dtype == np.uint8:
        return batch
    if batch.dtype == np.bool_:
        return batch.astype(np.uint8) * 255
    if np.issubdtype(batch.dtype, np.integer):  # checked to hold 0-255 by to_image_batch
        return batch.astype(np.uint8)
    return (np.clip(np.nan_to_num(batch.astype(np.float32)), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


# A fixed, colour-blind-friendly-ish palette for mask classes; class 0 is background (not drawn).
_PALETTE = np.array(
    [
        [0, 0, 0],
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [210, 245, 60],
        [250, 190, 212],
        [0, 128, 128],
        [220, 190, 255],
        [170, 110, 40],
        [255, 250, 200],
        [128, 0, 0],
        [170, 255, 195],
        [128, 128, 0],
        [255, 215, 180],
        [0, 0, 128],
    ],
    dtype=np.uint8,
)


def to_rgb(batch: np.ndarray) -> np.ndarray:
    """An NHWC uint8 batch with 1, 3 or 4 channels as 3-channel RGB (grey repeated, alpha dropped)."""
    if batch.shape[-1] == 1:
        return np.repeat(batch, 3, axis=-1)
    if batch.shape[-1] == 4:
        return batch[..., :3]
    return batch


def to_mask_batch(masks: Any, batch_shape: tuple[int, ...], name: str = 'mask') -> np.ndarray:
    """Return ``masks`` as an ``(N, H, W)`` integer array matching an NHWC image batch.

    Accepts one mask (HW) for a single image, a batch (NHW, N1HW or NHW1), or a
    sequence of HW masks; values are class ids (integers >= 0) or booleans.

    Raises:
        ValueError: a shape that does not match the images, or a non-integer dtype, saying what was expected.
    """
    n, h, w = batch_shape[0], batch_shape[1], batch_shape[2]
    if isinstance(masks, Sequence) and not isinstance(masks, (str, bytes)):
        if len(masks) == 0:
            raise ValueError(f'mask {name!r}: expected {n} mask(s), got an empty sequence')
        array = np.stack([_as_numpy(m) for m in masks])
    else:
        array = _as_numpy(masks)
    if array.ndim == 2:
        array = array[None]
    if array.ndim == 4 and array.shape[1] == 1:
        array = array[:, 0]
    elif array.ndim == 4 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.shape != (n, h, w):
        raise ValueError(
            f'mask {name!r}: expected class ids of shape {(n, h, w)} (N, H, W) to match the images, '
            f'got shape {tuple(array.shape)}'
        )
    if array.dtype == np.bool_:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f'mask {name!r}: expected integer class ids or booleans, got dtype {array.dtype}')
    if array.size and array.min() < 0:
        raise ValueError(f'mask {name!r}: class ids must be >= 0, got {int(array.min())}')
    return array


def overlay_masks(batch: np.ndarray, mask: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Blend class-id ``mask`` (N, H, W) over an NHWC uint8 ``batch``; returns RGB uint8.

    Class 0 is background and left untouched; class ``k`` gets palette colour ``k``
    (the palette repeats after 19 classes).
    """
    rgb = to_rgb(batch).astype(np.float32)
    colours = _PALETTE[np.where(mask > 0, (mask - 1) % (len(_PALETTE) - 1) + 1, 0)].astype(np.float32)
    drawn = (mask > 0)[..., None]
    out = np.where(drawn, rgb * (1.0 - alpha) + colours * alpha, rgb)
    return (out + 0.5).astype(np.uint8)


def validate_masks(masks: Any, batch: np.ndarray) -> dict[str, np.ndarray]:
    """Check every entry of a ``masks`` mapping against an NHWC ``batch``; return them as (N, H, W) arrays.

    Raises:
        TypeError: ``masks`` is not a mapping of str -> masks.
        ValueError: as :func:`to_mask_batch`.
    """
    if masks is None:
        return {}
    if not hasattr(masks, 'items'):
        raise TypeError(f'masks must be a mapping of mask name -> masks, got {type(masks).__name__}')
    out = {}
    for mask_name, value in masks.items():
        if not isinstance(mask_name, str) or not mask_name:
            raise TypeError(f'mask names must be non-empty str, got {mask_name!r}')
        out[mask_name] = to_mask_batch(value, batch.shape, mask_name)
    return out


def prepare_images(images: Any, channels_last: bool, masks: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``images`` as a uint8 NHWC batch and their validated ``masks``: every destination's ``log_images`` preamble.

    The batch may share memory with ``images``; use :func:`snapshot_images` to log it later.

    Raises:
        ValueError, TypeError: as :func:`to_image_batch` and :func:`validate_masks`.
    """
    batch = to_uint8(to_image_batch(images, channels_last))
    return batch, validate_masks(masks, batch)


def snapshot_images(images: Any, channels_last: bool, masks: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """As :func:`prepare_images`, but the batch is always a copy, for a background thread to log later
    (the caller may reuse its tensor or array at once).

    Raises:
        ValueError, TypeError: as :func:`to_image_batch` and :func:`validate_masks`.
    """
    batch, mask_batches = prepare_images(images, channels_last, masks)
    return np.array(batch), mask_batches


def image_files(batch: np.ndarray, mask_batches: dict[str, np.ndarray], stem: str) -> list[tuple[str, np.ndarray]]:
    """The files a batch is saved as: per image ``<stem>-<i>.png``, then ``<stem>-<i>.<mask>.png`` per mask
    (the mask overlaid on the image), with the mask's name made safe for a file name."""
    from dist_logging._artifacts import safe_artifact_name

    files = []
    for index in range(batch.shape[0]):
        files.append((f'{stem}-{index}.png', batch[index]))
        for mask_name, mask in mask_batches.items():
            overlaid = overlay_masks(batch[index : index + 1], mask[index : index + 1])[0]
            files.append((f'{stem}-{index}.{safe_artifact_name(mask_name).replace("/", "_")}.png', overlaid))
    return files


def encode_png(image: np.ndarray) -> bytes:
    """Encode one HWC uint8 image (1, 3 or 4 channels) as PNG bytes (no third-party library).

    Raises:
        ValueError: not an HWC uint8 array with 1, 3 or 4 channels.
    """
    import struct
    import zlib

    if image.ndim == 2:
        image = image[..., None]
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(
            f'encode_png: expected an HWC uint8 image with 1, 3 or 4 channels, '
            f'got shape {image.shape} dtype {image.dtype}'
        )
    height, width, channels = image.shape
    colour_type = {1: 0, 3: 2, 4: 6}[channels]
    # Filter type 0 (None) on every scanline: a zero byte before each row.
    raw = np.concatenate([np.zeros((height, 1), np.uint8), np.ascontiguousarray(image).reshape(height, -1)], axis=1)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack('>I', len(payload)) + kind + payload + struct.pack('>I', zlib.crc32(kind + payload))

    header = struct.pack('>IIBBBBB', width, height, 8, colour_type, 0, 0, 0)
    return (
        b'\x89PNG\r\n\x1a\n'
        + chunk(b'IHDR', header)
        + chunk(b'IDAT', zlib.compress(raw.tobytes(), 6))
        + chunk(b'IEND', b'')
    )


def write_png(path: Any, image: np.ndarray) -> None:
    """Write one HWC uint8 image as a PNG file, atomically (temp name, then ``os.replace``).

    Raises:
        ValueError: as :func:`encode_png`.
        OSError: the file cannot be written.
    """
    import os

    data = encode_png(image)
    tmp = f'{os.fspath(path)}.tmp{os.getpid()}'
    with open(tmp, 'wb') as f:
        f.write(data)
    os.replace(tmp, path)
