"""Building one rank's postmortem set: header, stacks, torch's flight-recorder dump, the exception, the last events.

A set is a handful of small files written into a local folder, then handed to the Logger's upload path
(see :mod:`dist_logging.postmortem.trigger`). Object names, per run, attempt and rank
(:func:`object_names`)::

    {run_name}/postmortem/attempt-{A}/rank-{N}/header.json     rank, host, pid, attempt, reason, time, world, groups,
                                                               the exception (with the ranks a Logger error names)
    {run_name}/postmortem/attempt-{A}/rank-{N}/stacks.txt      every thread's Python stack (faulthandler's layout)
    {run_name}/postmortem/attempt-{A}/rank-{N}/stacks.json     the same, structured (for ``dist-logging diagnose``)
    {run_name}/postmortem/attempt-{A}/rank-{N}/exception.txt   the exception and its traceback, when there is one
    {run_name}/postmortem/attempt-{A}/rank-{N}/events.json     the Logger's last events (steps, uploads, flushes)
    {run_name}/postmortem/attempt-{A}/fr/fr_trace_rank_{N}     torch's flight-recorder dump, torch's pickle format

The ``fr/`` folder of an attempt is a set torch's own loader reads
(``torch.distributed.flight_recorder.components.loader.read_dir`` with the prefix ``fr_trace_rank_``).

This module is the one place that reads torch's private distributed state (the flight recorder's
dump function and the table of process groups); both are read in ``try`` blocks, so a torch without
them still gets every other file of the set.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from typing import Any, Mapping, Optional

__all__ = [
    'FR_PREFIX',
    'SET_FILES',
    'object_names',
    'rank_prefix',
    'attempt_prefix',
    'write_set',
    'python_stacks',
    'flight_recorder_dump',
    'process_groups',
]

#: The name prefix of flight-recorder dumps in an attempt's ``fr/`` folder (torch's loader takes it as ``prefix``).
FR_PREFIX = 'fr_trace_rank_'
#: The files of a rank's folder, in the order they are handed over (the header last: it says the set is whole).
SET_FILES = ('stacks.txt', 'stacks.json', 'exception.txt', 'events.json', 'header.json')
FORMAT_VERSION = 1


def attempt_prefix(run_name: str, attempt: Any) -> str:
    """The object-name prefix of an attempt's postmortem: ``{run_name}/postmortem/attempt-{attempt}/``."""
    return f'{run_name}/postmortem/attempt-{attempt}/'


def rank_prefix(run_name: str, attempt: Any, rank: int) -> str:
    """The object-name prefix of a rank's set: ``{run_name}/postmortem/attempt-{attempt}/rank-{rank}/``."""
    return f'{attempt_prefix(run_name, attempt)}rank-{rank}/'


def object_names(run_name: str, attempt: Any, rank: int) -> dict[str, str]:
    """Local file name -> object name, for every file a rank's set may hold (the dump under ``fr``)."""
    names = {name: rank_prefix(run_name, attempt, rank) + name for name in SET_FILES}
    names['fr'] = f'{attempt_prefix(run_name, attempt)}fr/{FR_PREFIX}{rank}'
    return names


def python_stacks(skip: Optional[int] = None) -> list[dict[str, Any]]:
    """Every thread's Python stack: ``[{'ident', 'name', 'daemon', 'main', 'frames': [{'file', 'line', 'function'}]}]``,
    frames oldest first (as ``traceback`` prints them). ``skip``: a thread ident to leave out (the capturing one)."""
    threads = {thread.ident: thread for thread in threading.enumerate()}
    main = threading.main_thread().ident
    stacks = []
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the documented way to read other threads
        if ident == skip:
            continue
        thread = threads.get(ident)
        frames = [
            {'file': entry.filename, 'line': entry.lineno, 'function': entry.name}
            for entry in traceback.extract_stack(frame)
        ]
        stacks.append(
            {
                'ident': ident,
                'name': thread.name if thread is not None else f'thread-{ident}',
                'daemon': bool(thread.daemon) if thread is not None else None,
                'main': ident == main,
                'frames': frames,
            }
        )
    stacks.sort(key=lambda item: (not item['main'], item['name']))
    return stacks


def stacks_text(stacks: list[dict[str, Any]]) -> str:
    """``stacks`` in faulthandler's layout (most recent call first), one block per thread."""
    lines = []
    for stack in stacks:
        label = 'Current thread' if stack['main'] else 'Thread'
        lines.append(f'{label} 0x{stack["ident"]:016x} "{stack["name"]}" (most recent call first):')
        for frame in reversed(stack['frames']):
            lines.append(f'  File "{frame["file"]}", line {frame["line"]} in {frame["function"]}')
        lines.append('')
    return '\n'.join(lines)


def flight_recorder_dump() -> tuple[Optional[bytes], str]:
    """torch's flight-recorder dump (its pickle) and what happened: ``'on'``, ``'off'`` (no entries recorded:
    ``TORCH_FR_BUFFER_SIZE=0``, or no collective yet) or ``'unavailable: ...'``.

    Without the C++ stack traces: symbolizing them took 1.7-3.4 s per rank on a 2-core machine (torch
    2.13), far too long for a process about to be killed; the Python stacks say where each thread is.
    """
    try:
        import torch

        # No public API; collectives and their Python frames, without C++ stacks (those take seconds per rank).
        raw = torch._C._distributed_c10d._dump_fr_trace(True, False, False)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - an older torch or a build without it: the rest of the set stands
        return None, f'unavailable: {type(exc).__name__}: {exc}'
    try:
        entries = pickle.loads(raw).get('entries') or []
    except Exception:  # noqa: BLE001 - kept as torch wrote it
        entries = None
    if entries == [] and os.environ.get('TORCH_FR_BUFFER_SIZE', '').strip() == '0':
        return raw, 'off'
    return raw, 'on'


def process_groups(rank: int) -> list[dict[str, Any]]:
    """The process groups this rank belongs to, as torch names them: ``[{'name', 'desc', 'ranks'}]`` (global ranks).

    Read from torch's table of groups (private; an empty list where it is missing): torch's dump
    records the default group's membership under ``''`` and empties it after any ``new_group``.
    """
    try:
        from torch.distributed import distributed_c10d

        world = distributed_c10d._world  # noqa: SLF001 - no public table of the groups
        groups = []
        for group, ranks in list(world.pg_group_ranks.items()):
            if rank not in ranks:
                continue
            name = world.pg_names.get(group, '')
            desc = getattr(group, 'group_desc', '') or ''
            groups.append({'name': str(name), 'desc': str(desc), 'ranks': sorted(int(r) for r in ranks)})
        return groups
    except Exception:  # noqa: BLE001 - the header says what the Logger knows
        return []


def _named_ranks(exception: BaseException) -> dict[str, list[int]]:
    """The ranks a :class:`~dist_logging.DistributedLoggingError` names, by kind (``left``, ``unreachable``,
    ``late``: see its attributes); empty for other exceptions or when it names nobody."""
    named = {}
    for kind in ('left', 'unreachable', 'late'):
        ranks = getattr(exception, f'{kind}_ranks', None)
        if isinstance(ranks, (tuple, list)) and ranks:
            named[kind] = sorted(int(r) for r in ranks)
    return named


def _write(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, 'wb') as handle:
        handle.write(data)
    return path


def write_set(
    folder: str,
    *,
    reason: str,
    rank: int,
    world_size: int,
    attempt: Any,
    run_name: str,
    roster: Mapping[int, Any],
    logging_group: Optional[str] = None,
    exception: Optional[BaseException] = None,
    events: Optional[Mapping[str, Any]] = None,
    training_thread: Optional[int] = None,
    skip_thread: Optional[int] = None,
) -> dict[str, str]:
    """Write a rank's set into ``folder`` and return local file name -> path (``'fr'`` for the dump).

    Args:
        folder: an existing, empty folder.
        reason: why (``'hang'``, ``'exception'``, ``'sigterm'``, ``'logging_error'``, or the caller's).
        rank, world_size, attempt, run_name: from the Logger.
        roster: global rank -> ``(host, pid)`` known through the store (who ran where).
        logging_group: the name of the Logger's own process group (its collectives are in the dump too).
        exception: the exception that triggered the capture, if any.
        events: the Logger's last events (JSON-serializable).
        training_thread: the ident of the thread that made the Logger (named in the header).
        skip_thread: a thread whose stack is left out (the capturing thread).

    Returns:
        Local file name -> path of every file written.
    """
    started = time.time()
    files: dict[str, str] = {}
    raw, recorder = flight_recorder_dump()
    if raw is not None:
        files['fr'] = _write(folder, f'{FR_PREFIX}{rank}', raw)
    stacks = python_stacks(skip_thread)
    files['stacks.txt'] = _write(folder, 'stacks.txt', stacks_text(stacks).encode())
    files['stacks.json'] = _write(folder, 'stacks.json', json.dumps(stacks).encode())
    error: Optional[dict[str, Any]] = None
    if exception is not None:
        text = ''.join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        files['exception.txt'] = _write(folder, 'exception.txt', text.encode())
        first = str(exception).strip().splitlines()
        error = {'type': type(exception).__name__, 'message': first[0] if first else ''}
        frames = traceback.extract_tb(exception.__traceback__)
        if frames:
            error['where'] = f'{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}'
        named = _named_ranks(exception)
        if named:
            error['named'] = named
    files['events.json'] = _write(folder, 'events.json', json.dumps(events or {}, default=str).encode())
    header = {
        'format': FORMAT_VERSION,
        'rank': rank,
        'host': socket.gethostname(),
        'pid': os.getpid(),
        'attempt': attempt,
        'run_name': run_name,
        'reason': reason,
        'time': started,
        'time_iso': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(started)),
        'world_size': world_size,
        'groups': process_groups(rank),
        'logging_group': logging_group,
        'roster': {str(r): list(v) for r, v in sorted(roster.items())},
        'flight_recorder': recorder,
        'fr_buffer_size': os.environ.get('TORCH_FR_BUFFER_SIZE'),
        'training_thread': training_thread,
        'exception': error,
        'files': sorted(files),
        'capture_seconds': round(time.time() - started, 4),
    }
    files['header.json'] = _write(folder, 'header.json', json.dumps(header, indent=1, default=str).encode())
    return files
