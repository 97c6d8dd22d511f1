"""A CPU training job (gloo) for the multi-node tests, run by torchrun as several agents, one per "node", each agent's
ranks reporting to its node's daemon (SOCKET, FR_DIR). It runs until the control file says stop (or it is killed).

Faults come from the control file (CONTROL, JSON, read again whenever it changes), so a test can switch them while the
job runs: {"slow": {"3": 0.2}} adds 0.2 s to rank 3's compute in each step (a straggler); {"stall": [2, 3]} holds
ranks 2 and 3 before their next all_reduce, outside any phase, until they are taken out of the list (a hung node);
{"stop": true} ends the loop. Each rank writes $OUT_DIR/rank-N.json at the start: its group rank (the agent it runs
under) and the daemon it reports to.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from goodput_client import Telemetry

COMPUTE_SECONDS = 0.03  # each step's work, on top of the tiny model's


class Control:
    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp = 0
        self.data: dict = {}

    def read(self) -> dict:
        try:
            stamp = os.stat(self.path).st_mtime_ns
            if stamp != self.stamp:
                with open(self.path) as f:
                    self.data = json.load(f)
                self.stamp = stamp
        except (OSError, ValueError):
            pass  # written as we read: the last good one holds
        return self.data


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    control = Control(os.environ["CONTROL"])
    with open(os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.json"), "w") as out:
        json.dump({"group_rank": int(os.environ["GROUP_RANK"]), "socket": os.environ["SOCKET"],
                   "workload": os.environ.get("TORCHELASTIC_RUN_ID")}, out)
    telemetry = Telemetry(socket_path=os.environ["SOCKET"], flush_interval=0.1)
    telemetry.open_phase_interval = float(os.environ.get("OPEN_PHASE_SECONDS", "1"))
    telemetry.dump_flight_recorder(os.environ["FR_DIR"], interval=0.5)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(4, 16)
    dist.barrier()
    while not control.read().get("stop"):
        faults = control.read()
        with telemetry.step(tokens=64, samples=4):
            with telemetry.phase("compute"):
                loss = model(batch).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                time.sleep(COMPUTE_SECONDS + float(faults.get("slow", {}).get(str(rank), 0.0)))
            while rank in control.read().get("stall", []):  # stopped before the all_reduce
                time.sleep(0.05)
            with telemetry.phase("comm_wait"):
                for param in model.parameters():
                    dist.all_reduce(param.grad)
            optimizer.step()
    dist.barrier()
    telemetry.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
