"""The dist-logging command: drain / ls on a staging folder left by a killed process, upload / download, validate."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap

import pytest

from s3_server import aws_credentials, s3_server  # noqa: F401 - fixtures

from dist_logging.cli import main

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / 'configs'
pytestmark = pytest.mark.timeout(180)


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- help and usage
@pytest.mark.parametrize('command', ['drain', 'ls', 'upload', 'download', 'validate'])
def test_help_for_each_command(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, '--help'])
    assert exc.value.code == 0
    assert f'dist-logging {command}' in capsys.readouterr().out


def test_bad_usage_exits_2(capsys):
    for argv in ([], ['frobnicate'], ['upload', 'file:///tmp/b'], ['validate', 'x.yaml', '--world-size', '0']):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()


def test_python_m_dist_logging(tmp_path):
    result = subprocess.run(
        [sys.executable, '-m', 'dist_logging', 'validate', str(tmp_path / 'missing.yaml')],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert 'does not exist' in result.stderr


# ---------------------------------------------------------------------------- drain / ls
CRASH = textwrap.dedent('''
    import os, signal, sys, time
    from dist_logging.object_store import local

    def hang(self, *args, **kwargs):  # a store that never answers: uploads stay pending
        time.sleep(3600)

    local.LocalObjectStore.upload_object = hang
    from dist_logging import Logger
    from dist_logging.destinations.remote import RemoteUploaderDownloader

    bucket, staging, data = sys.argv[1:4]
    logger = Logger(RemoteUploaderDownloader(bucket_uri=bucket, upload_staging_folder=staging,
                                             num_concurrent_uploads=1), run_name='crash')
    for i in range(3):
        path = os.path.join(data, f'f{i}.txt')
        with open(path, 'w') as f:
            f.write(str(i) * (1000 * (i + 1)))
        logger.upload_file(f'{{run_name}}/f{i}.txt', path)
    print('queued', flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
''')


@pytest.fixture
def killed_run(tmp_path):
    if importlib.util.find_spec('dist_logging.destinations.remote') is None:
        pytest.skip('dist_logging.destinations.remote is not there yet')
    script = tmp_path / 'crash.py'
    script.write_text(CRASH)
    bucket, staging, data = tmp_path / 'bucket', tmp_path / 'staging', tmp_path / 'data'
    data.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(bucket), str(staging), str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert 'queued' in result.stdout, result.stderr
    return bucket, staging, data


def test_ls_and_drain_a_killed_run(killed_run, capsys):
    bucket, staging, data = killed_run
    code, out, _ = _run(capsys, 'ls', str(staging))
    assert code == 0
    assert 'rank 0: 3 pending' in out
    for i in range(3):
        assert f'crash/f{i}.txt' in out
    assert 'total: 3 pending upload(s)' in out

    code, out, err = _run(capsys, 'drain', str(staging), '--no-progress')
    assert code == 0, err
    assert 'uploaded 3 object(s)' in out
    for i in range(3):
        assert (bucket / 'crash' / f'f{i}.txt').read_bytes() == (data / f'f{i}.txt').read_bytes()
    code, out, _ = _run(capsys, 'ls', str(staging))
    assert code == 0 and 'no pending uploads' in out


def test_drain_and_ls_missing_folder_exit_2(tmp_path, capsys):
    for command in ('drain', 'ls'):
        code, _, err = _run(capsys, command, str(tmp_path / 'nope'))
        assert code == 2 and 'does not exist' in err


# ---------------------------------------------------------------------------- upload / download
def test_upload_and_download_with_a_local_bucket(tmp_path, capsys):
    bucket = tmp_path / 'bucket'
    a, b = tmp_path / 'a.txt', tmp_path / 'b.bin'
    a.write_text('alpha')
    b.write_bytes(b'\x00\x01' * 5000)
    code, out, err = _run(
        capsys, 'upload', bucket.as_uri(), str(a), str(b), '--name', 'up/{stem}-{index}{ext}', '--no-progress'
    )
    assert code == 0, err
    assert (bucket / 'up' / 'a-0.txt').read_text() == 'alpha'
    assert (bucket / 'up' / 'b-1.bin').read_bytes() == b.read_bytes()

    code, _, err = _run(capsys, 'upload', str(bucket), str(a), '--name', 'up/a-0.txt', '--no-progress')
    assert code == 1 and 'already exists' in err and '--overwrite' in err
    code, _, err = _run(capsys, 'upload', str(bucket), str(a), '--name', 'up/a-0.txt', '--overwrite', '--no-progress')
    assert code == 0, err

    dest = tmp_path / 'down'
    dest.mkdir()
    code, out, err = _run(capsys, 'download', str(bucket), 'up/b-1.bin', str(dest), '--no-progress')
    assert code == 0, err
    assert (dest / 'b-1.bin').read_bytes() == b.read_bytes()
    code, _, err = _run(capsys, 'download', str(bucket), 'up/b-1.bin', str(dest / 'b-1.bin'), '--no-progress')
    assert code == 2 and '--overwrite' in err
    code, _, err = _run(capsys, 'download', str(bucket), 'up/missing', str(dest / 'x'), '--no-progress')
    assert code == 1 and "no object 'up/missing'" in err


def test_upload_and_download_with_s3(tmp_path, capsys, monkeypatch, s3_server):
    pytest.importorskip('boto3')
    bucket = s3_server.create_bucket()
    monkeypatch.setenv('AWS_ENDPOINT_URL', s3_server.endpoint)
    file = tmp_path / 'model.pt'
    file.write_bytes(b'weights' * 1000)
    code, out, err = _run(
        capsys, 'upload', f's3://{bucket}/runs', str(file), '--name', 'exp/{filename}', '--no-progress'
    )
    assert code == 0, err
    assert f's3://{bucket}/runs/exp/model.pt' in out
    code, _, err = _run(
        capsys, 'download', f's3://{bucket}/runs', 'exp/model.pt', str(tmp_path / 'back.pt'), '--no-progress'
    )
    assert code == 0, err
    assert (tmp_path / 'back.pt').read_bytes() == file.read_bytes()


@pytest.mark.parametrize(
    'argv, message',
    [
        (['upload', 'magic://bucket/p', '{file}'], "unsupported scheme 'magic'"),
        (['upload', '{bucket}', '{missing}'], 'does not exist'),
        (['upload', '{bucket}', '{file}', '{file}'], 'the same name'),
        (['upload', '{bucket}', '{file}', '--name', '../{filename}'], '".." component'),
        (['upload', '{bucket}', '{file}', '--name', '{nope}'], 'placeholders'),
        (['download', 'nosuchproto://x/y', 'a', '{dest}'], "unsupported scheme 'nosuchproto'"),
        (['download', '{bucket}', '/abs', '{dest}'], 'absolute'),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, argv, message):
    file = tmp_path / 'f.txt'
    file.write_text('x')
    values = {
        'file': str(file),
        'bucket': str(tmp_path / 'bucket'),
        'missing': str(tmp_path / 'missing'),
        'dest': str(tmp_path / 'dest'),
    }
    code, _, err = _run(
        capsys, *[arg.format(**values) if arg.startswith('{') and arg != '{nope}' else arg for arg in argv]
    )
    assert code == 2 and message in err


# ---------------------------------------------------------------------------- validate
def test_validate_prints_each_rank(capsys):
    if importlib.util.find_spec('dist_logging.destinations.remote') is None:
        pytest.skip('dist_logging.destinations.remote is not there yet')
    code, out, err = _run(
        capsys,
        'validate',
        str(CONFIGS / 'per_rank.yaml'),
        '--world-size',
        '4',
        '--nproc-per-node',
        '2',
        '--run-name',
        'demo',
    )
    assert code == 0, err
    assert 'world size 4, 2 rank(s) per node, 2 node(s)' in out
    assert 'rank 3 (node 1, local rank 1):' in out
    assert 'filename=runs/demo/logs/rank3.jsonl' in out and 'remote_file_name=demo/logs/rank3.jsonl' in out
    assert 'upload: remote (ranks=all)' in out
    rank1 = out.split('rank 1 (')[1].split('rank 2 (')[0]
    assert 'tensorboard' not in rank1 and 'console' not in rank1  # rank-zero destinations only on rank 0
    assert 'package tensorboard: ok' in out and out.rstrip().endswith('config OK')


def test_validate_bad_config_exits_2_with_the_key_path(tmp_path, capsys):
    config = tmp_path / 'bad.yaml'
    config.write_text('destinations:\n  - type: console\n  - type: file\n  - type: console\n    rankz: zero\n')
    code, _, err = _run(capsys, 'validate', str(config))
    assert code == 2
    assert "destinations[2].rankz: unknown key; did you mean 'ranks'?" in err
    code, _, err = _run(capsys, 'validate', str(tmp_path / 'missing.yaml'))
    assert code == 2 and 'does not exist' in err


def test_validate_catches_values_per_rank(tmp_path, capsys):
    config = tmp_path / 'shared.yaml'
    config.write_text('destinations:\n  - type: file\n    filename: runs/{run_name}/log.txt\n    ranks: all\n')
    code, _, err = _run(capsys, 'validate', str(config))
    assert code == 0  # one rank: fine
    code, _, err = _run(capsys, 'validate', str(config), '--world-size', '2')
    assert code == 2 and 'cannot tell ranks apart' in err and 'destinations[0] (file)' in err


def test_validate_names_the_extra_of_a_missing_package(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'mlflow' else real(name, *a))
    code, out, err = _run(capsys, 'validate', str(CONFIGS / 'mlflow.yaml'))
    assert code == 1
    assert 'package mlflow: MISSING: pip install "dist-logging[mlflow]"' in out


# ---------------------------------------------------------------------------- logs
def _python_log(path: pathlib.Path, rank: int, message: str, when: float) -> None:
    from dist_logging._log_line import format_record

    with open(path, 'a', encoding='utf-8') as handle:
        handle.write(format_record(when, rank, 'INFO', 'train', message) + '\n')


def test_logs_merges_and_reports_bad_input(tmp_path, capsys):
    import time

    for rank in range(3):
        _python_log(tmp_path / f'py-rank{rank}.log', rank, 'same everywhere', time.time())
    code, out, _ = _run(capsys, 'logs', str(tmp_path))
    assert code == 0 and out.startswith('[ranks 0-2] ') and out.count('\n') == 1
    code, out, _ = _run(capsys, 'logs', str(tmp_path), '--ranks', '1', '--level', 'info', '--no-collapse')
    assert code == 0 and out.startswith('[rank 1] ') and out.count('\n') == 1
    code, _, err = _run(capsys, 'logs', str(tmp_path / 'nope'))
    assert code == 2 and 'dist-logging logs: error:' in err and 'does not exist' in err
    for bad in (['--ranks', '3-1'], ['--level', 'LOUD'], ['--window', '-1']):
        with pytest.raises(SystemExit) as exc:
            main(['logs', str(tmp_path), *bad])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'ends before it starts' in err and "unknown level 'LOUD'" in err and "got '-1'" in err


def test_logs_follow_until_sigterm(tmp_path):
    import queue
    import signal
    import threading
    import time

    log = tmp_path / 'py-rank0.log'
    _python_log(log, 0, 'first line', time.time())
    proc = subprocess.Popen(
        [sys.executable, '-m', 'dist_logging', 'logs', '--follow', '--window', '0', str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        assert 'first line' in lines.get(timeout=60)
        _python_log(tmp_path / 'py-rank1.log', 1, 'a new file', time.time())  # a rank's file appearing later
        assert lines.get(timeout=30).startswith('[rank 1] ')
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
