"""Issue 40, acceptance 4: real per-operation traces of pipeline-parallel jobs, from ByteDance's straggler study (Lin
et al., "Understanding Stragglers in Large Model Training Using What-if Analysis", OSDI 2025, arXiv:2505.05713; the
artifact ByteDance-Seed/StragglerAnalysis, Apache-2.0: tests/straggler_traces/PROVENANCE.md), replayed through the
real client into two real daemons scraped by one Prometheus (the demo stack, the shipped rules).

Each job's trace, aggregated per (rank, step) by tests/straggler_traces/convert.py, is replayed rank by rank: one
Telemetry per rank, half the ranks on each node, each step's phases (compute, comm_wait) and the step itself sent at
the step's end, time compressed by one factor per job (ratios kept), the bubbles left unreported (`untracked`).
Prometheus then holds each rank's counters, from which the straggler rules' figures are computed (the rules'
expressions over the replay's whole span: the counters, which start at 0 with the replay, stand for their rates):
each rank's own time per step, every stage's median, the job's slowdown S = T / (T - (O_max - M_max)) and the kind.

1. The replay is faithful: what Prometheus holds per rank matches the trace's aggregate (own time, waits, bubbles).
2. The acceptance: S within 10% of the study's (S - 1) (result-<job>.json's `blocking_slowdown`) and the study's
   culprit kind (AR worker, SE random, ST stage). The rules' formula misses it (expected to fail, with the figures).
"""

from __future__ import annotations

import csv
import json
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from goodput_client import Telemetry
from goodput_mixin.demo.stack import Ports, Stack

TRACES = Path(__file__).resolve().parent / "straggler_traces"
JOBS = {"AR": "worker", "SE": "random", "ST": "stage"}  # the study's culprit kind of each job
STEP_SECONDS = 0.12  # a replayed step's mean length: about 5 s a job, the three at once
# the straggler rules' thresholds (i40-rules' RulesSettings defaults)
STRAGGLER_RATIO, STAGE_IMBALANCE_RATIO, RANDOM_WAIT_RATIO = 1.5, 1.3, 0.3


@dataclass
class Row:
    rank: int
    stage: int
    replica: int
    step: int
    seconds: float
    compute: float
    wait: float  # collectives and pipeline sends/recvs: both wait for a peer
    other: float

    @property
    def untracked(self) -> float:
        return max(0.0, self.seconds - self.compute - self.wait - self.other)


def trace(job: str) -> list[Row]:
    with (TRACES / f"{job}.csv").open() as f:
        return [Row(int(r["rank"]), int(r["pipeline_stage"]), int(r["data_parallel_rank"]), int(r["step"]),
                    float(r["step_seconds"]), float(r["compute_seconds"]),
                    float(r["collective_seconds"]) + float(r["p2p_seconds"]), float(r["other_seconds"]))
                for r in csv.DictReader(f)]


def study(job: str) -> float:
    return float(json.loads((TRACES / f"{job}.json").read_text())["blocking_slowdown"])


def replay(job: str, rows: list[Row], sockets: list[str]) -> float:
    """Every rank of the job reports its steps in compressed time; returns the compression factor."""
    steps: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        steps[row.step].append(row)
    ranks = sorted({row.rank for row in rows})
    scale = STEP_SECONDS / statistics.fmean(row.seconds for row in rows)
    start = time.perf_counter()
    clients = {rank: Telemetry(f"trace-{job}", rank, socket_path=sockets[i * len(sockets) // len(ranks)],
                               flush_interval=0.2, captures=False, since=start)
               for i, rank in enumerate(ranks)}
    end = start
    for number in sorted(steps):
        end += steps[number][0].seconds * scale  # every rank's step lasts as long (synchronous training)
        time.sleep(max(0.0, end - time.perf_counter()))
        for row in steps[number]:
            client = clients[row.rank]
            client.record_phase("compute", row.compute * scale)
            client.record_phase("comm_wait", row.wait * scale)
            if row.other:
                client.record_phase("other", row.other * scale)
            client.record_step(row.seconds * scale)
    closing = [threading.Thread(target=client.close) for client in clients.values()]  # each "end" stamped now
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()
    return scale


def query(stack: Stack, promql: str) -> dict[int, float]:
    body = httpx.get(f"{stack.urls['prometheus']}/api/v1/query", params={"query": promql}, timeout=5).json()
    return {int(s["metric"]["rank"]): float(s["value"][1]) for s in body["data"]["result"]}


@dataclass
class Ranks:
    """What Prometheus holds of one replayed job, per rank, in the trace's seconds per step."""

    step: dict[int, float]
    own: dict[int, float]
    wait: dict[int, float]
    untracked: dict[int, float]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[list[Row], Ranks]]]:
    stack = Stack(tmp_path_factory.mktemp("traces"), Ports.free(), gpus=1, ranks=0, nodes=2, job=False,
                  serving=False).start()
    try:
        rows = {job: trace(job) for job in JOBS}
        scales: dict[str, float] = {}
        sockets = [node.socket_path for node in stack.nodes]
        threads = [threading.Thread(target=lambda j=job: scales.__setitem__(j, replay(j, rows[j], sockets)))
                   for job in JOBS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out = {}
        for job in JOBS:
            w = f'workload="trace-{job}"'
            ranks = len({row.rank for row in rows[job]})
            steps = len(rows[job]) // ranks
            by = "sum by (workload, rank)"
            deadline = time.monotonic() + 20
            while True:  # the last scrape after the last step: every rank's step count in Prometheus
                counts = query(stack, f"{by} (goodput_steps_total{{{w}}})")
                if len(counts) == ranks and all(v == steps for v in counts.values()):
                    break
                assert time.monotonic() < deadline, f"{job}: steps in Prometheus {counts}"
                time.sleep(0.5)
            per_step = f" / {by} (goodput_steps_total{{{w}}}) / {scales[job]}"
            phase = f"{by} (goodput_phase_seconds_total{{{w},phase=%r}})"
            # the i40-rules' own time: elapsed less untracked, per step, less comm_wait per step
            elapsed, untracked, comm = (f"{by} (goodput_elapsed_seconds_total{{{w}}})",
                                        phase % "untracked", phase % "comm_wait")
            out[job] = (rows[job], Ranks(
                step=query(stack, f"{by} (goodput_step_duration_seconds_sum{{{w}}}){per_step}"),
                own=query(stack, f"(({elapsed}) - ({untracked}) - ({comm})){per_step}"),
                wait=query(stack, f"({comm}){per_step}"), untracked=query(stack, f"({untracked}){per_step}")))
        yield out
    finally:
        stack.stop()


def median(values: list[float]) -> float:
    return statistics.median(values)  # Prometheus' quantile(0.5): the mean of the middle two of an even count


@dataclass
class Verdict:
    slowdown: float
    kind: str | None
    ratio: float  # the largest rank's own time over its stage's median
    stage_imbalance: float
    wait_min: float


def rules(rows: list[Row], ranks: Ranks) -> Verdict:
    """The i40-rules' straggler figures from the ranks' series, the stage of each rank from its role."""
    stage = {row.rank: row.stage for row in rows}
    typical = {s: median([o for r, o in ranks.own.items() if stage[r] == s]) for s in set(stage.values())}
    t = max(ranks.step.values())
    gap = max(ranks.own.values()) - max(typical.values())
    ratio = max(o / typical[stage[r]] for r, o in ranks.own.items())
    imbalance = max(typical.values()) / statistics.fmean(typical.values())
    wait_min = min(ranks.wait.values()) / t
    kind = ("worker" if ratio > STRAGGLER_RATIO else "stage" if imbalance > STAGE_IMBALANCE_RATIO
            else "random" if wait_min > RANDOM_WAIT_RATIO else None)
    return Verdict(t / (t - gap), kind, ratio, imbalance, wait_min)


@pytest.mark.parametrize("job", JOBS)
def test_replay_is_faithful(replayed: dict[str, tuple[list[Row], Ranks]], job: str) -> None:
    """Prometheus holds, per rank and step, the trace's own time, waits and bubbles (within 2% of the step)."""
    rows, ranks = replayed[job]
    by_rank: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_rank[row.rank].append(row)
    assert sorted(ranks.own) == sorted(by_rank)
    for rank, mine in by_rank.items():
        step = statistics.fmean(r.seconds for r in mine)
        for name, got, want in (("step", ranks.step, step),
                                ("own", ranks.own, statistics.fmean(r.compute + r.other for r in mine)),
                                ("wait", ranks.wait, statistics.fmean(r.wait for r in mine)),
                                ("untracked", ranks.untracked, statistics.fmean(r.untracked for r in mine))):
            assert got[rank] == pytest.approx(want, abs=0.02 * step), f"{job} rank {rank} {name}"


@pytest.mark.xfail(strict=True, reason="the i40-rules' straggler formula on real traces (issue 40, acceptance 4): "
                   "AR S 2.15 vs the study's 1.973 ((S-1) +18%); SE 1.02 vs 1.537, no kind; ST 1.00 vs 1.179, "
                   "random not stage")
@pytest.mark.parametrize("job", JOBS)
def test_slowdown_and_kind_match_the_study(replayed: dict[str, tuple[list[Row], Ranks]], job: str) -> None:
    rows, ranks = replayed[job]
    verdict = rules(rows, ranks)
    expected = study(job)
    print(f"{job}: study S={expected:.3f}, ours {verdict}")
    assert verdict.slowdown - 1 == pytest.approx(expected - 1, rel=0.10)
    assert verdict.kind == JOBS[job]
