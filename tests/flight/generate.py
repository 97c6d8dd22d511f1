"""Writes the real flight-recorder dumps under tests/flight/dumps/ (run by torchrun, gloo, CPU).

    make flight-dumps     # regenerates every scenario (needs torch==2.13.0 from the test extras)

Run without arguments it starts one torchrun per scenario, then records when each file was written
in `dumps/written.json` (git does not keep mtimes; the tests put them back). Each rank writes
`dumps/<scenario>/nccl_trace_rank_<rank>` (pickle, as `_dump_fr_trace` returns it): the name PyTorch
itself uses for its dump-on-timeout files, so each folder is also valid input for `torchfrtrace`.
Scenarios:

- healthy4: 4 ranks; all_reduce (float32, int64, bfloat16), broadcast, all_gather, reduce, a barrier,
  and all_reduce on a subgroup of ranks 0 and 1.
- healthy2 and healthy2-json: 2 ranks; the same state dumped as a pickle and as JSON
  (`_dump_fr_trace_json`, files named `nccl_trace_rank_<r>.json`).
- hang4: 4 ranks run 5 all_reduces in step, then rank 1 skips the 6th. The others block in it
  (timeout 8 s); every rank dumps from a timer thread 2 s into the hang.

Stack traces are left out: they would carry this machine's paths, and the daemon does not read them
(the NCCL-shaped dumps built in the tests carry frames).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

HERE = Path(__file__).resolve().parent / "dumps"


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def healthy4(rank: int, out: Path) -> None:
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        dist.all_reduce(torch.ones(1024, dtype=dtype))
    dist.broadcast(torch.arange(256, dtype=torch.float32), src=0)
    gathered = [torch.zeros(16, 8) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.full((16, 8), float(rank)))
    dist.reduce(torch.ones(64), dst=0)
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        for _ in range(3):
            dist.all_reduce(torch.ones(512), group=pair)
    dist.barrier()
    time.sleep(0.5)  # completion is recorded just after the barrier returns
    write(out / f"nccl_trace_rank_{rank}", _dump_fr_trace(True, False, False))


def healthy2(rank: int, out: Path) -> None:
    for _ in range(4):
        dist.all_reduce(torch.ones(2048))
    dist.broadcast(torch.ones(100, dtype=torch.float64), src=1)
    dist.barrier()
    time.sleep(0.5)  # let the last completion be recorded, so both forms show one state
    write(out / f"nccl_trace_rank_{rank}", _dump_fr_trace(True, False, False))
    write(out.with_name("healthy2-json") / f"nccl_trace_rank_{rank}.json", _dump_fr_trace_json(True, False))


def hang4(rank: int, out: Path) -> None:
    for _ in range(5):
        dist.all_reduce(torch.ones(4096))
    timer = threading.Timer(2.0, lambda: write(out / f"nccl_trace_rank_{rank}", _dump_fr_trace(True, False, False)))
    timer.start()
    if rank == 1:
        time.sleep(9.0)  # skips the 6th all_reduce; the others time out waiting for it
    else:
        with contextlib.suppress(RuntimeError):  # the gloo timeout, as expected
            dist.all_reduce(torch.ones(4096))
    timer.join()


# scenario: (function, ranks, collective timeout in seconds)
SCENARIOS = {"healthy4": (healthy4, 4, 60), "healthy2": (healthy2, 2, 60), "hang4": (hang4, 4, 8)}


def rank_main(scenario: str) -> None:
    run, _, timeout = SCENARIOS[scenario]
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    run(dist.get_rank(), HERE / scenario)
    if scenario != "hang4":  # after a timeout the gloo group cannot be torn down cleanly
        dist.destroy_process_group()


def generate_all() -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    for scenario, (_, ranks, _) in SCENARIOS.items():
        subprocess.run([str(torchrun), "--standalone", f"--nproc-per-node={ranks}", __file__, scenario],
                       check=True)
    written = {str(p.relative_to(HERE)): p.stat().st_mtime for p in sorted(HERE.rglob("nccl_trace_rank_*"))}
    (HERE / "written.json").write_text(json.dumps(written, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        rank_main(sys.argv[1])
    else:
        generate_all()
