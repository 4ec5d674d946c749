"""Section timing on one rank (dist_logging.stragglers.timer): nesting, wait sections, busy time, CUDA events read
later."""

import pytest

from dist_logging.stragglers.timer import SectionTimer, _DeviceEvents, check_section_name


class Clock:
    """A clock the test advances by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def tick(self, seconds):
        self.now += seconds


def test_busy_is_top_level_work_minus_nested_waits():
    clock = Clock()
    timer = SectionTimer('cpu', memory=False, clock=clock)
    for _ in range(2):
        with timer.section('data'):
            clock.tick(1.0)
        with timer.section('forward'):
            clock.tick(2.0)
            with timer.section('attention'):  # nested work: counted once, in forward
                clock.tick(0.5)
            with timer.section('sync', wait=True):  # a wait inside work is not busy
                clock.tick(3.0)
        with timer.section('allreduce', wait=True):
            clock.tick(4.0)
        timer.step()
    totals = timer.take()
    assert totals.steps == 2
    assert totals.busy_s == pytest.approx(2 * (1.0 + 2.5))
    assert totals.wait_s == pytest.approx(2 * 4.0)
    assert totals.sections == pytest.approx(
        {'data': 2.0, 'forward': 11.0, 'attention': 1.0, 'sync': 6.0, 'allreduce': 8.0}
    )
    assert totals.wall_s == pytest.approx(2 * 10.5)
    again = timer.take()  # a new window
    assert again.steps == 0 and again.sections == {} and again.busy_s == 0.0


def test_without_work_sections_busy_is_wall_minus_waits_and_collectives():
    clock = Clock()
    timer = SectionTimer('cpu', memory=False, clock=clock)
    clock.tick(10.0)
    with timer.section('barrier', wait=True):
        clock.tick(2.0)
    timer.add_collective(1.5)
    totals = timer.take()
    assert totals.busy_s == pytest.approx(12.0 - 2.0 - 1.5)


def test_decorator_start_stop_and_reuse():
    clock = Clock()
    timer = SectionTimer('cpu', memory=False, clock=clock)

    @timer.section('train')
    def step(x):
        clock.tick(x)
        return x * 2

    assert step(1.0) == 2.0
    with pytest.raises(ZeroDivisionError):
        timer.section('train')(lambda: 1 / 0)()
    section = timer.section('optimizer')
    assert timer.section('optimizer') is section
    section.start()
    clock.tick(0.25)
    section.stop()
    section.stop()  # an unmatched stop (a hook fired alone) does nothing
    assert timer.take().sections == pytest.approx({'train': 1.0, 'optimizer': 0.25})


def test_sections_must_nest():
    timer = SectionTimer('cpu', memory=False)
    outer, inner = timer.section('outer'), timer.section('inner')
    outer.start()
    inner.start()
    with pytest.raises(RuntimeError, match="section 'outer' closed while"):
        outer.stop()


@pytest.mark.parametrize(
    'name, error', [('', ValueError), ('a/b', ValueError), ('busy', ValueError), ('x' * 65, ValueError), (3, TypeError)]
)
def test_bad_section_names(name, error):
    with pytest.raises(error):
        check_section_name(name)
    with pytest.raises(ValueError, match='device'):
        SectionTimer('tpu')


class FakeEvent:
    """Stands in for torch.cuda.Event: 'completes' when the test says so; times are given."""

    clock = 0.0

    def __init__(self):
        self.done = False
        self.at = None

    def record(self):
        self.at = FakeEvent.clock
        self.done = False

    def query(self):
        return self.done

    def elapsed_time(self, end):
        assert end.done, 'elapsed_time read before the event completed (that would synchronize)'
        return (end.at - self.at) * 1000.0


def test_device_events_are_read_only_once_completed_and_pooled():
    created = []

    def factory():
        created.append(FakeEvent())
        return created[-1]

    events = _DeviceEvents(factory)
    start = events.record()
    FakeEvent.clock = 0.002
    events.finish(start, 'forward', 1, False)
    assert events.completed() == []  # not completed: left for a later report, no waiting
    for event in created:
        event.done = True
    assert events.completed() == [('forward', pytest.approx(0.002), 1, False)]
    events.record()
    assert len(created) == 2  # the pair went back to the pool


def test_busy_per_step_is_the_median_step_so_a_descheduled_step_is_not_a_slowdown():
    clock = Clock()
    timer = SectionTimer('cpu', memory=False, clock=clock)
    for seconds in (1.0, 1.0, 50.0, 1.0, 1.0):  # one step descheduled for 50 s
        with timer.section('forward'):
            clock.tick(seconds)
        timer.step()
    totals = timer.take()
    assert totals.busy_median_s == 1.0 and totals.busy_s == pytest.approx(54.0)
    assert totals.busy_mad_s == 0.0  # four of five steps at the median: the window's jitter is nil
    # without work sections, each step's wall time minus its waits
    for wall, wait in ((3.0, 1.0), (3.0, 1.0), (9.0, 1.0)):
        with timer.section('sync', wait=True):
            clock.tick(wait)
        clock.tick(wall - wait)
        timer.step()
    totals = timer.take()
    assert totals.busy_median_s == pytest.approx(2.0) and totals.busy_mad_s == pytest.approx(0.0)
    for seconds in (1.0, 1.2, 0.9, 1.5, 1.0):  # |x - 1.0|: 0, .2, .1, .5, 0 -> median .1
        with timer.section('forward'):
            clock.tick(seconds)
        timer.step()
    totals = timer.take()
    assert totals.busy_median_s == pytest.approx(1.0) and totals.busy_mad_s == pytest.approx(0.1)
