"""``dist-logging diagnose URI``: read a run's postmortem from its bucket and print who is to blame.

``URI`` is the run's prefix in the bucket (``s3://bucket/runs/my-run``, ``file:///abs/bucket/my-run``,
a local folder), or the bucket itself with ``--run RUN_NAME``. The first line printed is a one-line
verdict; the culprits are exactly the ranks written ``rank N`` on it (other ranks are written
``ranks 0, 2, 3``). Exit status: 1 a culprit is named, 0 no postmortem or nothing wrong, 2 cannot
tell (the verdict says why). ``--json`` prints one JSON object instead. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from typing import Any, Optional

from dist_logging.postmortem.capture import FR_PREFIX
from dist_logging.postmortem.diagnose import (
    EXIT_NOTHING,
    EXIT_UNKNOWN,
    RankSet,
    Verdict,
    analyse,
    load_dump,
    parse_header,
    rank_of_path,
)

__all__ = ['add_parser', 'run', 'read_sets', 'diagnose_uri']

_ATTEMPT = re.compile(r'(?:^|/)postmortem/attempt-([^/]+)/')


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``diagnose`` subcommand to the ``dist-logging`` parser's subparsers."""
    p = sub.add_parser(
        'diagnose',
        help="read a run's postmortem and name the rank that hung, desynced or crashed",
        description='Read the postmortem sets the ranks of a run left in the bucket (see '
        'docs/postmortem.md) and print a one-line verdict naming the culprit as '
        '"rank N (host H)", then the evidence. Exit status: 1 a culprit is named, 0 the '
        'run has no postmortem or it shows nothing wrong, 2 cannot tell (says why).',
    )
    p.add_argument('uri', metavar='URI', help="the run's prefix in the bucket, or the bucket with --run")
    p.add_argument('--run', default=None, metavar='RUN_NAME', help='the run, when URI is the bucket')
    p.add_argument('--attempt', default=None, help='which torchrun attempt (default: the latest with a postmortem)')
    p.add_argument('--json', action='store_true', help='print one JSON object (verdict, culprits, per-rank facts)')
    p.set_defaults(func=run)
    return p


def _progress(message: str) -> None:
    print(f'dist-logging diagnose: {message}', file=sys.stderr, flush=True)


def _find_prefix(store: Any, run_name: Optional[str]) -> tuple[Optional[str], str]:
    """The object prefix holding ``postmortem/``, and a note when it had to be searched for."""
    if run_name:
        return f'{run_name.strip("/")}/postmortem/', ''
    if store.list('postmortem/'):
        return 'postmortem/', ''
    runs = sorted({name.split('/postmortem/', 1)[0] for name, _ in store.list('') if '/postmortem/attempt-' in name})
    if len(runs) == 1:
        return f'{runs[0]}/postmortem/', f'run {runs[0]}'
    if len(runs) > 1:
        return None, f'several runs have a postmortem here ({", ".join(runs[:10])}); pass --run RUN_NAME'
    return None, ''


def read_sets(
    store: Any, prefix: str, attempt: Optional[str] = None, scratch: Optional[str] = None
) -> tuple[Optional[str], dict[int, RankSet], list[str]]:
    """Read every rank's set of one attempt under ``prefix`` (``.../postmortem/``).

    Returns:
        ``(attempt, rank -> set, problems)``: the attempt read (the latest when ``attempt`` is None;
        None when there is no postmortem), the sets, and what could not be read.
    """
    objects = [name for name, _ in store.list(prefix)]
    attempts = sorted(
        {m.group(1) for m in (_ATTEMPT.search(name) for name in objects) if m},
        key=lambda a: (not a.isdigit(), int(a) if a.isdigit() else 0, a),
    )
    if attempt is None:
        if not attempts:
            return None, {}, []
        attempt = attempts[-1]
    base = f'{prefix}attempt-{attempt}/'
    names = [name for name in objects if name.startswith(base)]
    if len(names) > 50:
        _progress(f'reading {len(names)} objects of attempt {attempt}')
    sets: dict[int, RankSet] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix='dist_logging-diagnose-', dir=scratch) as folder:
        for index, name in enumerate(sorted(names)):
            leaf = name.rsplit('/', 1)[-1]
            if leaf not in ('header.json', 'stacks.json', 'exception.txt') and not leaf.startswith(FR_PREFIX):
                continue
            local = os.path.join(folder, f'{index}')
            try:
                store.download_object(name, local, overwrite=True)
                with open(local, 'rb') as handle:
                    data = handle.read()
            except Exception as exc:  # noqa: BLE001 - one unreadable object must not hide the others
                problems.append(f'{name}: {type(exc).__name__}: {exc}')
                continue
            header = parse_header(data) if leaf == 'header.json' else {}
            rank = rank_of_path(name[len(base) :])
            if rank is None and isinstance(header.get('rank'), int):
                rank = header['rank']
            if rank is None:
                problems.append(f'{name}: no rank in its path or header')
                continue
            rank_set = sets.setdefault(rank, RankSet(rank))
            try:
                if leaf == 'header.json':
                    rank_set.header = header
                elif leaf == 'stacks.json':
                    rank_set.stacks = json.loads(data)
                elif leaf == 'exception.txt':
                    rank_set.exception = data.decode(errors='replace')
                else:
                    rank_set.dump = load_dump(data)
            except Exception as exc:  # noqa: BLE001 - said in the output
                problems.append(f'{name}: {type(exc).__name__}: {exc}')
    return attempt, sets, problems


def diagnose_uri(uri: str, run_name: Optional[str] = None, attempt: Optional[str] = None) -> Verdict:
    """Read the postmortem of the run at ``uri`` (or of ``run_name`` in the bucket ``uri``) and analyse it.

    Raises:
        ValueError: a bad URI.
        ImportError: the store's optional dependency is missing.
    """
    from dist_logging.object_store import store_from_uri

    store = store_from_uri(uri)
    try:
        prefix, note = _find_prefix(store, run_name)
        if prefix is None:
            if note:
                return Verdict('unknown', f'cannot tell: {note}', code=EXIT_UNKNOWN)
            where = f'run {run_name} in {uri}' if run_name else uri
            return Verdict('none', f'no postmortem: nothing under {where} (no rank captured one)', code=EXIT_NOTHING)
        found_attempt, sets, problems = read_sets(store, prefix, attempt)
    finally:
        store.close()
    if found_attempt is None:
        return Verdict('none', f'no postmortem under {uri} ({prefix})', code=EXIT_NOTHING)
    verdict = analyse(sets)
    verdict.details += [f'could not read {problem}' for problem in problems]
    verdict.facts['attempt'] = found_attempt
    verdict.facts['prefix'] = prefix
    verdict.facts['ranks'] = {
        str(rank): {
            'host': s.host,
            'reason': s.header.get('reason'),
            'error': s.error_line(),
            'location': s.location(),
            'flight_recorder': s.header.get('flight_recorder'),
        }
        for rank, s in sorted(sets.items())
    }
    return verdict


def run(args: argparse.Namespace) -> int:
    """Run ``dist-logging diagnose`` with parsed ``args``; return the exit code."""
    verdict = diagnose_uri(args.uri, args.run, args.attempt)
    if args.json:
        print(json.dumps(verdict.as_json(), indent=1, default=str))
        return verdict.code
    print(verdict.line)
    for line in verdict.details:
        print(f'  {line}')
    for rank, facts in (verdict.facts.get('ranks') or {}).items():
        where = f' at {facts["location"]}' if facts.get('location') else ''
        error = f'; {facts["error"]}' if facts.get('error') else ''
        print(f'  [{rank}] host {facts["host"]}: {facts["reason"]}{where}{error}')
    if verdict.facts.get('prefix'):
        print(
            f'  evidence: {verdict.facts["prefix"]}attempt-{verdict.facts["attempt"]}/ (stacks.txt per rank; '
            f'fr/ is a set torch.distributed.flight_recorder loads)'
        )
    return verdict.code
