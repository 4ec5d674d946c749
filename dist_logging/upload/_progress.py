"""The wait at close for uploads still in flight, with a progress bar on global rank zero."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
BAR_AFTER = 2.0  # seconds: a close that waits less shows nothing


def wait_with_progress(scheduler: Any) -> None:
    """Block until ``scheduler`` (an :class:`~dist_logging.upload.workers.UploadScheduler`) has nothing
    outstanding; after ``BAR_AFTER`` s, a ``tqdm`` bar of files on global rank zero (a log line elsewhere)."""
    if scheduler.wait(BAR_AFTER):
        return
    from dist_logging import dist  # imports torch: only when a close has to wait

    bar = None
    if dist.get_global_rank() == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=scheduler.outstanding, desc='waiting for uploads', unit='file', leave=False)
    else:
        log.info('rank %d: waiting for %d upload(s)', dist.get_global_rank(), scheduler.outstanding)
    try:
        start = scheduler.outstanding
        while not scheduler.wait(0.5):
            if bar is not None:
                bar.total = max(bar.total, scheduler.outstanding)
                bar.n = max(0, start - scheduler.outstanding)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
