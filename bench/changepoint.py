"""The ingest's step-time change detector on recorded step times: detection delay, false alarms, cost.

The series are real (bench/data/, recorded by bench/record_steps.py: PyTorch training loops on this
machine's CPU). Onto each the bench injects periodic spikes (a checkpoint step every CHECKPOINT_EVERY steps,
CHECKPOINT_FACTOR x; an evaluation of EVAL_STEPS steps every EVAL_EVERY, EVAL_FACTOR x), and then a lasting
multiplicative shift of SHIFTS from one of POSITIONS on: one run per (series, shift, position), each with a new
detector, timed with the series' own durations as its clock. Reported per series and shift: the delay from the
first shifted step to the alarm in that direction (steps, and seconds of the series), whether every run found it
within FOUND_WITHIN steps, the false alarms (any alarm before the shift) per hour of series time, and the extra
alarms after the detection. The spike-only rows run each series whole with no shift: every alarm is false. Then
the cost of one `observe`, and a sweep of the threshold and the smallest ratio that picked the defaults. Run alone
with `python bench/changepoint.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.sources.ingest.changepoint import (  # noqa: E402
    DEFAULT_MIN_RATIO,
    DEFAULT_THRESHOLD,
    DEFAULT_WARMUP,
    StepTimeDetector,
)

DATA = ROOT / "bench" / "data"
CHECKPOINT_EVERY, CHECKPOINT_FACTOR = 50, 10.0
EVAL_EVERY, EVAL_OFFSET, EVAL_STEPS, EVAL_FACTOR = 200, 125, 2, 20.0
SHIFTS = (0.05, 0.10, 0.30, -0.10)
POSITIONS = (600, 1200, 1800, 2400)
FOUND_WITHIN = 50  # steps
START = 1_760_000_000.0  # the clock's start, seconds
SWEEP_THRESHOLDS = (4.0, 8.0, 16.0)
SWEEP_MIN_RATIOS = (0.04, 0.05, 0.06, 0.08)
COST_ROUNDS = 5


def load(path: Path) -> tuple[str, list[float]]:
    """A recorded series: its header line (how it was recorded) and its durations in seconds."""
    lines = path.read_text().splitlines()
    header = lines[0].lstrip("# ") if lines and lines[0].startswith("#") else ""
    return header, [int(line) / 1e6 for line in lines if line and not line.startswith("#")]


def series() -> dict[str, list[float]]:
    """bench/data's series by name (the file's stem)."""
    return {path.stem: load(path)[1] for path in sorted(DATA.glob("*.txt"))}


def with_spikes(durations: list[float]) -> list[float]:
    """The series with a checkpoint step every CHECKPOINT_EVERY and an evaluation every EVAL_EVERY."""
    out = list(durations)
    for i in range(len(out)):
        if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
            out[i] *= CHECKPOINT_FACTOR
        if EVAL_OFFSET <= i % EVAL_EVERY < EVAL_OFFSET + EVAL_STEPS:
            out[i] *= EVAL_FACTOR
    return out


def with_shift(durations: list[float], ratio: float, at: int) -> list[float]:
    """Every step from `at` on takes (1 + ratio) times as long."""
    return durations[:at] + [d * (1 + ratio) for d in durations[at:]]


def alarms(durations: list[float], **settings: float) -> list[tuple[int, int]]:
    """(step index, direction) of every alarm of a new detector fed the series, its durations as its clock."""
    detector = StepTimeDetector(**settings)  # type: ignore[arg-type]
    now, out = START, []
    for i, duration in enumerate(durations):
        now += duration
        direction = detector.observe(duration, now)
        if direction:
            out.append((i, direction))
    return out


@dataclass
class Row:
    series: str
    shift: float | None  # None: spike-only
    delays: list[int | None] = field(default_factory=list)  # per position; None: not found
    delay_seconds: list[float] = field(default_factory=list)  # of the runs that found it
    false_alarms: int = 0
    watched_seconds: float = 0.0  # series time in which any alarm is false
    watched_steps: int = 0
    extra_alarms: int = 0  # alarms after the detection

    @property
    def found(self) -> int:
        return sum(1 for d in self.delays if d is not None and d <= FOUND_WITHIN)

    @property
    def false_per_hour(self) -> float:
        return self.false_alarms / self.watched_seconds * 3600 if self.watched_seconds else 0.0


def evaluate(data: dict[str, list[float]], **settings: float) -> list[Row]:
    """Spike-only and shifted runs of every series, under these detector settings."""
    rows = []
    for name, base in data.items():
        spiked = with_spikes(base)
        row = Row(name, None, watched_seconds=sum(spiked), watched_steps=len(spiked),
                  false_alarms=len(alarms(spiked, **settings)))
        rows.append(row)
        for ratio in SHIFTS:
            row = Row(name, ratio)
            direction = 1 if ratio > 0 else -1
            for at in POSITIONS:
                if at >= len(spiked):
                    continue
                shifted = with_shift(spiked, ratio, at)
                found = alarms(shifted, **settings)
                row.false_alarms += sum(1 for i, _ in found if i < at)
                row.watched_seconds += sum(shifted[:at])
                row.watched_steps += at
                hit = next((i for i, d in found if i >= at and d == direction), None)
                row.delays.append(None if hit is None else hit - at)
                if hit is not None:
                    row.delay_seconds.append(sum(shifted[at:hit + 1]))
                    row.extra_alarms += sum(1 for i, _ in found if i > hit)
            rows.append(row)
    return rows


def observe_microseconds(data: dict[str, list[float]]) -> tuple[float, float]:
    """µs per `observe` over all the spiked series (with their alarms and re-baselines), and per `summaries`;
    best of COST_ROUNDS."""
    runs = [with_spikes(durations) for durations in data.values()]
    steps = sum(len(r) for r in runs)
    best_observe = best_summary = float("inf")
    for _ in range(COST_ROUNDS):
        elapsed = 0.0
        detectors = []
        for durations in runs:
            detector = StepTimeDetector()
            now = START
            started = time.perf_counter()
            for duration in durations:
                now += duration
                detector.observe(duration, now)
            elapsed += time.perf_counter() - started
            detectors.append((detector, now))
        best_observe = min(best_observe, elapsed / steps * 1e6)
        started = time.perf_counter()
        for detector, now in detectors:
            for _ in range(100):
                detector.summaries(now)
        best_summary = min(best_summary, (time.perf_counter() - started) / (100 * len(detectors)) * 1e6)
    return best_observe, best_summary


@dataclass
class Sweep:
    threshold: float
    min_ratio: float
    spike_only_false: int
    false_before: int
    found_10: tuple[int, int]  # runs with a shift of 10% or more found within FOUND_WITHIN, of all of them
    worst_10: int | None  # the largest delay among those runs (None: one was never found)
    found_5: tuple[int, int]


def sweep(data: dict[str, list[float]]) -> list[Sweep]:
    out = []
    for threshold in SWEEP_THRESHOLDS:
        for min_ratio in SWEEP_MIN_RATIOS:
            rows = evaluate(data, threshold=threshold, min_ratio=min_ratio)
            big = [d for r in rows if r.shift is not None and abs(r.shift) >= 0.10 for d in r.delays]
            small = [d for r in rows if r.shift is not None and abs(r.shift) < 0.10 for d in r.delays]
            out.append(Sweep(
                threshold, min_ratio,
                sum(r.false_alarms for r in rows if r.shift is None),
                sum(r.false_alarms for r in rows if r.shift is not None),
                (sum(1 for d in big if d is not None and d <= FOUND_WITHIN), len(big)),
                None if any(d is None for d in big) else max(d for d in big if d is not None),
                (sum(1 for d in small if d is not None and d <= FOUND_WITHIN), len(small))))
    return out


def pick(swept: list[Sweep]) -> Sweep | None:
    """The settings the defaults should be: of those with no false alarm on the spike-only series and every shift
    of 10% or more found within FOUND_WITHIN steps, the smallest min_ratio (the most sensitive), then the fewest
    false alarms before a shift, then the smallest worst delay, then the highest threshold (the fewest second
    tests)."""
    fit = [s for s in swept if s.spike_only_false == 0 and s.found_10[0] == s.found_10[1]]
    return min(fit, key=lambda s: (s.min_ratio, s.false_before, s.worst_10, -s.threshold), default=None)


@dataclass
class Result:
    headers: dict[str, str]  # series -> how it was recorded
    lengths: dict[str, tuple[int, float, float]]  # series -> steps, seconds, median step
    rows: list[Row]
    observe_us: float
    summaries_us: float
    sweep: list[Sweep]


def run() -> Result:
    paths = sorted(DATA.glob("*.txt"))
    headers = {path.stem: load(path)[0] for path in paths}
    data = series()
    lengths = {name: (len(d), sum(d), statistics.median(d)) for name, d in data.items()}
    rows = evaluate(data)
    observe_us, summaries_us = observe_microseconds(data)
    return Result(headers, lengths, rows, observe_us, summaries_us, sweep(data))


def _delay(row: Row) -> str:
    found = [d for d in row.delays if d is not None]
    if not found:
        return "not found"
    text = f"{statistics.median(found):.0f} / {max(found)}"
    missed = len(row.delays) - len(found)
    return text + (f" ({missed} missed)" if missed else "")


def markdown(result: Result) -> list[str]:
    lines = [
        "## Step-time change detector",
        "",
        "Real step times (bench/data/, recorded by `bench/record_steps.py`: PyTorch training loops on this machine's "
        "CPU, one thread, wall time per step):",
        "",
    ]
    for name, header in result.headers.items():
        steps, seconds, median = result.lengths[name]
        lines.append(f"- `{name}`: {steps} steps, {seconds:.0f} s, median step {median * 1000:.1f} ms. {header}")
    lines += [
        "",
        f"Injected onto each: a checkpoint step every {CHECKPOINT_EVERY} steps ({CHECKPOINT_FACTOR:.0f}x) and an "
        f"evaluation of {EVAL_STEPS} steps every {EVAL_EVERY} ({EVAL_FACTOR:.0f}x); then, one run each, a lasting "
        f"shift from step {', '.join(map(str, POSITIONS))} on. Detector defaults: threshold {DEFAULT_THRESHOLD:g} "
        f"robust standard deviations, min_ratio {DEFAULT_MIN_RATIO:g}, warmup {DEFAULT_WARMUP} steps. *Delay* is "
        "steps from the first shifted step to the alarm in the shift's direction (median / worst of the runs), and "
        "the median in seconds of series time; *found* counts the runs that alarmed within "
        f"{FOUND_WITHIN} steps; *false alarms* are any alarm before the shift (in spike-only runs, any alarm), per "
        "hour of the series time they could have come in; *after* counts further alarms once the shift was found. "
        f"Targets: none on the spike-only series, every shift of 10% or more found within {FOUND_WITHIN} steps.",
        "",
        "| series | injected | delay, steps | delay, s | found | false alarms | per hour | after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result.rows:
        if row.shift is None:
            lines.append(f"| `{row.series}` | spikes only | | | | {row.false_alarms} | {row.false_per_hour:.1f} | |")
            continue
        seconds = f"{statistics.median(row.delay_seconds):.2f}" if row.delay_seconds else "-"
        lines.append(f"| `{row.series}` | spikes, {row.shift:+.0%} | {_delay(row)} | {seconds} | "
                     f"{row.found}/{len(row.delays)} | {row.false_alarms} | {row.false_per_hour:.1f} | "
                     f"{row.extra_alarms} |")
    watched = sum(row.watched_seconds for row in result.rows)
    steps = sum(row.watched_steps for row in result.rows)
    false = sum(row.false_alarms for row in result.rows)
    lines += [
        "",
        f"In all, {false} false alarms in {steps:,} steps ({watched / 60:.1f} minutes of series time) watched for "
        "them: the spike-only runs whole, the shifted runs before their shift.",
        "",
        f"Cost: {result.observe_us:.2f} µs per `observe` (all the spiked series, alarms and re-baselines included; "
        f"best of {COST_ROUNDS}), {result.summaries_us:.1f} µs per `summaries`.",
        "",
        "How the defaults were picked: the same runs for each threshold and smallest ratio (warmup "
        f"{DEFAULT_WARMUP}). Of the settings with no false alarm on the spike-only series and every shift of 10% or "
        "more found in time, the smallest min_ratio, then the fewest false alarms before a shift, then the "
        "smallest worst delay, then the highest threshold (the fewest second tests).",
        "",
        "| threshold | min_ratio | false alarms, spike-only | false alarms before a shift | >= 10% found | "
        "worst delay, >= 10% | 5% found |",
        "|---|---|---|---|---|---|---|",
    ]
    chosen = pick(result.sweep)
    for s in result.sweep:
        worst = "missed" if s.worst_10 is None else str(s.worst_10)
        mark = " (picked)" if s is chosen else ""
        lines.append(f"| {s.threshold:g}{mark} | {s.min_ratio:g} | {s.spike_only_false} | {s.false_before} | "
                     f"{s.found_10[0]}/{s.found_10[1]} | {worst} | {s.found_5[0]}/{s.found_5[1]} |")
    defaults = (DEFAULT_THRESHOLD, DEFAULT_MIN_RATIO)
    if chosen is None:
        lines += ["", "No setting met both targets."]
    elif (chosen.threshold, chosen.min_ratio) != defaults:
        lines += ["", f"The pick (threshold {chosen.threshold:g}, min_ratio {chosen.min_ratio:g}) is not the "
                  f"defaults (threshold {defaults[0]:g}, min_ratio {defaults[1]:g}): change them."]
    lines.append("")
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    print("\n".join(markdown(run())))
