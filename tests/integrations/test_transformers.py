"""DistLoggingCallback: a real Hugging Face Trainer under torchrun (2 processes), and in-process checks."""

from __future__ import annotations

import pathlib
import types

import pytest

from _integration_helpers import read_jsonl, upload_records
from torchrun_helper import run_torchrun

HERE = pathlib.Path(__file__).resolve().parent
HUB_TOKEN = 'hf_SECRETabcdefghijklmnopqrstuvwxyz01'  # as in transformers_scenario.py

CONFIG = """\
run_name: hf-run
destinations:
  - type: file
    filename: runs/{run_name}/rank{rank}.jsonl
    format: jsonl
    ranks: all
  - type: '_integration_helpers:RecordingRemote'
    bucket: ${OUT_DIR}/bucket
    upload_staging_folder: ${OUT_DIR}/staging
"""


@pytest.mark.serial
def test_trainer_under_torchrun_with_report_to(tmp_path):
    config = tmp_path / 'logger.yaml'
    config.write_text(CONFIG)
    run_torchrun(
        HERE / 'transformers_scenario.py',
        2,
        tmp_path,
        timeout=240,
        env={
            'DIST_LOGGING_CONFIG': str(config),
            'HF_HUB_OFFLINE': '1',
            'TRANSFORMERS_OFFLINE': '1',
            'WANDB_DISABLED': 'true',
            'HF_HOME': str(tmp_path / 'hf_home'),
        },
    )
    bucket = tmp_path / 'bucket'

    # Every file of both checkpoints landed, byte-identical.
    for checkpoint in ('checkpoint-10', 'checkpoint-20'):
        local = tmp_path / 'hf' / checkpoint
        files = sorted(p.name for p in local.iterdir())
        assert {'model.safetensors', 'optimizer.pt', 'rng_state_0.pth', 'rng_state_1.pth'} <= set(files)
        for name in files:
            assert (bucket / 'hf-run' / 'checkpoints' / checkpoint / name).read_bytes() == (local / name).read_bytes()

    # Each rank uploaded its own rng state; rank zero everything else; each file once per save.
    records = [r for r in upload_records(tmp_path) if '/checkpoints/' in r['name']]
    by_name = {}
    for record in records:
        by_name.setdefault(record['name'], []).append(record['rank'])
    assert all(len(ranks) == 1 for ranks in by_name.values()), by_name
    for checkpoint in ('checkpoint-10', 'checkpoint-20'):
        prefix = f'hf-run/checkpoints/{checkpoint}/'
        assert by_name[prefix + 'rng_state_0.pth'] == [0]
        assert by_name[prefix + 'rng_state_1.pth'] == [1]
        assert {ranks[0] for name, ranks in by_name.items() if name.startswith(prefix) and 'rng_state' not in name} == {
            0
        }

    # Rank zero: the hyperparameters once (hub_token redacted), loss and learning rate at their steps.
    logs = {rank: read_jsonl(tmp_path / 'runs' / 'hf-run' / f'rank{rank}.jsonl') for rank in (0, 1)}
    hparams = [r['data'] for r in logs[0] if r['kind'] == 'hparams']
    assert len(hparams) == 1
    assert hparams[0]['max_steps'] == 20 and hparams[0]['model_config/n_layer'] == 2
    assert hparams[0]['hub_token'] != HUB_TOKEN
    assert not [r for r in logs[1] if r['kind'] == 'hparams']
    for rank in (0, 1):  # the Trainer gives every rank the same averaged logs; per-rank files keep both
        steps = {r['step']: r['data'] for r in logs[rank] if r['kind'] == 'metric' and 'loss' in r['data']}
        assert sorted(steps) == [5, 10, 15, 20]
        assert all(isinstance(data['learning_rate'], float) for data in steps.values())
    for path in [*(tmp_path / 'runs').rglob('*.jsonl'), *(bucket / 'runs').rglob('*.jsonl')]:
        assert HUB_TOKEN not in path.read_text(), path


# ---------------------------------------------------------------------- in-process checks (fast)


def test_callback_validates_its_arguments(monkeypatch):
    from dist_logging.integrations.transformers import DistLoggingCallback

    monkeypatch.delenv('DIST_LOGGING_CONFIG', raising=False)
    config = {'destinations': [{'type': 'in_memory'}]}
    with pytest.raises(ValueError, match=r'must contain \{checkpoint\}'):
        DistLoggingCallback(config=config, checkpoint_name='{run_name}/{name}')
    with pytest.raises(TypeError, match='upload_checkpoints'):
        DistLoggingCallback(config=config, upload_checkpoints=1)
    with pytest.raises(ValueError, match='DIST_LOGGING_CONFIG'):
        DistLoggingCallback()  # what report_to=['dist_logging'] does without the variable


def test_report_to_name_is_registered():
    from transformers.integrations import get_reporting_integration_callbacks

    from dist_logging.integrations.transformers import DistLoggingCallback

    assert get_reporting_integration_callbacks(['dist_logging']) == [DistLoggingCallback]


def test_on_save_uploads_only_this_ranks_files(tmp_path):
    from dist_logging import Logger
    from dist_logging.integrations.transformers import DistLoggingCallback
    from recording_uploader import RecordingUploader

    folder = tmp_path / 'checkpoint-10'
    (folder / 'sub').mkdir(parents=True)
    for name in ('model.safetensors', 'rng_state_0.pth', 'rng_state_1.pth', 'sub/shard.bin'):
        (folder / name).write_bytes(name.encode())
    state = types.SimpleNamespace(global_step=10)

    def uploaded_by(process_index, should_save):
        uploads = RecordingUploader()
        callback = DistLoggingCallback(Logger([uploads], run_name='r'))
        args = types.SimpleNamespace(output_dir=str(tmp_path), process_index=process_index, should_save=should_save)
        callback.on_save(args, state, None)
        assert all(
            data == name.rsplit('/', 1)[1].encode() or name.endswith('shard.bin') for name, data, _ in uploads.uploads
        )
        return sorted(uploads.names())

    assert uploaded_by(0, True) == [
        'r/checkpoints/checkpoint-10/model.safetensors',
        'r/checkpoints/checkpoint-10/rng_state_0.pth',
        'r/checkpoints/checkpoint-10/sub/shard.bin',
    ]
    assert uploaded_by(1, False) == ['r/checkpoints/checkpoint-10/rng_state_1.pth']
    # save_on_each_node: another node's local zero also wrote the shared files; only global zero uploads them.
    assert uploaded_by(2, True) == []


def test_on_log_splits_numbers_from_text_and_on_train_end_closes_what_it_built():
    from dist_logging.integrations.transformers import DistLoggingCallback

    callback = DistLoggingCallback(config={'run_name': 'r', 'destinations': [{'type': 'in_memory'}]})
    state = types.SimpleNamespace(global_step=4)
    callback.on_log(None, state, None, logs={'loss': 1.25, 'learning_rate': 1e-3, 'note': 'text'})
    logger = callback.logger
    memory = logger.destinations[0]
    assert memory.data == {'loss': [(4, 1.25)], 'learning_rate': [(4, 1e-3)]} and memory.traces == {'note': ['text']}
    callback.on_train_end(None, state, None)
    with pytest.raises(RuntimeError, match='closed'):
        logger.log_metrics({'loss': 1.0})


def test_resume_from_checkpoint_resumes_the_logger(tmp_path):
    """A real one-process Trainer run (tiny GPT-2, 10 steps, a checkpoint at 5), then a second Trainer with a new
    callback and Logger (as after a relaunch) resumed from checkpoint-5: the log has a resume marker at step 5 and
    the merged view shows steps 1..10 once each."""
    import io

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from dist_logging import Logger
    from dist_logging._cli_logs.merge import merge_logs
    from dist_logging.destinations import FileLogger
    from dist_logging.integrations.transformers import DistLoggingCallback

    class TokenData(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 64, (40, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, index):
            return {'input_ids': self.ids[index], 'labels': self.ids[index]}

    log = str(tmp_path / 'logs-rank{rank}.txt')

    def train(resume=None):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
        args = TrainingArguments(
            output_dir=str(tmp_path / 'hf'),
            max_steps=10,
            save_strategy='steps',
            save_steps=5,
            logging_steps=1,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            dataloader_num_workers=0,
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            seed=0,
        )
        logger = Logger(FileLogger(log), run_name='hf')
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=TokenData(),
            callbacks=[DistLoggingCallback(logger, upload_checkpoints=False)],
        )
        trainer.train(resume_from_checkpoint=resume)
        logger.close()

    train()
    train(str(tmp_path / 'hf' / 'checkpoint-5'))
    text = (tmp_path / 'logs-rank0.txt').read_text()
    assert 'resumed at step 5 (resume 1, attempt 0)' in text
    out = io.StringIO()
    merge_logs([str(tmp_path / 'logs-rank0.txt')], out, collapse=False)
    steps = [int(line.split('[batch=')[1].split(']')[0]) for line in out.getvalue().splitlines() if ' loss: ' in line]
    assert steps == list(range(1, 11))
