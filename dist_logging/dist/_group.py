"""The logging group: the Logger's own collectives, each with a deadline, naming who did not arrive."""

from __future__ import annotations

import atexit
import datetime
import itertools
import os
import re
import socket
import threading
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as torch_dist

from dist_logging.dist._facts import get_global_rank, is_initialized, select_reduction_device
from dist_logging.errors import DistributedLoggingError

__all__ = ['LoggingGroup']


def _rows(tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """``world_size`` output tensors shaped like ``tensor``: rows of one allocation (one
    allocation instead of N; ``torch.stack(rows)`` of the result is a view-free copy, and
    ``rows[0]._base`` is the whole table)."""
    table = torch.empty((world_size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    return list(table.unbind(0))


_GROUP_INSTANCES = itertools.count()
_DEFAULT_GROUP = object()  # LoggingGroup._group when the default group is used: looked up, never held
_LIVE_GROUPS: 'weakref.WeakSet[LoggingGroup]' = weakref.WeakSet()


_PROC_PREFIX = 'dist_logging/proc/'  # rank -> 'host pid', set once per process (see LoggingGroup._announce)
_ANNOUNCED: set[int] = set()
_HOST = socket.gethostname()
_ROLL_CALL_SECONDS = 5.0
# How gloo, NCCL and TCP report a peer that went away.
_CONNECTION_LOST = re.compile(
    r'Connection (reset|closed) by peer|Broken pipe|remote process exited|Socket closed|connection closed', re.I)


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie, ended but not yet reaped by its launcher, has ended)."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as handle:
            state = handle.read().rsplit(b')', 1)[1].split()[0]
        return state not in (b'Z', b'X')
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@atexit.register
def _release_process_groups() -> None:
    """At interpreter exit, drop our references to the dedicated groups and stores of Loggers
    never closed (no torch call: nothing here may block at exit).

    atexit runs while the interpreter is whole; a process group's C++ object freed later,
    during finalization, takes the process down with SIGABRT.
    """
    for group in list(_LIVE_GROUPS):
        with group._lock:
            group._group = group._store = None


class LoggingGroup:
    """The Logger's own collectives: a lazily created gloo group over CPU tensors.

    All methods are collectives: every rank must call them in the same order.
    With a world of one (or no process group) they return at once without
    communicating. The group is created on first use; its creation is itself a
    collective and obeys the same timeout.

    Naming the ranks that did not arrive: before each collective, a rank writes the
    collective's sequence number under its own key in the rendezvous store (a
    one-way ``set``: a few microseconds, no round trip, not a collective). When a
    collective fails or times out, the ranks that did arrive read those keys and
    name the ranks whose number differs. The steady state therefore still costs
    exactly one collective per call; the store is only read on failure.

    Args:
        timeout: Seconds each collective may wait for the slowest rank before
            raising :class:`DistributedLoggingError`.

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
        self._prefix = f'dist_logging/group{next(_GROUP_INSTANCES)}/arrived/'
        self._sequence = 0
        self._store: Any = None
        self._device: Optional[torch.device] = None
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
        on the backend, which every rank shares, so every rank picks the same one; it is
        made once, the group is looked up at each call (see :meth:`group`).
        """
        if self._device is None:
            self._device = select_reduction_device(torch_dist.get_backend(), torch.cuda.is_available())
        if self._device.type == 'cuda':
            return torch_dist.group.WORLD, self._device
        return self.group(), self._device

    def group(self) -> Any:
        """The logging gloo group; the first call creates it (a collective).

        When the default group already is gloo it is used (a second one would only cost
        ports and threads; our own ``Work.wait(timeout)`` bounds each call), and it is
        looked up at every call rather than held: a reference kept after the user's
        ``destroy_process_group()`` leaves gloo's threads to be torn down at interpreter
        exit, which aborts the process ("terminate called without an active exception").
        """
        with self._lock:
            if self._group is None:
                what = 'creating the logging gloo process group'
                self._announce()
                self._arrive()
                try:
                    if torch_dist.get_backend() == 'gloo':
                        self._group = _DEFAULT_GROUP
                    else:
                        self._group = torch_dist.new_group(backend='gloo', timeout=self._timedelta())
                except RuntimeError as exc:
                    raise self._failure(what, exc) from exc
            return torch_dist.group.WORLD if self._group is _DEFAULT_GROUP else self._group

    # ------------------------------------------------------------------ arrival marks
    def arrive(self) -> None:
        """Mark (in the rendezvous store) that this rank reached the next collective step.

        Call it once before a batch of collectives issued with :meth:`start_all_reduce` /
        :meth:`start_gather`; the synchronous collectives below mark their own arrival.
        """
        self._arrive()

    def _get_store(self) -> Any:
        if self._store is None:
            try:
                from torch.distributed import distributed_c10d

                self._store = distributed_c10d._get_default_store()
            except Exception:  # noqa: BLE001 - diagnostics are best effort
                self._store = False
        return self._store

    def _arrive(self) -> None:
        """Record in the store that this rank reached collective number ``_sequence + 1``."""
        self._sequence += 1
        store = self._get_store()
        if store:
            try:
                store.set(f'{self._prefix}{get_global_rank()}', str(self._sequence))
            except Exception:  # noqa: BLE001 - a store hiccup must not fail logging
                pass

    def missing_ranks(self) -> Optional[list[int]]:
        """Ranks that have not reached this rank's latest collective (None when unknown).

        Reads every rank's arrival mark from the rendezvous store (no collective).
        """
        store = self._get_store()
        if not store:
            return None
        missing = []
        try:
            for rank in range(torch_dist.get_world_size()):
                key = f'{self._prefix}{rank}'
                if not store.check([key]) or int(store.get(key)) != self._sequence:
                    missing.append(rank)
        except Exception:  # noqa: BLE001 - the store may be gone with the failed rank's host
            return None
        return missing

    # ------------------------------------------------------------------ who left
    def _announce(self) -> None:
        """Write ``host pid`` under this rank's key once per process and store (one ``set``), so that a
        failed collective can tell which ranks' processes have ended."""
        store = self._get_store()
        if not store or id(store) in _ANNOUNCED:
            return
        try:
            store.set(f'{_PROC_PREFIX}{get_global_rank()}', f'{_HOST} {os.getpid()}')
            _ANNOUNCED.add(id(store))
        except Exception:  # noqa: BLE001 - diagnostics only
            pass

    def departed_ranks(self, connection_lost: bool = False) -> tuple[list[int], list[int], dict[int, str]]:
        """After a failed collective: ``(left, silent, where)``.

        ``left``: ranks on this host whose process has ended (checked in ``/proc``: exact, immediate).
        ``silent``: only when ``connection_lost``, ranks on other hosts that did not answer a roll
        call in the store within a few seconds (the survivors of the same failure all answer).
        ``where``: rank -> ``'host pid'`` as the ranks announced themselves. Reads one key per rank
        from the store (on failure only); never raises.
        """
        store = self._get_store()
        if not store:
            return [], [], {}
        me, world = get_global_rank(), torch_dist.get_world_size()
        import time

        where: dict[int, str] = {}
        local: dict[int, int] = {}
        remote: list[int] = []
        try:
            for rank in range(world):
                key = f'{_PROC_PREFIX}{rank}'
                if rank == me or not store.check([key]):
                    continue
                where[rank] = store.get(key).decode()
                host, _, pid = where[rank].partition(' ')
                if host != _HOST:
                    remote.append(rank)
                else:
                    local[rank] = int(pid)
        except Exception:  # noqa: BLE001 - the store may have gone with the failed host
            pass
        left = [rank for rank, pid in local.items() if not _process_alive(pid)]
        # A closed connection comes from a process that is exiting: the kernel closes its sockets a
        # moment before the process shows as ended. Look again, briefly.
        deadline = time.monotonic() + 1.0
        while connection_lost and local and not left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [rank for rank, pid in local.items() if not _process_alive(pid)]
        silent: list[int] = []
        if connection_lost and remote:
            silent = self._roll_call(store, remote)
        return left, silent, where

    def _roll_call(self, store: Any, ranks: list[int]) -> list[int]:
        """Answer and wait (at most ``_ROLL_CALL_SECONDS``) for ``ranks`` to answer too; the silent ones."""
        import time

        prefix = f'{self._prefix}rollcall{self._sequence}/'
        try:
            store.set(f'{prefix}{get_global_rank()}', '1')
            deadline = time.monotonic() + min(_ROLL_CALL_SECONDS, self.timeout)
            pending = list(ranks)
            while pending and time.monotonic() < deadline:
                pending = [r for r in pending if not store.check([f'{prefix}{r}'])]
                if pending:
                    time.sleep(0.1)
            return pending
        except Exception:  # noqa: BLE001
            return []

    def _failure(self, what: str, exc: BaseException) -> DistributedLoggingError:
        text = str(exc)
        first = text.splitlines()[0] if text else type(exc).__name__
        connection_lost = bool(_CONNECTION_LOST.search(text))
        left, silent, where = self.departed_ranks(connection_lost)
        if left:
            # A rank that reached this collective and ended afterwards (e.g. it timed out first and exited)
            # is not the cause: keep the ranks that never arrived, when the arrival marks tell.
            missing = self.missing_ranks()
            if missing is not None:
                arrived_then_ended = [rank for rank in left if rank not in missing]
                if len(arrived_then_ended) < len(left) or not connection_lost:
                    left = [rank for rank in left if rank in missing]
        if left or silent:
            parts = []
            if left:
                parts.append(f'rank(s) {left} left the job (their process ended: '
                             + ', '.join(f'rank {r}: pid {where[r].split(" ")[1]} on {where[r].split(" ")[0]}'
                                         for r in left) + ')')
            if silent:
                parts.append(f'rank(s) {silent} on other hosts did not answer within {_ROLL_CALL_SECONDS:g} s '
                             'after the connection closed (they left, or hang)')
            cause = 'a peer closed its connection' if connection_lost else 'the collective failed'
            return DistributedLoggingError(f'{what}: {"; ".join(parts)}; {cause} ({first})',
                                           missing_ranks=silent, left_ranks=left)
        if connection_lost:
            return DistributedLoggingError(f'{what}: a peer closed its connection: a rank left or failed (none '
                                           f'of the ranks this one can check has ended) ({first})')
        error = DistributedLoggingError.from_runtime_error(what, exc, self.timeout)
        if not error.missing_ranks:
            missing = self.missing_ranks()
            if missing:
                error = DistributedLoggingError(
                    f'{what}: ranks {missing} did not reach it within {self.timeout:g} s, or failed ({first})',
                    missing)
        return error

    # ------------------------------------------------------------------ collectives
    def _collective(self, what: str, issue: Callable[[], Any], wait: bool = False) -> Any:
        """Issue one collective (``issue()``), count it, and turn torch's failure into a named error.

        Args:
            what: what the collective is for (the error message starts with it).
            issue: issues the collective; returns its Work (or None for a blocking one).
            wait: wait for the Work within the timeout before returning.

        Returns:
            What ``issue`` returned (the Work of an asynchronous collective).

        Raises:
            DistributedLoggingError: the collective failed or timed out (names the ranks when known).
        """
        try:
            work = issue()
            if wait:
                self._wait(work, what)
            return work
        except DistributedLoggingError:
            raise
        except RuntimeError as exc:
            raise self._failure(what, exc) from exc
        finally:
            self.collective_count += 1

    def barrier(self, what: str) -> None:
        """Wait until every rank arrives, or raise naming the ranks that did not.

        Uses ``monitored_barrier`` on the gloo group, which reports the ranks that
        failed to arrive within the timeout.
        """
        if not self.active:
            return
        group = self.group()
        self._arrive()
        self._collective(what, lambda: torch_dist.monitored_barrier(group=group, timeout=self._timedelta(),
                                                                    wait_all_ranks=True))

    def all_reduce(self, tensor: torch.Tensor, op: Any, what: str) -> torch.Tensor:
        """All-reduce a CPU tensor in place on the logging group and return it."""
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
        """
        return self._collective(what, lambda: torch_dist.all_reduce(tensor, op=op, group=group, async_op=True))

    def start_gather(self, tensor: torch.Tensor, group: Any, what: str, dst: int = 0) -> tuple[Any, list[torch.Tensor]]:
        """Issue a gather of ``tensor`` to rank ``dst`` (``async_op=True``).

        Returns:
            ``(work, outputs)``: ``outputs`` holds one tensor per rank on ``dst`` (filled once
            the work completes) and is empty elsewhere.
        """
        outputs = _rows(tensor, torch_dist.get_world_size()) if get_global_rank() == dst else []
        work = self._collective(what, lambda: torch_dist.gather(tensor, gather_list=outputs or None, dst=dst,
                                                                group=group, async_op=True))
        return work, outputs

    def wait_all(self, works: Sequence[Any], what: str, deadline: Optional[float] = None) -> None:
        """Wait for ``works`` until ``deadline`` (``time.monotonic()``; default: now + timeout).

        Raises:
            DistributedLoggingError: some work failed or did not finish in time; names the
                ranks that did not arrive when the store says which.
        """
        import time

        if deadline is None:
            deadline = time.monotonic() + self.timeout
        for work in works:
            # timedelta(0) would mean "no timeout" to c10d: always pass at least a millisecond.
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                finished = work.wait(timeout=datetime.timedelta(seconds=remaining))
            except RuntimeError as exc:
                raise self._failure(what, exc) from exc
            if finished is False:
                raise self._failure(what, RuntimeError('timed out'))

    def all_gather_bytes(self, payload: bytes, length: int, lengths: Optional[Sequence[int]], what: str,
                         group: Any = None, device: Any = None) -> list[bytes]:
        """All-gather byte strings padded to a length every rank already knows (one collective).

        Args:
            payload: this rank's bytes.
            length: the padded length, identical on every rank (at least every payload's length).
            lengths: every rank's payload length, by rank; None to strip trailing NUL bytes
                instead (for payloads that never end with one, e.g. JSON text).
            group, device: see :meth:`all_gather` (default: the gloo group, CPU).
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
        """
        if not self.active:
            return [obj]
        import pickle

        payload = pickle.dumps(obj)
        sizes = [int(s.item()) for s in self.all_gather(torch.tensor([len(payload)], dtype=torch.int64), what)]
        gathered = self.all_gather_bytes(payload, max(sizes), sizes, what)
        return [pickle.loads(g) for g in gathered]

    def broadcast_object(self, obj: Any, what: str, src: int = 0) -> Any:
        """Return rank ``src``'s object on every rank."""
        if not self.active:
            return obj
        return self.all_gather_object(obj if get_global_rank() == src else None, what)[src]

    def _wait(self, work: Any, what: str) -> None:
        try:
            finished = work.wait(timeout=self._timedelta())
        except RuntimeError as exc:
            raise self._failure(what, exc) from exc
        if finished is False:
            raise self._failure(what, RuntimeError('timed out'))

    def destroy(self) -> None:
        """Release the dedicated group (not the default group)."""
        with self._lock:
            group, self._group = self._group, None
            self._device = None
            self._store = None
        if group is not None and group is not _DEFAULT_GROUP and is_initialized():
            try:
                torch_dist.destroy_process_group(group)
            except (RuntimeError, ValueError):
                pass
