"""The finish forecast (docs/forecast.md) against replayed jobs: how far its P50 and P90 finish dates are from each
job's actual finish, beside the naive ETA a progress bar gives (issue 41's acceptance 1).

Each job is drawn at random (seeded) and replayed through the real parts: its ranks are threads that report through
the training client (goodput_client.Telemetry) to two daemons (ranks split between them), scraped by one Prometheus
running the shipped rules (the demo's 5 s groups). Time is compressed by COMPRESSION (one replayed second stands for
ten minutes) and each rank stands for GPUS_PER_RANK GPUs, so the published interruption rate becomes a rate per
rank-second of the replay; ratios (interruptions per job, their cost against the job's length) are those of the real
jobs. The rules' priors are scaled the same way (forecast_interruptions_per_gpu_hour, forecast_interruption_cost).

A job: 1-4 ranks, 300-600 optimizer steps of 0.12-0.25 s with lognormal noise (2-10%), a checkpoint every 10-40 steps
(1-3 steps' time to save), an evaluation every 50, 100 or 150 steps (3-8 steps' time) or none; with probability 0.2 a
straggler (one rank 1.2-1.6x slower from a step on, the others waiting for it in comm_wait, until a restart moves the
job off its GPU), with probability 0.3 data stalls that come back (every 80-150 steps, 5-15 steps of 0.5-2 steps'
time more data wait). Interruptions arrive as a Poisson process in the job's wall time at INTERRUPTIONS_PER_GPU_HOUR
(Llama 3's pre-training: 419 unexpected interruptions in 54 days on 16,384 H100s, Dubey et al. 2024, "The Llama 3 Herd
of Models", section 3.3.4) x its GPUs: every rank's process dies after the step in which one lands, is down 0.5-1.5 s
(5-15 minutes), compiles again (0.5-1 s), restores the last checkpoint (0.3-0.6 s) and redoes the steps since.

From each job's replay, Prometheus's records at 1 s resolution: at the first time its progress reached 20%, 30%, ...,
90%, the forecast's P50 and P90 finish dates (workload:goodput_finish_timestamp_seconds:{p50,p90}) and two naive
ETAs computed from the same series: remaining steps x the mean step time of the last NAIVE_WINDOW (the step
histogram's rate: what the issue names), and remaining steps x the wall time per step over the last NAIVE_WINDOW (a
progress bar's rate, tqdm's). The error of a forecast is (its date - the actual finish) / the job's actual duration
(from its first process's start to its last step).

    python bench/forecast_replay.py [--jobs 200] [--batch 20] [--seed 41]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "mixin"))

from daemon_cost import percentile  # noqa: E402
from goodput_client import Telemetry  # noqa: E402
from goodput_mixin.demo.stack import DEMO_SETTINGS, Ports, Stack  # noqa: E402

COMPRESSION = 600.0  # real seconds per replayed second
GPUS_PER_RANK = 1024
INTERRUPTIONS_PER_GPU_HOUR = 419 / (54 * 24 * 16384)  # Llama 3: 2.0e-5
PER_RANK_SECOND = INTERRUPTIONS_PER_GPU_HOUR * GPUS_PER_RANK * COMPRESSION / 3600
RESTART_COST_PRIOR = "2s"  # 20 minutes of downtime, start-up and redone steps, replayed
PROGRESS_POINTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
NAIVE_WINDOW = 20  # seconds (about 100 steps)
VERBOSE = False  # --verbose: each job's plan and its forecasts' errors, on stderr
SETTLE = 15.0  # seconds after a batch's last job ends, for the groups to record its end


@dataclass
class Job:
    name: str
    ranks: int
    steps: int
    actions: list[tuple] = field(default_factory=list)  # type: ignore[type-arg]  # common to every rank
    interruptions: int = 0
    plan: dict[str, object] = field(default_factory=dict)  # what was drawn, for --verbose
    started: float | None = None  # wall time its first process started
    finished: float | None = None  # wall time its last step ended (rank 0)


def draw(rng: random.Random, name: str) -> Job:
    """A job's plan: its processes, phases, steps and crashes in order; every rank replays the same."""
    job = Job(name, rng.choice((1, 1, 2, 2, 3, 4)), rng.randint(300, 600))
    base, noise = rng.uniform(0.12, 0.25), rng.uniform(0.02, 0.10)
    every = rng.randint(10, 40)  # steps between checkpoints: 2-10 s, 20-100 minutes
    save = rng.uniform(1, 3) * base
    evals = rng.choice((None, 50, 100, 150))
    eval_seconds = rng.uniform(3, 8) * base
    # a slow rank (a GPU running hot, a degraded link) from a step on, until the next restart moves the job
    straggler = (rng.randrange(job.steps), rng.uniform(1.2, 1.6), rng.randrange(job.ranks)) \
        if rng.random() < 0.2 else None
    # data stalls that come back (a shard's download, an epoch's shuffle): every `period` steps, `length` steps long
    stall = (rng.randint(80, 150), rng.randint(5, 15), rng.uniform(0.5, 2.0) * base) if rng.random() < 0.3 else None
    rate = PER_RANK_SECOND * job.ranks
    job.plan = {"base": round(base, 3), "noise": round(noise, 3), "every": every, "evals": evals,
                "straggler": straggler and (straggler[0], round(straggler[1], 2)), "stall": stall and stall[:2]}
    clock, next_crash = 0.0, rng.expovariate(rate)

    def phase(name: str, seconds: float) -> None:
        nonlocal clock
        job.actions.append(("phase", name, seconds))
        clock += seconds

    checkpoint, step, slow_since = 0, 0, straggler[0] if straggler else None
    job.actions.append(("process", None))
    phase("compile", rng.uniform(0.5, 1.0))
    while step < job.steps:
        step += 1
        data = 0.1 * base + (stall[2] if stall and step % stall[0] < stall[1] else 0.0)
        compute = 0.9 * base * math.exp(rng.gauss(0, noise))
        slow = straggler if straggler and slow_since is not None and step >= slow_since else None
        job.actions.append(("step", step, data, compute, slow[2] if slow else -1, slow[1] if slow else 1.0))
        clock += data + compute * (slow[1] if slow else 1.0)
        if step % every == 0:
            phase("checkpoint_save", save)
            checkpoint = step
        if evals and step % evals == 0:
            phase("eval", eval_seconds)
        if clock >= next_crash and step < job.steps:
            down = rng.uniform(0.5, 1.5)  # 5-15 minutes
            job.actions.append(("crash", down))
            job.interruptions += 1
            clock += down
            job.actions.append(("process", checkpoint))
            phase("compile", rng.uniform(0.5, 1.0))
            phase("checkpoint_restore", rng.uniform(0.3, 0.6))
            step = checkpoint
            slow_since = None  # the restart moved the job off the slow GPU
            next_crash = clock + rng.expovariate(rate)
    return job


class Replay:
    """A rank's replay of its job's plan, on a deadline clock (no drift): what it reports is what it slept."""

    def __init__(self, job: Job, rank: int, socket: str) -> None:
        self.job, self.rank, self.socket = job, rank, socket
        self.deadline = time.perf_counter()

    def wait(self, seconds: float) -> float:
        started = time.perf_counter()
        self.deadline += seconds
        time.sleep(max(0.0, self.deadline - time.perf_counter()))
        return time.perf_counter() - started

    def run(self) -> None:
        telemetry: Telemetry | None = None
        job = self.job
        for action in job.actions:
            kind = action[0]
            if kind == "process":
                telemetry = Telemetry(job.name, self.rank, socket_path=self.socket, flush_interval=0.3,
                                      resumed_from_step=action[1])
                telemetry.target(job.steps)
                if job.started is None and self.rank == 0:
                    job.started = telemetry.started_at
            elif kind == "phase":
                telemetry.record_phase(action[1], self.wait(action[2]))  # type: ignore[union-attr]
            elif kind == "step":
                _, number, data, compute, slow_rank, factor = action
                waited = self.wait(data)
                telemetry.record_phase("data_wait", waited)  # type: ignore[union-attr]
                own = self.wait(compute * (factor if slow_rank == self.rank else 1.0))
                telemetry.record_phase("compute", own)  # type: ignore[union-attr]
                peers = self.wait(compute * (factor - 1.0) if slow_rank not in (-1, self.rank) else 0.0)
                if peers:
                    telemetry.record_phase("comm_wait", peers)  # type: ignore[union-attr]
                telemetry.record_step(waited + own + peers, step=number)  # type: ignore[union-attr]
                if number == job.steps and self.rank == 0:
                    job.finished = time.time()
            elif kind == "crash":
                telemetry.close(timeout=1.0)  # type: ignore[union-attr]  # the process dies (atexit closes it)
                self.wait(action[1])
        if telemetry is not None:
            telemetry.close(timeout=2.0)


def _range(prometheus: str, expr: str, start: float, end: float) -> dict[float, float]:
    body = httpx.get(f"{prometheus}/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end, "step": 1}, timeout=30).json()
    result = body["data"]["result"]
    return {float(t): float(v) for t, v in result[0]["values"]} if result else {}


@dataclass
class Sample:
    job: str
    interrupted: bool
    straggler: bool  # a rank turned slow from a step on: a shift no forecast made before it can foresee
    progress: float
    p50: float  # errors: (forecast date - actual finish) / actual duration
    p90: float
    naive: float | None
    tqdm: float | None


def samples_of(prometheus: str, job: Job) -> list[Sample]:
    assert job.started is not None and job.finished is not None, job.name
    sel = f'{{workload="{job.name}"}}'
    start, end = job.started - 5, job.finished + 5
    progress = _range(prometheus, f"workload:goodput_progress_ratio{sel}", start, end)
    p50 = _range(prometheus, f"workload:goodput_finish_timestamp_seconds:p50{sel}", start, end)
    p90 = _range(prometheus, f"workload:goodput_finish_timestamp_seconds:p90{sel}", start, end)
    step = _range(prometheus, f"max(goodput_step_number{sel})", start, end)
    mean = _range(prometheus, f"sum(rate(goodput_step_duration_seconds_sum{sel}[{NAIVE_WINDOW}s])) / "
                              f"sum(rate(goodput_step_duration_seconds_count{sel}[{NAIVE_WINDOW}s]))", start, end)
    duration = job.finished - job.started
    found: list[Sample] = []
    for point in PROGRESS_POINTS:
        at = next((t for t in sorted(progress) if progress[t] >= point and t in p50 and t in p90), None)
        if at is None:
            continue
        left = job.steps - step.get(at, 0.0)
        naive = at + left * mean[at] if at in mean else None
        made = step.get(at, 0.0) - step.get(at - NAIVE_WINDOW, math.inf)
        tqdm = at + left * NAIVE_WINDOW / made if made > 0 else None

        def error(date: float | None) -> float | None:
            return None if date is None else (date - job.finished) / duration  # type: ignore[operator]

        found.append(Sample(job.name, job.interruptions > 0, job.plan.get("straggler") is not None, point,
                            error(p50[at]), error(p90[at]), error(naive), error(tqdm)))  # type: ignore[arg-type]
    return found


def run_batch(stack: Stack, jobs: list[Job]) -> None:
    sockets = [node.socket_path for node in stack.nodes]
    threads = []
    for job in jobs:
        for rank in range(job.ranks):
            replay = Replay(job, rank, sockets[rank % len(sockets)])
            threads.append(threading.Thread(target=replay.run, name=f"{job.name}/{rank}", daemon=True))
            threads[-1].start()
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    time.sleep(SETTLE)


def summary(samples: list[Sample], jobs: list[Job]) -> dict[str, dict[str, float]]:
    """Per group (all, with interruptions, without): median and P90 of |error| of each forecast, the share of
    samples whose actual finish was at or before the P90 date, and the mean signed error (bias)."""
    groups = {"all jobs": samples, "with interruptions": [s for s in samples if s.interrupted],
              "without": [s for s in samples if not s.interrupted],
              "with a straggler from a step on": [s for s in samples if s.straggler],
              "neither": [s for s in samples if not s.interrupted and not s.straggler]}
    out: dict[str, dict[str, float]] = {}
    for name, group in groups.items():
        if not group:
            continue
        row: dict[str, float] = {"jobs": len({s.job for s in group}), "samples": len(group)}
        for kind in ("p50", "naive", "tqdm"):
            errors = [getattr(s, kind) for s in group if getattr(s, kind) is not None]
            row[f"{kind} median"] = statistics.median(abs(e) for e in errors)
            row[f"{kind} p90"] = percentile([abs(e) for e in errors], 0.9)
            row[f"{kind} bias"] = statistics.fmean(errors)
        row["covered"] = sum(s.p90 >= 0 for s in group) / len(group)
        out[name] = row
    interrupted = [j for j in jobs if j.interruptions]
    out["all jobs"]["interruptions"] = sum(j.interruptions for j in jobs)
    out["all jobs"]["interrupted jobs"] = len(interrupted)
    return out


def replay(count: int, batch: int, seed: int) -> tuple[list[Sample], list[Job]]:
    rng = random.Random(seed)
    jobs = [draw(rng, f"replay-{n:03d}") for n in range(count)]
    settings = DEMO_SETTINGS.model_copy(update={"forecast_interruptions_per_gpu_hour": PER_RANK_SECOND * 3600,
                                                "forecast_interruption_cost": RESTART_COST_PRIOR})
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="gp-replay-") as top:
        stack = Stack(Path(top), Ports.free(), gpus=1, ranks=0, nodes=2, job=False, serving=False,
                      settings=settings).start()
        try:
            for first in range(0, count, batch):
                run_batch(stack, jobs[first:first + batch])
                for job in jobs[first:first + batch]:
                    found = samples_of(stack.urls["prometheus"], job)
                    samples.extend(found)
                    if VERBOSE:
                        print(job.name, job.ranks, job.steps, job.interruptions, job.plan,
                              [(s.progress, round(s.p50, 3), round(s.p90, 3), s.naive and round(s.naive, 3))
                               for s in found], file=sys.stderr)
                print(f"replayed {min(first + batch, count)}/{count} jobs", file=sys.stderr, flush=True)
        finally:
            stack.stop()
    return samples, jobs


def section(count: int = 200, batch: int = 25, seed: int = 41) -> str:
    samples, jobs = replay(count, batch, seed)
    rows = summary(samples, jobs)
    everything = rows["all jobs"]
    lines = [
        "## Finish forecast against replayed jobs",
        "",
        f"`python bench/forecast_replay.py`: {count} jobs drawn with seed {seed} (bench/forecast_replay.py says how), "
        f"{int(everything['interrupted jobs'])} of them interrupted ({int(everything['interruptions'])} "
        f"interruptions, at Llama 3's {INTERRUPTIONS_PER_GPU_HOUR:.2e} per GPU-hour, each rank {GPUS_PER_RANK} "
        f"GPUs, one replayed second for {COMPRESSION / 60:g} minutes), replayed {batch} at a time through the "
        "training client, two daemons and Prometheus with the shipped rules. Errors: (forecast date - actual finish) / "
        "the job's actual duration, at the first record of 20%, 30%, ..., 90% progress; |error| median and P90, "
        "bias (mean signed error; negative: too early), and the share of forecasts whose actual finish came at or "
        "before the P90 date.",
        "",
        "| jobs | forecasts | P50 median | P50 P90 | P50 bias | at or before P90 | naive median | naive P90 "
        "| naive bias | tqdm median | tqdm P90 | tqdm bias |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} ({int(row['jobs'])}) | {int(row['samples'])} | {row['p50 median']:.1%} | {row['p50 p90']:.1%} "
            f"| {row['p50 bias']:+.1%} | {row['covered']:.0%} | {row['naive median']:.1%} | {row['naive p90']:.1%} "
            f"| {row['naive bias']:+.1%} | {row['tqdm median']:.1%} | {row['tqdm p90']:.1%} "
            f"| {row['tqdm bias']:+.1%} |")
    lines += ["", "naive: remaining steps x the mean step time of the last 20 s (the step histogram's rate); tqdm: "
              "remaining steps x the wall time per step over the last 20 s (a progress bar's rate). Targets (issue "
              "41): P50 median <= 3%, P90 of |error| <= 8%, the actual finish at or before P90 for >= 85%."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    print(section(args.jobs, args.batch, args.seed))


if __name__ == "__main__":
    main()
