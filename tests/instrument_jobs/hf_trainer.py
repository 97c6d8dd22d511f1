"""An unmodified Hugging Face Trainer job (nothing of goodput in it): a tiny GPT-2 built from a config with random
weights (nothing downloaded), gradient accumulation, save_steps and eval_steps, on the CPU, fixed seed. It times its
own evaluations and checkpoint saves (a Trainer subclass, as a job that logs them would) and writes them, its
optimizer steps and its losses to $OUT_DIR/<RUN_NAME>-rank-0.json."""

from __future__ import annotations

import json
import os
import time
from typing import ClassVar

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

SEQ = 16


class Sequences(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (count, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(0.001)
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class TimedTrainer(Trainer):
    own: ClassVar[dict[str, float]] = {"eval": 0.0, "checkpoint_save": 0.0}

    def evaluate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.own["eval"] += time.perf_counter() - started

    def _save_checkpoint(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return super()._save_checkpoint(*args, **kwargs)
        finally:
            self.own["checkpoint_save"] += time.perf_counter() - started


def main() -> None:
    out = os.environ["OUT_DIR"]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=os.path.join(out, "hf"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
        gradient_accumulation_steps=2, max_steps=8, save_steps=4, eval_steps=4, eval_strategy="steps",
        save_strategy="steps", logging_steps=1, report_to=[], use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = TimedTrainer(model=model, args=args, train_dataset=Sequences(64, 1), eval_dataset=Sequences(16, 2))
    trainer.train()
    own = {**TimedTrainer.own, "steps": trainer.state.global_step,
           "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
           "total_flos": trainer.state.total_flos}
    with open(os.path.join(out, f"{os.environ.get('RUN_NAME', 'run')}-rank-0.json"), "w") as file:
        json.dump(own, file)


if __name__ == "__main__":
    main()
