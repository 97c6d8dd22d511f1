"""How far the idle fraction is off when estimated two ways, against the simulator's ground truth.

* integrated: rate of goodput_gpu_idle_seconds_total over goodput_gpu_sampled_seconds_total, as our
  rules use it (what the NVML source integrates from every buffered utilization sample);
* gauge average: 1 - mean of goodput_gpu_utilization_ratio read at each scrape instant, which is what
  an exporter that only exposes the utilization gauge gives a dashboard.

Runs on a manual clock, polling NVML at the nvml source's default interval: one simulated hour per pattern takes
well under a second of real time.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.cadence import INTERVAL
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource


class _Clock:
    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Result:
    pattern: str
    truth: float
    integrated: float
    gauge: float

    @property
    def integrated_error(self) -> float:
        return self.integrated - self.truth

    @property
    def gauge_error(self) -> float:
        return self.gauge - self.truth


PATTERNS = {
    "square 100 ms busy / 100 ms idle": {"pattern": "square", "busy": 0.1, "idle": 0.1},
    "square 50 ms busy / 250 ms idle": {"pattern": "square", "busy": 0.05, "idle": 0.25},
    "square 5 s busy / 10 s idle": {"pattern": "square", "busy": 5.0, "idle": 10.0},
    "training (steps, data stalls, checkpoint)": {"pattern": "training"},
}


def measure(kwargs: dict, seconds: int = 3600, poll: float = INTERVAL,
            scrape: float = 15.0) -> tuple[float, float, float]:
    clock = _Clock()
    sim = SimulatedGpus(1, seed=11, clock=clock, **kwargs)
    source = NvmlSource(sim, clock=clock)
    gauges: list[float] = []
    start_sample = None
    first_idle = first_sampled = 0.0
    idle = sampled = 0.0
    steps = int(seconds / poll)
    per_scrape = round(scrape / poll)
    for step in range(1, steps + 1):
        clock.now += poll
        batch = source.collect()
        if step % per_scrape:
            continue
        util = batch.values(c.GPU_UTILIZATION)
        idle = next(iter(batch.values(c.GPU_IDLE_SECONDS).values()))
        sampled = next(iter(batch.values(c.GPU_SAMPLED_SECONDS).values()))
        if start_sample is None:
            start_sample, first_idle, first_sampled = sim.last_sample_time(), idle, sampled
            continue
        gauges.append(next(iter(util.values())))
    end_sample = sim.last_sample_time()
    truth = sim.truth_idle_seconds(0, start_sample, end_sample) / (end_sample - start_sample)
    integrated = (idle - first_idle) / (sampled - first_sampled)
    gauge = 1.0 - sum(gauges) / len(gauges)
    return truth, integrated, gauge


def run() -> list[Result]:
    return [Result(name, *measure(kwargs)) for name, kwargs in PATTERNS.items()]



def markdown(results: list[Result]) -> list[str]:
    lines = [
        "## Idle fraction: integrated counter vs utilization-gauge average",
        "",
        f"One simulated hour per pattern, NVML polled every {INTERVAL:g} s (the nvml source's default interval), "
        "scraped every 15 s. *Integrated* is",
        "`rate(goodput_gpu_idle_seconds_total) / rate(goodput_gpu_sampled_seconds_total)`; *gauge* is",
        "`1 - avg_over_time(goodput_gpu_utilization_ratio)` from the scraped samples. Errors are in",
        "percentage points of idle fraction.",
        "",
        "| pattern | true idle | integrated | error | gauge average | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.pattern} | {r.truth:.2%} | {r.integrated:.2%} | {r.integrated_error * 100:+.2f} pp | "
            f"{r.gauge:.2%} | {r.gauge_error * 100:+.2f} pp |")
    return lines


def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    for result in run():
        print(f"{result.pattern}: truth {result.truth:.4f} integrated {result.integrated:.4f} "
              f"gauge {result.gauge:.4f}")
