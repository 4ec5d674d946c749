"""SerialWorker: ordered background jobs, recorded failures, back-pressure, draining close."""

import threading

import pytest

from dist_logging.worker import SerialWorker


def test_runs_jobs_in_order_and_close_drains_the_queue():
    worker = SerialWorker('test')
    gate = threading.Event()
    done = []
    worker.submit(lambda: gate.wait(30))
    for index in range(100):
        worker.submit(lambda index=index: done.append(index))
    assert done == []  # held by the first job: submit never waited for a job to run
    gate.set()
    assert worker.close() and done == list(range(100))
    with pytest.raises(RuntimeError, match='closed'):
        worker.submit(lambda: None)
    assert worker.close()  # idempotent


def test_failures_are_recorded_and_raised_once_with_the_first_as_cause():
    worker = SerialWorker('tracker')
    ran = []

    def fail(message):
        raise OSError(message)

    worker.submit(lambda: fail('first'))
    worker.submit(lambda: fail('second'))
    worker.submit(lambda: ran.append(True))  # later jobs still run
    worker.close()
    with pytest.raises(RuntimeError, match=r'tracker: 2 background call\(s\) failed; first: OSError: first') as info:
        worker.raise_errors()
    assert isinstance(info.value.__cause__, OSError) and any('second' in note for note in info.value.__notes__)
    assert ran == [True]
    worker.raise_errors()  # reported once


def test_a_full_queue_makes_submit_wait_for_room():
    worker = SerialWorker('test', max_queue=1)
    gate = threading.Event()
    worker.submit(lambda: gate.wait(30))  # running
    worker.submit(lambda: None)  # queued: the queue is full now
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (worker.submit(lambda: None), returned.set()))
    thread.start()
    assert not returned.wait(0.2)  # back-pressure: waits rather than dropping or growing
    gate.set()
    assert returned.wait(30)
    thread.join()
    assert worker.close()
