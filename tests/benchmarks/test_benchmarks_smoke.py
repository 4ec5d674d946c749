"""Each benchmark runs once at tiny sizes under torchrun (2 ranks) and writes a well-formed JSON summary.

Never a timed assertion: the figures are not checked, only that the benchmarks still run
and report what the README's tables are built from.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from torchrun_helper import REPO_ROOT, run_torchrun

pytestmark = pytest.mark.multiprocess

BENCH = REPO_ROOT / 'benchmarks'


def _run(tmp_path, name, *args, timeout=300):
    out = tmp_path / f'{name}.json'
    result = run_torchrun(
        BENCH / f'{name}.py', 2, tmp_path / 'out', args=['--quick', '--out-json', str(out), *args], timeout=timeout
    )
    doc = json.loads(out.read_text())  # written by rank zero
    assert doc['benchmark'] == name
    assert doc['environment']['world_size'] == 2
    assert json.loads(result.stdout[result.stdout.index('{') :])['benchmark'] == name  # also printed on rank zero
    assert out.with_suffix('.png').stat().st_size > 0
    return doc


def _finite_summary(summary):
    assert summary['n'] > 0
    for key in ('median', 'p95', 'p99', 'max'):
        assert summary[key] is not None and summary[key] >= 0


def test_log_overhead(tmp_path):
    doc = _run(tmp_path, 'log_overhead')
    assert set(doc['per_rank']) == {'0', '1'}
    for mode in ('noop_call', 'dict_append', 'ours_3zero', 'ours_inmem', 'composer_design'):
        _finite_summary(doc['per_rank']['0'][mode])
        _finite_summary(doc['per_rank']['1'][mode])
    assert doc['targets']['other_ranks_ours_3zero_le_0.3us']['met'] in (True, False)


def test_gather_cost_and_run_all_renders_a_table(tmp_path):
    """One gather_cost launch serves both checks (run_all's table used to launch gather_cost again)."""
    doc = _run(tmp_path, 'gather_cost')
    assert doc['keys'] == [1, 10]
    for entry in doc['results'].values():
        for mode in ('flush', 'floor_1tensor', 'per_key'):
            _finite_summary(entry[mode]['slowest_rank'])
        assert entry['collectives_per_flush']['max'] >= 1  # a real reduction at 2 ranks
    spec = importlib.util.spec_from_file_location('bench_run_all', BENCH / 'run_all.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.render([doc])
    assert '| 2 | 10 |' in table


@pytest.mark.timeout(480)  # above its run's own bound (400 s): a loaded machine, not a hang
def test_upload_latency(tmp_path):
    doc = _run(tmp_path, 'upload_latency', '--sizes', '4KiB', '--stores', 'local,s3', timeout=400)
    for store in ('local', 's3'):
        modes = doc['results'][store]['4KiB']['modes']
        for mode in (
            'ours_copy',
            'ours_nocopy',
            'ours_procs',
            'floor_cfr',
            'floor_copy2',
            'floor_link',
            'sync_upload',
            'composer_design',
        ):
            _finite_summary(modes[mode]['blocking_us'])
        for mode in ('ours_copy', 'ours_nocopy', 'ours_procs', 'sync_upload', 'composer_design'):
            _finite_summary(modes[mode]['end_to_end_ms'])
            assert modes[mode]['bad_objects'] == 0  # everything accepted landed, byte counts right
    assert 'headline' in doc['evaluation']


def test_training_stall(tmp_path):
    doc = _run(tmp_path, 'training_stall')
    assert 'none' in doc['modes'] and 'ours_nocopy' in doc['modes'] and 'ours_procs_nocopy' in doc['modes']
    for mode in doc['modes'].values():
        _finite_summary(mode['step_ms'])
        assert mode['inflation_mean'] is not None


def test_size_parsing():
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))
    assert _common.parse_sizes('4KiB,1MiB,64MiB,256MiB,1GiB') == [4096, 1 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert _common.parse_size('2MB') == 2_000_000
    assert _common.format_size(256 << 20) == '256MiB'
    with pytest.raises(ValueError):
        _common.parse_size('4 parsecs')
    assert _common.summarize([1000, 2000, 3000])['median'] == 2.0


def test_soak(tmp_path):
    doc = _run(tmp_path, 'soak', '--minutes', '0.1', '--stores', 'local')
    overall = doc['overall']
    assert overall['missing_objects'] == 0 and overall['objects'] > 0
    assert overall['metric_calls_per_s_total'] > 0 and overall['max_open_fds'] > 0
    assert set(doc['series']) == {'0', '1'}


def test_checkpoint_load(tmp_path):
    # The S3 readers of the table that need no extra server-side work, and a tuned reader; fsspec and
    # s3torchconnector are exercised by test_checkpoint_stall's launch already.
    doc = _run(tmp_path, 'checkpoint_load', '--modes', 'floor,fs_local,boto3_fs,ours,ours_local,ours:2x4')
    ((label, result),) = doc['results'].items()
    assert label == '32MiB'
    for mode in ('fs_local', 'boto3_fs', 'ours', 'ours_local', 'ours:2x4'):
        assert result[mode]['exact'] is True, mode  # every reader loaded the checkpoint bit-exactly
        assert result[mode]['load_s'] > 0
    assert result['ours']['disk_during_mib'] == 0 and result['ours']['disk_after_mib'] == 0
    targets = result['targets']
    assert targets['best_other'] == 'boto3_fs'
    assert len(targets['ours_over_floor_per_round']) == 1 and targets['ours_over_floor_round_median'] > 0


@pytest.mark.timeout(480)  # above its run's own bound (400 s): a loaded machine, not a hang
def test_checkpoint_stall(tmp_path):
    doc = _run(tmp_path, 'checkpoint_stall', timeout=400)
    assert doc['skipped'] == {}  # every mode ran, s3torchconnector and s3fs included (the bench extra)
    ((label, exp),) = doc['experiments'].items()
    assert label == '4MiB/cpu-bound' and exp['checkpoint_bytes'] >= 4 << 20
    modes = exp['modes']
    assert set(modes) == {
        'none',
        'ours_save',
        'ours_async',
        'fs_upload',
        'fs_async_local',
        'fsspec_async',
        's3tc_save',
        's3tc_async',
    }
    for name, mode in modes.items():
        _finite_summary(mode['step_ms'])
        if name == 'none':
            continue
        _finite_summary(mode['blocking_ms'])
        _finite_summary(mode['local_durable_s'])
        if name != 'fs_async_local':
            _finite_summary(mode['commit_s'])  # every save of every uploading mode committed
        io = mode['disk_bytes_per_checkpoint_byte']
        # Byte counts, not timings: the local-disk modes wrote the checkpoint, the S3-direct ones did not.
        if name in ('fs_upload', 'fs_async_local'):
            assert io['write_bytes'] >= 0.9
        elif name.startswith('ours'):
            # Shards go to local disk and are read back once for the upload; written over spare files,
            # whose pages may still be dirty from the save before (counted once by the kernel).
            assert 0 < io['write_bytes'] <= 1.1 and 0.9 <= io['rchar'] <= 1.1
        else:
            assert io['write_bytes'] < 0.1
    _finite_summary(modes['fs_upload']['save_call_ms'])
    assert set(doc['targets'][label]) >= {
        'ours_save_blocking_le_1.1x_filesystemwriter_save',
        'ours_async_blocking_le_1.1x_dcp_async_local',
        'ours_save_commit_le_best_of_modes_4_5',
        'ours_save_written_once_read_once',
    }
    memory = doc['memory']  # --quick: 24 saves through one writer, sampled every 10
    assert memory['saves'] == 24 and memory['committed_at_end'] == ['ckpt/memory/step00022', 'ckpt/memory/step00023']
    for rank in memory['ranks']:
        assert [s['saves'] for s in rank['samples']] == [10, 20, 24]
        assert set(rank['rss_growth_by_mode']) == {'ours', 'filesystemwriter'}
        assert all(s['rss'] > 0 and s['dist_logging_py'] > 0 and s['fds'] > 0 for s in rank['samples'])


def test_telemetry_overhead(tmp_path):
    pytest.importorskip('psutil', reason='pip install "dist-logging[system]"')
    pytest.importorskip('prometheus_client', reason='pip install "dist-logging[prometheus]"')
    doc = _run(tmp_path, 'telemetry_overhead')
    for mode in ('off', 'on', 'on_fast'):
        _finite_summary(doc['step_us'][mode])
    assert set(doc['median_round_ratio_vs_off']) == {'on', 'on_fast'}
    assert doc['sample_once_cpu_us']['median'] > 0
