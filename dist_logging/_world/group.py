"""The logging group: the Logger's own collectives, each with a deadline, naming who did not arrive."""

from __future__ import annotations

import atexit
import datetime
import itertools
import re
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as torch_dist

from dist_logging._world.diagnose import Read, diagnose
from dist_logging._world.ending import note_fatal_error
from dist_logging._world.facts import get_attempt, get_global_rank, is_initialized, select_reduction_device
from dist_logging._world.watch import STORE_ANSWER_SECONDS, StoreLine, StoreUnreachable, beat_period, line_for
from dist_logging._world.watch import release
from dist_logging._world.watch import HOST, process_state
from dist_logging.errors import DistributedLoggingError

__all__ = ['LoggingGroup', 'WATCH_AFTER_SECONDS']

# How gloo and TCP report a peer that went away.
_CONNECTION_LOST = re.compile(
    r'Connection (reset|closed) by peer|Broken pipe|remote process exited|Socket closed|connection closed', re.I
)

#: A wait this long (or half of ``sync_timeout``, if shorter) looks at the other ranks' beats and
#: warns, naming the ranks it waits for (alive but not calling, or silent), before the timeout.
WATCH_AFTER_SECONDS = 60.0


def _rows(tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """``world_size`` output tensors shaped like ``tensor``: rows of one allocation (one
    allocation instead of N; ``torch.stack(rows)`` of the result is a view-free copy, and
    ``rows[0]._base`` is the whole table)."""
    table = torch.empty((world_size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    return list(table.unbind(0))


_GROUP_INSTANCES = itertools.count()
_LIVE_GROUPS: 'weakref.WeakSet[LoggingGroup]' = weakref.WeakSet()


@atexit.register
def _release_process_groups() -> None:
    """At interpreter exit, drop our references to the dedicated groups of Loggers never closed
    (no torch call: nothing here may block at exit).

    atexit runs while the interpreter is whole; a process group's C++ object freed later,
    during finalization, takes the process down with SIGABRT.
    """
    for group in list(_LIVE_GROUPS):
        with group._lock:
            group._group = None


class LoggingGroup:
    """The Logger's own collectives: a lazily created gloo group over CPU tensors.

    All methods are collectives: every rank must call them in the same order.
    With a world of one (or no process group) they return at once without
    communicating. The group is created on first use (always a group of its own, never the
    training group, so abandoning it leaves the user's group untouched); its creation is itself
    a collective and obeys the same timeout.

    Bounded waits: every wait (the group's creation, each collective) is a poll on the calling
    thread with a deadline, so a signal handler (FileLogger's SIGTERM flush) runs within
    milliseconds; the group's own gloo timeout is ``timeout`` too, so work left in flight
    after a failure ends by itself by then, and interpreter exit does not wait longer for it.
    No store operation runs on the calling thread: the store is only read through the
    process's :class:`~dist_logging._world.watch.StoreLine`, with a deadline.

    Naming the ranks that did not arrive: each rank's line beats in the store (proof of
    life, and how far the rank got); after a failure, or during a long wait, the waiting ranks
    read the beats and name who left, who went silent (and on which host), and who is alive but
    late (see :mod:`dist_logging._world.diagnose`). The steady state costs exactly one
    collective per call and no store operation on the calling thread.

    After a collective failed (timed out, or a peer failed), the group is abandoned: its later
    collectives raise at once, naming the first failure, instead of waiting again.

    Args:
        timeout: Seconds each collective may wait for the slowest rank before
            raising :class:`DistributedLoggingError`.

    Raises:
        ValueError: ``timeout`` is not a positive number.

    Attributes:
        collective_count: How many collectives this group issued (tests use it to
            prove "one collective per flush").
    """

    def __init__(self, timeout: float = 300.0):
        if not timeout > 0:
            raise ValueError(f'sync_timeout must be a positive number of seconds, got {timeout!r}')
        self.timeout = float(timeout)
        self._group: Any = None
        self._lock = threading.Lock()
        self.collective_count = 0  # counted so tests can prove "one collective per flush"
        # Every rank builds its Loggers in the same order, so the index names the same group everywhere.
        self._id = next(_GROUP_INSTANCES)
        self._sequence = 0
        self._line: Any = None  # this process's StoreLine, False without a store
        self._device: Optional[torch.device] = None
        self._failed: Optional[DistributedLoggingError] = None
        self._reads: list[Read] = []  # beat reads made during the current wait
        # Lent to another thread (the rank reporter's): until given back, other threads' collectives wait for it.
        self._lent_to: Optional[int] = None
        self._given_back = threading.Event()
        self._given_back.set()
        self._failure_listeners: list[Callable[[DistributedLoggingError], None]] = []
        _LIVE_GROUPS.add(self)

    @property
    def active(self) -> bool:
        """Whether collectives really communicate (an initialized world of more than one)."""
        return is_initialized() and torch_dist.get_world_size() > 1

    @property
    def rank(self) -> int:
        """This process's rank in the group (the global rank)."""
        return get_global_rank()

    def _timedelta(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def reduction_target(self) -> tuple[Any, torch.device]:
        """Where metric reductions run: ``(process group, device)``; may create the gloo group.

        With an NCCL default group and CUDA available, the default group on the current
        CUDA device (device-native: no gloo group, no host synchronization until values
        are read). Otherwise the logging gloo group on the CPU. The choice depends only
        on the backend, which every rank shares, so every rank picks the same one.

        Raises:
            DistributedLoggingError: creating the group failed or timed out, or the group was abandoned.
        """
        if self._device is None:
            self._device = select_reduction_device(torch_dist.get_backend(), torch.cuda.is_available())
        if self._device.type == 'cuda':
            return torch_dist.group.WORLD, self._device
        return self.group(), self._device

    def group(self) -> Any:
        """The logging gloo group; the first call creates it (a collective, bounded by the timeout).

        ``new_group`` reads and writes the store on the thread that calls it, so it runs on a
        helper thread while this one waits with a deadline.

        Raises:
            DistributedLoggingError: creating the group failed or timed out, or the group was abandoned.
        """
        with self._lock:
            self._check_usable('creating the logging gloo process group')
            if self._group is None:
                what = 'creating the logging gloo process group'
                line = self._get_line()
                if line:  # this rank's 'host pid' is in the store before the creation can complete anywhere
                    try:
                        line.call(lambda store: None, STORE_ANSWER_SECONDS)
                    except Exception:  # noqa: BLE001 - the creation's own deadline decides
                        pass
                self._arrive()
                outcome: dict[str, Any] = {}

                def create() -> None:
                    try:
                        outcome['group'] = torch_dist.new_group(backend='gloo', timeout=self._timedelta())
                    except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                        outcome['error'] = exc

                helper = threading.Thread(target=create, name='dist_logging-new-group', daemon=True)
                helper.start()
                self._poll(lambda: not helper.is_alive(), time.monotonic() + self.timeout, what)
                if 'error' in outcome:
                    raise self._failure(what, outcome['error']) from outcome['error']
                self._group = outcome['group']
                if line:  # every rank announced itself before the creation completed: read who runs where
                    line.submit(line.read_roster)
            return self._group

    # ------------------------------------------------------------------ the store, off this thread
    def arrive(self) -> None:
        """Note that this rank reached the next collective step (in memory; the line's beat carries it).

        Call it once before a batch of collectives issued with :meth:`start_all_reduce` /
        :meth:`start_gather`; the synchronous collectives below note their own arrival.

        Raises:
            DistributedLoggingError: the group is lent (see :meth:`lend`) and was not given back in time.
        """
        self._wait_if_lent('a logging collective')
        self._arrive()

    def lend(self, thread_ident: int) -> None:
        """Let the thread ``thread_ident`` issue the group's next collectives: until :meth:`give_back`,
        a collective (or :meth:`arrive`) called on any other thread first waits for the group to be given back.

        Collectives must come in the same order on every rank. Lend the group from the thread that
        otherwise issues them, at the same point of its sequence of collectives on every rank: the
        borrower's collectives then come, on every rank, between the same two of the lender's. A
        lend while the group is lent waits for it to be given back first.

        Raises:
            DistributedLoggingError: the group was lent and not given back within the timeout.
        """
        self._wait_if_lent('lending the logging group')
        self._lent_to = thread_ident
        self._given_back.clear()

    def give_back(self) -> None:
        """End a :meth:`lend` (the borrower calls it once its collectives were issued and completed)."""
        self._lent_to = None
        self._given_back.set()

    def _wait_if_lent(self, what: str) -> None:
        if self._given_back.is_set() or threading.get_ident() == self._lent_to:
            return
        deadline = time.monotonic() + self.timeout
        while not self._given_back.wait(0.05):  # in short waits, so that signals get through
            if time.monotonic() >= deadline:
                raise DistributedLoggingError(
                    f'{what}: the logging group was lent to another thread (the rank report) and not given back '
                    f'within {self.timeout:g} s'
                )

    def _arrive(self) -> None:
        self._sequence += 1
        line = self._get_line()
        if line:
            line.entered(self._id, self._sequence)

    def _get_line(self) -> Any:
        if self._line is None:
            try:
                from torch.distributed import distributed_c10d

                store = distributed_c10d._get_default_store()
                self._line = line_for(
                    store, get_global_rank(), torch_dist.get_world_size(), get_attempt(), beat_period(self.timeout)
                )
            except Exception:  # noqa: BLE001 - no store (no process group): nothing to name ranks with
                self._line = False
        return self._line

    def store_line(self) -> Optional[StoreLine]:
        """This process's line to the rendezvous store (see :mod:`dist_logging._world.watch`), None without a store.

        Telemetry publishes its heartbeats on the line's beats and reads them back through it.
        """
        return self._get_line() or None

    def _read(self, line: StoreLine) -> Read:
        return line.call(line.read_beats, STORE_ANSWER_SECONDS)

    def missing_ranks(self) -> Optional[list[int]]:
        """Ranks not known to have reached this rank's latest collective (None when the store does not tell).

        Reads every rank's beat (no collective; bounded by a couple of seconds).
        """
        line = self._get_line()
        if not line:
            return None
        try:
            _, beats, _ = self._read(line)
        except Exception:  # noqa: BLE001 - the store may be gone with the failed rank's host
            return None
        return [
            r
            for r in range(line.world_size)
            if r != line.rank and (r not in beats or beats[r].sequences.get(self._id, 0) < self._sequence)
        ]

    # ------------------------------------------------------------------ watching (the postmortem's hooks)
    def watch(self, tick: Callable[[], None], period: float) -> bool:
        """Call ``tick()`` on this process's watch thread (the store line) at least every ``period`` seconds.

        ``tick`` must return at once (start a thread for real work): it runs between the line's beats.
        The line's beat period is lowered to :func:`~dist_logging._world.watch.beat_period` of ``period``
        if that is shorter. No thread is added.

        Returns:
            False when there is no line (no process group, or no store): ``tick`` is never called.
        """
        line = self._get_line()
        if not line:
            return False
        wanted = beat_period(period)
        if wanted < line.period:
            line.period = wanted
            line.submit(lambda store: None)  # wake the thread: the next beat comes sooner
        line.ticks.append(tick)
        return True

    def unwatch(self, tick: Callable[[], None]) -> None:
        """Stop calling ``tick`` (no error if it was not watching)."""
        line = self._line
        if line and tick in line.ticks:
            line.ticks.remove(tick)

    def add_failure_listener(self, listener: Callable[[DistributedLoggingError], None]) -> None:
        """Call ``listener(error)`` (on the failing collective's thread; keep it short) when a collective of
        this group fails and the group is abandoned."""
        self._failure_listeners.append(listener)

    def roster(self) -> dict[int, tuple[str, int]]:
        """Global rank -> ``(host, pid)`` of the ranks this process has heard of through the store (may be partial;
        empty without a process group)."""
        line = self._line
        return dict(line.roster) if line else {}

    # ------------------------------------------------------------------ failures
    def _check_usable(self, what: str) -> None:
        if self._failed is not None:
            first = self._failed
            raise DistributedLoggingError(
                f'{what}: the logging group was abandoned after an earlier failure ({first}); end this process '
                '(see docs/gather.md)',
                left_ranks=first.left_ranks,
                unreachable_ranks=first.unreachable_ranks,
                late_ranks=first.late_ranks,
                hosts=first.hosts,
            )

    def _failure(self, what: str, exc: Optional[BaseException]) -> DistributedLoggingError:
        """Name who is missing after ``what`` failed (``exc``; None: it timed out), and abandon the group.

        Takes at most two store reads (:data:`~dist_logging._world.watch.STORE_ANSWER_SECONDS` each)
        1.5 beat periods apart beyond the deadline; one read when a peer closed its connection and
        ``/proc`` shows a rank on this host that ended (that rank is the cause, and the launcher is
        about to stop this process too).
        """
        text = str(exc) if exc is not None else ''
        cause = (
            text.splitlines()[0]
            if text
            else (type(exc).__name__ if exc is not None else f'timed out after {self.timeout:g} s')
        )
        line = self._get_line()
        if not line:
            error = DistributedLoggingError(
                f'{what}: not every rank arrived within {self.timeout:g} s, or one '
                f'failed; without a store this rank cannot tell which ({cause})'
            )
        else:
            if len(line.roster) < line.world_size:  # a failure in the first beat period: who runs where
                try:
                    line.call(line.read_roster, STORE_ANSWER_SECONDS)
                except Exception:  # noqa: BLE001 - the diagnosis says what the store did not tell
                    pass
            quick = bool(_CONNECTION_LOST.search(text)) and self._local_rank_ended(line)
            reads, problem = self._two_reads(line, quick)
            error = diagnose(
                line.rank, line.world_size, dict(line.roster), self._id, self._sequence, reads, problem
            ).error(what, cause)
        self._abandon(error)
        return error

    @staticmethod
    def _local_rank_ended(line: StoreLine) -> bool:
        """Whether a rank on this host has ended; looks again for up to a second (a process closes its
        sockets a moment before it shows as ended)."""
        local = [pid for rank, (host, pid) in list(line.roster.items()) if host == HOST and rank != line.rank]
        deadline = time.monotonic() + 1.0
        while local:
            if any(process_state(pid) is None for pid in local):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)  # the launcher notices the same exit within ~0.1 s and stops this process
        return False

    def _two_reads(self, line: StoreLine, quick: bool = False) -> tuple[Optional[tuple[Read, Read]], Optional[str]]:
        """Two beat reads at least 1.5 beat periods apart (one made during the wait counts); with
        ``quick``, one (``/proc`` told who left; the read says whether that rank had reached this
        collective, i.e. failed too and is not the cause, and who is behind; nobody is called silent)."""
        if quick:  # one read only: the launcher may be about to stop this process too (~0.1 s)
            try:
                read = self._read(line)
            except Exception:  # noqa: BLE001 - /proc's finding stands alone
                read = (time.monotonic(), {}, set())
            return (read, read), None
        try:
            reads = self._reads + [self._read(line)]
            spacing = 1.5 * line.period
            if reads[-1][0] - reads[0][0] < spacing:
                time.sleep(max(reads[0][0] + spacing - time.monotonic(), 0.0))  # a signal interrupts it
                reads.append(self._read(line))
            return (reads[0], reads[-1]), None
        except StoreUnreachable as exc:
            return None, str(exc)
        except Exception as exc:  # noqa: BLE001 - any store failure means the same here
            return None, f'{type(exc).__name__}: {exc}'

    def _abandon(self, error: DistributedLoggingError) -> None:
        """Refuse this group's later collectives; let gloo end what is in flight (its timeout is ours).

        The error is fatal for the process: at interpreter exit it ends in bounded time instead of
        waiting in torch's teardown for collectives that cannot complete (see ``_ending``)."""
        self._failed = error
        for listener in list(self._failure_listeners):
            try:
                listener(error)
            except Exception:  # noqa: BLE001 - the error is raised to the caller regardless
                pass
        note_fatal_error(error)
        group = self._group
        if group is not None:
            try:
                group.abort()  # a no-op for gloo in torch 2.13; NCCL/others stop their in-flight work
            except Exception:  # noqa: BLE001 - best effort
                pass

    # ------------------------------------------------------------------ waiting
    def _poll(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Wait until ``done()`` or raise at ``deadline``, sleeping in short steps (signals get through).

        Past :data:`WATCH_AFTER_SECONDS` (or half the timeout, if shorter) it reads the other
        ranks' beats twice and warns once, naming the ranks it waits for.
        """
        if done():
            return
        line = self._get_line()
        started = time.monotonic()
        watch_at = started + min(self.timeout / 2, WATCH_AFTER_SECONDS)
        self._reads, pending, warned, delay = [], None, False, 0.0
        if line:
            line.waiting += 1
        try:
            while not done():
                now = time.monotonic()
                if now >= deadline:
                    raise self._failure(what, None)
                if line and not warned and now >= watch_at:
                    pending, warned = self._watch(line, pending, what, now - started)
                time.sleep(delay)
                delay = min(delay * 2 or 0.00005, 0.005)
            self._reads = []  # this wait's reads say nothing about a later failure
        finally:
            if line:
                line.waiting -= 1

    def _watch(self, line: StoreLine, pending: Any, what: str, waited: float) -> tuple[Any, bool]:
        """One step of the long-wait check: queue a beat read, or take its answer; warn once."""
        if pending is not None:
            if not pending.done.is_set():
                return pending, False
            if pending.error is not None:
                return None, True  # the store does not answer now: the failure will say so
            self._reads.append(pending.result)
            pending = None
        if self._reads and self._reads[-1][0] - self._reads[0][0] >= 1.5 * line.period:
            found = diagnose(
                line.rank,
                line.world_size,
                dict(line.roster),
                self._id,
                self._sequence,
                (self._reads[0], self._reads[-1]),
            )
            if found.names_someone:
                warnings.warn(
                    f'{what}: still waiting after {waited:.0f} s: {found.describe()}; raising at '
                    f'{self.timeout:g} s (sync_timeout)',
                    RuntimeWarning,
                    stacklevel=5,
                )
            return None, True
        if not self._reads or time.monotonic() - self._reads[-1][0] >= 1.5 * line.period:
            pending = line.submit(line.read_beats)
        return pending, False

    def _wait_work(self, work: Any, deadline: float, what: str) -> None:
        try:
            done = work.get_future().done  # gloo, NCCL and torch's fake group all keep one
        except (AttributeError, RuntimeError):  # a backend without futures
            done = work.is_completed
        self._poll(done, deadline, what)
        work.wait()  # completed: returns, or raises the work's error

    # ------------------------------------------------------------------ collectives
    def _collective(self, what: str, issue: Callable[[], Any], wait: bool = False) -> Any:
        """Issue one collective (``issue()``), count it, and turn torch's failure into a named error.

        Args:
            what: what the collective is for (the error message starts with it).
            issue: issues the collective with ``async_op=True``; returns its Work.
            wait: wait for the Work within the timeout before returning.

        Returns:
            What ``issue`` returned (the Work).

        Raises:
            DistributedLoggingError: the collective failed or timed out (names the ranks when known).
        """
        self._check_usable(what)
        self._wait_if_lent(what)
        try:
            work = issue()
            if wait:
                self._wait_work(work, time.monotonic() + self.timeout, what)
            return work
        except DistributedLoggingError:
            raise
        except RuntimeError as exc:
            raise self._failure(what, exc) from exc
        finally:
            self.collective_count += 1

    def barrier(self, what: str) -> None:
        """Wait until every rank arrives, or raise naming the ranks that did not.

        An all_reduce of one number on the logging group (an interruptible, bounded wait).

        Raises:
            DistributedLoggingError: as :meth:`all_reduce`.
        """
        if not self.active:
            return
        self.all_reduce(torch.zeros(1), torch_dist.ReduceOp.SUM, what)

    def all_reduce(self, tensor: torch.Tensor, op: Any, what: str) -> torch.Tensor:
        """All-reduce a CPU tensor in place on the logging group and return it.

        Raises:
            DistributedLoggingError: a rank did not arrive within the timeout or failed (named).
        """
        if not self.active:
            return tensor
        group = self.group()
        self._arrive()
        self._collective(what, lambda: torch_dist.all_reduce(tensor, op=op, group=group, async_op=True), wait=True)
        return tensor

    def all_gather(self, tensor: torch.Tensor, what: str, group: Any = None) -> list[torch.Tensor]:
        """All-gather equal-shaped tensors; returns one tensor per rank.

        Every rank must pass a tensor of the same shape and dtype: gloo aborts the
        process (it does not raise) when the sizes differ.

        Args:
            group: the process group (default: the logging gloo group, CPU tensors); pass
                the group of :meth:`reduction_target` with tensors on its device.

        Raises:
            DistributedLoggingError: as :meth:`all_reduce`.
        """
        if not self.active:
            return [tensor]
        if group is None:
            group = self.group()
        outputs = _rows(tensor, torch_dist.get_world_size())
        self._arrive()
        self._collective(what, lambda: torch_dist.all_gather(outputs, tensor, group=group, async_op=True), wait=True)
        return outputs

    # ------------------------------------------------------------------ asynchronous collectives
    def start_all_reduce(self, tensor: torch.Tensor, op: Any, group: Any, what: str) -> Any:
        """Issue an all_reduce of ``tensor`` in place with ``async_op=True``; returns the Work.

        Nothing waits here: complete it with :meth:`wait_all`. Every rank must issue the
        same collectives, with tensors of the same size, in the same order.

        Raises:
            DistributedLoggingError: issuing failed, or the group was abandoned.
        """
        return self._collective(what, lambda: torch_dist.all_reduce(tensor, op=op, group=group, async_op=True))

    def start_gather(self, tensor: torch.Tensor, group: Any, what: str, dst: int = 0) -> tuple[Any, list[torch.Tensor]]:
        """Issue a gather of ``tensor`` to rank ``dst`` (``async_op=True``).

        Returns:
            ``(work, outputs)``: ``outputs`` holds one tensor per rank on ``dst`` (filled once
            the work completes) and is empty elsewhere.

        Raises:
            DistributedLoggingError: issuing failed, or the group was abandoned.
        """
        outputs = _rows(tensor, torch_dist.get_world_size()) if get_global_rank() == dst else []
        work = self._collective(
            what, lambda: torch_dist.gather(tensor, gather_list=outputs or None, dst=dst, group=group, async_op=True)
        )
        return work, outputs

    def wait_all(self, works: Sequence[Any], what: str, deadline: Optional[float] = None) -> None:
        """Wait for ``works`` until ``deadline`` (``time.monotonic()``; default: now + timeout).

        Raises:
            DistributedLoggingError: some work failed or did not finish in time; names the
                ranks that did not arrive, where they run and why, as far as this rank can tell.
        """
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        for work in works:
            try:
                self._wait_work(work, deadline, what)
            except DistributedLoggingError:
                raise
            except RuntimeError as exc:
                raise self._failure(what, exc) from exc

    def all_gather_bytes(
        self,
        payload: bytes,
        length: int,
        lengths: Optional[Sequence[int]],
        what: str,
        group: Any = None,
        device: Any = None,
    ) -> list[bytes]:
        """All-gather byte strings padded to a length every rank already knows (one collective).

        Args:
            payload: this rank's bytes.
            length: the padded length, identical on every rank (at least every payload's length).
            lengths: every rank's payload length, by rank; None to strip trailing NUL bytes
                instead (for payloads that never end with one, e.g. JSON text).
            group, device: see :meth:`all_gather` (default: the gloo group, CPU).

        Raises:
            DistributedLoggingError: as :meth:`all_reduce`.
        """
        if not self.active:
            return [payload]
        padded = torch.zeros(max(length, 1), dtype=torch.uint8)
        if payload:
            padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if device is not None and torch.device(device).type != 'cpu':
            padded = padded.to(device)
        rows = self.all_gather(padded, what, group)
        table = rows[0]._base if rows[0]._base is not None else torch.stack(rows)
        gathered = [row.tobytes() for row in table.cpu().numpy()]
        if lengths is None:
            return [g.rstrip(b'\0') for g in gathered]
        return [g[:n] for g, n in zip(gathered, lengths)]

    def all_gather_object(self, obj: Any, what: str) -> list[Any]:
        """All-gather picklable objects; returns one per rank.

        Implemented as two tensor all-gathers (sizes, then padded bytes) so the
        timeout applies, which ``torch.distributed.all_gather_object`` lacks.

        Raises:
            DistributedLoggingError: as :meth:`all_reduce`.
        """
        if not self.active:
            return [obj]
        import pickle

        payload = pickle.dumps(obj)
        sizes = [int(s.item()) for s in self.all_gather(torch.tensor([len(payload)], dtype=torch.int64), what)]
        gathered = self.all_gather_bytes(payload, max(sizes), sizes, what)
        return [pickle.loads(g) for g in gathered]

    def broadcast_object(self, obj: Any, what: str, src: int = 0) -> Any:
        """Return rank ``src``'s object on every rank.

        Raises:
            DistributedLoggingError: as :meth:`all_reduce`.
        """
        if not self.active:
            return obj
        return self.all_gather_object(obj if get_global_rank() == src else None, what)[src]

    def destroy(self) -> None:
        """Release the dedicated group. An abandoned group is only let go of: destroying it would
        wait for the work it still has in flight."""
        with self._lock:
            group, self._group = self._group, None
            self._device = None
            line, self._line = self._line, None
        if line:
            release(line)
        if group is not None and self._failed is None and is_initialized():
            try:
                torch_dist.destroy_process_group(group)
            except (RuntimeError, ValueError):
                pass
