"""The wait at close for uploads still in flight, with a progress bar on global rank zero."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)
BAR_AFTER = 2.0  # seconds: a close that waits less shows nothing
#: After a fatal error in the process, the longest a close waits with no upload landing (then it gives up and
#: leaves the rest in staging for ``dist-logging drain``).
FATAL_STALL_SECONDS = 10.0


def process_fatal_error() -> Optional[BaseException]:
    """The fatal error this process noted (``dist_logging.dist.note_fatal_error``), or None.

    Without importing ``dist_logging.dist`` (and torch): a process that never imported it noted nothing.
    """
    dist = sys.modules.get('dist_logging.dist')
    fatal_error = getattr(dist, 'fatal_error', None)
    return fatal_error() if fatal_error is not None else None


def wait_while_landing(scheduler: Any, landed: Callable[[], int], stall: Optional[float] = None) -> bool:
    """Wait until ``scheduler`` has nothing outstanding, as long as an upload lands (``landed()`` grows) at
    least every ``stall`` seconds (default :data:`FATAL_STALL_SECONDS`); True when nothing is outstanding,
    False when it gave up."""
    stall = FATAL_STALL_SECONDS if stall is None else stall
    count, since = landed(), time.monotonic()
    while not scheduler.wait(min(0.5, stall)):
        now = landed()
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= stall:
            return False
    return True


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
