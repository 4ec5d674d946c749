"""Heartbeats and node samples through a real torch store, written and read by store lines (no collective)."""

from __future__ import annotations

import time

import torch.distributed as torch_dist

from dist_logging.dist._watch import StoreLine
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
