"""Time to read 64 ranks x 2,000-entry flight-recorder dumps: our safe parse against plain pickle.load.

The dump is real: this process runs 2,000 collectives on a one-rank gloo group (PyTorch, CPU) and
dumps its flight recorder, with and without stack traces; 64 copies stand for 64 ranks. Each round
reads all 64 files every way, one after the other, so all see the same machine noise; the median
round is reported. Our parse is the daemon's: the bytes go to the memory-limited parser process,
which runs the restricted unpickler, the schema check, the extraction and the counting with the
garbage collector paused, and sends a summary back. Plain pickle.load is timed both as usually called and with the
collector paused the same way. Run alone with `python bench/flight_parse.py`.
"""

from __future__ import annotations

import gc
import os
import pickle
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.config import load
from exporter.sources.flight.accounting import Prior
from exporter.sources.flight.source import FlightSource
from exporter.sources.flight.worker import ParseWorker

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "flight"
RANKS = 64
ENTRIES = 2000
ROUNDS = 7


@dataclass
class Result:
    variant: str
    file_bytes: int
    plain_ms: float  # pickle.load of all 64 files, median round
    paused_ms: float  # the same with the garbage collector paused
    safe_ms: float  # our read_dump
    source_ms: float  # a first pass of the flight source over the folder: scan, read, parse, render

    @property
    def ratio(self) -> float:
        return self.safe_ms / self.plain_ms

    @property
    def paused_ratio(self) -> float:
        return self.safe_ms / self.paused_ms


def real_dumps() -> dict[str, bytes]:
    """One rank's flight-recorder buffer after 2,000 collectives of several kinds and two groups."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(ENTRIES))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        other = dist.new_group([0])
        grads = [torch.ones(4096), torch.ones(1024, dtype=torch.bfloat16), torch.ones(64, 64)]
        for i in range(ENTRIES + 100):  # more than the buffer holds: it has wrapped, as in a long job
            if i % 10 == 9:
                dist.broadcast(grads[0], src=0, group=other)
            elif i % 10 == 8:
                dist.all_gather([torch.zeros(256)], torch.ones(256))
            else:
                dist.all_reduce(grads[i % 3])
        dumps = {"without stack traces": _dump_fr_trace(True, False, False),
                 "with stack traces": _dump_fr_trace(True, True, False)}
    finally:
        dist.destroy_process_group()
    for data in dumps.values():
        assert len(pickle.loads(data)["entries"]) == ENTRIES
    return dumps


def measure(variant: str, data: bytes) -> Result:
    folder = WORK / variant.replace(" ", "-") / "job"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(RANKS):
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(data)
        paths.append(path)

    def plain() -> None:
        for path in paths:
            with path.open("rb") as handle:
                pickle.load(handle)

    def paused() -> None:
        for path in paths:
            gc.disable()
            try:
                with path.open("rb") as handle:
                    pickle.load(handle)
            finally:
                gc.enable()

    parser = ParseWorker(max_file_bytes=64 * 2**20, timeout=60.0)

    def safe() -> None:
        for path in paths:
            parser.summarize(path.read_bytes(), Prior())

    plain_rounds: list[float] = []
    paused_rounds: list[float] = []
    safe_rounds: list[float] = []
    source_rounds: list[float] = []
    config = load(None, {"flight": {"dir": str(folder.parent), "timeout": "60s"}}, environ={}).flight
    safe()  # start the parser process before timing
    for _ in range(ROUNDS):
        for fn, rounds in ((plain, plain_rounds), (paused, paused_rounds), (safe, safe_rounds)):
            started = time.perf_counter()
            fn()
            rounds.append((time.perf_counter() - started) * 1000)
        source = FlightSource(config)
        started = time.perf_counter()
        batch = source.collect()
        source_rounds.append((time.perf_counter() - started) * 1000)
        assert source.rejected.total() == 0 and len(batch) > 0
        source.close()
    parser.close()
    return Result(variant, len(data), *(statistics.median(r) for r in (plain_rounds, paused_rounds, safe_rounds,
                                                                        source_rounds)))


def run() -> list[Result]:
    return [measure(variant, data) for variant, data in real_dumps().items()]



def markdown(results: list[Result]) -> list[str]:
    lines = [
        "## Flight-recorder dumps: safe parse vs pickle.load",
        "",
        f"{RANKS} ranks x {ENTRIES:,}-entry dumps, real (PyTorch's gloo flight recorder after {ENTRIES:,}+ "
        f"collectives), median of {ROUNDS} rounds over all files. *Safe parse* is what the daemon does with a new "
        "dump: sent to",
        "its memory-limited parser process, the restricted unpickler, the schema check, the extraction and "
        "the counting with the garbage collector paused, and a summary sent back. "
        "Target: within 1.5x of plain `pickle.load`.",
        "",
        "| dump | size per file | `pickle.load` | `pickle.load`, GC paused | safe parse | ratio | ratio to GC-paused "
        "| flight source, first pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.variant} | {r.file_bytes / 1024:.0f} KiB | {r.plain_ms:.0f} ms | {r.paused_ms:.0f} ms | "
            f"{r.safe_ms:.0f} ms | {r.ratio:.2f} | {r.paused_ratio:.2f} | {r.source_ms:.0f} ms |")
    return lines


def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    for r in run():
        print(f"{r.variant}: {r.file_bytes / 1024:.0f} KiB per file; pickle.load {r.plain_ms:.1f} ms "
              f"(GC paused {r.paused_ms:.1f} ms), safe parse {r.safe_ms:.1f} ms ({r.ratio:.2f}x, "
              f"{r.paused_ratio:.2f}x of paused), source pass {r.source_ms:.1f} ms")
