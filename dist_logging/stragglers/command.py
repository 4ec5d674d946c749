"""``dist-logging stragglers RUN``: the summary of a run's rank history and its heatmap PNG.

``RUN`` is a run folder (searched for ``rank_history.jsonl``), the history file itself, or a
bucket URI (``s3://bucket/prefix``, ``file:///abs/bucket``, a local bucket folder ...) under
which the run uploaded it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Optional

from dist_logging.stragglers.history import HISTORY_NAME, read_history, summary_text

__all__ = ['add_parser', 'find_history', 'run']

_USAGE_ERROR = 2


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``stragglers`` subcommand to the ``dist-logging`` parser's subparsers."""
    p = sub.add_parser(
        'stragglers',
        help="summarize a run's rank report history and draw its heatmap",
        description='Read the per-rank history a run with rank_report_every= kept '
        f'({HISTORY_NAME}, uploaded with its logs), print which ranks were slow, on which '
        'host, since when, and write a PNG heatmap: one row per rank (rank 0 on top), one '
        "column per report (oldest left), a cell's brightness its busy time over the "
        "report's median (dark: at or below the median; bright: slow).",
    )
    p.add_argument('run', metavar='RUN', help=f'a run folder, a {HISTORY_NAME} file, or a bucket URI holding one')
    p.add_argument(
        '--out',
        default=None,
        metavar='PNG',
        help='where to write the heatmap (default: stragglers-<run name>.png in the current folder)',
    )
    p.add_argument('--series', default='busy', help="what to draw: busy (default), step, or a section's name")
    p.add_argument('--top', type=int, default=5, help='how many flagged ranks to list (default 5)')
    p.set_defaults(func=run)
    return p


def find_history(target: str, scratch: str) -> str:
    """The local path of the history file of ``target`` (downloaded into ``scratch`` from a bucket).

    Raises:
        FileNotFoundError: no history file there (says where it looked).
        ValueError: several history files (lists them: name the run's folder).
    """
    if os.path.isfile(target):
        return target
    if os.path.isdir(target):
        found = []
        for folder, subfolders, names in os.walk(target):
            subfolders.sort()
            if HISTORY_NAME in names:
                found.append(os.path.join(folder, HISTORY_NAME))
        return _one(found, target)
    if '://' not in target:
        raise FileNotFoundError(f'{target!r}: no such file or folder')
    from dist_logging.object_store import store_from_uri

    store = store_from_uri(target)
    try:
        names = [name for name in store.list_objects() if name.rsplit('/', 1)[-1] == HISTORY_NAME]
        name = _one(names, target)
        local = os.path.join(scratch, HISTORY_NAME)
        store.download_object(name, local, overwrite=True)
        return local
    finally:
        store.close()


def _one(found: list[str], where: str) -> str:
    if not found:
        raise FileNotFoundError(f'no {HISTORY_NAME} under {where!r} (was the run started with rank_report_every=?)')
    if len(found) > 1:
        listed = ', '.join(sorted(found)[:10])
        raise ValueError(f'{len(found)} rank histories under {where!r}: {listed}; name one run')
    return found[0]


def run(args: argparse.Namespace) -> int:
    """Print the summary and write the heatmap; returns the exit code (2: nothing to read)."""
    from dist_logging.stragglers.heatmap import write_heatmap

    with tempfile.TemporaryDirectory(prefix='dist-logging-stragglers-') as scratch:
        try:
            path = find_history(args.run, scratch)
            history = read_history(path)
        except (FileNotFoundError, ValueError) as exc:
            print(f'dist-logging stragglers: error: {exc}', file=sys.stderr)
            return _USAGE_ERROR
        print(summary_text(history, top=args.top))
        if not history.batches:
            return 0
        out = args.out or f"stragglers-{history.header.get('run_name') or 'run'}.png"
        try:
            image = write_heatmap(history, out, args.series)
        except KeyError as exc:
            print(f'dist-logging stragglers: error: {exc.args[0]}', file=sys.stderr)
            return _USAGE_ERROR
    ranks, windows = history.series[args.series].shape
    print(
        f'heatmap ({args.series}): {out} ({image.shape[1]}x{image.shape[0]} px; rows: ranks 0-{ranks - 1} top to '
        f'bottom; columns: {windows} reports, batch {history.batches[0]} left to {history.batches[-1]} right)'
    )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Run the subcommand alone (for tests and ``python -m dist_logging.stragglers.command``)."""
    parser = argparse.ArgumentParser(prog='dist-logging')
    add_parser(parser.add_subparsers(dest='command', required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
