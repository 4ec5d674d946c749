"""After a logging collective failed or while it waits long: which ranks are missing, where, and why.

The facts, from the most to the least certain:

- ``/proc`` on this host: a rank on this host whose process ended *left*; one stopped (SIGSTOP)
  is frozen. Exact and immediate, no store needed.
- the ``bye`` key a rank writes at interpreter exit: it *left*.
- two reads of every rank's beat, at least 1.5 beat periods apart (:mod:`dist_logging._world.watch`):
  a rank whose beat count did not move is *silent*. When every rank of its host is silent, the
  host is *unreachable* (cut off, frozen, or every process on it ended: from here the three look
  the same); when its host-mates still beat, that process froze or ended. A rank whose beat moved
  but whose sequence number for this group is behind this rank's is *late*: alive, not calling
  (its beat says for how long it has not entered a logging collective).
- nothing, when this rank cannot read the store: the error says so, and names the other hosts.

None of it depends on when a rank last wrote something before the failure: a rank that reached
the collective and then went silent is named as silent like one that never reached it.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from dist_logging._world.watch import HOST, Beat, process_state
from dist_logging.errors import DistributedLoggingError

__all__ = ['Read', 'Diagnosis', 'diagnose']

Read = tuple[float, dict[int, Beat], set[int]]  # (monotonic time, rank -> beat, ranks that said bye)


class Diagnosis:
    """Who is missing and why; :meth:`error` turns it into the exception."""

    def __init__(self) -> None:
        self.left: dict[int, str] = {}
        self.unreachable: dict[int, str] = {}
        self.late: dict[int, str] = {}
        self.hosts: dict[int, str] = {}
        self.unknown: Optional[str] = None  # why this rank cannot tell
        self.notes: list[str] = []

    @property
    def names_someone(self) -> bool:
        return bool(self.left or self.unreachable or self.late)

    def describe(self) -> str:
        """The findings as one sentence (no cause)."""
        parts = []
        if self.left:
            parts.append('left the job: ' + '; '.join(self.left[r] for r in sorted(self.left)))
        if self.unreachable:
            parts.append('silent: ' + '; '.join(dict.fromkeys(self.unreachable[r] for r in sorted(self.unreachable))))
        if self.late:
            parts.append('late: ' + '; '.join(self.late[r] for r in sorted(self.late)))
        if self.unknown:
            parts.append(self.unknown)
        if not parts and not self.notes:
            parts.append(
                'every rank answers and reached this collective: it failed between the ranks '
                '(the network between hosts?)'
            )
        return '; '.join(parts + self.notes)

    def error(self, what: str, cause: str) -> DistributedLoggingError:
        """The exception for a collective ``what`` that failed with ``cause``."""
        named = set(self.left) | set(self.unreachable) | set(self.late)
        return DistributedLoggingError(
            f'{what}: {self.describe()} ({cause})',
            left_ranks=self.left,
            unreachable_ranks=self.unreachable,
            late_ranks=self.late,
            hosts={r: h for r, h in self.hosts.items() if r in named},
        )


def _ranks_text(ranks: Sequence[int]) -> str:
    return f'rank {ranks[0]}' if len(ranks) == 1 else f'ranks {list(ranks)}'


def diagnose(
    rank: int,
    world_size: int,
    roster: dict[int, tuple[str, int]],
    group_id: int,
    sequence: int,
    reads: Optional[tuple[Read, Read]],
    store_problem: Optional[str] = None,
) -> Diagnosis:
    """Classify every other rank from ``/proc``, the roster and two beat reads (``None``: no store).

    Args:
        rank, world_size: this rank and the world size.
        roster: rank -> (host, pid) as the ranks announced themselves.
        group_id, sequence: the logging group and the collective number this rank is at.
        reads: the earlier and the later beat read, or None when the store did not answer.
        store_problem: why the store could not be read (for the message).
    """
    found = Diagnosis()
    found.hosts = {r: host for r, (host, _) in roster.items()}
    others = [r for r in range(world_size) if r != rank]
    frozen: dict[int, str] = {}
    for other, (host, pid) in roster.items():
        if other == rank or host != HOST:
            continue
        state = process_state(pid)
        if state is None:
            found.left[other] = f'rank {other} (pid {pid} on {host}, this host) ended'
        elif state in ('T', 't'):
            frozen[other] = f'rank {other} (pid {pid} on {host}, this host) is stopped (SIGSTOP)'
    if reads is None:
        found.unreachable.update(frozen)
        remote: dict[str, list[int]] = {}
        for other in others:
            if other not in found.left and other not in frozen:
                remote.setdefault(roster.get(other, ('an unknown host', 0))[0], []).append(other)
        where = '; '.join(f'{host}: {_ranks_text(ranks)}' for host, ranks in sorted(remote.items()))
        found.unknown = (
            f'cannot tell which other ranks are missing: the rendezvous store did not answer '
            f'({store_problem or "no store"}), so this host ({HOST}) may be the one cut off'
            + (f'; the other ranks are {where}' if where else '')
        )
        return found
    (_, first, _), (_, last, byes) = reads
    one_read = reads[0] is reads[1]  # who left and who is behind; silence needs two reads
    now = time.time()
    silent: list[int] = []
    since = []
    for other in others:
        beat = last.get(other)
        ended = other in found.left or other in byes
        if ended and beat is not None and beat.sequences.get(group_id, 0) >= sequence:
            found.left.pop(other, None)  # it reached this collective and ended since (it failed too): not the cause
            since.append(other)
            continue
        if other in found.left or (one_read and other not in byes and other not in last):
            continue
        if other in byes:
            found.left[other] = f'rank {other} on {found.hosts.get(other, "?")} ended (it said goodbye at exit)'
            continue
        before, after = first.get(other), last.get(other)
        if other in frozen or (not one_read and (after is None or before is None or after.count == before.count)):
            silent.append(other)
            continue
        assert after is not None  # one read: `other` is in `last` (skipped above otherwise); two: checked just above
        reached = after.sequences.get(group_id, 0)
        if reached < sequence:
            idle = after.idle + max(now - after.wall, 0.0)
            host = found.hosts.get(other, '?')
            if after.waiting:
                found.late[other] = (
                    f'rank {other} on {host} is alive but waits in an earlier logging collective '
                    f'(#{reached}; this is #{sequence})'
                )
            else:
                found.late[other] = (
                    f'rank {other} on {host} is alive but has not entered a logging collective '
                    f'for {idle:.0f} s (it reached #{reached}; this is #{sequence})'
                )
    if since:
        found.notes.append(f'{_ranks_text(since)} reached this collective and ended since')
    if one_read:
        found.notes.append('a peer closed its connection; silence not examined (one store read)')
    by_host: dict[str, list[int]] = {}
    for other in others:
        by_host.setdefault(found.hosts.get(other, '?'), []).append(other)
    host_texts: dict[str, str] = {}
    for other in silent:
        host = found.hosts.get(other, '?')
        beat = last.get(other) or first.get(other)
        quiet = f'for {now - beat.wall:.0f} s' if beat is not None else 'since the start'
        if other in frozen:
            found.unreachable[other] = frozen[other]
        elif host != '?' and host != HOST and all(r in silent or r in found.left for r in by_host[host]):
            if host not in host_texts:  # one sentence per host (its first silent rank's silence), said once
                ranks = [r for r in by_host[host] if r in silent]
                host_texts[host] = (
                    f'host {host} ({_ranks_text(ranks)}) silent {quiet}: cut off, frozen, or every process on it ended'
                )
            found.unreachable[other] = host_texts[host]
        else:
            found.unreachable[other] = (
                f'rank {other} on {host} silent {quiet} while other ranks answer: its process froze or ended'
            )
    return found
