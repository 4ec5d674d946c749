"""Per-rank progress and upload heartbeats, and node samples, through the rendezvous store (never a collective).

Every rank keeps, in memory, the last step it completed and the wall time ``batch_end`` returned
(two attribute writes on the training thread). The process's store line (the watch thread that
already beats in the store, see ``dist_logging.dist``) publishes them at each of its beats as
``<prefix>telemetry/rank/<rank>`` = ``'step wall host pending pending_bytes oldest_wall'``; the
local-zero rank of each node writes its latest node sample as ``<prefix>telemetry/node/<node>``
(JSON) when it takes it. Only rank zero reads them: the O(world) rank records at each scrape of
the endpoint, the O(nodes) node samples once per sample period, each read bounded by a short
deadline. A rank that stopped (SIGSTOP, a data loader stuck) stops publishing, so its
``wall`` stays behind and the age rank zero computes keeps rising, also while rank zero's
training thread waits for it in a collective (the store line and the endpoint run on threads
of their own).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, NamedTuple

__all__ = ['RankRecord', 'format_rank_record', 'parse_rank_record', 'RANK_KEY', 'NODE_KEY', 'StoreBoard']

#: The store key names under the line's prefix (``dist_logging/<attempt>/``), each followed by ``/<index>``.
RANK_KEY = 'telemetry/rank'
NODE_KEY = 'telemetry/node'


class RankRecord(NamedTuple):
    """One rank's latest progress and upload state.

    Attributes:
        step: the last batch count ``batch_end`` reached (0 before the first).
        wall: ``time.time()`` when ``batch_end`` last returned (the Logger's construction before).
        host: the rank's host.
        pending: uploads queued and not landed or failed yet.
        pending_bytes: their bytes (those whose size is known).
        oldest_wall: ``time.time()`` when the oldest of them was queued (0: none pending).
    """

    step: int
    wall: float
    host: str
    pending: int = 0
    pending_bytes: int = 0
    oldest_wall: float = 0.0


def format_rank_record(record: RankRecord) -> str:
    """The store value of ``record`` (host names hold no spaces)."""
    return (
        f'{record.step} {record.wall:.3f} {record.host} {record.pending} {record.pending_bytes} '
        f'{record.oldest_wall:.3f}'
    )


def parse_rank_record(text: str) -> RankRecord:
    """The inverse of :func:`format_rank_record`.

    Raises:
        ValueError: a malformed value.
    """
    step, wall, host, pending, pending_bytes, oldest = text.split(' ')
    return RankRecord(int(step), float(wall), host, int(pending), int(pending_bytes), float(oldest))


class StoreBoard:
    """One process's use of its store line for telemetry (publishing; reading on rank zero).

    Args:
        line: the process's store line (``LoggingGroup.store_line()``), or None in a world of one.
        rank: this process's global rank.
        world_size: the number of ranks.
        record: returns this rank's current :class:`RankRecord` (called on the line's thread).
    """

    #: The longest a read for a scrape waits for the store (Prometheus' scrape timeout is often 1 s).
    READ_SECONDS = 0.5

    def __init__(self, line: Any, rank: int, world_size: int, record: Callable[[], RankRecord]):
        self.line, self.rank, self.world_size = line, rank, world_size
        self._record = record
        self._cache: dict[int, RankRecord] = {}
        self.read_failures = 0
        if line is not None:
            line.add_publisher(RANK_KEY, lambda: format_rank_record(self._record()))

    def close(self) -> None:
        """Stop publishing (the line outlives this board when another Logger uses it)."""
        if self.line is not None:
            self.line.remove_publisher(RANK_KEY)

    def publish_node(self, node: int, sample: dict[str, Any], host: str, wall: float) -> None:
        """Queue the write of a node sample (returns at once; the line's thread writes it)."""
        if self.line is None:
            return
        key = f'{self.line.prefix}{NODE_KEY}/{node}'
        value = json.dumps({'host': host, 'wall': wall, 'metrics': sample}, separators=(',', ':'))
        self.line.submit(lambda store: store.set(key, value))

    def read_nodes(self, num_nodes: int, timeout: float = 2.0) -> list[dict[str, Any]]:
        """(Rank zero, off the training thread.) The latest sample of every node that published one.

        Raises:
            dist_logging's StoreUnreachable (a RuntimeError): the store did not answer within ``timeout``.
        """
        if self.line is None or num_nodes < 1:
            return []
        keys = [f'{self.line.prefix}{NODE_KEY}/{n}' for n in range(num_nodes)]
        values = self.line.call(lambda store: self.line.read_values(store, keys), timeout)
        return [json.loads(value) for value in values if value is not None]

    def read_ranks(self) -> tuple[dict[int, RankRecord], bool]:
        """(Rank zero, at a scrape.) Every other rank's latest record, and whether the store answered in time.

        On no answer within :attr:`READ_SECONDS` the records of the last read are returned
        (their walls are then older, never newer, than the truth: ages only rise).
        """
        if self.line is None or self.world_size <= 1:
            return {}, True
        keys = [f'{self.line.prefix}{RANK_KEY}/{r}' for r in range(self.world_size) if r != self.rank]
        try:
            values = self.line.call(lambda store: self.line.read_values(store, keys), self.READ_SECONDS)
        except Exception:  # noqa: BLE001 - the store is slow or gone: the last known records
            self.read_failures += 1
            return dict(self._cache), False
        ranks = [r for r in range(self.world_size) if r != self.rank]
        for rank, value in zip(ranks, values):
            if value is not None:
                try:
                    self._cache[rank] = parse_rank_record(value.decode())
                except ValueError:
                    pass
        return dict(self._cache), True


def now() -> float:
    """The wall clock the records use."""
    return time.time()
