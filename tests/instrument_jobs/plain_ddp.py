"""An unmodified PyTorch training job (nothing of goodput in it): DistributedDataParallel over gloo, a DataLoader with
worker processes for training and one without for evaluation, AdamW, gradient clipping, torch.save every SAVE_EVERY
steps, an evaluation pass every EVAL_EVERY steps, the loss averaged across ranks for logging. Fixed seeds.

It times itself the way a job's own logs would (its optimizer steps, its waits on the training DataLoader, its saves,
its evaluations) and writes them with its losses to $OUT_DIR/<run>-rank-N.json, for the tests of goodput-instrument
to compare against what the daemon recorded. Run by torchrun from tests/test_instrument_jobs.py.

Like most training scripts it resumes from its checkpoint when one is there (RESUME=1). CRASH_AFTER=N makes its
first attempt (TORCHELASTIC_RESTART_COUNT 0) fail after step N: a fault from its environment, for torchrun to
restart it.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("STEPS", "12"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "4"))
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "6"))
CRASH_AFTER = int(os.environ.get("CRASH_AFTER", "0"))
BATCH = 8
FEATURES = 32


class Records(Dataset):
    """Fixed random records; reading one takes a little time, as reading a file would."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, FEATURES, generator=generator)
        self.y = torch.randn(count, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return self.x[index], self.y[index]


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = DataLoader(Records(STEPS * BATCH * world, seed=1 + rank), batch_size=BATCH, num_workers=2)
    val = DataLoader(Records(4 * BATCH, seed=100 + rank), batch_size=BATCH, num_workers=0)
    own = {"steps": 0, "data_wait": 0.0, "checkpoint_save": 0.0, "eval": 0.0, "losses": [], "eval_losses": [],
           "resumed_from": 0}
    out = os.environ["OUT_DIR"]
    checkpoint = os.path.join(out, f"checkpoint-rank-{rank}.pt")
    if os.environ.get("RESUME") and os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        own["resumed_from"] = state["step"]
    iterator = iter(train)
    for step in range(own["resumed_from"] + 1, STEPS + 1):
        started = time.perf_counter()
        x, y = next(iterator)
        own["data_wait"] += time.perf_counter() - started
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        own["steps"] += 1
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        own["losses"].append((logged / world).item())
        if step % SAVE_EVERY == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            started = time.perf_counter()
            torch.save(state, checkpoint)
            own["checkpoint_save"] += time.perf_counter() - started
        if step % EVAL_EVERY == 0:
            model.eval()
            started = time.perf_counter()
            with torch.no_grad():
                total = sum(torch.nn.functional.mse_loss(model(vx), vy).item() for vx, vy in val)
            own["eval"] += time.perf_counter() - started
            own["eval_losses"].append(total)
            model.train()
        if step == CRASH_AFTER and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            raise SystemExit(f"rank {rank}: failing after step {step} (CRASH_AFTER)")
    own["run"] = os.environ.get("TORCHELASTIC_RUN_ID", "")
    with open(os.path.join(out, f"{os.environ.get('RUN_NAME', 'run')}-rank-{rank}.json"), "w") as file:
        json.dump(own, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
