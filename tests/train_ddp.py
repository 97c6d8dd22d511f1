"""A tiny 2-rank CPU training job (gloo) instrumented with goodput_client; run by torchrun from tests.

Each rank measures its own totals the same way the client reports them and writes them to
$OUT_DIR/rank-N.json, so the test can compare /metrics with what the loop measured itself. It also
records where goodput_client came from and which of the daemon's modules it could import: the tests
run it in a venv holding only PyTorch and goodput-client, as a training image would.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time

import goodput_client
import torch
import torch.distributed as dist
from goodput_client import Telemetry
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("STEPS", "12"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "0"))
# what the loop reports itself (the phases it times with telemetry.phase, whether it uses telemetry.step), and a
# wait inside its comm_wait block that no goodput-instrument probe sees (as NCCL's on the GPU)
PHASES = os.environ.get("PHASES", "compute,comm_wait").split(",")
STEP_BLOCK = os.environ.get("STEP_BLOCK", "1") == "1"
UNSEEN_WAIT = float(os.environ.get("UNSEEN_WAIT", "0"))
DAEMON_MODULES = ("exporter", "fastapi", "httpx", "pydantic", "uvicorn", "grpc")


class Batch:
    """What a step block's target holds, without one."""

    tokens = samples = 0


class Numbers(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return STEPS * 4

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == SLOW_RANK and index % 4 == 0:
            time.sleep(SLOW_SECONDS)  # a slow input pipeline on this rank only
        return torch.full((16,), float(index))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    telemetry = Telemetry(socket_path=os.environ["SOCKET"], flush_interval=0.1)
    if os.environ.get("FR_DIR"):
        telemetry.dump_flight_recorder(os.environ["FR_DIR"], interval=0.2)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    built = time.perf_counter()  # under goodput-instrument, training (its first window) starts here
    loader = DataLoader(Numbers(rank), batch_size=4, num_workers=0)
    # Each span is measured twice by the loop itself: inside the `with` (a lower bound of what the
    # client times) and around it (an upper bound), so the test can check the report exactly.
    measured: dict[str, float] = {"steps": 0, "tokens": 0, "samples": 0}
    for key in ("data_wait", "compute", "comm_wait", "step"):
        measured[f"{key}_inner"] = measured[f"{key}_outer"] = 0.0
    iterator = iter(telemetry.data_wait(loader))
    # start the loop together: a rank that set up faster would otherwise wait out the other's start-up
    # in its first all-reduce, which on a loaded machine can outweigh the slow rank's data waits
    dist.barrier()
    measured["before_loop"] = time.perf_counter() - built
    for _ in range(STEPS):
        step_outer = time.perf_counter()
        with telemetry.step() if STEP_BLOCK else contextlib.nullcontext(Batch()) as step:
            step_inner = time.perf_counter()
            started = time.perf_counter()
            batch = next(iterator)
            measured["data_wait_outer"] += time.perf_counter() - started
            step.tokens, step.samples = batch.numel(), len(batch)
            for phase in ("compute", "comm_wait"):
                outer = time.perf_counter()
                with telemetry.phase(phase) if phase in PHASES else contextlib.nullcontext():
                    inner = time.perf_counter()
                    if phase == "compute":
                        loss = model(batch).pow(2).mean()
                        optimizer.zero_grad()
                        loss.backward()
                    else:
                        for param in model.parameters():
                            dist.all_reduce(param.grad)
                        time.sleep(UNSEEN_WAIT)
                    measured[f"{phase}_inner"] += time.perf_counter() - inner
                measured[f"{phase}_outer"] += time.perf_counter() - outer
            optimizer.step()
            measured["step_inner"] += time.perf_counter() - step_inner
        measured["step_outer"] += time.perf_counter() - step_outer
        measured["steps"] += 1
        measured["tokens"] += batch.numel()
        measured["samples"] += len(batch)
    telemetry.close()
    measured["sent"], measured["dropped"] = telemetry.sent, telemetry.dropped
    measured["dumps"], measured["dump_errors"] = telemetry.dumps, telemetry.dump_errors
    environment = {"client_file": goodput_client.__file__,
                   "daemon_modules": [name for name in DAEMON_MODULES if importlib.util.find_spec(name)]}
    with open(os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.json"), "w") as out:
        json.dump({**measured, "environment": environment}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
