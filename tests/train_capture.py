"""A 2-rank CPU training job (gloo) whose step time changes mid-run on one rank; run by torchrun from
tests/test_capture_e2e.py, in a venv holding only PyTorch and goodput-client.

Every step computes (a small model, then a sleep of BASE_SECONDS that stands for the GPU's work) and all-reduces
the gradients, as data-parallel training does. From step SLOW_FROM on, rank SLOW_RANK's compute takes
SLOW_SECONDS longer: its peer then waits for it in the all-reduce, so both ranks' steps slow down, but only the slow
rank's `compute` range (a profiler annotation, seen in any captured trace) grows. Each rank writes its own step and
compute durations to $OUT_DIR/rank-N.json, for the test to compare with what the capture holds.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from goodput_client import Telemetry

STEPS = int(os.environ.get("STEPS", "160"))
BASE_SECONDS = float(os.environ.get("BASE_SECONDS", "0.02"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_FROM = int(os.environ.get("SLOW_FROM", "80"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "0"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    telemetry = Telemetry(workload=os.environ["WORKLOAD"], socket_path=os.environ["SOCKET"], flush_interval=0.1)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps: list[float] = []
    computes: list[float] = []
    dist.barrier()
    for number in range(1, STEPS + 1):
        started = time.perf_counter()
        with telemetry.step(step=number, samples=8):
            with telemetry.phase("compute"), torch.profiler.record_function("compute"):
                compute_started = time.perf_counter()
                loss = model(torch.randn(8, 64)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                extra = SLOW_SECONDS if rank == SLOW_RANK and number >= SLOW_FROM else 0.0
                time.sleep(BASE_SECONDS + extra)
                computes.append(time.perf_counter() - compute_started)
            with telemetry.phase("comm_wait"):
                for param in model.parameters():
                    dist.all_reduce(param.grad)
            optimizer.step()
        steps.append(time.perf_counter() - started)
    telemetry.close()
    out = os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.json")
    with open(out, "w") as handle:
        json.dump({"steps": steps, "computes": computes, "sent": telemetry.sent, "dropped": telemetry.dropped},
                  handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
