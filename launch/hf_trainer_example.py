"""Hugging Face Trainer with dist_logging: metrics, hyperparameters (secrets redacted) and checkpoint uploads.

    torchrun --standalone --nproc_per_node=2 launch/hf_trainer_example.py --config configs/per_rank.yaml

A tiny GPT-2 built from a config trains on synthetic tokens (nothing is downloaded). Each
checkpoint-N folder is uploaded while training goes on: global rank zero uploads the files it
wrote, every rank its own rng_state_{rank}.pth. The same works without code changes as
``report_to=['dist_logging']`` with ``DIST_LOGGING_CONFIG=configs/per_rank.yaml`` set.
"""

from __future__ import annotations

import argparse
import pathlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from dist_logging.integrations.transformers import DistLoggingCallback

ROOT = pathlib.Path(__file__).resolve().parents[1]


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 512, length: int = 32, vocab: int = 128):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {'input_ids': self.ids[index], 'labels': self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=str(ROOT / 'configs' / 'per_rank.yaml'), help='Logger config (YAML)')
    parser.add_argument('--output-dir', default='hf_output')
    parser.add_argument('--max-steps', type=int, default=40)
    args = parser.parse_args()

    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        logging_steps=10,
        save_steps=20,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=RandomTokens(),
        callbacks=[DistLoggingCallback(config=args.config)],
    )
    trainer.train()  # on_train_end closes the Logger: waits for uploads, raises UploadError


if __name__ == '__main__':
    main()
