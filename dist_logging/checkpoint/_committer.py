"""The coordinator's committer: one background thread that commits checkpoints in save order.

It never blocks the training thread and issues no collective: it learns what to wait for
from the coordinator's ``finish()`` (every rank's write results) and watches the bucket
(one listing of the checkpoint's folder per poll). The polls back off from 50 ms to 250 ms, and to
one a second after the first 30 s of waiting; each upload this process lands (:meth:`Committer.nudge`)
starts the schedule over at once, so a commit follows the last shard by about one listing.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable, Optional

from dist_logging.checkpoint._intents import CommitIntent, read_intents, remove_intent
from dist_logging.checkpoint.commit import CorruptCheckpoint, NotLanded, commit_checkpoint
from dist_logging.checkpoint.retention import apply_retention

__all__ = ['Committer', 'commit_intent']

log = logging.getLogger(__name__)
_POLL_MIN, _POLL_MAX = 0.05, 1.0
_POLL_EARLY_MAX, _POLL_EARLY_S = 0.25, 30.0  # an upload lands within seconds: poll closely at first
_RESUMED_TRIES = 5  # an earlier process's intent whose files never land is left to drain after this many


def commit_intent(store: Any, intent: CommitIntent, scratch: str) -> list[str]:
    """Commit ``intent`` now (raises :class:`NotLanded` if a file is missing), apply its retention,
    remove it and every older intent of the same checkpoint in its folder; returns the ids retention deleted."""
    commit_checkpoint(
        store,
        intent.checkpoint_id,
        intent.files,
        scratch,
        metadata_file=intent.metadata_file,
        kind=intent.kind,
        extra=intent.extra,
        time_ns=intent.time_ns,
    )
    folder = os.path.dirname(intent.path)
    for other in read_intents(folder):
        if other.checkpoint_id == intent.checkpoint_id and other.time_ns <= intent.time_ns:
            remove_intent(other)
    remove_intent(intent)
    deleted: list[str] = []
    if intent.keep_last is not None:
        parent = intent.checkpoint_id.rsplit('/', 1)[0] if '/' in intent.checkpoint_id else ''
        try:
            deleted = apply_retention(store, parent, intent.keep_last, protect=intent.checkpoint_id)
        except Exception as exc:  # noqa: BLE001 - the commit stands; retention runs again after the next one
            log.warning('retention after committing %r failed: %s: %s', intent.checkpoint_id, type(exc).__name__, exc)
    return deleted


class Committer:
    """Commits intents one at a time, oldest first.

    Args:
        store: the object store.
        scratch: a private local folder for marker files (removed at close).
        timeout: seconds an intent may wait for its files before it fails.
        failed_uploads: returns this rank's failed uploads (object name -> error), so a shard
            that can never land fails its checkpoint at once instead of at the timeout.
        on_result: ``on_result(intent, error_or_None, committed_at, timing, t0, resumed)`` after each intent.

    An intent left by an earlier process (``resumed=True``) is tried once when submitted, without
    waiting for its files and without holding up newer ones, and once more by
    :meth:`retry_resumed`; if its files never land it stays on disk for ``dist-logging drain``.
    """

    def __init__(
        self,
        store: Any,
        scratch: str,
        timeout: float,
        failed_uploads: Callable[[], dict],
        on_result: Callable[..., None],
    ):
        self.store, self.scratch, self.timeout = store, scratch, timeout
        self._failed_uploads, self._on_result = failed_uploads, on_result
        self._queue: collections.deque[tuple[CommitIntent, bool, Any, Optional[float]]] = collections.deque()
        self._resumed_left: list[CommitIntent] = []
        self._resumed_tries: dict[str, int] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by nudge() and by a stop: ends the wait between two polls
        self._thread = threading.Thread(target=self._loop, name='checkpoint-committer', daemon=True)
        self._thread.start()

    def submit(
        self, intent: CommitIntent, *, resumed: bool = False, timing: Any = None, t0: Optional[float] = None
    ) -> None:
        """Queue ``intent`` (``timing``/``t0`` are handed back to ``on_result``).

        Before a new intent, the earlier processes' intents not committed yet are tried again
        (their files may have landed since: resumed uploads on every rank).
        """
        if not resumed:
            self.retry_resumed()
        with self._cond:
            self._queue.append((intent, resumed, timing, t0))
            self._cond.notify_all()

    def retry_resumed(self) -> None:
        """Try the earlier processes' intents that could not commit yet once more (e.g. after this rank's
        resumed uploads landed)."""
        with self._cond:
            left, self._resumed_left = self._resumed_left, []
        for intent in left:
            tries = self._resumed_tries.get(intent.path, 0)
            if tries < _RESUMED_TRIES and os.path.exists(intent.path):
                self._resumed_tries[intent.path] = tries + 1
                self.submit(intent, resumed=True)

    def nudge(self, *_: Any) -> None:
        """Poll again now: an upload just landed (e.g. one of the coordinator's own shards)."""
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every submitted intent committed or failed; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop after the queued intents (or at once: an intent cut short stays on disk for drain)."""
        with self._cond:
            self._stop_when_idle = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            self._wake.set()
            self._thread.join(5)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def abort(self) -> None:
        """Stop at once (an intent cut short stays on disk, uncommitted, for drain or the next job)."""
        self._stop.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(5)
        shutil.rmtree(self.scratch, ignore_errors=True)

    _stop_when_idle = False

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stop_when_idle or self._stop.is_set())
                if self._stop.is_set() or not self._queue:
                    return
                intent, resumed, timing, t0 = self._queue.popleft()
                self._busy = True
            try:
                error = self._commit(intent, patient=not resumed)
            except BaseException as exc:  # noqa: BLE001 - reported, never raised into the void
                error = exc
            if error is not None and resumed:
                with self._cond:
                    self._resumed_left.append(intent)
            try:
                self._on_result(intent, error, time.time(), timing, t0, resumed)
            except Exception:  # noqa: BLE001
                log.exception('checkpoint commit callback failed')
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _commit(self, intent: CommitIntent, patient: bool = True) -> Optional[BaseException]:
        started = time.monotonic()
        deadline = started + (self.timeout if patient else 0)
        delay = _POLL_MIN
        while True:
            self._wake.clear()  # a landing from here on triggers the next poll
            try:
                commit_intent(self.store, intent, self.scratch)
                return None
            except CorruptCheckpoint as exc:
                return _corrupt_error(intent, exc)
            except NotLanded as exc:
                failed = self._failed_uploads()
                dead = {name: failed[name] for name in exc.missing if name in failed}
                if dead:
                    return _not_landed_error(intent, exc, dead)
                now = time.monotonic()
                if now >= deadline:
                    return _not_landed_error(intent, exc, {}, f'after {self.timeout:g} s')
            nudged = self._wake.wait(min(delay, max(0.0, deadline - now)))
            if self._stop.is_set():
                return RuntimeError(
                    f'checkpoint {intent.checkpoint_id!r}: commit interrupted (stays uncommitted; '
                    f'its intent {intent.path} lets `dist-logging drain` finish it)'
                )
            cap = _POLL_EARLY_MAX if time.monotonic() - started < _POLL_EARLY_S else _POLL_MAX
            delay = _POLL_MIN if nudged else min(cap, delay * 2)


def _not_landed_error(intent: CommitIntent, exc: NotLanded, dead: dict, when: str = '') -> BaseException:
    from dist_logging.errors import UploadError

    failures: dict[str, BaseException] = {}
    for name, why in exc.missing.items():
        failures[name] = dead.get(name) or FileNotFoundError(f'{name}: {why}')
    error = UploadError(failures)
    cause = 'its upload failed' if dead else f'not landed {when}'.strip()
    error.add_note(
        f'checkpoint {intent.checkpoint_id!r} stays uncommitted (invisible): {len(exc.missing)} file(s) '
        f'{cause}; once they land, `dist-logging drain <staging folder>` commits it from {intent.path}'
    )
    return error


def _corrupt_error(intent: CommitIntent, exc: CorruptCheckpoint) -> BaseException:
    """A checkpoint whose landed objects hold other bytes than were written: it can never commit, so its intent
    goes (no later job or drain tries again); the error names each object."""
    from dist_logging.errors import UploadError

    remove_intent(intent)
    error = UploadError(dict(exc.mismatches))
    error.add_note(
        f'checkpoint {intent.checkpoint_id!r} is not committed (invisible): {len(exc.mismatches)} '
        "object(s) landed with other bytes than their writer wrote (CRC32C mismatch); it was dropped"
    )
    return error
