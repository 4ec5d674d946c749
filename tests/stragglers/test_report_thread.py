"""The report thread: jobs run in order off the calling thread, results and failures come back in order."""

import threading
import time

import pytest

from dist_logging.stragglers._report_thread import ReportThread


def test_jobs_run_in_order_on_their_own_thread_and_failures_come_back_in_place():
    ran_on = []

    def run(value):
        ran_on.append(threading.current_thread().name)
        time.sleep(0.01)
        if value == 2:
            raise ValueError('job 2 failed')
        return value * 10

    jobs = ReportThread(run, 'test-report-thread')
    assert not jobs.ready() and jobs.outstanding == 0
    with pytest.raises(LookupError):
        jobs.result()
    for value in (1, 2, 3):
        jobs.submit(value)
    assert jobs.outstanding == 3
    assert jobs.result(timeout=10) == 10
    with pytest.raises(ValueError, match='job 2 failed'):
        jobs.result(timeout=10)
    assert jobs.result(timeout=10) == 30
    assert ran_on == ['test-report-thread'] * 3
    jobs.close(timeout=10)
    assert not any(t.name == 'test-report-thread' for t in threading.enumerate())
    with pytest.raises(RuntimeError, match='closed'):
        jobs.submit(4)
    jobs.close()  # idempotent


def test_ready_never_waits_and_result_times_out():
    release = threading.Event()
    jobs = ReportThread(lambda: release.wait(10), 'test-report-thread-wait')
    jobs.submit()
    assert not jobs.ready()
    with pytest.raises(TimeoutError, match='test-report-thread-wait'):
        jobs.result(timeout=0.05)
    release.set()
    deadline = time.monotonic() + 10
    while not jobs.ready() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert jobs.ready() and jobs.result() is True
    jobs.close(timeout=10)


def test_close_finishes_the_queued_jobs():
    done = []
    jobs = ReportThread(lambda value: done.append(value), 'test-report-thread-close')
    for value in range(5):
        jobs.submit(value)
    jobs.close(timeout=10)
    assert done == [0, 1, 2, 3, 4] and jobs.outstanding == 0
