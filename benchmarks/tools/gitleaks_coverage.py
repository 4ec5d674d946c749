"""How many of gitleaks' own true-positive examples the redactor replaces, by cause (issue 35).

Usage (a gitleaks git directory, e.g. a bare clone, and the commit its formats were imported from)::

    python benchmarks/tools/gitleaks_coverage.py GITLEAKS_GIT_DIR [--commit b58d3f10...] [--code-at 29372ac]
        [--json out.json] [--misses 20]

Every example of every rule (``cmd/generate/config/rules/*.go``, read by ``gitleaks_examples``) is
logged as a hyperparameter value the way a user would (``{'example': text}`` through the Logger's
redactor, ``build_redactor(True)``). A true positive counts as redacted when no occurrence of its
secret is left: the secret is what gitleaks' own rule regex (``config/gitleaks.toml`` at the same
commit, translated by ``import_gitleaks_rules.to_python``) captures, or, where that translation does
not match in Python, the secret the example was generated from. False positives are counted as
changed or not (informational: the issue allows redacting placeholders).

``--code-at COMMIT`` scores the redaction code of an earlier commit of this repository instead (read
with ``git show`` by ``redaction_at.py``), on the same examples (same seed): the "before" column.

The cause of a miss is read from how the example was written: a ``GenerateSampleSecrets`` template
the pair rule reads (INI, JSON, YAML, C#, Java, Kotlin, Python, Make ``=``) -> *credential-named key*;
a template of another syntax (XML element, Go ``:=``/backticks, ``=>``, Make ``:=``/``?=``, PHP
``.=``, ``setProperty``) -> *pair syntax*; a literal example -> *format*.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tomllib
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gitleaks_examples  # noqa: E402
import redaction_at  # noqa: E402
from import_gitleaks_rules import to_python  # noqa: E402

PINNED_COMMIT = 'b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b'  # the commit _gitleaks_formats.py was generated from
PAIR_TEMPLATES = {
    'ini - quoted1',
    'ini - quoted2',
    'ini - unquoted1',
    'ini - unquoted2',
    'json - string',
    'json - escaped newline in string',
    'yaml - singleline - unquoted',
    'yaml - singleline - single quote',
    'yaml - singleline - double quote',
    'C#',
    'go - normal',
    'java',
    'kotlin - notype',
    'python - single quote',
    'python - double quote',
    'make - recursive assignment',
}


def cause_of(example: gitleaks_examples.Example) -> str:
    """The issue's cause for a missed example, from how it was written."""
    if example.syntax == 'literal':
        return 'format'
    return 'credential-named key' if example.syntax in PAIR_TEMPLATES else 'pair syntax'


def rule_regexes(git_dir: str, commit: str) -> dict[str, tuple[re.Pattern, int]]:
    """rule id -> (its regex in Python, its secret group) from gitleaks.toml at ``commit``."""
    config = tomllib.loads(gitleaks_examples.git_show(git_dir, commit, 'config/gitleaks.toml'))
    out = {}
    for rule in config['rules']:
        if not rule.get('regex'):
            continue
        try:
            compiled = re.compile(to_python(rule['regex']))
        except re.error:
            continue
        # gitleaks' secret: ``secretGroup``, else the first group, else the match; a rule with named groups
        # only (``jwt-base64``'s header names) names parts of its secret, which is the whole match.
        unnamed = compiled.groups > len(compiled.groupindex)
        group = rule.get('secretGroup') or (1 if unnamed else 0)
        out[rule['id']] = (compiled, group)
    return out


def secret_of(example: gitleaks_examples.Example, regexes: dict) -> tuple[str, str]:
    """(the secret, where it came from): the rule's capture, else the generated secret, else ''."""
    found = regexes.get(example.rule)
    if found is not None:
        regex, group = found
        for match in regex.finditer(example.text):
            try:
                secret = match.group(group)
            except IndexError:
                secret = match.group(0)
            if secret:
                return secret, 'rule regex'
    if example.secret:
        return example.secret, 'generated secret'
    return '', 'none'


def redactor_from(commit: Optional[str]):
    """The Logger's default redactor: of this tree, or of an earlier ``commit`` of this repository."""
    if commit is None:
        from dist_logging.redaction import build_redactor
    else:
        build_redactor = redaction_at.module_at(commit).build_redactor
    return build_redactor(True)


def measure(git_dir: str, commit: str, code_at: Optional[str] = None, seed: int = 35) -> dict:
    """Per-example results and the per-cause summary (of this tree's code, or of commit ``code_at``'s)."""
    rules = gitleaks_examples.load(git_dir, commit, seed)
    regexes = rule_regexes(git_dir, commit)
    redact = redactor_from(code_at)
    rows = []
    for rule in rules:
        for example in rule.examples:
            out = redact({'example': example.text})['example']
            if example.positive:
                secret, source = secret_of(example, regexes)
                caught = (secret not in out) if secret else out != example.text
            else:
                secret, source, caught = '', '', out != example.text
            rows.append(
                {
                    'rule': example.rule,
                    'positive': example.positive,
                    'syntax': example.syntax,
                    'text': example.text,
                    'out': out,
                    'secret': secret,
                    'secret_from': source,
                    'caught': caught,
                }
            )
    positives = [r for r in rows if r['positive']]
    misses = [r for r in positives if not r['caught']]
    by_cause = collections.Counter(
        cause_of(gitleaks_examples.Example(r['rule'], r['text'], True, r['syntax'], None)) for r in misses
    )
    totals = collections.Counter(
        cause_of(gitleaks_examples.Example(r['rule'], r['text'], True, r['syntax'], None)) for r in positives
    )
    return {
        'commit': commit,
        'seed': seed,
        'code_at': code_at or 'this tree',
        'rules': len(rules),
        'skipped': {r.rule: r.skipped for r in rules if r.skipped},
        'positives': len(positives),
        'redacted': len(positives) - len(misses),
        'percent': round(100 * (len(positives) - len(misses)) / len(positives), 2),
        'by_cause': {cause: {'examples': totals[cause], 'missed': by_cause[cause]} for cause in sorted(totals)},
        'missed_by_rule': collections.Counter(r['rule'] for r in misses).most_common(),
        'false_positives': sum(not r['positive'] for r in rows),
        'false_positives_changed': sum(not r['positive'] and r['caught'] for r in rows),
        'rows': rows,
    }


def freeze(result: dict, path: str) -> None:
    """Write ``result``'s true positives that have a secret to ``path`` (gzipped JSON lines, sorted keys)."""
    import gzip

    with gzip.open(path, 'wt', encoding='utf-8', compresslevel=9) as handle:
        handle.write(json.dumps({'gitleaks_commit': result['commit'], 'seed': result['seed']}) + '\n')
        for row in result['rows']:
            if row['positive'] and row['secret']:
                cause = cause_of(gitleaks_examples.Example(row['rule'], row['text'], True, row['syntax'], None))
                handle.write(
                    json.dumps(
                        {'rule': row['rule'], 'cause': cause, 'text': row['text'], 'secret': row['secret']},
                        sort_keys=True,
                    )
                    + '\n'
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('git_dir')
    parser.add_argument('--commit', default=PINNED_COMMIT)
    parser.add_argument('--code-at', help='score the redaction code of this earlier commit (before issue 33)')
    parser.add_argument('--seed', type=int, default=35)
    parser.add_argument('--json')
    parser.add_argument('--misses', type=int, default=0, help='print this many missed examples per cause')
    parser.add_argument(
        '--freeze',
        metavar='PATH',
        help='also write the true positives (rule, syntax, cause, text, secret) as gzipped JSON lines: '
        'the corpus tests/test_redact.py scores without a gitleaks checkout',
    )
    args = parser.parse_args()
    result = measure(args.git_dir, args.commit, args.code_at, args.seed)
    if args.freeze:
        freeze(result, args.freeze)
    print(
        f"{result['redacted']} of {result['positives']} true positives redacted ({result['percent']} %), "
        f"{result['rules']} rules; false positives changed: {result['false_positives_changed']} of "
        f"{result['false_positives']}"
    )
    for cause, counts in result['by_cause'].items():
        print(f"  {cause}: {counts['missed']} missed of {counts['examples']}")
    print('  skipped statements:', result['skipped'] or 'none')
    print('  most missed rules:', result['missed_by_rule'][:25])
    if args.misses:
        shown = collections.Counter()
        for row in result['rows']:
            cause = cause_of(gitleaks_examples.Example(row['rule'], row['text'], True, row['syntax'], None))
            if row['positive'] and not row['caught'] and shown[cause] < args.misses:
                shown[cause] += 1
                print(f'--- {cause} {row["rule"]} [{row["syntax"]}] secret={row["secret"]!r}\n{row["text"][:300]}')
    if args.json:
        with open(args.json, 'w') as handle:
            json.dump(result, handle, indent=1)


if __name__ == '__main__':
    main()
