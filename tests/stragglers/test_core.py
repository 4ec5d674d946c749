"""The hot path of section timing (dist_logging.stragglers._core): the compiled core, the Python core, and that
they agree.

These run on the real clock (the core's: a timer with a clock of its own always takes the Python path,
which tests/stragglers/test_timer.py covers with a hand-driven clock), so they check relations that hold
whatever the elapsed times are. The last test runs this file and test_timer.py again under the Python core.
"""

import gc
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from dist_logging.stragglers import _core
from dist_logging.stragglers.reporter import NullSection
from dist_logging.stragglers.timer import Section, SectionTimer

CORE = 'compiled' if _core.ACCELERATED else 'python'


def spin(seconds=2e-4):
    end = _core.clock() + seconds
    while _core.clock() < end:
        pass


def test_the_compiled_core_is_built_where_a_compiler_is():
    if os.environ.get('DIST_LOGGING_NO_EXTENSIONS', '').strip() not in ('', '0'):
        assert not _core.ACCELERATED
        pytest.skip('DIST_LOGGING_NO_EXTENSIONS is set: the Python core is in use, as asked')
    if os.name != 'posix' or shutil.which('cc') is None:
        pytest.skip('no C compiler (or not POSIX): the install falls back to the Python core')
    assert _core.ACCELERATED, 'a C compiler is here, but dist_logging/stragglers/_csections.c was not built'
    assert Section.__mro__[1].__module__ == 'dist_logging.stragglers._csections'


def test_timer_reads_the_cores_clock_and_sections_time_inline():
    timer = SectionTimer('cpu', memory=False)
    assert timer._clock is _core.clock
    assert timer.section('forward')._wall  # the core's inline path
    assert not SectionTimer('cpu', memory=False, clock=lambda: 0.0).section('forward')._wall or not _core.ACCELERATED


def test_busy_is_top_level_work_minus_nested_waits_on_the_cores_path():
    timer = SectionTimer('cpu', memory=False)
    data, forward, attention = timer.section('data'), timer.section('forward'), timer.section('attention')
    sync, allreduce = timer.section('sync', wait=True), timer.section('allreduce', wait=True)
    for _ in range(3):
        with data:
            spin()
        with forward:
            spin()
            with attention:  # nested inside the core's outermost frame: the timer's Python path
                spin()
            with sync:
                spin()
        with allreduce:
            spin()
        timer.step()
    totals = timer.take()
    seconds = totals.sections
    assert set(seconds) == {'data', 'forward', 'attention', 'sync', 'allreduce'}
    assert all(value >= 3 * 2e-4 for value in seconds.values()), seconds
    assert seconds['forward'] > seconds['attention'] + seconds['sync']
    assert totals.busy_s == pytest.approx(seconds['data'] + seconds['forward'] - seconds['sync'], rel=1e-9)
    assert totals.wait_s == pytest.approx(seconds['allreduce'], rel=1e-9)
    assert len(totals.per_step_s) == 3 and sum(totals.per_step_s) == pytest.approx(totals.busy_s, rel=1e-9)
    assert timer.take().sections == {}  # a new window: the sections were reset


def test_the_block_exception_propagates_and_the_frame_closes():
    timer = SectionTimer('cpu', memory=False)
    forward = timer.section('forward')
    with pytest.raises(ZeroDivisionError):
        with forward:
            1 / 0
    assert timer.open_sections == []
    assert timer.take().sections['forward'] > 0


def test_open_sections_recursion_and_nesting_errors():
    timer = SectionTimer('cpu', memory=False)
    outer, inner = timer.section('outer'), timer.section('inner')
    with outer:
        assert timer.open_sections == ['outer']
        with outer:  # entered again while open: a nested frame of the same section
            assert timer.open_sections == ['outer', 'outer']
            spin()
        inner.start()
        with pytest.raises(RuntimeError, match="section 'outer' closed while"):
            outer.__exit__(None, None, None)
        inner.stop()
    assert timer.open_sections == []
    totals = timer.take()
    # the section's seconds count both of its frames; busy time only the outermost
    assert 2e-4 < totals.busy_s < totals.sections['outer'] - 2e-4 * 0.99
    assert totals.sections['inner'] > 0


def test_a_decorated_function_and_start_stop_nest_with_the_statement():
    timer = SectionTimer('cpu', memory=False)
    train_step, optimizer = timer.section('train_step'), timer.section('optimizer')

    @train_step  # the decorator opens its frame on the timer's Python path ...
    def train():
        with optimizer:  # ... and the statement inside it sees that frame: nested work
            spin()

    train()
    optimizer.start()  # start()/stop() at the top level: the Python path's outermost frame
    spin()
    optimizer.stop()
    totals = timer.take()
    seconds = totals.sections
    assert seconds['train_step'] > 2e-4 and seconds['optimizer'] > 2 * 2e-4
    # busy: the step frame (with the nested optimizer in it, counted once) and the top-level optimizer frame
    assert seconds['train_step'] + 2e-4 < totals.busy_s < seconds['train_step'] + seconds['optimizer']
    assert timer.open_sections == []


def test_null_section_does_nothing_and_passes_exceptions():
    section = NullSection('forward', wait=True)
    with section as entered:
        assert entered is section
    with pytest.raises(KeyError):
        with section:
            raise KeyError('x')
    assert section.name == 'forward' and section.wait is True


def test_the_hot_path_leaks_nothing_and_cycles_are_collected():
    timer = SectionTimer('cpu', memory=False)
    work, wait = timer.section('forward'), timer.section('sync', wait=True)
    references = (sys.getrefcount(work), sys.getrefcount(wait), sys.getrefcount(timer))
    for _ in range(1000):  # warm up the allocators
        with work:
            pass
        with wait:
            pass
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100_000):
            with work:
                pass
            with wait:
                pass
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f'{grown} bytes kept by 200,000 section entries'
    assert (sys.getrefcount(work), sys.getrefcount(wait), sys.getrefcount(timer)) == references
    del work, wait, timer

    def count():
        gc.collect()
        return sum(type(obj) in (Section, SectionTimer) for obj in gc.get_objects())

    baseline = count()
    for _ in range(50):  # timer -> its sections -> timer: a cycle only the collector frees
        timer = SectionTimer('cpu', memory=False)
        with timer.section('a'):
            pass
        del timer
    assert count() <= baseline


@pytest.mark.skipif(not _core.ACCELERATED, reason='the compiled core is not built: this run is the Python core')
def test_the_same_tests_pass_on_the_python_core():
    here = Path(__file__).parent
    env = dict(os.environ, DIST_LOGGING_NO_EXTENSIONS='1')
    done = subprocess.run(
        [
            sys.executable,
            '-m',
            'pytest',
            '-q',
            '-p',
            'no:xdist',
            '-p',
            'no:cacheprovider',
            str(here / 'test_core.py'),
            str(here / 'test_timer.py'),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ' passed' in done.stdout
