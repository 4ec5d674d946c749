"""The Logger's side of the black box: builds its :class:`~dist_logging.postmortem.Recorder` over its upload path.

A rank's set goes to every destination active on this rank that takes files (as ``upload_file``
does: journaled, so a set handed over survives the process and ``dist-logging drain`` finishes it).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Optional

from dist_logging import dist
from dist_logging._logger.handover import hand_file
from dist_logging._logger.routing import Router
from dist_logging.postmortem import Recorder
from dist_logging.state import State


def check_reason(reason: Any) -> str:
    """A capture's reason: a short word (letters, digits, ``-`` and ``_``).

    Raises:
        ValueError: anything else (named).
    """
    if (
        not isinstance(reason, str)
        or not reason
        or len(reason) > 64
        or not reason.replace('-', '').replace('_', '').isalnum()
    ):
        raise ValueError(f'capture_postmortem: reason must be a short word (letters, digits, - and _), got {reason!r}')
    return reason


def check_hang_timeout(value: Any) -> None:
    """Check ``Logger(hang_timeout=...)``.

    Raises:
        ValueError: not None and not a positive number of seconds (named).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError(f'hang_timeout must be a positive number of seconds or None, got {value!r}')


def make_recorder(
    router: Router, state: State, group: Any, gatherer: Any, hang_timeout: Optional[float], enabled: bool
) -> Optional[Recorder]:
    """The Logger's recorder (None when this rank has no destination that takes files), started when ``enabled``.

    Raises:
        ValueError: a bad ``hang_timeout``.
    """
    started = time.time()

    def deliver(remote: str, local: str) -> None:
        hand_file(router, state, remote, local, overwrite=True, copy=True)

    def wait_delivered(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        landed = True
        for destination in router.uploaders:
            wait = getattr(destination, 'wait_for_uploads', None)
            if wait is not None:
                landed = bool(wait(max(0.0, deadline - time.monotonic()))) and landed
        return landed

    def events() -> dict[str, Any]:
        uploads = {}
        for index, destination in enumerate(router.uploaders):
            uploader = getattr(destination, 'uploader', None)
            uploads[f'{index}:{type(destination).__name__}'] = {
                'staged_bytes': getattr(uploader, 'staged_bytes', None),
                'uploaded_count': getattr(uploader, 'uploaded_count', None),
                'failed': sorted(getattr(destination, 'failed_uploads', dict)())[:20],
            }
        return {
            'timestamp': dataclasses.asdict(state.timestamp)
            if dataclasses.is_dataclass(state.timestamp)
            else str(state.timestamp),
            'logger_age_seconds': round(time.time() - started, 3),
            'logging_collectives': getattr(group, 'collective_count', None),
            'flush_in_flight': getattr(gatherer, 'in_flight', None),
            'uploads': uploads,
            'destination_failures': [
                f'{type(d).__name__}: {type(e).__name__}: {e}' for d, e in router.failures.values()
            ],
        }

    check_hang_timeout(hang_timeout)
    if not router.uploaders:
        if enabled:
            warnings.warn(
                'Logger(hang_timeout=/postmortem=): no destination on this rank takes files, so there is '
                'nowhere to deliver a postmortem; add a RemoteUploaderDownloader',
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    recorder = Recorder(
        run_name=state.run_name,
        rank=dist.get_global_rank(),
        world_size=dist.get_world_size(),
        attempt=dist.get_attempt(),
        deliver=deliver,
        wait_delivered=wait_delivered,
        events=events,
        progress=lambda: (state.timestamp.batch, state.timestamp.epoch),
        hang_timeout=hang_timeout,
        roster=group.roster,
    )
    if enabled:
        recorder.start()
        group.add_failure_listener(recorder.on_logging_error)
        if hang_timeout is not None and not group.watch(recorder.tick, hang_timeout):
            warnings.warn(
                'Logger(hang_timeout=...): no process group (and so no watch thread): the hang watchdog '
                'is off; the other postmortem triggers stay on',
                RuntimeWarning,
                stacklevel=3,
            )
    return recorder


def stop_recorder(recorder: Optional[Recorder], group: Any) -> None:
    """Stop the recorder's triggers at close (a capture in progress is handed over first, bounded)."""
    if recorder is None:
        return
    group.unwatch(recorder.tick)
    recorder.close()
