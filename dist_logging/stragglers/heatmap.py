"""The straggler heatmap: ranks (rows, rank 0 on top) x reports (columns, oldest left), slow cells bright.

A cell is the rank's busy time in that report ÷ the median rank's: 1.0 and below is dark,
``slow_ratio`` is mid-orange, ``2 * slow_ratio - 1`` and above is white-yellow. A rank that
is slow all along is a bright row; a host that slows down late is a bright tail on its rows;
a bright column is one report where many ranks were slow (a hiccup of the whole job, or a
rank that happened to be very fast). Grey: no value. No fonts are drawn, so the image needs
no plotting library; ``dist-logging stragglers`` prints the axes with the summary.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from dist_logging.stragglers.history import History

__all__ = ['heatmap_image', 'ratio_grid', 'write_heatmap']

# An inferno-like ramp: black, purple, red, orange, pale yellow.
_STOPS = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
_COLOURS = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float64)
_MISSING = np.array([96, 96, 96], dtype=np.uint8)


def ratio_grid(history: History, series: str = 'busy') -> np.ndarray:
    """Each cell's value ÷ that report's median across ranks (ranks x reports; NaN: no value).

    Raises:
        KeyError: the history has no such series (names the ones it has).
    """
    if series not in history.series:
        raise KeyError(f'no series {series!r} in the history; it has {sorted(history.series)}')
    values = history.series[series]
    if values.size == 0:
        return values.copy()
    with np.errstate(invalid='ignore', divide='ignore'):
        medians = np.nanmedian(np.where(np.isnan(values), np.nan, values), axis=0)
        return values / np.where(medians > 0, medians, np.nan)


def heatmap_image(
    history: History, series: str = 'busy', slow_ratio: Optional[float] = None, max_pixels: int = 1 << 22
) -> np.ndarray:
    """The heatmap as an HWC uint8 RGB array (each cell a block of pixels, at most ``max_pixels``).

    Args:
        history: a history read by :func:`~dist_logging.stragglers.history.read_history`.
        series: ``'busy'`` (default), ``'step'`` or a section name.
        slow_ratio: the ratio drawn mid-scale (default: the run's, from the header, else 1.1).
        max_pixels: cap on the image size; large runs get one pixel per cell or fewer windows.

    Raises:
        KeyError: an unknown series.
        ValueError: a history without reports.
    """
    grid = ratio_grid(history, series)
    if grid.size == 0:
        raise ValueError('the history has no reports yet: nothing to draw')
    if slow_ratio is None:
        slow_ratio = float(history.header.get('slow_ratio') or 1.1)
    top = 2 * slow_ratio - 1  # ratio drawn brightest
    position = np.clip((grid - 1.0) / (top - 1.0), 0.0, 1.0)
    rgb = np.empty(grid.shape + (3,), dtype=np.uint8)
    for channel in range(3):
        rgb[..., channel] = np.interp(np.nan_to_num(position, nan=0.0), _STOPS, _COLOURS[:, channel]).round()
    rgb[np.isnan(grid)] = _MISSING
    ranks, windows = grid.shape
    # Cells at least 1 pixel, up to 24 x 64, and at least ~256 pixels wide and tall when small.
    cell_w = int(np.clip(256 // max(windows, 1), 1, 24))
    cell_h = int(np.clip(256 // max(ranks, 1), 1, 64))
    while ranks * cell_h * windows * cell_w > max_pixels and (cell_w > 1 or cell_h > 1):
        cell_w, cell_h = max(cell_w // 2, 1), max(cell_h // 2, 1)
    if ranks * windows > max_pixels:  # keep the latest reports that fit
        rgb = rgb[:, -max(max_pixels // ranks, 1) :]
    return np.repeat(np.repeat(rgb, cell_h, axis=0), cell_w, axis=1)


def write_heatmap(history: History, path: str, series: str = 'busy') -> np.ndarray:
    """Write :func:`heatmap_image` as a PNG file (atomically) and return the image.

    Raises:
        KeyError, ValueError: as :func:`heatmap_image`.
        OSError: the file cannot be written.
    """
    from dist_logging._images import write_png

    image = heatmap_image(history, series)
    write_png(path, image)
    return image
