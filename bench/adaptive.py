"""Adaptive intervals: the CPU they save on a steady workload, the interval through a load change, what measuring
a batch's change costs, and the idle accuracy with them on.

* CPU: two daemons on the same machine at the same time, the daemon's own command line on 8 simulated GPUs running
  the simulator's training job (steps, data-loader stalls; its steady state), every source at its default
  interval and the dcgm source on; one with every source `adaptive`, one without. Both are left WARMUP seconds
  (the adaptive one's intervals grow meanwhile), then scraped every 15 s, as Prometheus would, over WINDOW seconds:
  their CPU (utime + stime from /proc) and their collections over that window, and the intervals they end at.
* Load change: the nvml source's runner (8 simulated GPUs, a manual clock, so it takes no time and repeats
  exactly), adaptive, through the training job's steady state, the job ending (every GPU idle), and a job starting.
* Cost: `ChangeMeter.measure` per batch of the nvml source (8 simulated GPUs) and the dcgm source, on this
  thread's CPU clock, best of 5 rounds of 200 batches, beside the collection itself.
* Idle accuracy: bench/idle_accuracy.py's patterns and figures (one simulated hour, scrapes every 15 s), with the
  NVML source polled at its adapted interval instead of every second, and the criterion of
  tests/test_nvml_source.py (every 15 s scrape-to-scrape increase of the idle counter within 1% of the truth).

Run alone with `python bench/adaptive.py`.
"""

from __future__ import annotations

import http.client
import itertools
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import idle_accuracy
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port, wait_ready

from exporter.config import load
from exporter.core.adaptive import Cadence, ChangeMeter
from exporter.core.runner import SourceRunner
from exporter.core.store import Store
from exporter.sources import NAMES
from exporter.sources.dcgm.simulated import SimulatedDcgm
from exporter.sources.dcgm.source import DcgmSource
from exporter.sources.nvml import metrics as nvml_metrics
from exporter.sources.nvml.simulated import Pattern, SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
WARMUP = 60.0
WINDOW = 120.0
SCRAPE = 15.0
COST_ROUNDS = 5
COST_BATCHES = 200
LOAD_EVENTS = (420.0, 720.0)  # seconds into the run: the job ends, a job starts


@dataclass
class Arm:
    adaptive: bool
    cpu_s: float = 0.0
    collections: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, float] = field(default_factory=dict)


@dataclass
class Event:
    name: str
    before: float  # the interval when it happened
    lowest: float  # the shortest within 30 s after
    back_after: float | None  # seconds until the interval was back where it was, None if not within the run


@dataclass
class Accuracy:
    pattern: str
    fixed: idle_accuracy.Result
    adapted: idle_accuracy.Result
    fixed_worst: float  # worst 15 s window, relative (the test's criterion: < 1%)
    adapted_worst: float
    fixed_polls: int
    adapted_polls: int


@dataclass
class Result:
    off: Arm
    on: Arm
    events: list[Event]
    cost_us: dict[str, tuple[int, float, float]]  # source -> (series, measure µs, collect µs)
    accuracy: list[Accuracy]

    @property
    def ratio(self) -> float:
        return self.on.cpu_s / self.off.cpu_s


# --- CPU of two daemons ------------------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(adaptive: bool, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    run = work / ("on" if adaptive else "off")
    run.mkdir()
    args = [str(ROOT / ".venv" / "bin" / "goodput-exporter"), "serve", "--simulate", str(GPUS),
            "--dcgm.enabled", "true", "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning",
            "--ingest.socket-path", str(run / "ingest.sock"), "--flight.dir", str(run / "flight")]
    if adaptive:
        for name in NAMES:
            args += [f"--{name}.adaptive", "true"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, "/readyz")
    return proc, port


def _self_metrics(port: int) -> tuple[dict[str, float], dict[str, float]]:
    """(collections, interval) per source, from the daemon's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    collections: dict[str, float] = {}
    intervals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "goodput_exporter_source_collections_total":
                collections[sample.labels["source"]] = sample.value
            elif sample.name == "goodput_exporter_source_interval_seconds":
                intervals[sample.labels["source"]] = sample.value
    return collections, intervals


def cpu_saved() -> tuple[Arm, Arm]:
    arms = [Arm(False), Arm(True)]
    with tempfile.TemporaryDirectory(prefix="gp-adaptive-") as tmp:
        running = [_start(arm.adaptive, Path(tmp)) for arm in arms]
        try:
            time.sleep(WARMUP)
            first = [(_cpu_seconds(proc.pid), _self_metrics(port)[0]) for proc, port in running]
            began = time.monotonic()
            while time.monotonic() - began < WINDOW:
                for _, port in running:
                    _self_metrics(port)
                time.sleep(min(SCRAPE, max(0.0, WINDOW - (time.monotonic() - began))))
            for arm, (proc, port), (cpu, collections) in zip(arms, running, first, strict=True):
                arm.cpu_s = _cpu_seconds(proc.pid) - cpu
                ended, arm.intervals = _self_metrics(port)
                arm.collections = {name: ended[name] - collections.get(name, 0.0) for name in ended}
        finally:
            for proc, _ in running:
                proc.terminate()
                proc.wait(10)
    return arms[0], arms[1]


# --- a load change, on a manual clock ----------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        return self.now


def _checkpoint_at(seed: int = 1) -> float:
    """When the simulator's training job (seed `seed`, the default) begins its checkpoint pause."""
    pattern = Pattern.training(random.Random(seed))
    for i in range(1, len(pattern.ends)):
        if pattern.kinds[i] == "idle" and pattern.ends[i] - pattern.ends[i - 1] == 8.0:
            return pattern.ends[i - 1]
    raise ValueError("the training pattern has no checkpoint")


def load_change() -> tuple[list[Event], list[tuple[float, float]]]:
    """The nvml runner through the training job (its checkpoint pause included), the job ending (every GPU idle),
    and a job starting again: each event's interval before, shortest after, and time to get back."""
    clock = _Clock()
    sim = SimulatedGpus(GPUS, clock=clock)
    settings = load(None, {"nvml": {"adaptive": True}}, environ={}).nvml
    runner = SourceRunner(NvmlSource(sim, clock=clock), settings.interval, settings.timeout, Store().publish,
                          clock=clock, monotonic=clock, adaptive=True, min_interval=settings.min_interval,
                          max_interval=settings.max_interval)
    began = clock()
    trace: list[tuple[float, float]] = []  # (seconds since start, interval after the collection then)
    pending: list[tuple[float, str, Pattern | None]] = [
        (_checkpoint_at(), "the training job's checkpoint (8 s pause)", None),
        (LOAD_EVENTS[0], "the job ends (every GPU idle)", Pattern([(1.0, 0)])),
        (LOAD_EVENTS[1], "a job starts", Pattern.training(random.Random(7)))]
    marks: list[tuple[str, float, float]] = []
    while clock() - began < LOAD_EVENTS[1] + 180:
        clock.now += runner.interval
        if pending and clock() - began >= pending[0][0]:
            _, name, pattern = pending.pop(0)
            marks.append((name, clock() - began, runner.interval))
            for gpu in range(GPUS if pattern is not None else 0):
                sim.set_pattern(gpu, pattern)
        runner.run_once()
        trace.append((clock() - began, runner.interval))
    out = []
    for name, at, before in marks:
        after = [(t, i) for t, i in trace if t >= at]
        lowest = min(i for t, i in after if t <= at + 30)
        dipped = next((t for t, i in after if i < before), None)
        back = None if dipped is None else next((t - at for t, i in after if t > dipped and i >= before), None)
        out.append(Event(name, before, lowest, back))
    return out, trace


# --- cost of the measure -----------------------------------------------------------------------------------------

def measure_cost() -> dict[str, tuple[int, float, float]]:
    clock = _Clock()
    sim = SimulatedGpus(GPUS, clock=clock)
    nvml = NvmlSource(sim, clock=clock)
    dcgm = DcgmSource(load(None, {"dcgm": {"enabled": True}}, environ={}).dcgm, SimulatedDcgm(sim), nvml.table,
                      clock=clock)
    batches: dict[str, list] = {"nvml": [], "dcgm": []}
    spent = {"nvml": 0.0, "dcgm": 0.0}
    for _ in range(COST_BATCHES):
        clock.now += 1.0
        for name, source in (("nvml", nvml), ("dcgm", dcgm)):
            started = time.thread_time()
            batches[name].append(source.collect())
            spent[name] += time.thread_time() - started
    out = {}
    for name, collected in batches.items():
        best = float("inf")
        for _ in range(COST_ROUNDS):
            meter = ChangeMeter()
            started = time.thread_time()
            for i, batch in enumerate(collected):
                meter.measure(batch, float(i))
            best = min(best, (time.thread_time() - started) / len(collected))
        out[name] = (len(collected[-1]), best * 1e6, spent[name] / COST_BATCHES * 1e6)
    return out


# --- idle accuracy with adaptive polling -------------------------------------------------------------------------

def _idle_accuracy(kwargs: dict, adaptive: bool, seconds: int = 3600) -> tuple[idle_accuracy.Result, float, int]:
    """bench/idle_accuracy.py's `measure`, with the poll at the source's interval (fixed 1 s, or adapted within
    250 ms-4 s as nvml's defaults give): scrapes every 15 s read the latest batch. Returns the result (pattern
    left blank), the worst 15 s window's relative error of the idle counter, and the polls made."""
    clock = _Clock()
    sim = SimulatedGpus(1, seed=11, clock=clock, **kwargs)
    source = NvmlSource(sim, clock=clock)
    cadence = Cadence(1.0, adaptive, 0.25, 4.0, clock=clock)
    end = clock.now + seconds
    next_scrape = clock.now + SCRAPE
    latest: tuple[float, float, float, float] | None = None  # sample time, idle, sampled, utilization
    scrapes: list[tuple[float, float, float, float]] = []
    polls = 0

    def scrape_due(now: float) -> None:
        nonlocal next_scrape
        while next_scrape <= now + 1e-9 and next_scrape <= end + 1e-9:
            if latest is not None:
                scrapes.append(latest)
            next_scrape += SCRAPE

    while clock.now + cadence.interval <= end + 1e-9:
        due = clock.now + cadence.interval
        scrape_due(due - 1e-6)  # scrapes before this poll read the last batch
        clock.now = due
        batch = source.collect()
        polls += 1
        cadence.collected(batch, clock.now)
        latest = (sim.last_sample_time(), next(iter(batch.values(nvml_metrics.GPU_IDLE_SECONDS).values())),
                  next(iter(batch.values(nvml_metrics.GPU_SAMPLED_SECONDS).values())),
                  next(iter(batch.values(nvml_metrics.GPU_UTILIZATION).values())))
        scrape_due(clock.now)
    start, idle0, sampled0, _ = scrapes[0]
    stop, idle1, sampled1, _ = scrapes[-1]
    truth = sim.truth_idle_seconds(0, start, stop) / (stop - start)
    integrated = (idle1 - idle0) / (sampled1 - sampled0)
    gauges = [util for _, _, _, util in scrapes[1:]]
    worst = 0.0
    for (t0, i0, _, _), (t1, i1, _, _) in itertools.pairwise(scrapes):
        if t1 <= t0:
            continue
        window_truth = sim.truth_idle_seconds(0, t0, t1)
        worst = max(worst, abs(i1 - i0 - window_truth) / (window_truth if window_truth > 1.0 else t1 - t0))
    return idle_accuracy.Result("", truth, integrated, 1.0 - sum(gauges) / len(gauges)), worst, polls


def accuracy() -> list[Accuracy]:
    out = []
    for name, kwargs in idle_accuracy.PATTERNS.items():
        fixed, fixed_worst, fixed_polls = _idle_accuracy(kwargs, adaptive=False)
        adapted, adapted_worst, adapted_polls = _idle_accuracy(kwargs, adaptive=True)
        fixed.pattern = adapted.pattern = name
        out.append(Accuracy(name, fixed, adapted, fixed_worst, adapted_worst, fixed_polls, adapted_polls))
    return out


def run() -> Result:
    events, _ = load_change()
    cost = measure_cost()
    checked = accuracy()
    off, on = cpu_saved()
    return Result(off, on, events, cost, checked)


def markdown(r: Result) -> list[str]:
    sources = [name for name in NAMES if name in r.off.collections]
    lines = [
        "",
        "## Adaptive intervals: CPU saved on a steady workload",
        "",
        f"Two daemons at the same time, {GPUS} simulated GPUs running the simulator's training job (steps, data "
        "stalls), every source at its default interval, dcgm on; one with `adaptive: true` on every source. After "
        f"{WARMUP:.0f} s, {WINDOW:.0f} s scraped every {SCRAPE:.0f} s: the daemon's CPU (utime + stime), the "
        "collections each source made in the window, and the interval each ended at "
        "(`goodput_exporter_source_interval_seconds`).",
        "",
        "| | CPU in the window | " + " | ".join(f"{name} collections (interval)" for name in sources) + " |",
        "|---|---|" + "---|" * len(sources),
    ]
    for label, arm in (("adaptive off", r.off), ("adaptive on", r.on)):
        cells = " | ".join(f"{arm.collections[name]:.0f} ({arm.intervals.get(name, float('nan')):g} s)"
                           for name in sources)
        lines.append(f"| {label} | {arm.cpu_s:.2f} s | {cells} |")
    lines += [
        "",
        f"CPU with adaptive on / off: {r.ratio:.2f} ({1 - r.ratio:.0%} saved).",
        "",
        "### Through a load change",
        "",
        "The nvml source's runner, adaptive at its defaults (1 s, 250 ms-4 s), on a manual clock: the simulator's "
        f"training job on {GPUS} simulated GPUs (its one checkpoint pause included), then at {LOAD_EVENTS[0]:.0f} s "
        f"every GPU idle, then at {LOAD_EVENTS[1]:.0f} s a job again.",
        "",
        "| event | interval before | shortest within 30 s | back to the interval before, after |",
        "|---|---|---|---|",
    ]
    for e in r.events:
        back = f"{e.back_after:.0f} s" if e.back_after is not None else "not within the run"
        lines.append(f"| {e.name} | {e.before:g} s | {e.lowest:g} s | {back} |")
    lines += [
        "",
        "### What measuring a batch costs",
        "",
        f"`ChangeMeter.measure` per batch (best of {COST_ROUNDS} x {COST_BATCHES}), beside the source's own "
        "collection (simulator included), on this thread's CPU clock; paid only with `adaptive: true`.",
        "",
        "| source | series | measure | collection |",
        "|---|---|---|---|",
    ]
    for name, (series, measure_us, collect_us) in r.cost_us.items():
        lines.append(f"| {name}, {GPUS} GPUs | {series} | {measure_us:.0f} µs | {collect_us:.0f} µs |")
    lines += [
        "",
        "### Idle accuracy with adaptive polling",
        "",
        "The idle-fraction table above, with NVML polled at its adapted interval (1 s, 250 ms-4 s) instead of every "
        "second; *worst 15 s* is the largest error of one scrape-to-scrape increase of the idle counter against the "
        "truth (tests/test_nvml_source.py requires < 1%).",
        "",
        "| pattern | polls fixed / adaptive | integrated error fixed / adaptive | worst 15 s fixed / adaptive | "
        "gauge-average error fixed / adaptive |",
        "|---|---|---|---|---|",
    ]
    for a in r.accuracy:
        lines.append(
            f"| {a.pattern} | {a.fixed_polls} / {a.adapted_polls} | {a.fixed.integrated_error * 100:+.2f} / "
            f"{a.adapted.integrated_error * 100:+.2f} pp | {a.fixed_worst:.2%} / {a.adapted_worst:.2%} | "
            f"{a.fixed.gauge_error * 100:+.2f} / {a.adapted.gauge_error * 100:+.2f} pp |")
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    print("\n".join(markdown(run())))
