"""Run launch/checkpoint_example.py twice under torchrun: train and get killed, then relaunch and resume.

Usage: ``python launch/checkpoint_run.py [--nproc-per-node 2] [--workdir demo-ckpt] [-- extra example args]``

The bucket (``<workdir>/bucket``, a local folder unless ``--bucket`` says otherwise), the upload
staging folder and the per-rank reports live in the work folder. Afterwards it prints which
checkpoint the restarted job resumed from and whether the state it loaded is bit-identical to
the state that was saved at that step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def command(nproc: int, workdir: pathlib.Path, bucket: str, attempt: int, extra: list[str]) -> list[str]:
    """The torchrun command line of one launch of the example."""
    return [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        f'--nproc_per_node={nproc}',
        str(HERE / 'checkpoint_example.py'),
        '--bucket',
        bucket,
        '--staging',
        str(workdir / 'staging'),
        '--out',
        str(workdir / 'report'),
        '--attempt',
        str(attempt),
        *extra,
    ]


def summarize(report_dir: pathlib.Path) -> dict:
    """What the attempts reported: per rank, the step resumed from and whether the loaded state matched."""
    reports = [json.loads(p.read_text()) for p in sorted(report_dir.glob('rank*-attempt*.json'))]
    by_rank: dict[int, dict[int, dict]] = {}
    for rep in reports:
        by_rank.setdefault(rep['rank'], {})[rep['attempt']] = rep
    out = {}
    for rank, attempts in sorted(by_rank.items()):
        first, last = attempts.get(0), attempts.get(max(attempts))
        resumed = last.get('resumed_from') if last else None
        saved = first['saves'].get(str(resumed)) if first and resumed is not None else None
        out[rank] = {
            'attempts': sorted(attempts),
            'resumed_from': resumed,
            'loaded_equals_saved': saved is not None and saved == last.get('loaded_digest'),
            'final_step': last.get('final_step') if last else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--nproc-per-node', type=int, default=2)
    parser.add_argument('--workdir', default='demo-ckpt')
    parser.add_argument('--bucket', default=None, help='default: <workdir>/bucket (a local folder)')
    parser.add_argument('--die-at-step', type=int, default=17, help='the first launch is killed from this step on')
    parser.add_argument(
        'example_args',
        nargs=argparse.REMAINDER,
        help='extra arguments for checkpoint_example.py (after --; default: --steps 40 --save-every 5)',
    )
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error(f'--nproc-per-node must be >= 1, got {args.nproc_per_node}')
    workdir = pathlib.Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    bucket = args.bucket or (workdir / 'bucket').as_uri()
    extra = [a for a in args.example_args if a != '--'] or ['--steps', '40', '--save-every', '5']
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    env.setdefault('OMP_NUM_THREADS', '1')
    first = command(args.nproc_per_node, workdir, bucket, 0, [*extra, '--die-at-step', str(args.die_at_step)])
    print('$ ' + ' '.join(first), flush=True)
    code = subprocess.call(first, cwd=workdir, env=env)
    if code == 0:
        print('the first launch finished without being killed (--die-at-step past --steps?)', file=sys.stderr)
        return 1
    print(f'first launch killed (exit {code}); relaunching', flush=True)
    second = command(args.nproc_per_node, workdir, bucket, 1, extra)
    print('$ ' + ' '.join(second), flush=True)
    code = subprocess.call(second, cwd=workdir, env=env)
    for rank, info in summarize(workdir / 'report').items():
        print(
            f'rank {rank}: attempts {info["attempts"]}, resumed from step {info["resumed_from"]}, '
            f'loaded state == saved state: {info["loaded_equals_saved"]}, finished at step {info["final_step"]}'
        )
    return code


if __name__ == '__main__':
    sys.exit(main())
