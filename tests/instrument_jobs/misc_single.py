"""An unmodified single-process PyTorch job (nothing of goodput in it), for what the DDP job does not do:
torch.compile (the eager backend: dynamo's compilation, no C compiler needed), GradScaler, torch.distributed.checkpoint
save and load, an asynchronous all_reduce waited for (a 1-rank gloo group), torch.load, torch.compile(fullgraph=True)
of a function calling all_reduce, reentrant activation checkpointing, a replaced optimizer. Writes its optimizer
steps and losses to $OUT_DIR/<RUN_NAME>-rank-0.json."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.checkpoint import checkpoint

STEPS = 6
CHECKPOINTED = 2
REPLACED = 3


def _reduced(t: torch.Tensor) -> torch.Tensor:
    t = t * 2
    dist.all_reduce(t)
    return t + 1


def main() -> None:
    out = os.environ["OUT_DIR"]
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        work = dist.all_reduce(loss.detach().clone(), async_op=True)
        work.wait()
        losses.append(loss.item())
    # reentrant activation checkpointing: the training forward runs under no_grad, and is no evaluation
    for _ in range(CHECKPOINTED):
        loss = torch.nn.functional.mse_loss(checkpoint(model, x.clone().requires_grad_(), use_reentrant=True), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # the optimizer replaced (the first one still referenced, as after Lightning's lr_find): every step counts
    replacement = torch.optim.AdamW(model.parameters(), lr=0.001)
    for _ in range(REPLACED):
        loss = torch.nn.functional.mse_loss(model(x), y)
        replacement.zero_grad()
        loss.backward()
        replacement.step()
        losses.append(loss.item())
    # torch.compile(fullgraph=True) over a function that calls a collective: dynamo traces through the probe's wrapper
    reduced = torch.compile(_reduced, fullgraph=True, backend="eager")(torch.ones(4))
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, "dcp"))
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(out, "dcp"))
    torch.save(model.state_dict(), os.path.join(out, "misc.pt"))
    model.load_state_dict(torch.load(os.path.join(out, "misc.pt")))
    with open(os.path.join(out, f"{os.environ.get('RUN_NAME', 'run')}-rank-0.json"), "w") as file:
        json.dump({"steps": STEPS + CHECKPOINTED + REPLACED, "losses": losses, "reduced": reduced.tolist()}, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
