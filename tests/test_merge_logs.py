"""The merger behind `dist-logging logs`: parsing, time order, collapsing, filters, FileLogger files,
bounded memory, and --follow."""

from __future__ import annotations

import io
import json
import pathlib
import re
import threading
import time
import tracemalloc

import pytest

from dist_logging import Logger
from dist_logging._log_line import format_record, utc_iso
from dist_logging._cli_logs.merge import Collapser, follow_logs, merge_logs
from dist_logging._cli_logs.sources import Record, find_log_files, format_ranks, parse_ranks
from dist_logging.destinations import FileLogger

pytestmark = pytest.mark.timeout(60)
T0 = 1_795_000_000.0  # some time in 2026


def write_log(path: pathlib.Path, records) -> pathlib.Path:
    """records: (seconds after T0, rank, level, logger, message), written as setup_logging writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'a', encoding='utf-8') as handle:
        for offset, rank, level, logger, message in records:
            handle.write(format_record(T0 + offset, rank, level, logger, message) + '\n')
    return path


def stamp(offset: float) -> str:
    """How the merged view shows the time ``T0 + offset``."""
    return utc_iso(T0 + offset)[:-3] + 'Z'


def merged(*paths, **options) -> list[str]:
    out = io.StringIO()
    merge_logs([str(p) for p in paths], out, **options)
    return out.getvalue().splitlines()


# ---------------------------------------------------------------------------- ranks
def test_parse_and_format_ranks():
    assert parse_ranks('0,3-5') == {0, 3, 4, 5}
    assert parse_ranks(' 7 , 2 - 3 ') == {2, 3, 7}
    assert format_ranks({0, 2, 3, 4, 5, 7}) == '0,2-5,7'
    assert format_ranks([3]) == '3' and format_ranks([1, 0]) == '0-1'
    for bad, message in (
        ('', "'' is not a rank"),
        ('a', "'a' is not a rank"),
        ('5-3', 'ends before it starts'),
        ('-1', "'-1' is not a rank"),
        ('1,,2', "'' is not a rank"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_ranks(bad)


# ---------------------------------------------------------------------------- collapsing and order
def test_identical_records_collapse_and_others_keep_their_rank(tmp_path):
    for rank in range(4):
        records = [(0.1 * rank, rank, 'INFO', 'train', 'epoch 1 starts')]
        if rank != 1:
            records.append((1 + 0.1 * rank, rank, 'WARNING', 'data', 'slow shard'))
        if rank == 2:
            records.append((1.5, 2, 'INFO', 'train', 'rank 2 only'))
        if rank == 3:
            records.append((30, 3, 'INFO', 'train', 'epoch 1 starts'))  # same text, far later: its own line
        write_log(tmp_path / f'py-rank{rank}.log', records)
    lines = merged(tmp_path)
    assert lines == [
        f'[ranks 0-3] {stamp(0)} INFO train: epoch 1 starts',
        f'[ranks 0,2-3] {stamp(1)} WARNING data: slow shard',
        f'[rank 2] {stamp(1.5)} INFO train: rank 2 only',
        f'[rank 3] {stamp(30)} INFO train: epoch 1 starts',
    ]
    assert len(merged(tmp_path, collapse=False)) == 4 + 3 + 1 + 1
    assert merged(tmp_path, window=0.05)[0] == f'[rank 0] {stamp(0)} INFO train: epoch 1 starts'


def test_same_rank_twice_is_two_lines_and_other_ranks_join_the_first(tmp_path):
    write_log(tmp_path / 'a-rank0.log', [(0, 0, 'INFO', 'x', 'tick'), (0.5, 0, 'INFO', 'x', 'tick')])
    write_log(tmp_path / 'a-rank1.log', [(0.2, 1, 'INFO', 'x', 'tick'), (0.7, 1, 'INFO', 'x', 'tick')])
    assert [line.split(' ')[:2] for line in merged(tmp_path)] == [['[ranks', '0-1]'], ['[ranks', '0-1]']]


def test_time_order_across_files(tmp_path):
    write_log(tmp_path / 'r-rank0.log', [(t, 0, 'INFO', 'a', f'zero {t}') for t in (0, 2, 4, 6)])
    write_log(tmp_path / 'r-rank1.log', [(t, 1, 'INFO', 'a', f'one {t}') for t in (1, 3, 5)])
    lines = merged(tmp_path)
    assert [line.split(': ', 1)[1] for line in lines] == [
        'zero 0',
        'one 1',
        'zero 2',
        'one 3',
        'zero 4',
        'one 5',
        'zero 6',
    ]


def test_multiline_records_and_lines_that_look_like_headers(tmp_path):
    fake = format_record(T0, 9, 'INFO', 'fake', 'not a record')  # inside a message: a continuation line
    message = f'failed\nTraceback (most recent call last):\n  File "x.py", line 1\n{fake}\nKeyError: 1'
    write_log(tmp_path / 'py-rank0.log', [(0, 0, 'ERROR', 'a', message), (1, 0, 'INFO', 'a', 'next')])
    write_log(tmp_path / 'py-rank1.log', [(0.5, 1, 'ERROR', 'a', message)])
    lines = merged(tmp_path)
    assert lines[0] == f'[ranks 0-1] {stamp(0)} ERROR a: failed'
    assert lines[1:5] == [
        '[ranks 0-1] \tTraceback (most recent call last):',
        '[ranks 0-1] \t  File "x.py", line 1',
        f'[ranks 0-1] \t{fake}',
        '[ranks 0-1] \tKeyError: 1',
    ]
    assert lines[5] == f'[rank 0] {stamp(1)} INFO a: next' and len(lines) == 6


def test_rank_and_level_filters(tmp_path):
    for rank in range(6):
        write_log(
            tmp_path / f'py-rank{rank}.log',
            [
                (0, rank, 'INFO', 'a', 'hello'),
                (1, rank, 'ERROR', 'a', 'bad'),
                (2, rank, 'Level_5', 'a', 'very verbose'),
            ],
        )
    assert merged(tmp_path, ranks=parse_ranks('0,3-5'))[0].startswith('[ranks 0,3-5] ')
    assert merged(tmp_path, min_level=30) == [f'[ranks 0-5] {stamp(1)} ERROR a: bad']
    assert len(merged(tmp_path, min_level=5)) == 3 and len(merged(tmp_path, min_level=20)) == 2


# ---------------------------------------------------------------------------- FileLogger files, finding files
def test_filelogger_text_and_jsonl_files_with_their_tables_skipped(tmp_path, capsys, fake_rank):
    for rank in range(2):
        fake_rank(rank, 2)
        text = FileLogger(str(tmp_path / 'text' / 'logs-rank{rank}.txt'), capture_stdout=True)
        jsonl = FileLogger(str(tmp_path / 'jsonl' / 'logs-rank{rank}.jsonl'), format='jsonl', capture_stdout=True)
        logger = Logger([text, jsonl], run_name='f')
        print(f'hello from {rank}')
        print('the same on every rank')
        logger.log_table(['a'], [[1]], name='t')  # tables/t.jsonl next to each log: not a log
        logger.log_metrics({'loss': float(rank)}, step=3)
        logger.close()
    capsys.readouterr()
    assert (tmp_path / 'jsonl' / 'logs-rank0' / 'tables' / 't.jsonl').is_file()
    sources = find_log_files([str(tmp_path)])
    assert sorted((pathlib.Path(s.path).name, s.rank, s.kind) for s in sources) == [
        ('logs-rank0.jsonl', 0, 'jsonl'),
        ('logs-rank0.txt', 0, 'text'),
        ('logs-rank1.jsonl', 1, 'jsonl'),
        ('logs-rank1.txt', 1, 'text'),
    ]
    lines = merged(tmp_path / 'jsonl')
    assert re.fullmatch(r'\[rank 0\] \S+Z STDOUT hello from 0', lines[0])
    assert re.fullmatch(r'\[ranks 0-1\] \S+Z STDOUT the same on every rank', lines[1]) or re.fullmatch(
        r'\[ranks 0-1\] \S+Z STDOUT the same on every rank', lines[2]
    )
    assert any(re.fullmatch(r'\[rank 1\] \S+Z METRIC \[step=3\] loss: 1.0', line) for line in lines)
    text_lines = merged(tmp_path / 'text')  # Composer's text lines carry no time: file order, '-' for the time
    assert '[rank 0] - STDOUT hello from 0' in text_lines and '[rank 1] - METRIC [batch=3]: loss: 1.0 ' in text_lines


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        merged(tmp_path / 'missing')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(ValueError, match='no log files found'):
        merged(tmp_path / 'empty')
    (tmp_path / 'notes.txt').write_text('just some notes\n')
    with pytest.raises(ValueError, match="is not a log written by setup_logging or FileLogger.*'just some notes'"):
        merged(tmp_path / 'notes.txt')
    for name in ('a.txt', 'b.txt'):
        (tmp_path / 'nameless' / name).parent.mkdir(exist_ok=True)
        (tmp_path / 'nameless' / name).write_text('[stdout]: hi\n')
    with pytest.raises(ValueError, match='cannot tell which rank wrote'):
        merged(tmp_path / 'nameless')
    assert merged(tmp_path / 'nameless' / 'a.txt') == ['[rank 0] - STDOUT hi']  # one file: rank 0


# ---------------------------------------------------------------------------- memory
class _Discard(io.TextIOBase):
    def write(self, text):
        return len(text)


def _peak_bytes_merging(folder: pathlib.Path) -> int:
    tracemalloc.start()
    try:
        merge_logs([str(folder)], _Discard())
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _generate(folder: pathlib.Path, records_per_rank: int, ranks: int = 4) -> int:
    for rank in range(ranks):
        with open(folder / f'py-rank{rank}.log', 'w', encoding='utf-8') as handle:
            for i in range(records_per_rank):
                message = f'step {i} loss {i * 0.001:.4f}' if i % 7 else f'epoch summary {i}\n  detail a\n  detail b'
                handle.write(format_record(T0 + i * 0.5 + rank * 0.01, rank, 'INFO', 'train', message) + '\n')
    return sum(p.stat().st_size for p in folder.iterdir())


def test_memory_does_not_grow_with_file_size(tmp_path):
    # A 1 GiB set was merged by hand (see docs/cli.md); here 8x more data must not need more memory.
    small, large = tmp_path / 'small', tmp_path / 'large'
    small.mkdir()
    large.mkdir()
    small_bytes, large_bytes = _generate(small, 400), _generate(large, 3_200)
    assert large_bytes > 7 * small_bytes
    small_peak, large_peak = _peak_bytes_merging(small), _peak_bytes_merging(large)
    assert large_peak < small_peak * 1.25 + 64 * 1024, (small_peak, large_peak)


def test_collapser_holds_at_most_max_pending_groups():
    collapser = Collapser(window=60, max_pending=50)
    written = []
    for i in range(1_000):  # all within one window, all different: nothing can collapse
        written += collapser.add(Record(T0 + i * 0.001, i % 4, 'INFO', 'x', f'message {i}'))
        assert len(collapser._pending) <= 50
    written += collapser.drain()
    assert [g.message for g in written] == [f'message {i}' for i in range(1_000)]


# ---------------------------------------------------------------------------- --follow
class _Collect(io.TextIOBase):
    def __init__(self):
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def write(self, text):
        with self.changed:
            self.lines += text.splitlines()
            self.changed.notify_all()
        return len(text)

    def wait_for(self, predicate, timeout=20.0):
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.lines):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f'timed out; got {self.lines}'
                self.changed.wait(remaining)


def test_follow_reads_as_files_grow_and_new_files_appear(tmp_path):
    now = time.time()
    first = tmp_path / 'py-rank0.log'
    first.write_text(format_record(now, 0, 'INFO', 'a', 'already there') + '\n')
    out, stop = _Collect(), threading.Event()
    thread = threading.Thread(
        target=follow_logs,
        args=([str(tmp_path)], out),
        kwargs=dict(window=0.2, poll_interval=0.02, rescan_interval=0.05, should_stop=stop.is_set),
    )
    thread.start()
    try:
        out.wait_for(lambda lines: any('already there' in line for line in lines))
        with open(first, 'a') as handle:  # a record written in two pieces, then its continuation lines
            handle.write(format_record(time.time(), 0, 'ERROR', 'a', 'grew')[:20])
            handle.flush()
            time.sleep(0.05)
            handle.write(format_record(time.time(), 0, 'ERROR', 'a', 'grew\nTraceback')[20:] + '\n')
        stamp = time.time()
        write_log(tmp_path / 'py-rank1.log', [(stamp - T0, 1, 'INFO', 'a', 'both')])
        with open(first, 'a') as handle:
            handle.write(format_record(stamp + 0.01, 0, 'INFO', 'a', 'both') + '\n')
        out.wait_for(lambda lines: any('both' in line for line in lines))
        out.wait_for(lambda lines: any('\tTraceback' in line for line in lines))
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert [line for line in out.lines if 'both' in line][0].startswith('[ranks 0-1] ')
    grew = [i for i, line in enumerate(out.lines) if ' ERROR a: grew' in line]
    assert len(grew) == 1 and out.lines[grew[0] + 1] == '[rank 0] \tTraceback'


def test_follow_stops_when_asked_and_writes_what_it_holds(tmp_path):
    write_log(tmp_path / 'py-rank0.log', [(time.time() - T0, 0, 'INFO', 'a', 'held in the window')])
    out = _Collect()
    written = follow_logs([str(tmp_path)], out, window=3600, poll_interval=0.01, should_stop=lambda: True)
    assert written == 1 and 'held in the window' in out.lines[0]
    json.dumps(out.lines)  # plain strings


def test_open_file_limit_is_raised_for_many_ranks(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 400:
        pytest.skip(f'hard limit on open files is {hard}')
    for rank in range(300):
        write_log(tmp_path / f'py-rank{rank}.log', [(rank * 0.001, rank, 'INFO', 'a', 'from all')])
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # less than the files to open
    try:
        assert merged(tmp_path) == [f'[ranks 0-299] {stamp(0)} INFO a: from all']
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 300
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
