"""An unmodified PyTorch training job (nothing of goodput in it) that reads its training data over HTTP, as a job
reading from an object store or a data service does: each rank asks DATA_URL/<rank>/<index> for its next batch
(68 little-endian float32: a 4 x 16 input, then its 4 targets).

The model is averaged across ranks by hand (an all_reduce of each gradient, then of the loss for the log), with
AdamW; every SAVE_EVERY steps each rank saves {"model", "optimizer", "step"} to OUT_DIR, and a new attempt resumes
from it (torchrun's restarts). It runs until it is killed, or until the data service answers 204 (no more data).

Faults come from its environment only: the data service can answer one rank slowly (a straggler) or not at all (a
rank stuck before its next collective), and a rank's process can be killed (torchrun restarts the job, which
redoes the steps since its last checkpoint). Run by tests/test_instrument_alerts_e2e.py.
"""

from __future__ import annotations

import os
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "100"))
FEATURES, BATCH = 16, 4


class RemoteBatches(IterableDataset):
    """The rank's batches from the data service, from batch `start` on."""

    def __init__(self, url: str, rank: int, start: int) -> None:
        self.url, self.rank, self.start = url, rank, start

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        index = self.start
        while True:
            with urllib.request.urlopen(f"{self.url}/{self.rank}/{index}", timeout=600) as response:
                if response.status == 204:
                    return
                body = response.read()
            values = struct.unpack(f"<{BATCH * FEATURES + BATCH}f", body)
            x = torch.tensor(values[:BATCH * FEATURES]).reshape(BATCH, FEATURES)
            y = torch.tensor(values[BATCH * FEATURES:]).reshape(BATCH, 1)
            yield x, y
            index += 1


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = os.path.join(os.environ["OUT_DIR"], f"checkpoint-rank-{rank}.pt")
    step = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    batches = DataLoader(RemoteBatches(os.environ["DATA_URL"], rank, step), batch_size=None, num_workers=0)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        step += 1
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if step % SAVE_EVERY == 0:
            partial = checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
            os.replace(partial, checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
