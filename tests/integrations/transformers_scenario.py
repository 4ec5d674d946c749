"""Run under torchrun (2 processes): a Hugging Face Trainer (tiny GPT-2 built from a config, synthetic
data, 20 steps, save_steps=10) with ``report_to=['dist_logging']``; the Logger config comes from
DIST_LOGGING_CONFIG (set by the test). Nothing is downloaded."""

import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import dist_logging.integrations.transformers  # noqa: E402,F401 - registers report_to='dist_logging'

OUT = pathlib.Path(os.environ['OUT_DIR'])
HUB_TOKEN = 'hf_SECRETabcdefghijklmnopqrstuvwxyz01'


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n: int = 80, length: int = 16, vocab: int = 64):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {'input_ids': self.ids[index], 'labels': self.ids[index]}


def main():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=str(OUT / 'hf'),
        max_steps=20,
        save_strategy='steps',
        save_steps=10,
        logging_steps=5,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        dataloader_num_workers=0,
        use_cpu=True,
        report_to=['dist_logging'],
        hub_token=HUB_TOKEN,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TokenData())
    trainer.train()


if __name__ == '__main__':
    main()
