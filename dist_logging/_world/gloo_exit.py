"""At interpreter exit, let gloo's worker threads go idle before Python finalizes.

Why: torch (2.13 at least) stashes a Python object in thread-local state for every
``backward()`` (``torch.autograd.graph._engine_run_backward``), and a gloo collective
enqueued during backward -- DDP's gradient all-reduce, FSDP's reduce-scatter -- copies that
state into its work item. A gloo worker thread (``pt_gloo_runloop``) drops the item just
*after* completing it, and dropping it takes the GIL. When the training thread has meanwhile
reached interpreter finalization (a short script, a loaded machine), that GIL acquisition
ends the worker thread with a forced unwind through C++ code that may not be unwound, and the
process aborts ("terminate called without an active exception", SIGABRT) after the script
itself succeeded -- torchrun then reports the whole job as failed. ``destroy_process_group()``
does not prevent it: DDP keeps the group (and its threads) alive until exit.

The wait is bounded (2 s), costs a few reads of ``/proc`` 10 ms apart when gloo threads exist
and nothing otherwise, and only runs on Linux (where thread names, states and CPU times are
readable).
"""

from __future__ import annotations

import atexit
import os
import time

__all__ = ['wait_for_idle_gloo_workers']

_GLOO_WORKER_NAME = 'pt_gloo_runloop'
_TASKS = '/proc/self/task'
_IDLE_POLLS = 3  # consecutive polls with every worker asleep and not run since the previous poll
_POLL_SECONDS = 0.01  # the sleep between polls releases the GIL, so a worker waiting for it can run


def _read(path: str) -> bytes:
    with open(path, 'rb') as handle:
        return handle.read()


def _gloo_workers() -> dict[str, tuple[str, int]]:
    """Each gloo worker thread: tid -> (scheduler state letter, CPU time used so far).

    The state alone cannot tell an idle worker from one waiting for the GIL (both 'S'), so the
    CPU time is compared between polls: nanoseconds from ``schedstat``, else clock ticks from ``stat``.
    """
    workers: dict[str, tuple[str, int]] = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return workers
    for tid in tids:
        try:
            stat = _read(f'{_TASKS}/{tid}/stat')
        except OSError:  # the thread ended between the listing and the read
            continue
        # "tid (comm) state ...": comm may hold spaces or parentheses, so split at the last ')'.
        head, _, rest = stat.rpartition(b')')
        fields = rest.split()
        if head.partition(b'(')[2].decode(errors='replace') != _GLOO_WORKER_NAME or not fields:
            continue
        try:
            cpu = int(_read(f'{_TASKS}/{tid}/schedstat').split()[0])
        except (OSError, IndexError, ValueError):
            cpu = sum(int(value) for value in fields[11:13]) if len(fields) >= 13 else 0  # utime + stime
        workers[tid] = (fields[0].decode(), cpu)
    return workers


def wait_for_idle_gloo_workers(timeout: float = 2.0) -> bool:
    """Wait until every gloo worker thread of this process is idle; True if they are.

    Idle: asleep, and not run at all, on several polls in a row with the GIL released between
    them. Returns at once (True) when the process has no gloo worker threads or ``/proc`` is not
    readable. Returns False after ``timeout`` seconds if a worker stayed busy; nothing is raised.
    A worker blocked in the network (a collective left in flight) counts as idle.

    Raises:
        ValueError: ``timeout`` is negative or not a number.
    """
    if not timeout >= 0:
        raise ValueError(f'timeout must be a non-negative number of seconds, got {timeout!r}')
    deadline = time.monotonic() + timeout
    idle_polls, previous = 0, None
    while True:
        workers = _gloo_workers()
        if not workers:
            return True
        cpu_times = {tid: cpu for tid, (_, cpu) in workers.items()}
        asleep = all(state == 'S' for state, _ in workers.values())
        idle_polls = idle_polls + 1 if asleep and cpu_times == previous else 0
        if idle_polls >= _IDLE_POLLS:
            return True
        if time.monotonic() >= deadline:
            return False
        previous = cpu_times
        time.sleep(_POLL_SECONDS)


atexit.register(wait_for_idle_gloo_workers)
