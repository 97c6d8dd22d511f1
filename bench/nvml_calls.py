"""NVML calls per GPU per second, by call, and the nvml source's CPU per collection.

The nvml source over 8 simulated H100s (18 NVLink links each) on a manual clock, collecting at its default intervals
(and at nvml.interval=1s, the former default) for 10 simulated minutes; its calls counted as
goodput_exporter_library_calls_total counts them (bench/nvml_real.py's `measure`). Then the runs of
bench/nvml_real.py on real GPUs kept in bench/data/nvml-real-*.json, each as rows of its own.

    python bench/nvml_calls.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvml_real

from exporter.sources.nvml.cadence import INTERVAL, SLOW_INTERVAL
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

DATA = Path(__file__).resolve().parent / "data"
GPUS = 8
SECONDS = 600.0
TARGET = 10.0  # calls per GPU per second at the default intervals
# Before the calls were batched and read at their own cadences: commit 38793cd at its default nvml.interval of 1 s,
# counted by the same counter on that commit's code (8 simulated H100s): 39.3 calls per GPU per second
BEFORE = ("38793cd", 1.0, 39.3)


class _Clock:
    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Result:
    interval: float
    slow_interval: float
    per_gpu_second: dict[str, float]  # by NVML function
    cpu_ms: float  # median CPU per collection, simulator included

    @property
    def total(self) -> float:
        return sum(self.per_gpu_second.values())


def measure(interval: float = INTERVAL, slow_interval: float = SLOW_INTERVAL, gpus: int = GPUS,
            seconds: float = SECONDS) -> Result:
    clock = _Clock()
    source = NvmlSource(SimulatedGpus(gpus, clock=clock), clock=clock, slow_interval=slow_interval, monotonic=clock)
    sleep: Callable[[float], None] = clock.advance
    run = nvml_real.measure(source, seconds, interval, sleep=sleep, clock=clock)
    cpu = sorted(run["cpu_s"])
    return Result(interval, slow_interval, nvml_real.per_gpu_second(run["calls"], run["gpus"], run["elapsed_s"]),
                  cpu[len(cpu) // 2] * 1000)


def run() -> list[Result]:
    return [measure(), measure(interval=1.0)]


def real_runs() -> list[dict]:
    return [{**json.loads(path.read_text()), "file": path.name} for path in sorted(DATA.glob("nvml-real-*.json"))]


def markdown(results: list[Result], real: list[dict]) -> list[str]:
    default = results[0]
    lines = [
        "## NVML calls per GPU per second",
        "",
        f"The nvml source over {GPUS} simulated H100s (18 NVLink links each), {SECONDS / 60:.0f} simulated minutes "
        "on a manual clock, its calls counted as `goodput_exporter_library_calls_total` counts them (one per NVML "
        f"function the source asks for). Target: at most {TARGET:g} per GPU per second at the default intervals "
        f"(nvml.interval {INTERVAL:g} s, nvml.slow_interval {SLOW_INTERVAL:g} s). Before the fields were batched and "
        f"each quantity read at its own cadence (commit {BEFORE[0]}, nvml.interval {BEFORE[1]:g} s, counted the same "
        f"way): {BEFORE[2]:g}. CPU per collection is the simulated GPUs' too.",
        "",
        "| nvml.interval | nvml.slow_interval | calls per GPU per second | CPU per collection (8 GPUs) |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.interval:g} s | {r.slow_interval:g} s | {r.total:.2f} | {r.cpu_ms:.2f} ms |")
    lines += ["", "By call, at the defaults:", "", "| NVML function | calls per GPU per second |", "|---|---|"]
    lines += [f"| `{name}` | {rate:.3f} |" for name, rate in default.per_gpu_second.items()]
    lines += ["", "### On real GPUs (bench/nvml_real.py)", ""]
    if not real:
        lines.append("No run on a real GPU kept yet: run `python3 bench/nvml_real.py --out DIR` on a GPU node and copy "
                     "DIR/nvml-real.json to bench/data/nvml-real-<model>.json.")
    for result in real:
        lines += [f"#### bench/data/{result['file']}", "", *nvml_real.markdown(result), ""]
    return lines


def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run(), real_runs())).rstrip()


if __name__ == "__main__":
    print(section())
