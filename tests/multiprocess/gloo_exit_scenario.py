"""Run under torchrun (2 processes): rank 0 exits while a gloo worker thread is still releasing a work
item that was enqueued during backward (the torch race dist_logging._gloo_exit waits out).

Argument ``with-hook`` keeps dist_logging's exit-time wait; ``without-hook`` unregisters it (the case
that must abort, proving the scenario reproduces the race). Rank 0 writes ``$OUT_DIR/rank0.json``
before it exits: the name of the thread that ran the release.

How the race is made certain rather than likely: a context variable holds an object whose
``__del__`` runs for 0.8 s. backward() stashes a copy of the context in thread-local state, the
all-reduce enqueued by a backward hook copies that state into its work item, and once the main
thread dropped its own references, the gloo worker that completes the item frees the last copy:
the ``__del__`` runs on that worker. Rank 0's main thread exits as soon as it started.
"""

import atexit
import contextvars
import sys
import threading
import time

import torch
import torch.distributed as dist

from dist_logging._world import gloo_exit as _gloo_exit
from torchrun_helper import dump_rank_output

RELEASE_SECONDS = 0.8


class ReleasedOnTheGlooWorker:
    started = threading.Event()
    thread_name = None

    def __del__(self):
        type(self).thread_name = threading.current_thread().name
        type(self).started.set()
        end = time.monotonic() + RELEASE_SECONDS
        while time.monotonic() < end:
            time.sleep(0.002)  # each wake-up takes the GIL again: fatal once finalization began


def main():
    if sys.argv[1] == 'without-hook':
        atexit.unregister(_gloo_exit.wait_for_idle_gloo_workers)
    dist.init_process_group('gloo')
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 1:
        store.wait(['backward-done'])
        dist.all_reduce(torch.ones(1))  # completes rank 0's all-reduce, on rank 0's gloo worker
        return
    payload = contextvars.ContextVar('payload')
    payload.set(ReleasedOnTheGlooWorker())
    leaf = torch.ones(2, requires_grad=True)

    def enqueue_all_reduce(grad):
        dist.all_reduce(torch.ones(1), async_op=True)  # the handle is dropped: the worker holds the item
        return grad

    leaf.register_hook(enqueue_all_reduce)
    (leaf * 2).sum().backward()
    payload.set(None)  # the stashed copy is now the last holder of the object
    store.set('backward-done', '1')
    if not ReleasedOnTheGlooWorker.started.wait(60):
        raise RuntimeError('the context copy was not released by a gloo worker within 60 s')
    dump_rank_output({'released_on': ReleasedOnTheGlooWorker.thread_name})


if __name__ == '__main__':
    main()
