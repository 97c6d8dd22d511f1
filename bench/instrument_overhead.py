"""goodput-instrument's cost to a training loop, next to the explicit client's: time per optimizer step of the same
loop run bare, under `goodput-instrument`, and with `Telemetry` calls in it, each in a fresh interpreter reporting to
a real ingest server on a Unix socket (the daemon's own app, in this process).

Three loops, on the CPU with one intra-op thread:
    optimizer  one SGD step on a 16-element parameter: the hooks' cost per step, nothing else in the way
    loop       a DataLoader batch (no workers), a forward and backward pass of a small MLP, AdamW's step: what a step
               costs with a batch fetched, a step counted, compute reported
    ddp        the same loop with the model in DistributedDataParallel, two ranks on gloo under torchrun: the
               multi-rank probes' cost too (the backward probe's exposed wait, the collectives' waits), rank 0 timed
Each variant runs ROUNDS rounds of STEPS steps after a warm-up; its figure is its best round (the least disturbed by
the machine's other load), and each variant is run RUNS times, interleaved, the best taken again. The overhead is
the difference per step; its share of a 50 ms step follows from it.

`python bench/instrument_overhead.py` prints the section; `section()` returns it for bench/results.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from serving import ingest_server

BIN = Path(sys.executable).parent
STEPS = 2000
DDP_STEPS = 500  # a DDP step (two ranks' all-reduce over gloo) is about 10x a single-process one
DDP_RUNS = 5  # two ranks sharing the cores with the ingest server: more runs to find the least disturbed
KINDS = ("optimizer", "loop", "ddp")
ROUNDS = 5
RUNS = 3
TARGET_US = 20.0
REFERENCE_STEP_S = 0.050

LOOP = r"""
import json, os, sys, time
import torch
torch.set_num_threads(1)
kind, variant, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
telemetry = None
rank = int(os.environ.get("RANK", "0"))
if kind == "ddp":
    import torch.distributed as dist
    dist.init_process_group("gloo")
if variant == "explicit":
    from goodput_client import Telemetry
    telemetry = Telemetry("bench-explicit", rank)
torch.manual_seed(0)
if kind == "optimizer":
    param = torch.zeros(16, requires_grad=True)
    param.grad = torch.ones(16)
    optimizer = torch.optim.SGD([param], lr=1e-6)
    def step():
        if telemetry is None:
            optimizer.step()
        else:
            with telemetry.step():
                optimizer.step()
    def epoch():
        return range(steps + 10)
else:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(64)]
    loader = torch.utils.data.DataLoader(data * ((steps + 10) // 64 + 1), batch_size=None)
    def epoch():
        return loader if telemetry is None else telemetry.data_wait(loader)
    def step(batch):
        x, y = batch
        if telemetry is None:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()
        else:
            with telemetry.step(samples=8), telemetry.phase("compute"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(); loss.backward(); optimizer.step()
best = float("inf")
for _ in range(rounds):
    items = iter(epoch())
    for _ in range(10):  # warm-up
        step() if kind == "optimizer" else step(next(items))
    if kind == "ddp":
        dist.barrier()  # both ranks start the round together
    started = time.perf_counter()
    for _ in range(steps):
        step() if kind == "optimizer" else step(next(items))
    best = min(best, (time.perf_counter() - started) / steps)
if telemetry is not None:
    telemetry.close()
if kind == "ddp":
    dist.destroy_process_group()
if rank == 0:
    print(json.dumps({"seconds_per_step": best}))
"""


def _per_step(kind: str, variant: str, path: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_") and k != "PYTHONPATH"}
    env.update(GOODPUT_INGEST_SOCKET_PATH=path, GOODPUT_WORKLOAD=f"bench-{variant}", OMP_NUM_THREADS="1")
    if kind == "ddp":  # two ranks under torchrun, one intra-op thread each
        script = Path(path).parent / "loop.py"
        script.write_text(LOOP)
        command = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(script), kind, variant,
                   str(DDP_STEPS), str(ROUNDS)]
    else:
        command = [str(BIN / "python"), "-c", LOOP, kind, variant, str(STEPS), str(ROUNDS)]
    if variant == "auto":
        command = [str(BIN / "goodput-instrument"), *command]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(result.stdout.strip().splitlines()[-1])["seconds_per_step"])


def measure() -> dict[str, dict[str, list[float]]]:
    """{loop: {variant: each run's best seconds per step}} for loops KINDS, variants bare, auto, explicit."""
    path = os.path.join(tempfile.mkdtemp(prefix="gp-bench-"), "ingest.sock")
    with ingest_server(path):
        found: dict[str, dict[str, list[float]]] = {}
        for kind in KINDS:
            runs: dict[str, list[float]] = {variant: [] for variant in ("bare", "auto", "explicit")}
            for _ in range(DDP_RUNS if kind == "ddp" else RUNS):
                for variant, seconds in runs.items():
                    seconds.append(_per_step(kind, variant, path))
            found[kind] = runs
        return found


def section() -> str:
    found = measure()
    lines = [
        "## Automatic instrumentation (goodput-instrument) vs the explicit client",
        "",
        f"Time per optimizer step of one loop run bare, under `goodput-instrument` (no change to the loop), and with "
        f"the explicit client's calls in it (`telemetry.step()`, and for the full loop `data_wait()` and "
        f"`phase(\"compute\")`), each a fresh interpreter reporting to the daemon's ingest app over its Unix socket. "
        f"Best round of {ROUNDS} x {STEPS} steps, best of {RUNS} interleaved runs, one intra-op thread. `optimizer`: "
        f"one SGD step on 16 floats (the hooks alone); `loop`: a DataLoader batch, forward and backward of a small MLP "
        f"and AdamW; `ddp`: the same loop in DistributedDataParallel, two ranks on gloo under torchrun ({DDP_STEPS} "
        f"steps a round, best of {DDP_RUNS} runs, rank 0's time: the backward probe's exposed-wait timing and the "
        f"collectives' probes in it). Target: < {TARGET_US:.0f} µs per step, and < 1% of a step of 50 ms or more "
        f"(the share below is the overhead over {REFERENCE_STEP_S * 1e3:.0f} ms).",
        "",
        "The last column is the spread of the bare loop's runs (their slowest best over their fastest, less 1): an "
        "overhead below it is within the machine's noise.",
        "",
        "| loop | bare | goodput-instrument | overhead | share of a 50 ms step | explicit client | overhead | "
        "bare's spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, runs in found.items():
        best = {variant: min(seconds) for variant, seconds in runs.items()}
        spread = max(runs["bare"]) / min(runs["bare"]) - 1
        auto = (best["auto"] - best["bare"]) * 1e6
        explicit = (best["explicit"] - best["bare"]) * 1e6
        lines.append(f"| {kind} | {best['bare'] * 1e6:.1f} µs | {best['auto'] * 1e6:.1f} µs | {auto:+.1f} µs | "
                     f"{max(auto, 0.0) * 1e-6 / REFERENCE_STEP_S:.3%} | {best['explicit'] * 1e6:.1f} µs | "
                     f"{explicit:+.1f} µs | {spread:.1%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(section())
