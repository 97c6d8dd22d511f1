"""When a real job will finish (issue 41), across two daemons: unmodified Hugging Face Trainer and Lightning jobs
(tests/instrument_jobs/straggler_jobs.py, DDP on gloo, one rank on each node) with `max_steps`, under
goodput-instrument and torchrun, reporting to node A's and node B's daemons; one Prometheus with the shipped rules
(the demo's short settings) over both.

- Each job reports its target with no code: its `max_steps`.
- At half way, the P50 forecast is within 15% of the actual finish. "Half way" is the first evaluation of the
  forecast's estimates that read a step number past half the target (workload:goodput_progress_ratio above 0.5);
  the forecast is the P50 finish date of the first evaluation of the finish group after it, and the error is that
  date's distance from the actual finish (the first scrape that saw the target step) over the time from then to the
  finish.

The jobs' work is sleeps (FORWARD 0.2 s a step), so that the loaded 2-core machine's scheduling is small beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from goodput_mixin.demo.stack import Ports, Stack
from test_instrument_waits_alerts import STAGGER, TwoNodeJob
from test_multinode_e2e import query

STEPS = 160  # about 70 s of steps at 0.43 s
FORECAST_JOBS = ("hf", "lightning")
BOUND = 0.15


@dataclass
class Watch:
    """What the poller saw of one job: (wall time, value) pairs, from each series' own sample timestamps."""

    target: float | None = None
    half: tuple[float, float] | None = None  # (when the estimates first read a step past half, its progress)
    forecast: tuple[float, float] | None = None  # (when the finish group evaluated after it, its P50 finish date)
    finished: float | None = None  # the first scrape that saw the target step
    samples: list[tuple[float, float | None, float | None]] = field(default_factory=list)


def _one(stack: Stack, expr: str) -> tuple[float, float] | None:
    """(the sample's timestamp, its value) of a query that returns at most one series."""
    found = query(stack, f"timestamp({expr}) and {expr}")
    value = query(stack, expr)
    if not found or not value:
        return None
    return float(found[0]["value"][1]), float(value[0]["value"][1])  # type: ignore[index]


def watch(stack: Stack, jobs: list[TwoNodeJob], found: dict[str, Watch], deadline: float) -> None:
    """Twice a second, each job's progress and P50 finish date as the rules recorded them, until each finished."""
    while any(w.finished is None for w in found.values()) and time.monotonic() < deadline:
        for job in jobs:
            w, sel = found[job.name], f'{{workload="{job.name}"}}'
            if w.finished is not None:
                continue
            job.alive()
            try:
                if w.target is None and (t := _one(stack, f"workload:goodput_target_step_number:max{sel}")):
                    w.target = t[1]
                progress = _one(stack, f"workload:goodput_progress_ratio{sel}")
                finish = _one(stack, f"workload:goodput_finish_timestamp_seconds:p50{sel}")
                done = query(stack, f"min(timestamp(goodput_step_number{sel} >= {STEPS}))")
            except httpx.HTTPError:  # a busy moment: the next reading
                continue
            w.samples.append((time.time(), progress and progress[1], finish and finish[1]))
            if w.half is None and progress and progress[1] > 0.5:
                w.half = progress
            if w.half is not None and w.forecast is None and finish and finish[0] > w.half[0]:
                w.forecast = finish
            if done:
                w.finished = float(done[0]["value"][1])  # type: ignore[index]
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    live = Stack(tmp_path_factory.mktemp("forecast"), Ports.free(), gpus=1, ranks=0, nodes=2, job=False,
                 serving=False).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def finishes(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Watch]]:
    top = tmp_path_factory.mktemp("forecast-jobs")
    jobs = [TwoNodeJob(f"forecast-{name}", name, {"STEPS": str(STEPS)}, per_node=1) for name in FORECAST_JOBS]
    found = {job.name: Watch() for job in jobs}
    try:
        for job in jobs:
            job.start(stack, top)
            time.sleep(STAGGER)
        watch(stack, jobs, found, deadline=time.monotonic() + 300)
        for name, w in found.items():
            print(f"{name}: target {w.target}, half {w.half}, forecast {w.forecast}, finished {w.finished}; "
                  f"samples {w.samples[::10]}")
    finally:
        for job in jobs:
            job.stop()
    yield found


@pytest.mark.parametrize("name", FORECAST_JOBS)
def test_the_framework_reports_its_target(finishes: dict[str, Watch], name: str) -> None:
    assert finishes[f"forecast-{name}"].target == STEPS


@pytest.mark.parametrize("name", FORECAST_JOBS)
def test_the_forecast_at_half_way_is_within_15_percent_of_the_finish(finishes: dict[str, Watch], name: str) -> None:
    w = finishes[f"forecast-{name}"]
    assert w.half is not None and w.forecast is not None and w.finished is not None, w.samples[-10:]
    made, date = w.forecast
    took = w.finished - made
    assert took > 20, (w.half, w.forecast, w.finished)  # half way left it most of its second half to run
    assert abs(date - w.finished) <= BOUND * took, (w.half, w.forecast, w.finished, took)
