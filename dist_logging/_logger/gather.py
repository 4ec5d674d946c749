"""Buffering of metrics logged with ``reduce=`` and their combination across ranks at flush.

Cost per flush, per rank: O(K) bytes and CPU for K reduced keys, whatever the world size N.

The collectives of one flush
----------------------------
Every rank holds the same *layout*: an ordered ``key -> reduce`` that only changes as a
deterministic function of collective results, so no rank ever has to decode another
rank's keys in the steady state. A flush packs what this rank buffered into, at most:

1. a SUM all_reduce of ``[sums | counts]`` over the layout's ``mean``/``sum`` keys
   (skipped when the layout has none);
2. a MAX all_reduce of ``[header | -header[:3] | steps | levels | extrema | nan flags]``:
   the header is ``(flush number, position, layout digest, new-key payload length,
   has data)``; the MAX of a value and of its negation gives every rank the largest and
   the smallest header, so a rank at another flush (it skipped one) or with another
   layout is detected by every rank. ``steps`` (largest step given, -inf for none) and
   ``levels`` (0: nobody logged the key) cover every key; ``extrema`` are the maxima of
   ``max`` keys and the negated minima of ``min`` keys (-inf: not logged), with a NaN
   flag beside each since MAX does not propagate NaN reliably;
3. a gather *to rank zero* of ``[value, count, step]`` per ``gather`` key (the only rank
   that emits them; skipped when the layout has none).

An idle flush with an empty layout is therefore one all_reduce of 8 floats.

New keys (or a key whose ``reduce`` changed) are not in the layout: a rank holding such
keys keeps their values and puts the length of a small JSON list of their names in the
header. When the MAX shows a non-zero length, every rank (and only then) spends one
all_gather of those padded name lists, extends the layout identically, and reduces the
held values with one more SUM/MAX/gather over the new keys alone. When the header shows
ranks at different flushes, one all_gather of the 3-number headers names them, and every
rank raises :class:`DistributedLoggingError`. Both slow paths cost O(N) and only run
when the key set changes or something is wrong.

Asynchronous flushes
--------------------
:meth:`MetricGatherer.start` issues the collectives with ``async_op=True`` from the
calling thread and returns; :meth:`MetricGatherer.complete` (at the next flush or at
close) waits for them -- at most until ``sync_timeout`` after they were issued -- and
returns their results, each with its own step. Collectives are issued in the same order
on every rank, and tensor sizes depend only on the layout, which only changes at a
completion that every rank performs at the same point of its sequence of flushes; so
the sizes always match (gloo aborts the process on a size mismatch).

Device-native reductions
------------------------
When the default process group is NCCL and CUDA is available, the same three
collectives run in the default group on the current CUDA device: CUDA tensors logged
with ``reduce=`` are stacked and scattered into the packed vectors on the device (no
``.item()``, no host synchronization), CPU numbers join them in one pinned host-to-device
copy, and the results come back in one asynchronous device-to-host copy whose event
:meth:`MetricGatherer.complete` waits for. Every other backend reduces on the CPU in
the Logger's gloo group.
"""

from __future__ import annotations

import collections
import json
import numbers
import time
import warnings
from typing import Any, Mapping, Optional

import numpy as np
import torch
import torch.distributed as torch_dist

from dist_logging import dist
from dist_logging._logger.gather_layout import (
    ACC,
    COUNT,
    HEADER,
    REDUCTIONS,
    SPEC,
    STEP,
    TENSORS,
    Layout,
    Results,
    as_table,
    combine,
    group_results,
    local_results,
    pack_flush,
    scatter_device_values,
    to_vector,
    unpack_values,
)
from dist_logging._logger.summaries import summarize_gathered
from dist_logging._values import check_metric_key, metric_scalar
from dist_logging.errors import DistributedLoggingError

__all__ = ['REDUCTIONS', 'MetricGatherer', 'FlushSchedule', 'IDLE_FLUSHES_BEFORE_DROP', 'MAX_FLUSH_GAP']


#: A key that no rank logged for this many consecutive flushes leaves the layout
#: (logging it again later costs the new-key slow path, once).
IDLE_FLUSHES_BEFORE_DROP = 100

#: The longest gap, in batches, between automatic flushes that found nothing to reduce.
MAX_FLUSH_GAP = 1024


class FlushSchedule:
    """When :meth:`Logger.batch_end` flushes: identical on every rank by construction.

    Automatic flushes happen at batch counts divisible by ``flush_every``. The decision
    depends only on the batch count and on results of completed flushes (which every
    rank receives identically): when a completed automatic flush found that no rank had
    anything buffered, the gap to the next one doubles (up to the largest
    ``flush_every * 2**j`` not above :data:`MAX_FLUSH_GAP`, or ``flush_every`` if that is
    larger), so automatic flushes stay on multiples of ``flush_every``; a flush that found
    data resets it. A flush's result is known when it completes, at the next checkpoint.

    Args:
        flush_every: a positive int.

    Raises:
        ValueError: ``flush_every`` is not a positive int.
    """

    def __init__(self, flush_every: int = 1):
        if isinstance(flush_every, bool) or not isinstance(flush_every, numbers.Integral) or flush_every < 1:
            raise ValueError(f'flush_every must be a positive int (batches between flushes), got {flush_every!r}')
        self.flush_every: int = int(flush_every)
        self.max_gap: int = self.flush_every
        while self.max_gap * 2 <= MAX_FLUSH_GAP:
            self.max_gap *= 2
        self.gap: int = self.flush_every
        self.last: int = 0  # batch count of the last automatic flush issued

    def is_checkpoint(self, batch: int) -> bool:
        """Whether ``batch`` is a point where the schedule may act (a multiple of ``flush_every``)."""
        return batch % self.flush_every == 0

    def due(self, batch: int) -> bool:
        """Whether an automatic flush is due at ``batch`` (a checkpoint)."""
        return batch >= self.last + self.gap

    def issued(self, batch: int) -> None:
        self.last = batch

    def record(self, had_data: Optional[bool], automatic: bool) -> None:
        """Adapt the gap to a completed flush's result (every rank passes the same values)."""
        if had_data is None:
            return
        if had_data:
            self.gap = self.flush_every
        elif automatic:
            self.gap = min(self.gap * 2, self.max_gap)


class _Flight:
    """One flush whose collectives were issued: what completing it needs."""

    __slots__ = (
        'seq',
        'position',
        'what',
        'layout',
        'header',
        'held',
        'payload',
        'works',
        'tensors',
        'gather_out',
        'host',
        'event',
        'deadline',
        'group',
        'device',
    )

    # Declared for type checkers (the values live in the slots above, set by MetricGatherer._issue).
    seq: int
    position: int
    what: str
    layout: Layout
    header: list[float]  # (flush number, position, layout digest, new-key payload length, has data)
    held: dict[str, list[Any]]  # buffered entries outside the layout
    payload: bytes  # JSON list of the held keys and their reduce
    works: list[Any]  # torch.distributed Work handles
    tensors: dict[str, torch.Tensor]
    gather_out: list[torch.Tensor]
    host: Optional[dict[str, Any]]  # device-to-host copies of the results (CUDA only)
    event: Any  # a torch.cuda.Event after the copies (CUDA only), else None
    deadline: float
    group: Any  # the process group the collectives run in
    device: torch.device


class MetricGatherer:
    """Buffers metrics logged with ``reduce=`` and combines them across ranks.

    :meth:`flush` combines synchronously; :meth:`start` issues a flush without waiting
    and :meth:`complete` finishes it. Both are collectives: every rank calls them at the
    same points, in the same order.

    Args:
        group: the Logger's :class:`~dist_logging.dist.LoggingGroup`.

    Attributes:
        last_had_data: whether the most recently completed flush found anything buffered
            on any rank (None before the first completion); identical on every rank.
        flushes_issued: how many flushes issued collectives (tests and benchmarks count them).
    """

    def __init__(self, group: dist.LoggingGroup):
        self._group = group
        # key -> [acc, count, step, (reduce, level), pending device tensors]
        self._buffer: dict[str, list[Any]] = {}
        self._layout = Layout({})
        self._idle = np.zeros(0, dtype=np.int64)
        self._seq = 0
        self._in_flight: Optional[_Flight] = None
        self._device: Optional[torch.device] = None  # where reductions run, once known
        # Whether tensors stay on their device until the reduction (the device-native path).
        self._keep_tensors = False
        self.last_had_data: Optional[bool] = None
        self.flushes_issued = 0
        # Above this many ranks, rank zero summarizes gathered keys (see _logger.summaries); the
        # per-rank values it took out wait in per_rank for the Logger.
        self.summarize_above: Optional[int] = None
        self.per_rank: dict[str, dict[int, tuple[float, float, float]]] = {}

    # ------------------------------------------------------------------ buffering (no collective)
    def add(self, metrics: Mapping[str, Any], step: Optional[int], reduce: str, level: int = 3) -> None:
        """Buffer ``metrics``; validates every key and value before buffering any.

        Raises:
            TypeError: a non-string key, a non-numeric value, or a non-integer step.
            ValueError: a multi-element tensor, or a key already buffered with another ``reduce``.
            RuntimeError: a world of more than one process without an initialized process group.
        """
        if not self._group.active and dist.get_world_size() > 1:
            raise RuntimeError(
                f'log_metrics(reduce={reduce!r}) combines values across ranks, but WORLD_SIZE is '
                f'{dist.get_world_size()} and torch.distributed is not initialized: call '
                'torch.distributed.init_process_group() first, or log with reduce=None'
            )
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise TypeError(f'step must be an int or None, got {type(step).__name__} {step!r}')
            step = int(step)
        buffer = self._buffer
        staged = []
        for key, value in metrics.items():
            if type(key) is not str or not key:
                check_metric_key(key)
            entry = buffer.get(key)
            if entry is not None and entry[SPEC][0] != reduce:
                raise ValueError(
                    f'metric {key!r} was logged with reduce={entry[SPEC][0]!r} since the last flush; '
                    f'it cannot also be reduced with {reduce!r} before the next flush'
                )
            kind = type(value)
            if kind is float or kind is int:
                value = float(value)
            elif isinstance(value, torch.Tensor) and value.device.type != 'cpu':
                # Kept on its device (no sync here); flush moves all of them to CPU in one copy per device.
                if value.numel() != 1:
                    metric_scalar(key, value)  # raises the standard message
                if value.is_complex():
                    raise TypeError(f'metric {key!r}: complex tensors are not supported')
                value = value.detach().reshape(())
            else:
                value = float(metric_scalar(key, value))
            staged.append((key, value, entry))
        spec = (reduce, level)
        for key, value, entry in staged:  # a mapping has no duplicate keys
            if entry is None:
                if type(value) is float:
                    buffer[key] = [value, 1, step, spec, None]
                else:
                    buffer[key] = [None, 0, step, spec, [value]]
                continue
            if step is not None and (entry[STEP] is None or step > entry[STEP]):
                entry[STEP] = step
            entry[SPEC] = spec
            if reduce == 'gather':  # only the latest value counts
                entry[ACC], entry[COUNT], entry[TENSORS] = None, 0, None
            if type(value) is float:
                entry[ACC] = value if entry[ACC] is None else combine(reduce, entry[ACC], value)
                entry[COUNT] += 1
            elif entry[TENSORS] is None:
                entry[TENSORS] = [value]
            else:
                entry[TENSORS].append(value)

    def pending_keys(self) -> list[str]:
        """The keys buffered since the last flush."""
        return list(self._buffer)

    def _materialize(self, buffered: dict[str, list[Any]]) -> None:
        """Fold device tensors into the accumulators: one stack + one copy per (device, dtype)."""
        groups: dict[tuple[Any, Any], list[tuple[list[Any], torch.Tensor]]] = collections.defaultdict(list)
        for entry in buffered.values():
            if entry[TENSORS]:
                for tensor in entry[TENSORS]:
                    groups[(tensor.device, tensor.dtype)].append((entry, tensor))
                entry[TENSORS] = None
        for items in groups.values():
            values = torch.stack([t for _, t in items]).to('cpu').to(torch.float64).tolist()
            for (entry, _), value in zip(items, values):
                entry[ACC] = value if entry[ACC] is None else combine(entry[SPEC][0], entry[ACC], value)
                entry[COUNT] += 1

    # ------------------------------------------------------------------ flushing (collectives)
    @property
    def in_flight(self) -> bool:
        """Whether a flush was issued by :meth:`start` and not completed yet."""
        return self._in_flight is not None

    def flush(self, position: int = 0) -> Results:
        """Complete any in-flight flush, then combine everything buffered, before returning.

        Args:
            position: where the caller is (the Logger's batch count); every rank must
                flush at the same position.

        Returns:
            ``(metrics, step, level)`` groups to emit, the in-flight flush's first. On
            ranks other than zero (which emit nothing) the list is empty.

        Raises:
            DistributedLoggingError: a rank did not arrive within the timeout, or ranks
                flushed at different positions (names the ranks and the step).
        """
        results = self.complete()
        buffered, self._buffer = self._buffer, {}
        if not self._group.active:
            self._materialize(buffered)
            self.last_had_data = bool(buffered)
            return results + local_results(buffered)
        flight = self._issue(buffered, position, self._layout)
        return results + self._finish(flight)

    def start(self, position: int = 0) -> Results:
        """Complete any in-flight flush, then issue this one without waiting for it.

        Returns:
            The completed in-flight flush's results (a world of one: this flush's).

        Raises:
            DistributedLoggingError: as :meth:`flush`, for the flush being completed.
        """
        results = self.complete()
        if not self._group.active:
            return results + self.flush(position)
        buffered, self._buffer = self._buffer, {}
        self._in_flight = self._issue(buffered, position, self._layout)
        return results

    def complete(self) -> Results:
        """Wait for the in-flight flush (until ``sync_timeout`` after it was issued) and return its results.

        Raises:
            DistributedLoggingError: a rank did not arrive in time, or ranks were at
                different flushes (names them).
        """
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return []
        return self._finish(flight)

    def _reduction_target(self) -> tuple[Any, torch.device]:
        # The group is looked up at every flush, never kept: see LoggingGroup.group().
        group, device = self._group.reduction_target()
        if self._device is None:
            self._device, self._keep_tensors = device, device.type != 'cpu'
        return group, device

    def _issue(
        self, buffered: dict[str, list[Any]], position: int, layout: Layout, seq: Optional[int] = None
    ) -> _Flight:
        """Pack ``buffered`` along ``layout`` and issue the flush's collectives (async)."""
        group, device = self._reduction_target()
        if not self._keep_tensors:
            self._materialize(buffered)
        if seq is None:
            self._seq += 1
            self.flushes_issued += 1
        flight = _Flight()
        flight.seq = self._seq if seq is None else seq
        flight.position, flight.layout, flight.group, flight.device = position, layout, group, device
        flight.what = f'flush at step {position} (flush #{flight.seq})'
        flight.held, flight.gather_out, flight.host, flight.event = {}, [], None, None
        K, S, E, G = len(layout.keys), layout.n_sum, layout.n_ext, layout.n_gather
        body, sums_counts, gathered, device_values = pack_flush(layout, buffered, flight.held)
        payload = b''
        if flight.held:
            payload = json.dumps(
                [[key, entry[SPEC][0]] for key, entry in flight.held.items()], separators=(',', ':')
            ).encode()
        flight.payload = payload
        header = [float(flight.seq), float(position), layout.digest, float(len(payload)), 1.0 if buffered else 0.0]
        flight.header = header
        header_mirrored = np.array(header + [-header[0], -header[1], -header[2]], dtype=np.float64)
        vectors = {'max': to_vector(np.concatenate([header_mirrored, body]), device)}
        if S:
            vectors['sum'] = to_vector(sums_counts, device)
        if G:
            vectors['gather'] = to_vector(gathered, device)
        if device_values:
            scatter_device_values(vectors, device_values, device, K, S, E)
        self._group.arrive()
        flight.deadline = time.monotonic() + self._group.timeout
        works = []
        # The same collectives in the same order on every rank (the layout decides which).
        if S:
            works.append(self._group.start_all_reduce(vectors['sum'], torch_dist.ReduceOp.SUM, group, flight.what))
        works.append(self._group.start_all_reduce(vectors['max'], torch_dist.ReduceOp.MAX, group, flight.what))
        if G:
            work, flight.gather_out = self._group.start_gather(vectors['gather'], group, flight.what)
            works.append(work)
        flight.works, flight.tensors = works, vectors
        if device.type == 'cuda':
            # Order a device-to-host copy of the results after the collectives on the current
            # stream (wait() without a timeout only makes the stream wait), and remember an
            # event: completing waits for that event, not for the training work queued since.
            for work in works:
                work.wait()
            host = {name: tensor.to('cpu', non_blocking=True) for name, tensor in vectors.items()}
            if flight.gather_out:
                host['gather_out'] = as_table(flight.gather_out).to('cpu', non_blocking=True)
            flight.host = host
            flight.event = torch.cuda.Event()
            flight.event.record()
        return flight

    def _wait(self, flight: _Flight) -> dict:
        """Wait for ``flight``'s collectives (and its device event) within its deadline; its host buffers.

        Raises:
            DistributedLoggingError: a rank did not arrive in time (the gatherer is reset first).
        """
        try:
            self._group.wait_all(flight.works, flight.what, flight.deadline)
            if flight.event is not None:
                _wait_event(flight.event, flight.deadline, flight.what, self._group)
        except DistributedLoggingError:
            self._reset()
            raise
        return flight.host if flight.host is not None else dict(flight.tensors, gather_out=flight.gather_out)

    def _finish(self, flight: _Flight) -> Results:
        """Wait for ``flight`` and turn its results into ``(metrics, step, level)`` groups."""
        host = self._wait(flight)
        layout = flight.layout
        K, S, E = len(layout.keys), layout.n_sum, layout.n_ext
        top = host['max'].tolist()
        header = top[:5]
        if top[:3] != [-x for x in top[5:8]]:
            self._identify(flight)  # raises
        self.last_had_data = top[4] > 0
        steps, levels = top[HEADER : HEADER + K], top[HEADER + K : HEADER + 2 * K]
        extrema = top[HEADER + 2 * K : HEADER + 2 * K + E]
        nans = top[HEADER + 2 * K + E :]
        sums = host['sum'].tolist() if S else []
        table = None
        if layout.n_gather and self._group.rank == 0:
            table = as_table(host['gather_out']).numpy()
        emit_rank = self._group.rank == 0
        values: dict[str, tuple[float, float, float]] = {}  # key -> (value, step, level)
        if emit_rank:
            values = unpack_values(layout, steps, levels, sums, extrema, nans, table)
        used = [level > 0 for level in levels]
        layout_dict = None
        if header[3] > 0:
            layout_dict, new_values, new_used = self._agree_new_keys(flight, int(header[3]), levels)
            for key in new_values.pop('__conflicts__', ()):
                values.pop(key, None)
            values.update(new_values)
            used_by_key = dict(zip(layout.keys, used))
            used_by_key.update(new_used)
        if (
            emit_rank
            and self.summarize_above is not None
            and values
            and self._group.active
            and torch_dist.get_world_size() > self.summarize_above
        ):
            gather_keys = [k for k, op in (layout_dict or layout.as_dict()).items() if op == 'gather']
            self.per_rank.update(summarize_gathered(values, gather_keys, torch_dist.get_world_size()))
        if layout_dict is not None:
            self._set_layout(layout_dict, used_by_key)
        else:
            self._age(used)
        return group_results(values) if emit_rank else []

    def _agree_new_keys(self, flight: _Flight, length: int, levels: list[float]):
        """The slow path: exchange the names of keys outside the layout, extend it, reduce the held values.

        Returns:
            ``(new layout as a dict, {key: (value, step, level)} for the new keys (with the
            conflicting keys under '__conflicts__'), {key: used})``.
        """
        layout = flight.layout
        blobs = self._group.all_gather_bytes(
            flight.payload,
            length,
            None,
            f'{flight.what}: agreeing on new keys',
            group=flight.group,
            device=flight.device,
        )
        # Ranks usually propose the same new keys: decode each distinct list once, in the order
        # of the first rank that sent it (a repeat adds nothing to the merge below).
        proposals = [json.loads(blob) for blob in dict.fromkeys(blobs) if blob]
        new_layout = layout.as_dict()
        first: dict[str, str] = {}
        conflicts: set[str] = set()
        for entries in proposals:  # rank order: identical on every rank
            for key, op in entries:
                if key in first:
                    if first[key] != op:
                        conflicts.add(key)
                    continue
                first[key] = op
                i = layout.index.get(key)
                if i is not None and levels[i] > 0:  # also logged with the layout's reduce in this flush
                    conflicts.add(key)
                new_layout[key] = op
        if conflicts and self._group.rank == 0:
            warnings.warn(
                f'metrics {sorted(conflicts)} were logged with different reduce= on different ranks '
                'in the same flush; they are dropped from this flush',
                RuntimeWarning,
                stacklevel=5,
            )
        sub_layout = Layout({key: op for key, op in first.items() if key not in conflicts})
        held = {
            key: entry for key, entry in flight.held.items() if key in sub_layout.index and entry[SPEC][0] == first[key]
        }
        sub = self._issue(held, flight.position, sub_layout, seq=flight.seq)
        sub.what = f'{flight.what}: reducing new keys'
        values = self._finish_sub(sub)
        values['__conflicts__'] = conflicts  # type: ignore[assignment]
        new_used = {key: True for key in first}
        return new_layout, values, new_used

    def _finish_sub(self, flight: _Flight) -> dict[str, tuple[float, float, float]]:
        host = self._wait(flight)
        if self._group.rank != 0:
            return {}
        layout = flight.layout
        K, S, E = len(layout.keys), layout.n_sum, layout.n_ext
        top = host['max'].tolist()
        table = None
        if layout.n_gather:
            table = as_table(host['gather_out']).numpy()
        return unpack_values(
            layout,
            top[HEADER : HEADER + K],
            top[HEADER + K : HEADER + 2 * K],
            host['sum'].tolist() if S else [],
            top[HEADER + 2 * K : HEADER + 2 * K + E],
            top[HEADER + 2 * K + E :],
            table,
        )

    def _identify(self, flight: _Flight) -> None:
        """Ranks are at different flushes or hold different layouts: name them (every rank raises)."""
        mine = to_vector(flight.header[:3], flight.device)
        try:
            rows = [
                row.tolist()
                for row in self._group.all_gather(mine, f'{flight.what}: naming the ranks that differ', flight.group)
            ]
        finally:
            self._reset()
        positions = [(int(position), int(seq)) for seq, position, _ in rows]
        if len(set(positions)) == 1:
            digests = [digest for _, _, digest in rows]
            counts = collections.Counter(digests)
            reference = max(counts, key=lambda d: (counts[d], -digests.index(d)))
            odd = [rank for rank, d in enumerate(digests) if d != reference]
            raise DistributedLoggingError(
                f'{flight.what}: ranks {odd} hold another metric layout than the others; was a Logger '
                're-created on some ranks only? The gather state was reset',
                odd,
            )
        counts = collections.Counter(positions)
        # The most common position is the flush in question (ties: the earliest); the other
        # ranks skipped it, or called an extra one.
        reference = min(counts, key=lambda p: (-counts[p], p))
        odd = [rank for rank, p in enumerate(positions) if p != reference]
        self._seq = max(s for _, s in positions)  # resynchronize identically on every rank
        detail = ', '.join(f'rank {r}: step {p} flush #{s}' for r, (p, s) in enumerate(positions))
        raise DistributedLoggingError(
            f'flush at step {reference[0]} (flush #{reference[1]}): ranks {odd} did not reach this flush '
            f'(they are at another one: {detail}); every rank must flush at the same points',
            odd,
        )

    def _reset(self) -> None:
        self._layout = Layout({})
        self._idle = np.zeros(0, dtype=np.int64)
        self._in_flight = None

    def _set_layout(self, layout: dict[str, str], used: Mapping[str, bool]) -> None:
        idle = dict(zip(self._layout.keys, self._idle.tolist()))
        counts = {key: 0 if used.get(key) else idle.get(key, 0) + 1 for key in layout}
        keep = {key: op for key, op in layout.items() if counts[key] < IDLE_FLUSHES_BEFORE_DROP}
        self._layout = Layout(keep)
        self._idle = np.array([counts[key] for key in keep], dtype=np.int64)

    def _age(self, used: list[bool]) -> None:
        """Count flushes without data per key; drop keys idle too long (identically on every rank)."""
        if not used:
            return
        self._idle = np.where(np.array(used, dtype=bool), 0, self._idle + 1)
        if self._idle.max() >= IDLE_FLUSHES_BEFORE_DROP:
            self._set_layout(self._layout.as_dict(), dict(zip(self._layout.keys, used)))


def _wait_event(event: Any, deadline: float, what: str, group: dist.LoggingGroup) -> None:
    """Wait for a CUDA event until ``deadline`` (polling: events have no timed wait)."""
    while not event.query():
        if time.monotonic() > deadline:
            raise group._failure(what, RuntimeError('timed out waiting for the device-to-host copy'))
        time.sleep(0.0002)
