"""Cost of the value rule on log lines: ``redact_text`` before issue 23 (``_redact_v1``), at 29372ac (before issue
35, read from git) and now.

Launch::

    torchrun --standalone --nproc_per_node=1 benchmarks/redaction_cost.py

Every rank times the same lines (redaction has no collective; more ranks only add load). Modes are
interleaved round by round (the order rotated), each round timing ``--inner`` back-to-back calls per
line and dividing. ``at_29372ac`` is the package's ``_redact.py`` and its two rule tables as they were at
that commit, read with ``git show`` and run as one module (``tools/redaction_at.py``, so the table
changes of issue 35 are not in it);
``ratio_vs_29372ac`` is issue 35's target (at most 1.5 on plain lines). Lines: plain training log lines
(what almost every call sees), a line with a long path component and one with a UUID (they pass the
cheap check and pay the keyword scan), and lines that do hold a credential (a URL password, a Hugging
Face token, a ``KAGGLE_KEY=...`` pair).

With ``detect-secrets`` installed (the ``bench`` extra) it is timed too (``scan_line`` with its
default plugins; ``--inner`` divided by 20 for it, it is ~100x slower), and its coverage is
counted on freshly drawn credentials of each format in ``tests/credential_samples.py``: which
formats a named plugin reports (high-entropy plugins do not count: they also report git SHAs,
which is checked) against ours.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tools'))

import _common as C  # noqa: E402
import _redact_v1  # noqa: E402
import redaction_at  # noqa: E402

from dist_logging.redaction import redact_text  # noqa: E402

NAME = 'redaction_cost'
_LETTERS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'
LINES = {
    'plain_metrics': 'step 1200 loss=1.2345 lr=3e-4 tokens/s=51234',
    'plain_logging': '2026-11-25 12:00:01 INFO trainer: epoch 3 batch 1200/5000 loss 1.2345 grad_norm 0.87 lr 3.0e-04',
    'plain_path': 'Saving checkpoint to /data/checkpoints/llama2_7b_sft/ep3-ba1200-rank0.pt',
    'long_path': 'Saving checkpoint to /data/checkpoints/llama2_7b_sft_lora_r16/ep3-ba1200-rank0.pt',
    'uuid': 'run 5f0c3a9e-8b7d-4c2e-9a1f-3e6d2b8c7a40 resumed from step 1200',
    'url_password': 'connecting to postgres://alice:s3cr3t@db:5432/x',
    'hf_token': 'login with hf_' + (_LETTERS * 2)[7:41] + ' done',
    'env_pair': 'env KAGGLE_KEY=0123456789abcdef0123456789abcdef01234567 WORLD_SIZE=8',
}
PLAIN = ('plain_metrics', 'plain_logging', 'plain_path')
BASELINE_COMMIT = '29372ac'


MODES = {
    'before': _redact_v1.redact_text,
    'at_29372ac': redaction_at.module_at(BASELINE_COMMIT).redact_text,
    'after': redact_text,
}
GIT_SHA = '01c7f73d771dfac7d292323805ebc428287df4f9'
_DETECT_SECRETS_SETTINGS: Any = None


def detect_secrets_scanner() -> Optional[Any]:
    """``line -> [secret types]`` with detect-secrets' default plugins, or None when it is not installed."""
    try:
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import default_settings
    except ImportError:
        return None
    global _DETECT_SECRETS_SETTINGS
    # Entered until run() ends (kept referenced: a collected context manager would exit at once).
    _DETECT_SECRETS_SETTINGS = default_settings()
    _DETECT_SECRETS_SETTINGS.__enter__()

    def scan(line: str) -> list[str]:
        return [secret.type for secret in scan_line(line)]

    return scan


def coverage(scan: Any) -> dict[str, Any]:
    """Formats of tests/credential_samples.py that detect-secrets (a named plugin) and we report."""
    sys.path.insert(0, str(C.REPO_ROOT / 'tests'))
    from credential_samples import samples, webhook_urls

    values = dict(samples())
    values.update({name: url for name, (url, _) in webhook_urls().items()})
    named = {name: [t for t in scan(value) if 'High Entropy' not in t] for name, value in values.items()}
    ours = {name: redact_text(value) != value for name, value in values.items()}
    return {
        'formats': len(values),
        'detect_secrets_named_plugin': sorted(name for name, types in named.items() if types),
        'ours': sorted(name for name, hit in ours.items() if hit),
        'detect_secrets_flags_git_sha': scan(f'revision: {GIT_SHA}'),
        'ours_flags_git_sha': redact_text(f'revision: {GIT_SHA}') != f'revision: {GIT_SHA}',
    }


def run(rounds: int, inner: int) -> dict[str, Any]:
    modes = dict(MODES)
    scan = detect_secrets_scanner()
    if scan is not None:
        modes['detect_secrets'] = scan
    samples: dict[str, dict[str, list[float]]] = {mode: {line: [] for line in LINES} for mode in modes}
    for _, order in C.rotations(list(modes), rounds):
        for mode in order:
            fn = modes[mode]
            calls = max(1, inner // 20) if mode == 'detect_secrets' else inner
            for line_name, line in LINES.items():
                start = time.perf_counter_ns()
                for _ in range(calls):
                    fn(line)
                samples[mode][line_name].append((time.perf_counter_ns() - start) / calls)
    per_line = {}
    for line_name in LINES:
        before = min(samples['before'][line_name])
        after = min(samples['after'][line_name])
        baseline = min(samples['at_29372ac'][line_name])
        per_line[line_name] = {
            'before_ns': round(before),
            'after_ns': round(after),
            'ratio': round(after / before, 2),
            'at_29372ac_ns': round(baseline),
            'ratio_vs_29372ac': round(after / baseline, 2),
            'before_median_ns': round(C.percentile(sorted(samples['before'][line_name]), 50)),
            'after_median_ns': round(C.percentile(sorted(samples['after'][line_name]), 50)),
        }
        if scan is not None:
            fastest = min(samples['detect_secrets'][line_name])
            per_line[line_name]['detect_secrets_ns'] = round(fastest)
            per_line[line_name]['detect_secrets_over_after'] = round(fastest / after, 1)
    worst_plain = max(per_line[name]['ratio'] for name in PLAIN)
    worst_vs_baseline = max(per_line[name]['ratio_vs_29372ac'] for name in PLAIN)
    summary = {
        'lines': LINES,
        'per_line': per_line,
        'worst_plain_ratio': worst_plain,
        'target_plain_ratio': 2.0,
        'worst_plain_ratio_vs_29372ac': worst_vs_baseline,
        'target_plain_ratio_vs_29372ac': 1.5,
    }
    if scan is not None:
        summary['coverage'] = coverage(scan)
        _DETECT_SECRETS_SETTINGS.__exit__(None, None, None)
    return summary


def plot(summary: dict[str, Any], d: C.Dist, out_json: Optional[str]) -> None:
    fig, axes = C.new_figure(width=9)
    ax = axes[0]
    names = list(summary['per_line'])
    xs = range(len(names))
    ax.bar(
        [x - 0.27 for x in xs],
        [summary['per_line'][n]['before_ns'] for n in names],
        width=0.27,
        label='before issue 23',
    )
    ax.bar(list(xs), [summary['per_line'][n]['at_29372ac_ns'] for n in names], width=0.27, label='29372ac')
    ax.bar([x + 0.27 for x in xs], [summary['per_line'][n]['after_ns'] for n in names], width=0.27, label='now')
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha='right')
    ax.set_ylabel('ns per redact_text call (min over rounds)')
    ax.set_title('redact_text per log line: before issue 23, at 29372ac, now')
    ax.legend()
    C.save_figure(fig, NAME, d, out_json)


def main() -> None:
    parser = C.base_parser(__doc__)
    parser.add_argument('--rounds', type=int, default=30)
    parser.add_argument('--inner', type=int, default=2000)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.inner = 3, 100
    d = C.init_distributed(args.backend)
    summary = {
        'environment': C.environment(d),
        'rounds': args.rounds,
        'inner': args.inner,
        **run(args.rounds, args.inner),
    }
    C.finish(NAME, d, summary, args, plot)


if __name__ == '__main__':
    main()
