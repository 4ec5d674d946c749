"""The packing side of metric gathering: the layout and the vectors one flush's collectives carry.

Pure functions over numpy arrays and tensors (no collective, no process group): :mod:`dist_logging._logger.gather`
lays a rank's buffered entries out along the layout with :func:`pack_flush`, issues the collectives, and turns
their results back into values with :func:`unpack_values`. The vectors' format is described in that module.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
from typing import Any, Mapping, Optional

import numpy as np
import torch

REDUCTIONS = ('mean', 'sum', 'min', 'max', 'gather')

ACC, COUNT, STEP, SPEC, TENSORS = range(5)  # a buffered entry; SPEC is (reduce, level)
_OP_CODES = {op: code for code, op in enumerate(REDUCTIONS)}
_MEAN, _SUM, _MIN, _MAX, _GATHER = range(5)
HEADER = 8  # seq, position, digest, new-key payload length, has data, -seq, -position, -digest
_NEG_INF = -math.inf

Results = list[tuple[dict[str, float], Optional[int], int]]


def _digest(layout: Mapping[str, str]) -> float:
    """A 48-bit digest of the layout, exact in float64."""
    text = json.dumps(list(layout.items()), separators=(',', ':'))
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), 'big'))


def combine(op: str, acc: Any, value: float) -> float:
    """Fold one more value of a rank into its local accumulator (NaN wins for min/max)."""
    if op == 'mean' or op == 'sum':
        return acc + value
    if op == 'gather':
        return value
    if acc != acc or value != value:
        return math.nan
    return min(acc, value) if op == 'min' else max(acc, value)


class Layout:
    """An ordered ``key -> reduce`` with each key's position in its section, built only when it changes."""

    __slots__ = (
        'keys',
        'ops',
        'codes',
        'index',
        'digest',
        'pos',
        'n_sum',
        'n_ext',
        'n_gather',
        'code_array',
        'pos_array',
        'key_array',
    )

    def __init__(self, layout: Mapping[str, str]):
        self.keys = list(layout)
        self.ops = [layout[k] for k in self.keys]
        self.codes = [_OP_CODES[op] for op in self.ops]
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.digest = _digest(layout) if layout else 0.0
        self.pos: list[int] = []
        sections: dict[str, list[int]] = {'sum': [], 'ext': [], 'gather': []}
        for i, code in enumerate(self.codes):
            section = 'sum' if code <= _SUM else 'ext' if code <= _MAX else 'gather'
            self.pos.append(len(sections[section]))
            sections[section].append(i)
        self.n_sum, self.n_ext, self.n_gather = (len(sections[name]) for name in ('sum', 'ext', 'gather'))
        self.code_array = np.array(self.codes, dtype=np.int64)
        self.pos_array = np.array(self.pos, dtype=np.int64)
        self.key_array = np.array(self.keys, dtype=object)

    def as_dict(self) -> dict[str, str]:
        return dict(zip(self.keys, self.ops))


def pack_flush(layout: Layout, buffered: dict[str, list[Any]], held: dict[str, list[Any]]):
    """Lay this rank's buffered entries out along ``layout`` (vectorized over keys: this runs every flush).

    Entries outside the layout (a new key, or another ``reduce``) go to ``held``.

    Returns:
        ``(MAX body [steps | levels | extrema | NaN flags], SUM vector [sums | counts],
        gather vector [value, count, step] * G, tensors left on their device as
        (section, slot, sign, tensor))``, the vectors as float64 numpy arrays.
    """
    K, S, E, G = len(layout.keys), layout.n_sum, layout.n_ext, layout.n_gather
    keys, entries = list(buffered), list(buffered.values())
    if keys == layout.keys and [e[SPEC][0] for e in entries] == layout.ops:
        slots = np.arange(K)  # the steady state: the layout's keys, in its order
    else:
        index_get, ops, fit_slots, fit_entries = layout.index.get, layout.ops, [], []
        for key, entry in zip(keys, entries):
            i = index_get(key)
            if i is None or ops[i] != entry[SPEC][0]:
                held[key] = entry
            else:
                fit_slots.append(i)
                fit_entries.append(entry)
        slots, entries = np.array(fit_slots, dtype=np.int64), fit_entries
    steps, levels = np.full(K, _NEG_INF), np.zeros(K)
    extrema, nans = np.full(E, _NEG_INF), np.zeros(E)
    sums_counts = np.zeros(2 * S)
    gathered = np.zeros(3 * G)
    gathered[2::3] = math.nan
    device_values: list[tuple[str, int, float, torch.Tensor]] = []
    if not entries:
        return np.concatenate([steps, levels, extrema, nans]), sums_counts, gathered, device_values
    levels[slots] = [e[SPEC][1] for e in entries]
    given = np.array([e[STEP] for e in entries], dtype=np.float64)  # None -> NaN
    steps[slots] = np.where(np.isnan(given), _NEG_INF, given)
    has_acc = np.array([e[ACC] is not None for e in entries])
    acc = np.array([e[ACC] for e in entries], dtype=np.float64)  # None -> NaN, masked by has_acc
    tensors = [e[TENSORS] for e in entries]
    count = np.array([e[COUNT] for e in entries], dtype=np.float64)
    if any(tensors):
        count += [len(t) if t else 0 for t in tensors]
    codes, positions = layout.code_array[slots], layout.pos_array[slots]
    mask = codes <= _SUM
    if mask.any():
        sums_counts[positions[mask]] = np.where(has_acc, acc, 0.0)[mask]
        sums_counts[S + positions[mask]] = count[mask]
    mask = (codes == _MIN) | (codes == _MAX)
    if mask.any():
        signed = np.where(codes == _MAX, acc, -acc)
        is_nan = has_acc & np.isnan(acc)
        extrema[positions[mask]] = np.where(has_acc & ~is_nan, signed, _NEG_INF)[mask]
        nans[positions[mask]] = is_nan[mask]
    mask = codes == _GATHER
    if mask.any():
        where = 3 * positions[mask]
        gathered[where] = np.where(has_acc, acc, 0.0)[mask]
        gathered[where + 1] = 1.0
        gathered[where + 2] = given[mask]
    if any(tensors):
        for code, p, kept in zip(codes.tolist(), positions.tolist(), tensors):
            if not kept:
                continue
            if code <= _SUM:
                device_values += [('sum', p, 1.0, t) for t in kept]
            elif code <= _MAX:
                device_values += [('ext', p, 1.0 if code == _MAX else -1.0, t) for t in kept]
            else:
                device_values.append(('gather', p, 1.0, kept[-1]))
    return np.concatenate([steps, levels, extrema, nans]), sums_counts, gathered, device_values


def to_vector(values: Any, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
    if device.type == 'cpu':
        return tensor
    if device.type == 'cuda':  # pinned, so the copy does not wait for the stream's queued work
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def scatter_device_values(
    vectors: dict[str, torch.Tensor],
    device_values: list[tuple[str, int, float, torch.Tensor]],
    device: torch.device,
    K: int,
    S: int,
    E: int,
) -> None:
    """Fold tensors that stayed on their device into the packed vectors, on ``device``.

    One stack per dtype and a few index kernels: no per-key kernel, no host synchronization.
    Mean/sum values are added into the sums, min/max values (signed) scattered with amax
    (NaN is flagged separately), a gather key's latest tensor copied into its value slot.
    """
    by_section: dict[str, list[tuple[int, float, torch.Tensor]]] = collections.defaultdict(list)
    for section, slot, sign, tensor in device_values:
        by_section[section].append((slot, sign, tensor))
    for section, items in by_section.items():
        stacked = _stack([t for _, _, t in items], device)
        if section == 'sum':
            index = to_vector([float(s) for s, _, _ in items], device).long()
            vectors['sum'].index_add_(0, index, stacked)
        elif section == 'ext':
            signs = to_vector([sign for _, sign, _ in items], device)
            signed = stacked * signs
            nan = torch.isnan(signed)
            base = HEADER + 2 * K
            index = to_vector([float(base + s) for s, _, _ in items], device).long()
            vectors['max'].scatter_reduce_(
                0, index, torch.where(nan, torch.full_like(signed, _NEG_INF), signed), reduce='amax'
            )
            vectors['max'].scatter_reduce_(0, index + E, nan.to(torch.float64), reduce='amax')
        else:
            index = to_vector([float(3 * s) for s, _, _ in items], device).long()
            vectors['gather'].index_copy_(0, index, stacked)


def _stack(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Stack scalar tensors as float64 on ``device``: one stack per (device, dtype), in the given order."""
    groups: dict[tuple[Any, Any], list[int]] = collections.defaultdict(list)
    for i, tensor in enumerate(tensors):
        groups[(tensor.device, tensor.dtype)].append(i)
    out = torch.empty(len(tensors), dtype=torch.float64, device=device)
    for indices in groups.values():
        part = torch.stack([tensors[i].reshape(()) for i in indices]).to(device=device, dtype=torch.float64)
        if len(indices) == len(tensors):
            return part
        out[to_vector([float(i) for i in indices], device).long()] = part
    return out


def as_table(rows: Any) -> torch.Tensor:
    """One (ranks x n) tensor from gathered rows (one allocation already, or stacked)."""
    if isinstance(rows, torch.Tensor):
        return rows
    return rows[0]._base if rows[0]._base is not None and rows[0]._base.shape[0] == len(rows) else torch.stack(rows)


def unpack_values(
    layout: Layout,
    steps: list[float],
    levels: list[float],
    sums: list[float],
    extrema: list[float],
    nans: list[float],
    table: Optional[np.ndarray],
) -> dict[str, tuple[float, float, float]]:
    """Reduced values of the keys somebody logged: ``{name: (value, step, level)}`` (rank zero only).

    NaN and inf pass through: a NaN on any rank makes mean/sum/min/max NaN.
    """
    level_array = np.asarray(levels, dtype=np.float64)
    logged = level_array > 0
    if not logged.any():
        return {}
    step_array = np.asarray(steps, dtype=np.float64)
    codes, pos, S = layout.code_array, layout.pos_array, layout.n_sum
    sum_array, ext_array, nan_array = (np.asarray(x, dtype=np.float64) for x in (sums, extrema, nans))
    values = np.full(len(codes), math.nan)
    with np.errstate(invalid='ignore', divide='ignore'):
        for code in (_MEAN, _SUM, _MIN, _MAX):
            mask = logged & (codes == code)
            if not mask.any():
                continue
            p = pos[mask]
            if code == _MEAN:
                values[mask] = sum_array[p] / sum_array[S + p]
            elif code == _SUM:
                values[mask] = sum_array[p]
            else:
                values[mask] = np.where(nan_array[p] > 0, math.nan, ext_array[p] if code == _MAX else -ext_array[p])
    plain = logged & (codes != _GATHER)
    out: dict[str, tuple[float, float, float]] = dict(
        zip(
            layout.key_array[plain].tolist(),
            zip(values[plain].tolist(), step_array[plain].tolist(), level_array[plain].tolist()),
        )
    )
    if table is not None:
        for i in np.flatnonzero(logged & (codes == _GATHER)).tolist():
            column, key, step, level = table[:, 3 * pos[i] : 3 * pos[i] + 3], layout.keys[i], steps[i], levels[i]
            for rank in np.flatnonzero(column[:, 1] > 0).tolist():
                out[f'{key}/rank{rank}'] = (float(column[rank, 0]), step, level)
    return out


def group_results(values: Mapping[str, tuple[float, float, float]]) -> Results:
    """``{name: (value, step, level)}`` -> ``(metrics, step, level)`` groups, by step then level."""
    groups: dict[tuple[float, int], dict[str, float]] = {}
    for key, (value, step, level) in values.items():
        groups.setdefault((step, int(level)), {})[key] = float(value)
    return [(groups[sl], None if sl[0] == _NEG_INF else int(sl[0]), sl[1]) for sl in sorted(groups)]


def local_results(buffered: Mapping[str, list[Any]]) -> list[tuple[dict[str, float], Optional[int], int]]:
    """The flush of a world of one: each accumulator already is the result.

    Plain Python rather than :func:`_results`: every ``batch_end`` flushes, and numpy's
    per-call overhead dominates for the handful of keys a single process logs.
    """
    groups: dict[tuple[Optional[int], int], dict[str, float]] = {}
    for key, entry in buffered.items():
        count = entry[COUNT]
        if not count:
            continue
        op, level = entry[SPEC]
        value = entry[ACC] / count if op == 'mean' else entry[ACC]
        groups.setdefault((entry[STEP], level), {})[f'{key}/rank0' if op == 'gather' else key] = float(value)
    ordered = sorted(groups, key=lambda sl: (-math.inf if sl[0] is None else sl[0], sl[1]))
    return [(groups[step_level], step_level[0], step_level[1]) for step_level in ordered]
