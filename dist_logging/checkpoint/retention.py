"""Retention: keep the newest ``keep_last`` committed checkpoints of a folder, delete older ones."""

from __future__ import annotations

import logging
from typing import Any, Optional

from dist_logging.checkpoint.commit import delete_checkpoint, retry
from dist_logging.checkpoint.latest import committed_markers
from dist_logging.upload.retry import RetryPolicy

__all__ = ['apply_retention']

log = logging.getLogger(__name__)


def apply_retention(
    store: Any, parent: str, keep_last: int, *, protect: Optional[str] = None, policy: Optional[RetryPolicy] = None
) -> list[str]:
    """Delete committed checkpoints under ``parent`` beyond the newest ``keep_last``, oldest first.

    Only committed checkpoints count and only they are deleted: folders being written (no
    marker yet) are left alone. The newest committed checkpoint (and ``protect``, the one just
    committed) is never deleted. Each deletion removes the marker first, so an interrupted
    one leaves an invisible folder, which the next run's retention does not see either (it is
    left for a lifecycle rule or ``dist-logging``'s user to remove).

    Returns:
        The ids deleted.

    Raises:
        ValueError: ``keep_last`` < 1.
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f'keep_last must be an int >= 1, got {keep_last!r}')
    prefix = f'{parent.strip("/")}/' if parent.strip('/') else ''
    listing = retry(store, lambda: store.list(prefix), policy)
    committed = [marker.checkpoint_id for marker in committed_markers(listing)]
    doomed = [cid for cid in committed[: max(0, len(committed) - keep_last)] if cid != protect]
    deleted = []
    for cid in doomed:
        nested = [other for other in committed if other != cid and other.startswith(f'{cid}/')]
        delete_checkpoint(store, cid, listing, keep_under=nested, policy=policy)
        deleted.append(cid)
        log.info('retention: deleted checkpoint %r (keep_last=%d)', cid, keep_last)
    return deleted
