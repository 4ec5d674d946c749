"""After a fatal error the process ends at exit in bounded time (dist_logging/_world/ending.py), in subprocesses:
the hook ends the interpreter it runs in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from dist_logging import dist


def _run(source: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(source)], capture_output=True, text=True, timeout=timeout
    )
    return result, time.monotonic() - started


def test_without_a_fatal_error_the_exit_is_unchanged():
    result, _ = _run("""
        import atexit, sys
        from dist_logging import dist
        atexit.register(lambda: print('hook registered later ran', flush=True))
        assert dist.fatal_error() is None
        sys.exit(3)
    """)
    assert result.returncode == 3, result.stderr
    assert result.stdout.strip() == 'hook registered later ran'
    assert 'ending this process' not in result.stderr


def test_after_a_fatal_error_the_process_ends_with_status_1_after_the_later_hooks_and_logging():
    result, _ = _run("""
        import atexit, logging, sys
        from dist_logging import dist
        from dist_logging.errors import DistributedLoggingError
        logging.getLogger('app').addHandler(logging.StreamHandler(sys.stdout))
        atexit.register(lambda: print('hook registered later ran', flush=True))
        dist.note_fatal_error(DistributedLoggingError('flush at step 5: host host2 (ranks [2, 3]) silent'))
        dist.note_fatal_error(RuntimeError('a second one is not kept'))
        logging.getLogger('app').error('logged before the end')
        sys.stdout.write('buffered, not flushed by the script')
        sys.exit(0)  # what the script says does not matter after a fatal error
    """)
    assert result.returncode == dist.EXIT_STATUS == 1, result.stderr
    assert 'hook registered later ran' in result.stdout
    assert 'logged before the end' in result.stdout
    assert 'buffered, not flushed by the script' in result.stdout
    assert (
        'dist_logging: ending this process (exit status 1) after a fatal error: DistributedLoggingError: '
        'flush at step 5: host host2 (ranks [2, 3]) silent.'
    ) in result.stderr
    assert 'dist-logging drain' in result.stderr


def test_a_forgotten_fatal_error_does_not_end_the_process():
    result, _ = _run("""
        import sys
        from dist_logging import dist
        error = RuntimeError('recovered')
        dist.note_fatal_error(error)
        assert dist.fatal_error() is error
        assert dist.forget_fatal_error() is error and dist.fatal_error() is None
        sys.exit(0)
    """)
    assert result.returncode == 0, result.stderr


def test_a_flush_that_blocks_still_ends_the_process_within_the_bound():
    """A logging handler whose flush never returns: faulthandler's native watchdog dumps the stacks and ends it."""
    result, seconds = _run("""
        import logging, threading
        from dist_logging import dist
        class Stuck(logging.Handler):
            def emit(self, record):
                pass
            def flush(self):
                threading.Event().wait()  # forever
        logging.getLogger().addHandler(Stuck())
        dist.note_fatal_error(RuntimeError('fatal'))
    """)
    assert result.returncode == 1, result.stderr
    assert 'Timeout' in result.stderr and 'flush' in result.stderr  # the dumped stacks name where it blocked
    print(f'a blocked flush ended after {seconds:.1f} s (bound {dist.FLUSH_SECONDS:g} s + interpreter start)')
    assert seconds < 4 * dist.FLUSH_SECONDS + 30  # liveness: a generous multiple (interpreter start, a loaded machine)


def test_file_logger_lines_since_the_last_batch_end_are_written_before_the_end(tmp_path):
    """A Logger never closed: its FileLogger's buffered lines would be written only when Python objects are
    finalized, which the exit after a fatal error skips; FileLogger flushes them through dist.on_fatal_exit."""
    path = tmp_path / 'rank0.txt'
    result, _ = _run(f"""
        from dist_logging import Logger, dist
        from dist_logging.destinations import FileLogger
        logger = Logger(FileLogger({str(path)!r}), run_name='fatal')
        logger.log_metrics({{'written_at_batch_end': 1}})
        logger.batch_end()
        logger.log_metrics({{'logged_after_the_last_batch_end': 2}})
        dist.note_fatal_error(RuntimeError('fatal'))
        raise SystemExit(0)
    """)
    assert result.returncode == 1, result.stderr
    text = path.read_text()
    assert 'written_at_batch_end' in text and 'logged_after_the_last_batch_end' in text, text
