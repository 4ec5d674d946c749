"""Heartbeats and node samples through a real torch store, written and read by store lines (no collective)."""

from __future__ import annotations

import time

import pytest
import torch.distributed as torch_dist

from dist_logging._world.watch import StoreLine
from dist_logging.telemetry import RankRecord, StoreBoard
from dist_logging.telemetry.heartbeats import format_rank_record, parse_rank_record


def test_a_record_round_trips():
    record = RankRecord(12, 1700000000.125, 'node-3', 2, 4096, 1699999990.5)
    assert parse_rank_record(format_rank_record(record)) == record


def test_rank_zero_reads_every_rank_and_node_from_the_store():
    store = torch_dist.HashStore()
    lines = [StoreLine(store, rank, 2, 'p/', clone=False, period=0.1) for rank in (0, 1)]
    try:
        progress = {'step': 5}
        one = StoreBoard(lines[1], 1, 2, lambda: RankRecord(progress['step'], 1000.0, 'node-b', 1, 10, 990.0))
        zero = StoreBoard(lines[0], 0, 2, lambda: RankRecord(0, 0.0, 'node-a'))
        one.publish_node(1, {'cpu_percent': 42.0}, 'node-b', 1000.0)
        deadline = time.monotonic() + 10
        records, ok = zero.read_ranks()
        while 1 not in records and time.monotonic() < deadline:
            time.sleep(0.05)
            records, ok = zero.read_ranks()
        assert ok and records == {1: RankRecord(5, 1000.0, 'node-b', 1, 10, 990.0)}
        progress['step'] = 6  # published at the next beat
        while zero.read_ranks()[0][1].step != 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert zero.read_ranks()[0][1].step == 6
        nodes = zero.read_nodes(2)
        assert nodes == [{'host': 'node-b', 'wall': 1000.0, 'metrics': {'cpu_percent': 42.0}}]
        one.close()  # stops publishing: rank zero keeps the last record, whose wall no longer moves
        progress['step'] = 7
        time.sleep(0.4)
        assert zero.read_ranks()[0][1].step == 6
    finally:
        for line in lines:
            line.stop()


def test_a_second_nodes_samples_and_progress_reach_rank_zero_through_the_store():
    """Two nodes' telemetry in one process, over one store (each with its own store line, as two hosts would)."""
    pytest.importorskip('psutil', reason='pip install "dist-logging[system]"')
    from dist_logging.telemetry import Telemetry, TelemetryOptions

    store = torch_dist.HashStore()
    lines = [StoreLine(store, rank, 2, 'p/', clone=False, period=0.1) for rank in (0, 1)]
    options = TelemetryOptions(system_metrics_every=0.1)
    common = dict(world_size=2, local_rank=0, num_nodes=2, uploaders=lambda: [])
    zero = Telemetry(options, lines[0], rank=0, node_rank=0, host='node-a', **common)
    one = Telemetry(options, lines[1], rank=1, node_rank=1, host='node-b', **common)
    try:
        one.batch_end(3)
        emitted: dict = {}
        deadline = time.monotonic() + 20
        while not {'system/node-a/cpu_percent', 'system/node-b/cpu_percent'} <= set(emitted):
            assert time.monotonic() < deadline, sorted(emitted)
            time.sleep(0.05)
            emitted.update(zero.batch_end(1) or {})
        assert emitted['system/node-b/memory_used_bytes'] > 0
        assert one.batch_end(4) is None  # only rank zero hands samples to destinations
        while True:
            samples = {(s.name, s.labels.get('rank'), s.labels.get('host')): s.value for s in zero.samples()}
            if samples.get(('dist_logging_step', '1', 'node-b')) == 4.0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert samples[('dist_logging_step', '1', 'node-b')] == 4.0
        assert samples[('dist_logging_step', '0', 'node-a')] == 1.0
        assert samples[('dist_logging_system_cpu_percent', None, 'node-b')] >= 0
    finally:
        one.close()
        zero.close()
        for line in lines:
            line.stop()
