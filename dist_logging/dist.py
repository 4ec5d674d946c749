"""Rank and world facts, and the one place that issues collectives.

Every function here works without a process group. Rank facts come from
``torch.distributed`` when a default process group is initialized, otherwise
from the environment torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``), otherwise they describe a
single process (rank 0 of a world of 1).

Collectives used by the Logger (gathering metrics, agreeing on the run name,
checking hyperparameters) run on a dedicated gloo group over CPU tensors that is
created lazily, so logging never enqueues work on the training group (e.g.
NCCL) or its GPU stream. Each collective has a timeout; when some rank does not
arrive the others raise :class:`~dist_logging.errors.DistributedLoggingError`
naming the missing ranks instead of blocking forever.
"""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import torch
import torch.distributed as torch_dist

from dist_logging.errors import DistributedLoggingError

__all__ = [
    'get_global_rank',
    'get_local_rank',
    'get_world_size',
    'get_local_world_size',
    'get_node_rank',
    'is_initialized',
    'is_available',
    'LoggingGroup',
]


def is_available() -> bool:
    """Whether ``torch.distributed`` is compiled into this torch build."""
    return torch_dist.is_available()


def is_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def _env_int(*names: str, default: int) -> int:
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw == '':
            continue
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f'environment variable {name}={raw!r} is not an integer') from None
    return default


def get_global_rank() -> int:
    """The rank of this process in the whole job (0 when not distributed)."""
    if is_initialized():
        return torch_dist.get_rank()
    return _env_int('RANK', default=0)


def get_world_size() -> int:
    """The number of processes in the whole job (1 when not distributed)."""
    if is_initialized():
        return torch_dist.get_world_size()
    return _env_int('WORLD_SIZE', default=1)


def get_local_rank() -> int:
    """The rank of this process on its node (0 when not distributed)."""
    return _env_int('LOCAL_RANK', default=0)


def get_local_world_size() -> int:
    """The number of processes on this node (1 when not distributed)."""
    return _env_int('LOCAL_WORLD_SIZE', default=1)


def get_node_rank() -> int:
    """The index of this node (0 when not distributed).

    torchrun exports ``GROUP_RANK``; other launchers often export ``NODE_RANK``.
    Without either, it is derived from the global rank and the local world size.
    """
    explicit = _env_int('GROUP_RANK', 'NODE_RANK', default=-1)
    if explicit >= 0:
        return explicit
    return get_global_rank() // max(get_local_world_size(), 1)


def get_num_nodes() -> int:
    """The number of nodes, assuming every node runs the same number of ranks."""
    return max(get_world_size() // max(get_local_world_size(), 1), 1)


class LoggingGroup:
    """The Logger's own collectives: a lazily created gloo group over CPU tensors.

    All methods are collectives: every rank must call them in the same order.
    With a world of one (or no process group) they return at once without
    communicating. The group is created on first use; its creation is itself a
    collective and obeys the same timeout.

    Args:
        timeout: Seconds each collective may wait for the slowest rank before
            raising :class:`DistributedLoggingError`.
    """

    def __init__(self, timeout: float = 300.0):
        if not timeout > 0:
            raise ValueError(f'sync_timeout must be a positive number of seconds, got {timeout!r}')
        self.timeout = float(timeout)
        self._group: Any = None
        self._lock = threading.Lock()
        self.collective_count = 0  # counted so tests can prove "one collective per flush"

    @property
    def active(self) -> bool:
        """Whether collectives really communicate (an initialized world of more than one)."""
        return is_initialized() and torch_dist.get_world_size() > 1

    def _timedelta(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def group(self) -> Any:
        """The dedicated gloo group, created on first call (a collective)."""
        with self._lock:
            if self._group is None:
                try:
                    if torch_dist.get_backend() == 'gloo':
                        # The default group already is gloo on CPU; a second one would only
                        # cost ports and threads.
                        self._group = torch_dist.group.WORLD
                    else:
                        self._group = torch_dist.new_group(backend='gloo', timeout=self._timedelta())
                except RuntimeError as exc:
                    raise DistributedLoggingError(
                        f'could not create the logging gloo process group: {exc}', missing_ranks=()
                    ) from exc
            return self._group

    def barrier(self, what: str) -> None:
        """Wait until every rank arrives, or raise naming the ranks that did not.

        Uses ``monitored_barrier`` on the gloo group, which reports the ranks that
        failed to arrive within the timeout.
        """
        if not self.active:
            return
        group = self.group()
        try:
            torch_dist.monitored_barrier(group=group, timeout=self._timedelta(), wait_all_ranks=True)
        except RuntimeError as exc:
            raise DistributedLoggingError.from_runtime_error(what, exc, self.timeout) from exc
        self.collective_count += 1

    def all_reduce(self, tensor: torch.Tensor, op: Any, what: str) -> torch.Tensor:
        """All-reduce a CPU tensor in place on the logging group and return it."""
        if not self.active:
            return tensor
        group = self.group()
        try:
            work = torch_dist.all_reduce(tensor, op=op, group=group, async_op=True)
            self._wait(work, what)
        finally:
            self.collective_count += 1
        return tensor

    def all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """All-gather equal-shaped CPU tensors; returns one tensor per rank."""
        if not self.active:
            return [tensor]
        group = self.group()
        outputs = [torch.empty_like(tensor) for _ in range(torch_dist.get_world_size())]
        try:
            work = torch_dist.all_gather(outputs, tensor, group=group, async_op=True)
            self._wait(work, what)
        finally:
            self.collective_count += 1
        return outputs

    def all_gather_object(self, obj: Any, what: str) -> list[Any]:
        """All-gather picklable objects; returns one per rank.

        Implemented as two tensor all-gathers (sizes, then padded bytes) so the
        timeout applies, which ``torch.distributed.all_gather_object`` lacks.
        """
        if not self.active:
            return [obj]
        import pickle

        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.all_gather(torch.tensor([payload.numel()], dtype=torch.int64), what)
        longest = int(max(int(s.item()) for s in sizes))
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: payload.numel()] = payload
        gathered = self.all_gather(padded, what)
        return [pickle.loads(g[: int(s.item())].numpy().tobytes()) for g, s in zip(gathered, sizes)]

    def broadcast_object(self, obj: Any, what: str, src: int = 0) -> Any:
        """Return rank ``src``'s object on every rank."""
        if not self.active:
            return obj
        return self.all_gather_object(obj if get_global_rank() == src else None, what)[src]

    def _wait(self, work: Any, what: str) -> None:
        try:
            finished = work.wait(timeout=self._timedelta())
        except RuntimeError as exc:
            raise DistributedLoggingError.from_runtime_error(what, exc, self.timeout) from exc
        if finished is False:
            raise DistributedLoggingError(
                f'{what}: not every rank arrived within {self.timeout:g} s', missing_ranks=()
            )

    def destroy(self) -> None:
        """Release the dedicated group (not the default group)."""
        with self._lock:
            group, self._group = self._group, None
        if group is not None and is_initialized() and group is not torch_dist.group.WORLD:
            try:
                torch_dist.destroy_process_group(group)
            except (RuntimeError, ValueError):
                pass

