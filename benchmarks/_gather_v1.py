"""The previous MetricGatherer design (one all_gather per flush), kept for side-by-side benchmarks.

This is dist_logging's own ``_gather.py`` as of commit 39f0261, before issue 11 replaced it:
every flush all-gathers (4 + 3K) float64 per rank, so each rank receives and unpacks
N x (4 + 3K) values. ``benchmarks/gather_cost.py --design old|both`` drives it directly
(not through the Logger) next to the current design. Not used by the package.

Buffering of metrics logged with ``reduce=`` and their combination across ranks at flush.

The packed collective
---------------------
:meth:`MetricGatherer.flush` issues ONE ``all_gather`` of a float64 CPU tensor laid
out as::

    [seq, position, layout digest, extras length | acc_0, count_0, step_0 | acc_1, ... ]

over the key *layout*: an ordered list of ``key -> (reduce, level)`` that every rank
holds identically, because it only ever changes as a deterministic function of data
every rank has gathered. Per key, ``acc`` is this rank's local combination of the
values it logged since the last flush (their sum for ``mean``/``sum``, their min or
max, the last one for ``gather``), ``count`` how many it logged (0 if none: the key
is then reduced over the ranks that did log it) and ``step`` the largest step given
(NaN for none).

Why an all_gather and not an all_reduce: mean/sum need SUM, min/max need MIN/MAX and
``gather`` needs every rank's value; an all_reduce would need three collectives (or
lossy tricks), while one all_gather of a few floats per key and rank carries all of it
exactly, and rank order makes the float sums deterministic. At 100 keys and 4 ranks
that is under 10 KB, so the collective is latency-bound like a 100-element all_reduce.

Agreeing on the key set costs nothing in the steady state: a rank whose buffered keys
all fit the layout sends extras length 0. A rank with keys outside the layout (a new
key, or a key whose ``reduce`` changed) puts their values in a small JSON payload and
its length in the header; since every rank sees every header, they all then spend
exactly one more collective (an all_gather of the padded payloads), add the new keys
to the layout in the same order, and reduce them together with the packed ones.
Keys nobody logged for :data:`IDLE_FLUSHES_BEFORE_DROP` flushes leave the layout
(again deterministically), so it does not grow forever.

The header also carries a flush sequence number and the caller's position (the
Logger's batch count). A rank that skipped a flush pairs its next flush with the
others' current one; the positions then differ and every rank raises
:class:`DistributedLoggingError` naming the odd ranks, instead of mixing steps.
Checking this before any second collective keeps all ranks issuing collectives of
equal sizes in the same order: gloo aborts the process on mismatched sizes.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import numbers
import warnings
from typing import Any, Mapping, Optional

import numpy as np
import torch

from dist_logging import dist
from dist_logging._values import check_metric_key, metric_scalar
from dist_logging.errors import DistributedLoggingError

__all__ = ['REDUCTIONS', 'MetricGatherer', 'IDLE_FLUSHES_BEFORE_DROP']

REDUCTIONS = ('mean', 'sum', 'min', 'max', 'gather')

#: A key that no rank logged for this many consecutive flushes leaves the packed layout
#: (logging it again later costs one extra collective, once).
IDLE_FLUSHES_BEFORE_DROP = 100

_HEADER = 4  # seq, position, layout digest, extras length
_SLOTS = 3  # acc, count, step
_ACC, _COUNT, _STEP, _SPEC, _TENSORS = range(5)  # a buffered entry; _SPEC is (reduce, level)


def _digest(layout: Mapping[str, tuple[str, int]]) -> float:
    """A 48-bit digest of the layout, exact in float64."""
    text = json.dumps(list(layout.items()), separators=(',', ':'))
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), 'big'))


def _combine(op: str, acc: Any, value: float) -> float:
    """Fold one more value of a rank into its local accumulator (NaN wins for min/max)."""
    if op == 'mean' or op == 'sum':
        return acc + value
    if op == 'gather':
        return value
    if acc != acc or value != value:
        return math.nan
    return min(acc, value) if op == 'min' else max(acc, value)


class MetricGatherer:
    """Buffers metrics logged with ``reduce=`` and combines them across ranks at :meth:`flush`.

    Args:
        group: the Logger's :class:`~dist_logging.dist.LoggingGroup`.
    """

    def __init__(self, group: dist.LoggingGroup):
        self._group = group
        # key -> [acc, count, step, (reduce, level), pending device tensors]
        self._buffer: dict[str, list[Any]] = {}
        self._layout = _Layout({})
        self._idle = np.zeros(0, dtype=np.int64)
        self._seq = 0

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
            if entry is not None and entry[_SPEC][0] != reduce:
                raise ValueError(
                    f'metric {key!r} was logged with reduce={entry[_SPEC][0]!r} since the last flush; '
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
            if step is not None and (entry[_STEP] is None or step > entry[_STEP]):
                entry[_STEP] = step
            entry[_SPEC] = spec
            if reduce == 'gather':  # only the latest value counts
                entry[_ACC], entry[_COUNT], entry[_TENSORS] = None, 0, None
            if type(value) is float:
                entry[_ACC] = value if entry[_ACC] is None else _combine(reduce, entry[_ACC], value)
                entry[_COUNT] += 1
            elif entry[_TENSORS] is None:
                entry[_TENSORS] = [value]
            else:
                entry[_TENSORS].append(value)

    def pending_keys(self) -> list[str]:
        """The keys buffered since the last flush."""
        return list(self._buffer)

    def _materialize(self, buffered: dict[str, list[Any]]) -> None:
        """Fold device tensors into the accumulators: one stack + one copy per (device, dtype)."""
        groups: dict[tuple[Any, Any], list[tuple[list[Any], torch.Tensor]]] = collections.defaultdict(list)
        for entry in buffered.values():
            if entry[_TENSORS]:
                for tensor in entry[_TENSORS]:
                    groups[(tensor.device, tensor.dtype)].append((entry, tensor))
                entry[_TENSORS] = None
        for items in groups.values():
            values = torch.stack([t for _, t in items]).to('cpu').to(torch.float64).tolist()
            for (entry, _), value in zip(items, values):
                entry[_ACC] = value if entry[_ACC] is None else _combine(entry[_SPEC][0], entry[_ACC], value)
                entry[_COUNT] += 1

    # ------------------------------------------------------------------ flush (a collective)
    def flush(self, position: int = 0) -> list[tuple[dict[str, float], Optional[int], int]]:
        """Combine everything buffered since the last flush across ranks.

        A collective when the world has more than one rank: one all_gather in the
        steady state, two when some rank logged a key outside the agreed layout.

        Args:
            position: where the caller is (the Logger's batch count); every rank must
                flush at the same position.

        Returns:
            ``(metrics, step, level)`` groups to emit (meaningful on rank zero; every rank
            gets the same result).

        Raises:
            DistributedLoggingError: a rank did not arrive within the timeout, or ranks
                flushed at different positions (names the ranks and the step).
        """
        buffered, self._buffer = self._buffer, {}
        if not self._group.active:
            self._materialize(buffered)
            return _local_results(buffered)
        self._materialize(buffered)
        return self._flush_collective(buffered, position)

    def _flush_collective(self, buffered: dict[str, list[Any]], position: int):
        group, layout = self._group, self._layout
        self._seq += 1
        n = len(layout.keys)
        packed = np.zeros(_HEADER + _SLOTS * n, dtype=np.float64)
        # Comprehensions and C-level list comparisons rather than a loop: this runs for every key
        # at every flush. Steady state: the same keys in the layout's order, with the same specs.
        keys, entries = list(buffered), list(buffered.values())
        extras: list[list[Any]] = []
        if keys == layout.keys and [e[_SPEC] for e in entries] == layout.specs:
            slots: Any = slice(None)
        else:
            index_get, specs = layout.index.get, layout.specs
            slots = [index_get(key, -1) for key in keys]
            fits = [s >= 0 and specs[s] == e[_SPEC] for s, e in zip(slots, entries)]
            if not all(fits):
                extras = [
                    [key, *e[_SPEC], e[_ACC], e[_COUNT], e[_STEP]]
                    for key, e, fit in zip(keys, entries, fits)
                    if not fit
                ]
                slots = [s for s, fit in zip(slots, fits) if fit]
                entries = [e for e, fit in zip(entries, fits) if fit]
        if entries:
            body = packed[_HEADER:].reshape(n, _SLOTS)
            body[slots, 0] = [e[_ACC] for e in entries]
            body[slots, 1] = [e[_COUNT] for e in entries]
            body[slots, 2] = np.array([e[_STEP] for e in entries], dtype=np.float64)  # None -> NaN
        payload = json.dumps(extras, separators=(',', ':')).encode() if extras else b''
        packed[:_HEADER] = (self._seq, position, layout.digest, len(payload))
        what = f'flush at step {position} (flush #{self._seq})'
        try:
            gathered = group.all_gather(torch.from_numpy(packed), what)
        except DistributedLoggingError:
            self._reset()
            raise
        table = torch.stack(gathered).numpy()  # (world, header + slots * n)
        header = table[:, :_HEADER]
        self._check_positions(header)
        if not (header[:, 2] == layout.digest).all():
            self._reset()
            raise DistributedLoggingError(
                f'{what}: ranks disagree on the metric layout (digests {header[:, 2].tolist()}); '
                'was a Logger re-created on some ranks only? The gather state was reset',
                (),
            )
        data = table[:, _HEADER:].reshape(len(gathered), n, _SLOTS)
        lengths = [int(x) for x in header[:, 3]]
        if max(lengths) > 0:
            blobs = group.all_gather_bytes(payload, max(lengths), lengths, f'{what}: agreeing on new keys')
            data = self._merge_extras(data, [json.loads(b) if b else [] for b in blobs])
        results = _results(self._layout, data)
        self._age(data)
        return results

    def _check_positions(self, header: np.ndarray) -> None:
        if (header[:, :2] == header[0, :2]).all():
            return
        positions = [(int(p), int(s)) for s, p in header[:, :2]]
        counts = collections.Counter(positions)
        # The most common position is the flush in question (ties: the earliest); the other
        # ranks skipped it, or called an extra one.
        reference = min(counts, key=lambda p: (-counts[p], p))
        odd = [rank for rank, p in enumerate(positions) if p != reference]
        # Resynchronize identically on every rank so that later flushes can work again.
        self._seq = max(s for _, s in positions)
        self._reset()
        detail = ', '.join(f'rank {r}: step {p} flush #{s}' for r, (p, s) in enumerate(positions))
        raise DistributedLoggingError(
            f'flush at step {reference[0]} (flush #{reference[1]}): ranks {odd} did not reach this flush '
            f'(they are at another one: {detail}); every rank must call flush() at the same points',
            odd,
        )

    def _reset(self) -> None:
        self._layout = _Layout({})
        self._idle = np.zeros(0, dtype=np.int64)

    def _merge_extras(self, data: np.ndarray, extras: list[list[list[Any]]]) -> np.ndarray:
        """Add every rank's new keys to the layout (same order on every rank) and their values to ``data``."""
        old = self._layout
        layout = dict(zip(old.keys, old.specs))
        changed_by: dict[str, int] = {}
        conflicts: set[str] = set()
        for rank, entries in enumerate(extras):
            for key, op, level, _acc, _count, _step in entries:
                spec = (op, level)
                if key in changed_by:
                    if layout[key][0] != op:
                        conflicts.add(key)
                    continue
                if key in layout and layout[key] != spec:
                    # The spec changes: ranks that used the old one in this flush conflict.
                    if layout[key][0] != op and (data[:, old.index[key], 1] > 0).any():
                        conflicts.add(key)
                layout[key] = spec
                changed_by[key] = rank
        self._layout = new = _Layout(layout)
        merged = np.zeros((data.shape[0], len(new.keys), _SLOTS), dtype=np.float64)
        merged[:, : data.shape[1]] = data
        for rank, entries in enumerate(extras):
            for key, _op, _level, acc, count, step in entries:
                merged[rank, new.index[key]] = (acc, count, math.nan if step is None else step)
        self._idle = np.concatenate([self._idle, np.zeros(len(new.keys) - len(self._idle), dtype=np.int64)])
        if conflicts:
            warnings.warn(
                f'metrics {sorted(conflicts)} were logged with different reduce= on different ranks '
                'in the same flush; they are dropped from this flush',
                RuntimeWarning,
                stacklevel=4,
            )
            for key in conflicts:
                merged[:, new.index[key], 1] = 0
        return merged

    def _age(self, data: np.ndarray) -> None:
        """Count flushes without data per key; drop keys idle too long (identically on every rank)."""
        used = (data[:, :, 1] > 0).any(axis=0)
        self._idle = np.where(used, 0, self._idle + 1)
        if self._idle.size and self._idle.max() >= IDLE_FLUSHES_BEFORE_DROP:
            keep = np.flatnonzero(self._idle < IDLE_FLUSHES_BEFORE_DROP).tolist()
            old = self._layout
            self._layout = _Layout({old.keys[i]: old.specs[i] for i in keep})
            self._idle = self._idle[keep]


_OP_CODES = {op: code for code, op in enumerate(REDUCTIONS)}
_GATHER = _OP_CODES['gather']


class _Layout:
    """An ordered ``key -> (reduce, level)`` with the derived lookups, built only when it changes."""

    __slots__ = ('keys', 'specs', 'index', 'digest', 'key_array', 'codes', 'levels')

    def __init__(self, layout: Mapping[str, tuple[str, int]], shared: bool = True):
        self.keys = list(layout)
        self.specs = [tuple(spec) for spec in layout.values()]
        self.index = {key: i for i, key in enumerate(self.keys)} if shared else {}
        self.digest = _digest(layout) if shared else 0.0
        self.key_array = np.array(self.keys, dtype=object)
        self.codes = np.array([_OP_CODES[op] for op, _ in self.specs], dtype=np.int64)
        self.levels = np.array([level for _, level in self.specs], dtype=np.int64)


def _local_results(buffered: Mapping[str, list[Any]]) -> list[tuple[dict[str, float], Optional[int], int]]:
    """The flush of a world of one: each accumulator already is the result.

    Plain Python rather than :func:`_results`: every ``batch_end`` flushes, and numpy's
    per-call overhead dominates for the handful of keys a single process logs.
    """
    groups: dict[tuple[Optional[int], int], dict[str, float]] = {}
    for key, entry in buffered.items():
        count = entry[_COUNT]
        if not count:
            continue
        op, level = entry[_SPEC]
        value = entry[_ACC] / count if op == 'mean' else entry[_ACC]
        groups.setdefault((entry[_STEP], level), {})[f'{key}/rank0' if op == 'gather' else key] = float(value)
    ordered = sorted(groups, key=lambda sl: (-math.inf if sl[0] is None else sl[0], sl[1]))
    return [(groups[step_level], step_level[0], step_level[1]) for step_level in ordered]


def _results(layout: _Layout, data: np.ndarray) -> list[tuple[dict[str, float], Optional[int], int]]:
    """Reduce ``data`` (ranks x keys x [acc, count, step]) into ``(metrics, step, level)`` groups.

    Vectorized over keys (this runs at every flush). NaN and inf pass through: a NaN on
    any rank makes mean/sum/min/max NaN.
    """
    if not layout.keys:
        return []
    acc, count, steps = data[:, :, 0], data[:, :, 1], data[:, :, 2]
    logged = count > 0
    with np.errstate(invalid='ignore', divide='ignore'):
        total = count.sum(axis=0)
        sums = np.where(logged, acc, 0.0).sum(axis=0)
        values = np.select(
            [layout.codes == 0, layout.codes == 1, layout.codes == 2, layout.codes == 3],
            [sums / total, sums, np.where(logged, acc, np.inf).min(axis=0), np.where(logged, acc, -np.inf).max(axis=0)],
            default=np.nan,
        )
        # The largest step any rank gave (NaN: that rank gave none; -inf: nobody did).
        top = np.where(logged & ~np.isnan(steps), steps, -np.inf).max(axis=0)
    emit = total > 0
    out = []
    for step_value, level in sorted(set(zip(top[emit].tolist(), layout.levels[emit].tolist()))):
        mask = emit & (top == step_value) & (layout.levels == level)
        plain = mask & (layout.codes != _GATHER)
        metrics = dict(zip(layout.key_array[plain].tolist(), values[plain].tolist()))
        for i in np.flatnonzero(mask & (layout.codes == _GATHER)).tolist():
            for rank in np.flatnonzero(logged[:, i]).tolist():
                metrics[f'{layout.keys[i]}/rank{rank}'] = float(acc[rank, i])
        out.append((metrics, None if step_value == -math.inf else int(step_value), level))
    return out
