"""DistLoggingTracker: a real 2-process Accelerate job under torchrun, and in-process argument checks."""

from __future__ import annotations

import pathlib
import pytest

from _integration_helpers import read_jsonl, upload_records
from torchrun_helper import read_rank_outputs, run_torchrun

HERE = pathlib.Path(__file__).resolve().parent

NAMED_CONFIG = """\
destinations:
  - type: file
    filename: runs/named/rank{rank}.jsonl
    format: jsonl
    ranks: all
"""


@pytest.mark.serial
def test_tracker_by_instance_and_by_name_under_torchrun(tmp_path):
    config = tmp_path / 'named.yaml'
    config.write_text(NAMED_CONFIG)
    run_torchrun(
        HERE / 'accelerate_scenario.py',
        2,
        tmp_path,
        timeout=240,
        env={'DIST_LOGGING_CONFIG': str(config), 'HF_HUB_OFFLINE': '1', 'WANDB_DISABLED': 'true'},
    )
    outputs = read_rank_outputs(tmp_path)
    assert set(outputs) == {0, 1}
    # Accelerate calls trackers on the main process only, and the tracker issues no collective.
    assert outputs[0]['trackers'] == ['DistLoggingTracker', 'DistLoggingTracker']
    assert outputs[1]['trackers'] == []
    assert outputs[0]['collectives'] == [] and outputs[1]['collectives'] == []
    assert outputs[0]['built'] == 1 and outputs[1]['built'] == 0  # the factory ran on the main process only

    for run in ('instance', 'named'):
        assert not (tmp_path / 'runs' / run / 'rank1.jsonl').exists(), f'{run}: rank 1 wrote a log'
        records = read_jsonl(tmp_path / 'runs' / run / 'rank0.jsonl')
        hparams = [r['data'] for r in records if r['kind'] == 'hparams']
        assert len(hparams) == 1 and hparams[0]['lr'] == 0.1
        assert 'hf_abcdefghijklmnopqrstuvwxyz0123' not in (tmp_path / 'runs' / run / 'rank0.jsonl').read_text()
        losses = [(r['step'], r['data']['loss']) for r in records if r['kind'] == 'metric']
        assert [step for step, _ in losses] == list(range(20))
        traces = [r['data'] for r in records if r['kind'] == 'trace']
        assert traces and all(t == {'phase': 'train'} for t in traces)

    # The instance's Logger uploaded its log at finish(), from rank zero, byte-identical.
    uploaded = tmp_path / 'bucket' / 'runs' / 'instance' / 'rank0.jsonl'
    assert uploaded.read_bytes() == (tmp_path / 'runs' / 'instance' / 'rank0.jsonl').read_bytes()
    assert {r['rank'] for r in upload_records(tmp_path)} == {0}


# ---------------------------------------------------------------------- in-process checks (fast)


def test_tracker_validates_its_arguments(tmp_path, monkeypatch):
    from dist_logging import Logger
    from dist_logging.integrations.accelerate import DistLoggingTracker

    monkeypatch.delenv('DIST_LOGGING_CONFIG', raising=False)
    with pytest.raises(ValueError, match='DIST_LOGGING_CONFIG'):
        DistLoggingTracker('run')
    with pytest.raises(ValueError, match='not both'):
        DistLoggingTracker('run', logger=Logger(run_name='x'), config={'destinations': []})
    with pytest.raises(TypeError, match='logger must be'):
        DistLoggingTracker('run', logger=42)
    with pytest.raises(FileNotFoundError, match='missing.yaml'):
        DistLoggingTracker('run', config=str(tmp_path / 'missing.yaml'))
    with pytest.raises(ValueError, match='rankz'):
        DistLoggingTracker('run', config={'destinations': [{'type': 'in_memory', 'rankz': 'all'}]})
    with pytest.raises(TypeError, match='run_name'):
        DistLoggingTracker(7, config={'destinations': []})
    tracker = DistLoggingTracker('run', logger=lambda: 'not a logger')
    with pytest.raises(TypeError, match='returned a str'):
        tracker.start()


def test_tracker_in_one_process_maps_calls_and_closes(monkeypatch, tmp_path):
    import yaml

    from dist_logging.integrations.accelerate import DistLoggingTracker

    config = tmp_path / 'c.yaml'
    config.write_text(yaml.safe_dump({'destinations': [{'type': 'in_memory'}]}))
    monkeypatch.setenv('DIST_LOGGING_CONFIG', str(config))
    tracker = DistLoggingTracker('from-env')  # the way Accelerate builds it from log_with='dist_logging'
    tracker.start()
    logger = tracker.tracker
    assert logger.run_name == 'from-env'
    tracker.store_init_configuration({'lr': 0.5, 'api_key': 'abc'})
    tracker.log({'loss': 1.5, 'note': 'hi'}, step=3)
    memory = logger.destinations[0]
    assert memory.hyperparameters['lr'] == 0.5 and memory.hyperparameters['api_key'] != 'abc'
    assert memory.data['loss'] == [(3, 1.5)] and memory.traces['note'] == ['hi']
    with pytest.raises(TypeError, match='unexpected keyword'):
        tracker.log({'loss': 1.0}, step=4, commit=True)
    tracker.finish()
    with pytest.raises(RuntimeError, match='closed'):
        logger.log_metrics({'loss': 1.0})


def test_register_for_checkpointing_restores_the_logger(tmp_path):
    """A real Accelerator (one process): ``register_for_checkpointing(logger)`` saves the Logger with
    ``save_state`` and ``load_state`` resumes a new Logger at the saved step."""
    from accelerate import Accelerator

    from dist_logging import Logger
    from dist_logging.destinations import InMemoryLogger

    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    logger = Logger(InMemoryLogger(), run_name='acc')
    accelerator.register_for_checkpointing(logger)
    for _ in range(5):
        logger.batch_end()
        logger.log_metrics({'loss': 1.0})
    accelerator.save_state(str(tmp_path / 'state'))
    logger.close()

    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    memory = InMemoryLogger()
    resumed = Logger(memory, run_name='acc')
    accelerator.register_for_checkpointing(resumed)
    accelerator.load_state(str(tmp_path / 'state'))
    assert resumed.state.timestamp.batch == 5
    resumed.batch_end()
    resumed.log_metrics({'loss': 2.0})
    assert memory.data['loss'] == [(6, 2.0)] and [info.step for info in memory.resumes] == [5]
    resumed.close()
