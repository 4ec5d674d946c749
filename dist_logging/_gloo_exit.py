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

The wait is bounded, costs a few reads of ``/proc`` when gloo threads exist and nothing
otherwise, and only runs on Linux (where the thread names and states are readable).
"""

from __future__ import annotations

import atexit
import os
import time

__all__ = ['wait_for_idle_gloo_workers']

_GLOO_WORKER_NAME = 'pt_gloo_runloop'
_TASKS = '/proc/self/task'
_IDLE_POLLS = 3  # consecutive polls with every worker asleep; the sleeps between them release the GIL
_POLL_SECONDS = 0.01


def _gloo_worker_states() -> list[str]:
    """The scheduler state letter ('R' running or runnable, 'S' asleep, ...) of each gloo worker thread."""
    states = []
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return states
    for tid in tids:
        try:
            with open(f'{_TASKS}/{tid}/stat', 'rb') as handle:
                stat = handle.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        # "tid (comm) state ...": comm may hold spaces or parentheses, so split at the last ')'.
        head, _, rest = stat.rpartition(b')')
        name = head.partition(b'(')[2].decode(errors='replace')
        if name == _GLOO_WORKER_NAME and rest.split():
            states.append(rest.split()[0].decode())
    return states


def wait_for_idle_gloo_workers(timeout: float = 2.0) -> bool:
    """Wait until every gloo worker thread of this process is asleep (idle); True if they are.

    Returns at once (True) when the process has no gloo worker threads or ``/proc`` is not
    readable. Returns False after ``timeout`` seconds if a worker stayed busy (e.g. a
    collective still in flight at exit); nothing is raised.

    Raises:
        ValueError: ``timeout`` is negative or not a number.
    """
    if not timeout >= 0:
        raise ValueError(f'timeout must be a non-negative number of seconds, got {timeout!r}')
    deadline = time.monotonic() + timeout
    idle_polls = 0
    while True:
        states = _gloo_worker_states()
        if not states:
            return True
        idle_polls = idle_polls + 1 if all(state == 'S' for state in states) else 0
        if idle_polls >= _IDLE_POLLS:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_SECONDS)


atexit.register(wait_for_idle_gloo_workers)
