"""A rank's line to the rendezvous store, off the caller's thread: who runs where, who is alive, who is late.

Why a thread: a store that does not answer (its host cut off or frozen) blocks a read for the
store's own timeout (torch's default: 30 minutes; a ``check`` even ignores it), and a signal
handler cannot run while the main thread is inside native code. So every store operation of the
logging groups runs on one daemon thread per process (:class:`StoreLine`), over its own connection
(a clone of the default store's ``TCPStore`` when there is one, so a read stuck on the line never
holds the lock of the connection torch itself uses). A caller waits for an answer on a Python
event, with a deadline, which a signal interrupts. A line whose thread is stuck answers nothing
more: later calls fail at once with :class:`StoreUnreachable`.

What the line writes, one key each per rank, under ``dist_logging/<attempt>/`` (a restarted
torchrun attempt gets clean keys in the agent's store that outlives it):

- ``proc/<rank>`` = ``'host pid'``, once (the roster, which every line reads back in the background
  and keeps, so a rank cut off from the store still knows who ran where);
- ``beat/<rank>`` = ``'count wall-time idle-seconds waiting group:sequence,...'`` every beat period
  (:func:`beat_period`): proof of life, plus how far this rank got in each logging group and for how
  long it has not entered a logging collective;
- ``bye/<rank>`` at interpreter exit (bounded to half a second).

Cost: one store write per rank per beat period, on this thread (the store serves N / period small
writes a second); reading the beats (O(N), one ``multi_get``) happens only after a failure or
during a long wait, never on a healthy step.
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue
import socket
import threading
import time
from typing import Any, Callable, Optional

__all__ = ['StoreLine', 'StoreUnreachable', 'Beat', 'beat_period', 'line_for', 'release', 'process_state']

HOST = socket.gethostname()
#: The longest a caller waits for one answer of the store before calling it unreachable.
STORE_ANSWER_SECONDS = 2.0
_BYE_SECONDS = 0.5
_PF_EXITING = 0x4  # include/linux/sched.h


def beat_period(timeout: float) -> float:
    """Seconds between beats for a group of ``sync_timeout`` ``timeout``: a tenth of it, within 0.5..5 s."""
    return min(max(timeout / 10.0, 0.5), 5.0)


def process_state(pid: int) -> Optional[str]:
    """The scheduler state letter of ``pid`` on this host ('R', 'S', 'T' stopped, ...), None when it has ended.

    A zombie (ended, not yet reaped by its launcher) and a process already exiting (the kernel's
    ``PF_EXITING`` flag: it has closed, or is closing, its sockets) count as ended.
    """
    try:
        with open(f'/proc/{pid}/stat', 'rb') as handle:
            fields = handle.read().rsplit(b')', 1)[1].split()
        state = fields[0].decode()
        return None if state in ('Z', 'X') or int(fields[6]) & _PF_EXITING else state
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return '?'
        return '?'


class StoreUnreachable(RuntimeError):
    """The store did not answer in time (or this rank's line to it is stuck in an earlier call)."""


class Beat:
    """One rank's latest beat as read from the store."""

    __slots__ = ('count', 'wall', 'idle', 'waiting', 'sequences')

    def __init__(self, text: str):
        count, wall, idle, waiting, *rest = text.split(' ')
        self.count, self.wall, self.idle, self.waiting = int(count), float(wall), float(idle), waiting == '1'
        items = (item.partition(':') for item in (rest[0] if rest else '').split(',') if item)
        self.sequences = {int(g): int(s) for g, _, s in items}


class _Call:
    __slots__ = ('fn', 'done', 'result', 'error')

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn, self.done, self.result, self.error = fn, threading.Event(), None, None


def _own_connection(store: Any) -> Any:
    """A new connection to the TCPStore under ``store`` (unwrapping PrefixStores), else ``store`` itself."""
    import torch.distributed as torch_dist

    base = store
    while isinstance(base, torch_dist.PrefixStore):
        base = base.underlying_store
    if isinstance(base, torch_dist.TCPStore):
        try:
            clone = base.clone()  # type: ignore[attr-defined]  # torch's stubs omit TCPStore.clone (it exists)
            clone.set_timeout(datetime.timedelta(seconds=STORE_ANSWER_SECONDS))
            return clone
        except Exception:  # noqa: BLE001 - an older torch: share the connection
            return store
    return store


class StoreLine:
    """This process's line to the store (one daemon thread); see the module docstring.

    Args:
        store: the store (the default group's, or any ``torch.distributed.Store`` in tests).
        rank, world_size: this process's global rank and the world size.
        prefix: the key prefix (``dist_logging/<attempt>/``).
        clone: open a connection of its own (False in tests over a HashStore).
        period: seconds between beats.
    """

    def __init__(self, store: Any, rank: int, world_size: int, prefix: str, clone: bool = True, period: float = 5.0):
        self.rank, self.world_size, self.prefix = rank, world_size, prefix
        self.period = period
        self.identity: Any = None
        self.users = 0  # logging groups using the line (see release)
        self.roster: dict[int, tuple[str, int]] = {rank: (HOST, os.getpid())}
        self.sequences: dict[int, int] = {}  # logging group id -> the collective number it reached
        self.last_entered = time.monotonic()  # when this rank last entered a logging collective
        self.waiting = 0  # logging waits in progress on this process
        self.ticks: list[Callable[[], None]] = []  # run after every beat, on this thread (the postmortem watchdog)
        self._source, self._clone = store, clone
        self._store: Any = None  # this thread's store (its own connection when cloned), made at its first run
        self._calls: 'queue.SimpleQueue[Any]' = queue.SimpleQueue()
        self._busy_since: Optional[float] = None
        self._count = 0
        # name -> fn() returning a value: written as '<prefix><name>/<rank>' at each beat (telemetry).
        self._publishers: dict[str, Callable[[], Optional[str]]] = {}
        self._thread = threading.Thread(target=self._run, name='dist_logging-store', daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the caller's side
    def call(self, fn: Callable[[Any], Any], timeout: float = STORE_ANSWER_SECONDS) -> Any:
        """Run ``fn(store)`` on the line's thread and return its result within ``timeout`` seconds.

        Raises:
            StoreUnreachable: no answer within ``timeout``, or the line is stuck in an earlier call.
            Exception: what ``fn`` raised.
        """
        busy = self._busy_since
        if busy is not None and time.monotonic() - busy > timeout:
            raise StoreUnreachable(f'the store has not answered an earlier call for {time.monotonic() - busy:.1f} s')
        call = self.submit(fn)
        if not call.done.wait(timeout):
            raise StoreUnreachable(f'the store did not answer within {timeout:g} s')
        if call.error is not None:
            raise call.error
        return call.result

    def submit(self, fn: Callable[[Any], Any]) -> _Call:
        """Queue ``fn(store)`` for the line's thread; the returned call's ``done`` is set when it ran."""
        call = _Call(fn)
        self._calls.put(call)
        return call

    def entered(self, group_id: int, sequence: int) -> None:
        """This rank entered collective number ``sequence`` of logging group ``group_id`` (no store call)."""
        self.sequences[group_id] = sequence
        self.last_entered = time.monotonic()

    def add_publisher(self, name: str, fn: Callable[[], Optional[str]]) -> None:
        """At each beat, also write ``fn()`` (unless None) as ``<prefix><name>/<rank>`` (on the line's thread).

        ``fn`` must be quick and must not block; an exception it raises skips its write for that beat.
        """
        self._publishers = {**self._publishers, name: fn}

    def remove_publisher(self, name: str) -> None:
        """Stop writing ``name`` (no error when it is not published)."""
        self._publishers = {k: v for k, v in self._publishers.items() if k != name}

    def read_values(self, store: Any, keys: list[str]) -> list[Optional[bytes]]:
        """(On the line's thread, e.g. in a :meth:`call`.) The values of ``keys``, None for a missing key."""
        return self._read(store, keys)

    def read_beats(self, store: Any) -> tuple[float, dict[int, Beat], set[int]]:
        """(On the line's thread.) ``(monotonic time, rank -> latest beat, ranks that said bye)``."""
        ranks = [r for r in range(self.world_size) if r != self.rank]
        beats = dict(zip(ranks, self._read(store, [f'{self.prefix}beat/{r}' for r in ranks])))
        byes = self._read(store, [f'{self.prefix}bye/{r}' for r in ranks])
        return (
            time.monotonic(),
            {r: Beat(v.decode()) for r, v in beats.items() if v is not None},
            {r for r, v in zip(ranks, byes) if v is not None},
        )

    # ------------------------------------------------------------------ the line's thread
    def stop(self) -> None:
        """End the line's thread after the call it is in (a line replaced by a new default store's)."""
        self._calls.put(None)

    def _run(self) -> None:
        last_beat = -float('inf')
        while True:
            try:
                call = self._calls.get(timeout=max(last_beat + self.period - time.monotonic(), 0.0))
                if call is None:
                    return
            except queue.Empty:
                call = None
            self._busy_since = time.monotonic()
            try:
                if self._store is None:
                    self._store = _own_connection(self._source) if self._clone else self._source
                    self._store.set(f'{self.prefix}proc/{self.rank}', f'{HOST} {os.getpid()}')
                if call is not None:
                    try:
                        call.result = call.fn(self._store)
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        call.error = exc
                    call.done.set()
                if time.monotonic() >= last_beat + self.period:
                    last_beat = time.monotonic()
                    self._beat()
            except Exception:  # noqa: BLE001 - a store hiccup: the next beat tries again
                last_beat = time.monotonic()
            finally:
                self._busy_since = None
            for tick in list(self.ticks):  # cheap checks (a postmortem watchdog starts its own thread to capture)
                try:
                    tick()
                except Exception:  # noqa: BLE001 - a watcher's failure must not stop the beats
                    pass

    def _beat(self) -> None:
        self._count += 1
        idle = 0.0 if self.waiting else time.monotonic() - self.last_entered
        sequences = ','.join(f'{g}:{s}' for g, s in sorted(self.sequences.items()))
        self._store.set(
            f'{self.prefix}beat/{self.rank}',
            f'{self._count} {time.time():.3f} {idle:.3f} {int(bool(self.waiting))} {sequences}',
        )
        for name, fn in self._publishers.items():
            try:
                value = fn()
            except Exception:  # noqa: BLE001 - a publisher's bug must not stop the beats
                continue
            if value is not None:
                self._store.set(f'{self.prefix}{name}/{self.rank}', value)
        self.read_roster(self._store)

    def read_roster(self, store: Any) -> None:
        """(On the line's thread.) Read the ``proc`` keys of the ranks not in the roster yet."""
        if len(self.roster) < self.world_size:
            missing = [r for r in range(self.world_size) if r not in self.roster]
            for rank, value in zip(missing, self._read(store, [f'{self.prefix}proc/{r}' for r in missing])):
                if value is not None:
                    host, _, pid = value.decode().partition(' ')
                    self.roster[rank] = (host, int(pid))

    @staticmethod
    def _read(store: Any, keys: list[str]) -> list[Optional[bytes]]:
        """The values of ``keys`` (None for a missing key): one ``multi_get`` when all exist."""
        if not keys:
            return []
        if store.check(keys):
            return list(store.multi_get(keys))
        return [store.get(key) if store.check([key]) else None for key in keys]

    def say_bye(self) -> None:
        """Write this rank's ``bye`` key (at exit; waits at most half a second)."""
        try:
            self.call(lambda store: store.set(f'{self.prefix}bye/{self.rank}', '1'), _BYE_SECONDS)
        except Exception:  # noqa: BLE001 - the process is ending
            pass


_LINE: Optional[StoreLine] = None
_LINE_LOCK = threading.Lock()


def _identity(store: Any) -> Any:
    """What names the store a line talks to: the TCPStore's address (Python wrappers come and go)."""
    import torch.distributed as torch_dist

    base = store
    while isinstance(base, torch_dist.PrefixStore):
        base = base.underlying_store
    if isinstance(base, torch_dist.TCPStore):
        return (base.host, base.port)
    return id(base)


def line_for(store: Any, rank: int, world_size: int, attempt: str, period: float) -> StoreLine:
    """The process's one line to ``store`` (made on first use; a new default store gets a new line).

    One line per process, whatever the number of Loggers: each rank has one beat key, and its beat
    carries every logging group's progress. ``period`` lowers the beat period (never raises it).
    """
    global _LINE
    with _LINE_LOCK:
        identity = (_identity(store), rank, world_size, attempt)
        line = _LINE
        if line is None or line.identity != identity:
            if line is not None:
                line.stop()
            line = _LINE = StoreLine(store, rank, world_size, f'dist_logging/{attempt}/', period=period)
            line.identity = identity
        elif period < line.period:
            line.period = period
            line.submit(lambda store: None)  # wake the thread: the next beat comes sooner
        line.users += 1
        return line


def release(line: StoreLine) -> None:
    """A logging group is done with ``line``; the last one out ends its thread (no thread outlives the Loggers)."""
    global _LINE
    with _LINE_LOCK:
        line.users -= 1
        if line.users > 0:
            return
        line.stop()
        if _LINE is line:
            _LINE = None
    line._thread.join(timeout=_BYE_SECONDS)  # ends at once unless a store call is stuck (it is a daemon)


@atexit.register
def _say_bye() -> None:
    if _LINE is not None:
        _LINE.say_bye()
