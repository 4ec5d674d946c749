"""Reading a run's postmortem sets and naming the culprit: hang, desync, crash, missing ranks.

The analysis works on what every rank left (see :mod:`dist_logging.postmortem.capture` for the
layout): the header (rank, host, reason, exception, world size, groups), the Python stacks and
torch's flight-recorder dump. Facts it relies on (torch 2.13, gloo): per process group every
collective has a ``collective_seq_id``; completion shows only as ``retired``. So:

- **desync**: ranks at the same sequence number of a group called different collectives
  (``profiling_name``); the culprits are the ranks outside the majority.
- **hang**: the waiting ranks hold sequence N not retired; the culprits are the members of the group
  whose last entry is below N (they never entered it); their stacks say where they are instead.
- **crash**: a rank raised an exception that is not a consequence of another rank's end (gloo's
  ``Connection closed by peer``, timeouts, the Logger's own ``DistributedLoggingError``).
- **missing**: ranks of the world that left no set (killed before they could write, or the host is gone).
- **partition** / **silent**: ranks that the other ranks' Logger errors named silent (``unreachable``) but
  that were alive: each left a set, its own Logger error naming nobody silent (``partition`` when they
  could not reach the rendezvous store either: their host was cut off).

Without dumps (``TORCH_FR_BUFFER_SIZE=0``) a hang is read from the stacks alone: the ranks whose
training thread is not inside a ``torch.distributed`` call are the culprits.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ['RankSet', 'Verdict', 'analyse', 'rank_of_path', 'load_dump', 'EXIT_CULPRIT', 'EXIT_NOTHING', 'EXIT_UNKNOWN']

EXIT_NOTHING = 0  # no postmortem, or nothing wrong
EXIT_CULPRIT = 1  # a culprit is named
EXIT_UNKNOWN = 2  # cannot tell (the verdict says why)

_RANK_IN_PATH = re.compile(r'rank[-_]?(\d+)(?!\d)')
# Errors that follow another rank's end or stall, not a cause of their own.
_CONSEQUENCE = re.compile(
    r'Connection closed by peer|Connection reset|Broken pipe|Timed out waiting|timed out|'
    r'Connection refused|ECONNRESET|EPIPE|DistributedLoggingError|abandoned|'
    r'NCCL communicator was aborted|Watchdog caught collective operation timeout',
    re.I,
)
_LIBRARY = re.compile(r'(site-packages|dist-packages|/lib/python\d[\d.]*/|<frozen |/dist_logging/)')
_COLLECTIVE_FRAME = re.compile(r'torch/distributed/|distributed_c10d')
_RANK_WORD = re.compile(r'(?<!\w)rank (\d+)', re.I)
# A Logger error of a rank that could not read the rendezvous store (dist_logging._world.diagnose says so).
_STORE_SILENT = re.compile(r'rendezvous store did not answer|without a store this rank cannot tell')


def rank_of_path(path: str) -> Optional[int]:
    """The rank an object of a postmortem belongs to, from its path (``rankN``, ``rank-N``, ``rank_N``); None if
    its path does not say (the last match wins: ``attempt-0/rank-3/header.json`` -> 3)."""
    found = _RANK_IN_PATH.findall(path)
    return int(found[-1]) if found else None


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): a dump from a bucket runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f'flight-recorder dump refers to {module}.{name}; only plain data is read')


def load_dump(data: bytes) -> dict[str, Any]:
    """A flight-recorder dump (torch's pickle) as plain data.

    Raises:
        pickle.UnpicklingError: not a dump of plain data.
    """
    return _PlainUnpickler(io.BytesIO(data)).load()


@dataclass
class RankSet:
    """What one rank left: its header, stacks, exception text and flight-recorder dump (each may be missing)."""

    rank: int
    header: dict[str, Any] = field(default_factory=dict)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    exception: Optional[str] = None
    dump: Optional[dict[str, Any]] = None

    @property
    def host(self) -> str:
        """The rank's host (``?`` when unknown)."""
        return str(self.header.get('host') or '?')

    def training_stack(self) -> list[dict[str, Any]]:
        """The frames of the training thread (the one that made the Logger; else the main thread), oldest first."""
        wanted = self.header.get('training_thread')
        for stack in self.stacks:
            if wanted is not None and stack.get('ident') == wanted:
                return stack.get('frames') or []
        for stack in self.stacks:
            if stack.get('main'):
                return stack.get('frames') or []
        return []

    def location(self) -> Optional[str]:
        """``file:line in function`` of the innermost frame of the training thread in the user's code
        (outside the standard library, site-packages and dist_logging); else the innermost frame."""
        frames = self.training_stack()
        if not frames:
            return None
        chosen = next((f for f in reversed(frames) if not _LIBRARY.search(f.get('file', ''))), frames[-1])
        return f'{chosen.get("file")}:{chosen.get("line")} in {chosen.get("function")}'

    def in_collective(self) -> bool:
        """Whether the training thread is inside a ``torch.distributed`` call."""
        return any(_COLLECTIVE_FRAME.search(f.get('file', '')) for f in self.training_stack())

    def error_line(self) -> Optional[str]:
        """``Type: message`` of the exception the rank captured, if any."""
        error = self.header.get('exception')
        if not error:
            return None
        return f'{error.get("type")}: {error.get("message")}'.strip()


@dataclass
class Verdict:
    """The diagnosis: a one-line verdict, the culprits, details and the exit code."""

    kind: str
    line: str
    culprits: list[int] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    code: int = EXIT_NOTHING
    facts: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The verdict as a JSON-serializable dict."""
        return {
            'kind': self.kind,
            'verdict': self.line,
            'culprits': self.culprits,
            'details': self.details,
            'exit_code': self.code,
            'facts': self.facts,
        }


def _quiet(text: Any) -> str:
    """Free text for the verdict line with ``rank N`` written ``rank=N``: only culprits are written ``rank N``."""
    return _RANK_WORD.sub(r'rank=\1', str(text))


def _ranks(ranks: Any) -> str:
    """``ranks 0, 1, 2`` (always the plural: only culprits are written ``rank N``)."""
    return 'ranks ' + ', '.join(str(r) for r in sorted(ranks))


def _op(name: Any) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``."""
    return str(name or '?').split(':', 1)[-1]


def _culprits(sets: dict[int, RankSet], ranks: Any, roster: dict[int, str], with_location: bool = False) -> str:
    parts = []
    for rank in sorted(ranks):
        host = sets[rank].host if rank in sets else roster.get(rank, '?')
        text = f'rank {rank} (host {host})'
        if with_location and rank in sets and sets[rank].location():
            text += f' at {_quiet(sets[rank].location())}'
        parts.append(text)
    return ', '.join(parts)


def _entries_by_group(dump: Optional[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in (dump or {}).get('entries') or []:
        if entry.get('is_p2p'):
            continue
        group = entry.get('process_group')
        name = str(group[0]) if isinstance(group, (list, tuple)) and group else str(entry.get('pg_id', '?'))
        groups.setdefault(name, []).append(entry)
    return groups


def _members(name: str, sets: dict[int, RankSet], world: int, seen: set[int]) -> set[int]:
    for rank_set in sets.values():
        for group in rank_set.header.get('groups') or []:
            if str(group.get('name')) == name and group.get('ranks'):
                return set(group['ranks'])
    if name == '0':  # the default group: the world
        return set(range(world))
    return seen


def _first_mismatch(entries: dict[int, list[dict[str, Any]]]) -> Optional[int]:
    """The lowest sequence number at which ranks recorded different collectives (None: they agree)."""
    ops: dict[int, set[str]] = {}
    for rank_entries in entries.values():
        for entry in rank_entries:
            ops.setdefault(entry.get('collective_seq_id') or 0, set()).add(_op(entry.get('profiling_name')))
    return min((seq for seq, names in ops.items() if len(names) > 1), default=None)


def _collective_verdict(
    sets: dict[int, RankSet], world: int, roster: dict[int, str], missing: set[int]
) -> Optional[Verdict]:
    """A desync or a hang read from the flight-recorder dumps (None when they show neither)."""
    per_rank = {rank: _entries_by_group(s.dump) for rank, s in sets.items() if s.dump is not None}
    if not per_rank:
        return None
    names = sorted({name for groups in per_rank.values() for name in groups}, key=lambda n: (len(n), n))
    for name in names:
        seen = {rank for rank, groups in per_rank.items() if name in groups}
        members = _members(name, sets, world, seen)
        last = {
            r: max((e.get('collective_seq_id') or 0 for e in per_rank[r].get(name, [])), default=0)
            for r in members
            if r in per_rank
        }
        pending = {}
        for rank in last:
            waiting = [e for e in per_rank[rank].get(name, []) if not e.get('retired')]
            if waiting:
                pending[rank] = min(waiting, key=lambda e: e.get('collective_seq_id') or 0)
        mismatch = _first_mismatch({r: per_rank[r].get(name, []) for r in last})
        if not pending and mismatch is None:
            continue
        seq: int = min(e.get('collective_seq_id') or 0 for e in pending.values()) if pending else (mismatch or 0)
        if mismatch is not None and mismatch < seq:
            seq = mismatch  # collectives that paired up wrongly (and even completed) before the wait
        at_seq = {
            r: next((e for e in per_rank[r].get(name, []) if e.get('collective_seq_id') == seq), None) for r in last
        }
        ops: dict[str, set[int]] = {}
        for rank, entry in at_seq.items():
            if entry is not None:
                ops.setdefault(_op(entry.get('profiling_name')), set()).add(rank)
        facts = {'group': name, 'sequence': seq, 'ops': {op: sorted(r) for op, r in ops.items()}}
        if len(ops) > 1:
            majority = max(ops, key=lambda op: (len(ops[op]), -min(ops[op])))
            culprits = sorted(r for op, ranks in ops.items() if op != majority for r in ranks)
            theirs = ' / '.join(sorted({op for op in ops if op != majority}))
            line = (
                f'desync: {_culprits(sets, culprits, roster)} called {theirs} #{seq} where '
                f'{_ranks(ops[majority])} called {majority} (process group {name})'
            )
            return Verdict('desync', line, culprits, code=EXIT_CULPRIT, facts=facts)
        op = next(iter(ops)) if ops else '?'
        behind = sorted(r for r in members - missing if r in last and last[r] < seq)
        absent = sorted(members & missing)
        waiting_ranks = sorted(pending)
        if behind:
            line = (
                f'hang: {_culprits(sets, behind, roster, with_location=True)} did not enter {op} #{seq} '
                f'(process group {name}) that {_ranks(waiting_ranks)} wait in'
            )
            details = [f'rank {r} last completed #{last[r]}; its stack: see rank-{r}/stacks.txt' for r in behind]
            return Verdict('hang', line, behind, details, EXIT_CULPRIT, facts)
        if absent:
            line = (
                f'missing: {_culprits(sets, absent, roster)} left no postmortem while {_ranks(waiting_ranks)} wait '
                f'in {op} #{seq} (process group {name}): its process ended before it could write one '
                '(killed, e.g. SIGKILL or the OOM killer) or its host is gone'
            )
            return Verdict('missing', line, absent, code=EXIT_CULPRIT, facts=facts)
    return None


def _silent_verdict(sets: dict[int, RankSet], roster: dict[int, str]) -> Optional[Verdict]:
    """Ranks that other ranks' Logger errors named silent (``unreachable``) although they were alive: each left a
    set of its own, and its own Logger error named nobody silent (it could not see the others, or the store).
    That is a partition (their host cut off from the others), or a host frozen for a while; None otherwise."""
    accusers: dict[int, set[int]] = {}
    accusing: set[int] = set()
    for rank, rank_set in sets.items():
        named = (rank_set.header.get('exception') or {}).get('named') or {}
        for other in named.get('unreachable') or []:
            if int(other) != rank:
                accusers.setdefault(int(other), set()).add(rank)
                accusing.add(rank)
    culprits = sorted(r for r in accusers if r in sets and r not in accusing)
    if not culprits:
        return None
    witnesses = sorted(set().union(*(accusers[r] for r in culprits)))
    cut_off = all(_STORE_SILENT.search(sets[r].error_line() or '') for r in culprits)
    line = (
        f'{"partition" if cut_off else "silent"}: {_culprits(sets, culprits, roster)} went silent to '
        f'{_ranks(witnesses)} but were alive (each captured its own set after its Logger error)'
    )
    if cut_off:
        line += ' and could not reach the rendezvous store either: cut off from the others (a network partition)'
    else:
        line += ': cut off from them for a while, or frozen (SIGSTOP, a stalled VM)'
    # The capture times tell a partition (both sides fail within their sync timeouts of each other) from a
    # witnesses' host frozen for a while (they fail once thawed, long after): the sets alone look the same.
    start = min(float(sets[r].header.get('time') or 0) for r in culprits + witnesses)
    details = [
        f'rank {r} captured at +{float(sets[r].header.get("time") or 0) - start:.1f} s: {sets[r].error_line()}'
        for r in culprits + witnesses
    ]
    facts = {'witnesses': witnesses}
    return Verdict('partition' if cut_off else 'silent', line, culprits, details, EXIT_CULPRIT, facts)


def _stack_verdict(sets: dict[int, RankSet], roster: dict[int, str]) -> Optional[Verdict]:
    """A hang read from the stacks alone: some ranks inside a collective, the others elsewhere."""
    inside = {r for r, s in sets.items() if s.stacks and s.in_collective()}
    outside = {r for r, s in sets.items() if s.stacks and not s.in_collective()}
    if inside and outside:
        line = (
            f'hang: {_culprits(sets, outside, roster, with_location=True)} not in a collective while '
            f'{_ranks(inside)} wait in one (read from the stacks: no flight-recorder entries)'
        )
        return Verdict('hang', line, sorted(outside), code=EXIT_CULPRIT)
    return None


def analyse(sets: dict[int, RankSet], world_size: Optional[int] = None) -> Verdict:
    """Name the culprit(s) of an attempt from its ranks' sets.

    Args:
        sets: rank -> its set (ranks that left none are absent).
        world_size: the world size, when known otherwise (default: the largest the headers say).

    Returns:
        The :class:`Verdict` (its ``code``: 1 culprit named, 0 nothing wrong, 2 cannot tell).
    """
    if not sets:
        return Verdict('none', 'no postmortem: no rank captured one', code=EXIT_NOTHING)
    world = world_size or max([int(s.header.get('world_size') or 0) for s in sets.values()] + [max(sets) + 1])
    roster: dict[int, str] = {}
    for rank_set in sets.values():
        for rank, value in (rank_set.header.get('roster') or {}).items():
            roster.setdefault(int(rank), str(value[0]) if value else '?')
    missing = set(range(world)) - set(sets)
    reasons = {r: str(s.header.get('reason', '?')) for r, s in sets.items()}
    details = []
    if missing:
        details.append(
            f'no postmortem from {_ranks(missing)} (hosts: {", ".join(roster.get(r, "?") for r in sorted(missing))})'
        )
    off = sorted(r for r, s in sets.items() if s.dump is None or s.header.get('flight_recorder') != 'on')
    if off:
        details.append(f'flight recorder off or unavailable on {_ranks(off)}')

    causes = {
        r
        for r, s in sets.items()
        if reasons[r] == 'exception' and s.error_line() and not _CONSEQUENCE.search(s.error_line() or '')
    }
    if causes:
        first = min(causes, key=lambda r: sets[r].header.get('time') or 0)
        others = sorted(set(sets) - causes)
        line = (
            f'crash: {_culprits(sets, [first], roster, with_location=False)} raised {_quiet(sets[first].error_line())}'
        )
        where = (sets[first].header.get('exception') or {}).get('where')
        if where:
            line += f' at {_quiet(where)}'
        if others:
            line += f'; {_ranks(others)} failed after it'
        culprits = [first]
        for rank in sorted(causes - {first}):
            details.append(f'also raised, later: rank {rank}: {sets[rank].error_line()}')
        return Verdict('crash', line, culprits, details, EXIT_CULPRIT, {'reasons': reasons})

    found = (
        _silent_verdict(sets, roster)
        or _collective_verdict(sets, world, roster, missing)
        or _stack_verdict(sets, roster)
    )
    if found is not None:
        found.details = details + found.details
        found.facts['reasons'] = reasons
        return found
    if missing:
        line = (
            f'missing: {_culprits(sets, missing, roster)} left no postmortem: its process ended before it '
            f'could write one (killed, e.g. SIGKILL or the OOM killer) or its host is gone'
        )
        return Verdict('missing', line, sorted(missing), details, EXIT_CULPRIT, {'reasons': reasons})
    kinds = set(reasons.values())
    if kinds <= {'manual', 'sigterm'} or all(r not in ('hang', 'exception', 'logging_error') for r in kinds):
        why = ', '.join(sorted(kinds))
        line = f'no culprit: {_ranks(sets)} captured ({why}) and show nothing wrong'
        return Verdict('none', line, [], details, EXIT_NOTHING, {'reasons': reasons})
    line = (
        f'cannot tell: {_ranks(sets)} captured ({", ".join(sorted(kinds))}) but their dumps show every rank '
        'at the same collective and no rank raised an error of its own (a network or backend stall?)'
    )
    return Verdict('unknown', line, [], details, EXIT_UNKNOWN, {'reasons': reasons})


def parse_header(data: bytes) -> dict[str, Any]:
    """A header's JSON (an empty dict when it does not parse)."""
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
