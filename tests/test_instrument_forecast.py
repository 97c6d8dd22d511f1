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

And one job across its runs: the Hugging Face job named `GOODPUT_JOB=resub`, checkpointing every SAVE steps, run
by torchrun as run `resub-1`, killed (SIGKILL, every process) some steps after a checkpoint, and submitted again as
run `resub-2` (a new rendezvous id) that resumes from that checkpoint:

- one workload in the series (none named after either run), both runs in its lineage (the rules' count, the
  workload dashboard's Runs panel's own query);
- on each rank: the steps it made past the checkpoint counted as redone (goodput_wasted_steps_total), the gap
  between the runs as downtime, one restart;
- the forecast continuing: the same workload's P50 finish is forecast in the second run, and its progress reaches
  the target.

The jobs' work is sleeps (FORWARD 0.45 s a step), so that the loaded 2-core machine's scheduling is small beside it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from conftest import ROOT
from goodput_mixin.dashboards.lint import panels, query_values, substitute
from goodput_mixin.demo.stack import DEMO_SETTINGS, Stack
from goodput_mixin.rules.settings import seconds
from test_instrument_waits_alerts import STAGGER, TwoNodeJob
from test_multinode_e2e import query
from two_nodes import two_nodes

STEPS = 110  # about 75 s of steps at 0.68 s
# each step sleeps most of its time (standing for the device's work): its CPU part, about 0.25 s, is what the loaded
# 2-core machine slows when the suite's other worker is busy. At FORWARD 0.2 s (0.43 s steps) the Hugging Face job
# once finished 17% before the P50 taken at half way (the bound: 15%) in a full run, where the other worker's load
# comes and goes; alone, or beside a steady load, the same forecast was 0.5 s off over 32 s
FORWARD = "0.45"
FORECAST_JOBS = ("hf", "lightning")
BOUND = 0.15
# what the forecast is made of, printed with it: a miss says which input was off
INPUTS = ("workload:goodput_step_number:max", "workload:goodput_step_number_timestamp_seconds:max",
          "workload:goodput_step_time_seconds:median", "workload:goodput_step_time_seconds:lifetime_mean",
          "workload:goodput_step_overhead_ratio:lifetime", "workload:goodput_time_to_finish_seconds:p50")


@dataclass
class Watch:
    """What the poller saw of one job: (wall time, value) pairs, from each series' own sample timestamps."""

    target: float | None = None
    half: tuple[float, float] | None = None  # (when the estimates first read a step past half, its progress)
    forecast: tuple[float, float] | None = None  # (when the finish group evaluated after it, its P50 finish date)
    finished: float | None = None  # the first scrape that saw the target step
    inputs: dict[str, float | None] = field(default_factory=dict)  # the forecast's inputs when it was taken
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
            job.alive(finished_ok=True)  # its end may come before the scrape that sees its last step
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
                w.inputs = {r: (v[1] if (v := _one(stack, f"{r}{sel}")) else None) for r in INPUTS}
            if done:
                w.finished = float(done[0]["value"][1])  # type: ignore[index]
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with two_nodes(tmp_path_factory.mktemp("forecast")) as live:
        yield live


@pytest.fixture(scope="module")
def finishes(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Watch]]:
    top = tmp_path_factory.mktemp("forecast-jobs")
    jobs = [TwoNodeJob(f"forecast-{name}", name, {"STEPS": str(STEPS), "FORWARD": FORWARD}, per_node=1)
            for name in FORECAST_JOBS]
    found = {job.name: Watch() for job in jobs}
    try:
        for job in jobs:
            job.start(stack, top)
            time.sleep(STAGGER)
        watch(stack, jobs, found, deadline=time.monotonic() + 300)
        for name, w in found.items():
            print(f"{name}: target {w.target}, half {w.half}, forecast {w.forecast}, finished {w.finished}; "
                  f"the forecast's inputs then: {w.inputs}; samples {w.samples[::10]}")
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


JOB = "resub"
RESUB_STEPS, SAVE = 100, 20
CHAIN = seconds(DEMO_SETTINGS.slow_groups_interval)  # the forecast groups' interval
GAP = 5.0  # seconds between the first run's kill and the second's submission


@dataclass
class Resubmitted:
    last: dict[str, float]  # each rank's last step number the daemons had when the first run was killed
    killed: float  # wall time of the kill
    submitted: float  # wall time the second run was submitted
    forecast: tuple[float, float] | None  # (when, the P50 finish date) once the second run made progress of its own
    finished: float | None  # the first scrape that saw its last step
    progress: float | None  # the workload's progress at the end


def _values(stack: Stack, expr: str, label: str = "rank") -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in query(stack, expr)}  # type: ignore[index]


def _until(what: str, check, timeout: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def resubmitted(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resubmitted]:
    """Run 1 until a checkpoint and some steps past it, killed; the gap; run 2, resuming, to its end. (The forecast
    jobs, whose tests come first, have finished: one batch at a time.)"""
    top = tmp_path_factory.mktemp("resubmission")
    checkpoints = top / "checkpoints"
    extra = {"STEPS": str(RESUB_STEPS), "SAVE_STEPS": str(SAVE), "CHECKPOINT_DIR": str(checkpoints),
             "GOODPUT_JOB": JOB}
    first = TwoNodeJob(f"{JOB}-1", "hf", extra, per_node=1)
    second = TwoNodeJob(f"{JOB}-2", "hf", extra, per_node=1)
    sel = f'{{workload="{JOB}"}}'
    try:
        first.start(stack, top)
        _until("the first run checkpointed and went 6 steps past it", lambda: first.alive() and (
            checkpoints / f"checkpoint-{SAVE}").is_dir() and len(steps := _values(
                stack, f"goodput_step_number{sel}")) == 2 and min(steps.values()) >= SAVE + 6)
        first.stop()
        killed = time.time()
        time.sleep(GAP)
        last = _values(stack, f"goodput_step_number{sel}")  # what the daemons had of it: its events in flight lost
        submitted = time.time()
        second.start(stack, top)
        forecast: list[tuple[float, float]] = []
        inputs: dict[str, float | None] = {}
        ahead = max(last.values()) + 5  # past what the first run had made: the second run's own progress
        seen: list[float] = []  # when the step record first read `ahead`

        def done() -> bool:
            second.alive(finished_ok=True)  # its end may come before the scrape that sees its last step
            if not seen and min(_values(stack, f"workload:goodput_step_number:max{sel}", "workload").values(),
                                default=0) >= ahead:
                seen.append(time.time())
            # the first P50 the finish group evaluated from it: the estimates' group and then the finish group each
            # read the other's records as of their last evaluation, two slow-group intervals at most (before them,
            # the P50 reads the gap's stale step number: the first run's last, as if stepping on from it)
            if seen and not forecast and (p50 := _one(stack, f"workload:goodput_finish_timestamp_seconds:p50{sel}")) \
                    and p50[0] >= seen[0] + 2 * CHAIN:
                forecast.append((time.time(), p50[1]))
                inputs.update({r: _values(stack, f"{r}{sel}", "workload").get(JOB) for r in INPUTS})
            steps = _values(stack, f"goodput_step_number{sel}")
            return len(steps) == 2 and min(steps.values()) >= RESUB_STEPS

        _until("the second run finished", done)
        finished = query(stack, f"min(timestamp(goodput_step_number{sel} >= {RESUB_STEPS}))")
        time.sleep(12)  # the estimates and the finish groups read the last step (5 s groups)
        progress = _values(stack, f"workload:goodput_progress_ratio{sel}", "workload").get(JOB)
        found = Resubmitted(last, killed, submitted, forecast[0] if forecast else None,
                            float(finished[0]["value"][1]) if finished else None, progress)  # type: ignore[index]
        print(f"resubmission: {found}; the forecast's inputs then: {inputs}; wasted steps, downtime: "
              f"{_values(stack, f'goodput_wasted_steps_total{sel}')}, "
              f"{_values(stack, f'goodput_downtime_seconds_total{sel}')}")
        yield found
    finally:
        first.stop()
        second.stop()


def test_the_resubmitted_job_is_one_workload_with_both_runs_in_its_lineage(stack: Stack,
                                                                           resubmitted: Resubmitted) -> None:
    assert not query(stack, f'goodput_steps_total{{workload=~"{JOB}-.*"}}')  # no workload named after a run
    assert _values(stack, f'workload:goodput_runs:count{{workload="{JOB}"}}', "workload") == {JOB: 2}
    workload = json.loads((ROOT / "dashboards" / "6-workload.json").read_text())
    panel = next(p for p in panels(workload) if p.get("title") == "Runs")
    expr = substitute(panel["targets"][0]["expr"], {**query_values(workload), "workload": JOB})
    started = _values(stack, expr, "run")
    assert set(started) == {f"{JOB}-1", f"{JOB}-2"}, started
    # the dashboard's dates, in ms: the first run before the kill, the second after its submission
    assert started[f"{JOB}-1"] / 1000 < resubmitted.killed < resubmitted.submitted < started[f"{JOB}-2"] / 1000


def test_the_steps_redone_after_the_resubmission_are_wasted_and_the_gap_is_downtime(
        stack: Stack, resubmitted: Resubmitted) -> None:
    sel = f'{{workload="{JOB}"}}'
    wasted = _values(stack, f"goodput_wasted_steps_total{sel}")
    downtime = _values(stack, f"goodput_downtime_seconds_total{sel}")
    restarts = _values(stack, f"goodput_workload_restarts_total{sel}")
    assert set(resubmitted.last) == {"0", "1"}, resubmitted.last
    # each rank redid every step it had made past the checkpoint it resumed from
    assert wasted == {rank: last - SAVE for rank, last in resubmitted.last.items()}, (wasted, resubmitted.last)
    assert all(n >= 6 for n in wasted.values()), wasted
    # the gap: from the first run's last event (before the kill) to the second run's processes' start (after the
    # submission, torchrun's and Python's start-up later)
    assert all(GAP <= d <= GAP + 60 for d in downtime.values()), downtime
    assert restarts == {"0": 1, "1": 1}, restarts


def test_the_forecast_continues_across_the_runs(resubmitted: Resubmitted) -> None:
    """The same workload's forecast, once the second run stepped past where the first had been: its P50 finish
    date within 25% of the time the run then took (the restart the resubmission counted barely moves it: one
    interruption in a few rank-minutes against the cluster's prior of 2e-5 per GPU-hour)."""
    assert resubmitted.forecast is not None and resubmitted.finished is not None, resubmitted
    when, date = resubmitted.forecast
    took = resubmitted.finished - when
    assert took > 5 and abs(date - resubmitted.finished) <= 0.25 * took, resubmitted
    assert resubmitted.progress == 1
