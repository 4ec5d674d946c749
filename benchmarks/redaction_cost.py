"""Cost of the value rule on log lines: ``redact_text`` before issue 23 (``_redact_v1``) and now.

Launch::

    torchrun --standalone --nproc_per_node=1 benchmarks/redaction_cost.py

Every rank times the same lines (redaction has no collective; more ranks only add load). Modes are
interleaved round by round (the order rotated), each round timing ``--inner`` back-to-back calls per
line and dividing. Lines: plain training log lines (what almost every call sees), a line with a long
path component (it passes the cheap check and pays the keyword scan), and lines that do hold a
credential (a URL password, a Hugging Face token, a ``KAGGLE_KEY=...`` pair).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import _redact_v1  # noqa: E402

from dist_logging._redact import redact_text  # noqa: E402

NAME = 'redaction_cost'
_LETTERS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'
LINES = {
    'plain_metrics': 'step 1200 loss=1.2345 lr=3e-4 tokens/s=51234',
    'plain_logging': '2026-11-25 12:00:01 INFO trainer: epoch 3 batch 1200/5000 loss 1.2345 grad_norm 0.87 lr 3.0e-04',
    'plain_path': 'Saving checkpoint to /data/checkpoints/llama2_7b_sft/ep3-ba1200-rank0.pt',
    'long_path': 'Saving checkpoint to /data/checkpoints/llama2_7b_sft_lora_r16/ep3-ba1200-rank0.pt',
    'url_password': 'connecting to postgres://alice:s3cr3t@db:5432/x',
    'hf_token': 'login with hf_' + (_LETTERS * 2)[7:41] + ' done',
    'env_pair': 'env KAGGLE_KEY=0123456789abcdef0123456789abcdef01234567 WORLD_SIZE=8',
}
PLAIN = ('plain_metrics', 'plain_logging', 'plain_path')
MODES = {'before': _redact_v1.redact_text, 'after': redact_text}


def run(rounds: int, inner: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {mode: {line: [] for line in LINES} for mode in MODES}
    for _, order in C.rotations(list(MODES), rounds):
        for mode in order:
            fn = MODES[mode]
            for line_name, line in LINES.items():
                start = time.perf_counter_ns()
                for _ in range(inner):
                    fn(line)
                samples[mode][line_name].append((time.perf_counter_ns() - start) / inner)
    per_line = {}
    for line_name in LINES:
        before = min(samples['before'][line_name])
        after = min(samples['after'][line_name])
        per_line[line_name] = {'before_ns': round(before), 'after_ns': round(after), 'ratio': round(after / before, 2),
                               'before_median_ns': round(C.percentile(sorted(samples['before'][line_name]), 50)),
                               'after_median_ns': round(C.percentile(sorted(samples['after'][line_name]), 50))}
    worst_plain = max(per_line[name]['ratio'] for name in PLAIN)
    return {'lines': LINES, 'per_line': per_line, 'worst_plain_ratio': worst_plain, 'target_plain_ratio': 2.0}


def plot(summary: dict[str, Any], d: C.Dist, out_json: Optional[str]) -> None:
    fig, axes = C.new_figure(width=9)
    ax = axes[0]
    names = list(summary['per_line'])
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [summary['per_line'][n]['before_ns'] for n in names], width=0.4, label='before')
    ax.bar([x + 0.2 for x in xs], [summary['per_line'][n]['after_ns'] for n in names], width=0.4, label='after')
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha='right')
    ax.set_ylabel('ns per redact_text call (min over rounds)')
    ax.set_title('redact_text per log line, before/after issue 23')
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
    summary = {'environment': C.environment(d), 'rounds': args.rounds, 'inner': args.inner,
               **run(args.rounds, args.inner)}
    C.finish(NAME, d, summary, args, plot)


if __name__ == '__main__':
    main()
