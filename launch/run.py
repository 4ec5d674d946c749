"""Launch launch/train.py under ``torchrun --standalone`` and show where each rank's output went.

Usage: ``python launch/run.py [--nproc-per-node N] [--config configs/per_rank.yaml] [-- extra train.py args]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--nproc-per-node', type=int, default=2)
    parser.add_argument('--config', default='configs/per_rank.yaml')
    parser.add_argument('--workdir', default='demo', help='folder the job runs in (logs and buckets go here)')
    parser.add_argument('train_args', nargs=argparse.REMAINDER, help='extra arguments for train.py (after --)')
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error(f'--nproc-per-node must be >= 1, got {args.nproc_per_node}')
    config = (ROOT / args.config).resolve() if not os.path.isabs(args.config) else pathlib.Path(args.config)
    if not config.is_file():
        parser.error(f'config {str(config)!r} does not exist')
    workdir = pathlib.Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    report = pathlib.Path(tempfile.mkdtemp(prefix='dist-logging-demo-'))
    try:
        extra = [a for a in args.train_args if a != '--']
        cmd = [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            f'--nproc_per_node={args.nproc_per_node}',
            str(HERE / 'train.py'),
            '--config',
            str(config),
            '--report',
            str(report),
            *extra,
        ]
        run_name = os.environ.get('DIST_LOGGING_RUN_NAME') or time.strftime('demo-%Y%m%d-%H%M%S')
        env = dict(
            os.environ,
            DIST_LOGGING_RUN_NAME=run_name,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])),
        )
        # The job's machine-wide state (upload caps, download locks) in the work folder too, not in the
        # system temp folder's per-user base: the demo leaves nothing outside the folder it names.
        env.setdefault('DIST_LOGGING_TMPDIR', str(workdir / '.dist_logging'))
        print('$ ' + ' '.join(cmd), flush=True)
        returncode = subprocess.call(cmd, cwd=workdir, env=env)
        if returncode != 0:
            print(f'training exited with {returncode}', file=sys.stderr)
            return returncode
        print('\nWhere each rank\'s output went (paths relative to ' + str(workdir) + '):')
        buckets: set[pathlib.Path] = set()
        for path in sorted(report.glob('rank*.json'), key=lambda p: int(p.stem[4:])):
            info = json.loads(path.read_text())
            print(
                f"  rank {info['rank']} (node {info['node_rank']}, local rank {info['local_rank']}, launched by "
                f"{info.get('launcher', '?')}), run {info['run_name']}:"
            )
            for output in info['outputs']:
                details = ', '.join(f'{k}={v}' for k, v in output.items() if k != 'destination')
                print(f"    {output['destination']}: {details}")
                bucket = _local_bucket(output.get('bucket_uri'), workdir)
                if bucket is not None:
                    buckets.add(bucket)
        python_logs = []
        for path in sorted(report.glob('rank*.json'), key=lambda p: int(p.stem[4:])):
            info = json.loads(path.read_text())
            if info.get('python_log'):
                python_logs.append(pathlib.Path(info['cwd']) / info['python_log'])
        if python_logs:
            print('\nPython logging, warnings and errors, one file per rank (setup_logging):')
            for item in python_logs:
                print(f'  {item.relative_to(workdir) if item.is_relative_to(workdir) else item}')
            folder = pathlib.Path(os.path.commonpath([str(p.parent) for p in python_logs]))
            folder = folder.relative_to(pathlib.Path.cwd()) if folder.is_relative_to(pathlib.Path.cwd()) else folder
            print('Read them as one time-ordered stream (identical lines of several ranks shown once, as [ranks 0-N]):')
            print(
                f'  .venv/bin/dist-logging logs {folder}/python-rank*.log'
                '    (also: --level WARNING, --ranks 1, --follow)'
            )
        for bucket in sorted(buckets):
            objects = sorted(p for p in (bucket / run_name).rglob('*') if p.is_file())
            print(f'\nIn the bucket {bucket} ({len(objects)} objects):')
            for item in objects:
                print(f'  {item.relative_to(bucket)} ({item.stat().st_size:,} bytes)')
        tensorboard_dirs = sorted({str(p.parent) for p in (workdir / 'runs' / run_name).rglob('events.out.tfevents.*')})
        if tensorboard_dirs:
            print('\nOpen TensorBoard on them with:')
            print(f'  .venv/bin/tensorboard --logdir {os.path.commonpath(tensorboard_dirs)}')
        return 0
    finally:
        shutil.rmtree(report, ignore_errors=True)


def _local_bucket(bucket_uri: str | None, workdir: pathlib.Path) -> pathlib.Path | None:
    """The folder of a ``file://`` (or plain path) bucket URI, resolved like the job resolved it."""
    if not bucket_uri or '://' in bucket_uri and not bucket_uri.startswith('file://'):
        return None
    path = pathlib.Path(bucket_uri[len('file://') :] if bucket_uri.startswith('file://') else bucket_uri)
    return path if path.is_absolute() else workdir / path


if __name__ == '__main__':
    sys.exit(main())
