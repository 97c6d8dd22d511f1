"""An unmodified PyTorch Lightning job (nothing of goodput in it): 2 processes on the CPU (strategy ddp, gloo), a
tiny model, gradient accumulation, validation every VAL_EVERY batches, a checkpoint every SAVE_EVERY optimizer steps,
fixed seed. It counts its own optimizer steps and times its validations and checkpoint saves (a callback and a
ModelCheckpoint subclass, as a job that logs them would), and writes them with its losses to
$OUT_DIR/<RUN_NAME>-rank-N.json."""

from __future__ import annotations

import json
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

FEATURES = 16


class Records(Dataset):
    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, FEATURES, generator=generator)
        self.y = torch.randn(count, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        return self.x[index], self.y[index]


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.losses: list[float] = []

    def training_step(self, batch, index):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, index):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


OWN = {"steps": 0, "eval": 0.0, "checkpoint_save": 0.0}


class OwnTimes(Callback):
    started = 0.0

    def on_before_optimizer_step(self, trainer, module, optimizer):  # type: ignore[no-untyped-def]
        OWN["steps"] += 1

    def on_validation_start(self, trainer, module):  # type: ignore[no-untyped-def]
        self.started = time.perf_counter()

    def on_validation_end(self, trainer, module):  # type: ignore[no-untyped-def]
        OWN["eval"] += time.perf_counter() - self.started


class TimedCheckpoint(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            super()._save_checkpoint(trainer, filepath)
        finally:
            OWN["checkpoint_save"] += time.perf_counter() - started


def main() -> None:
    out = os.environ["OUT_DIR"]
    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=6, accumulate_grad_batches=2,
        val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=out,
        callbacks=[OwnTimes(), TimedCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=3,
                                               save_top_k=-1)])
    trainer.fit(model, DataLoader(Records(64, 1), batch_size=4), DataLoader(Records(16, 2), batch_size=4))
    own = {**OWN, "global_step": trainer.global_step, "losses": model.losses}
    with open(os.path.join(out, f"{os.environ.get('RUN_NAME', 'run')}-rank-{trainer.global_rank}.json"), "w") as file:
        json.dump(own, file)


if __name__ == "__main__":
    main()
