"""Issue 40, acceptance 4: real per-operation traces of pipeline-parallel jobs, from ByteDance's straggler study (Lin
et al., "Understanding Stragglers in Large Model Training Using What-if Analysis", OSDI 2025, arXiv:2505.05713; the
artifact ByteDance-Seed/StragglerAnalysis, Apache-2.0: tests/straggler_traces/PROVENANCE.md), replayed through the
real client into two real daemons scraped by one Prometheus (the demo stack, the shipped rules with its short
windows: the straggler records over 20s).

Each job's trace, aggregated per (rank, step) by tests/straggler_traces/convert.py, is replayed rank by rank: one
Telemetry per rank, half the ranks on each node, each rank's role first (Telemetry.role: its pipeline stage and
data-parallel rank, goodput_rank_role_info), each step's phases (compute, comm_wait) and the step itself sent at the
step's end, time compressed by one factor per job (ratios kept), the bubbles left unreported (`untracked`). The
steps begin once Prometheus holds every rank with its counters at 0, so that the records' rates count every step
(the records read the same figures in every run); the replay (about 5 s) fits in their 20s window; once every step
is in Prometheus and the straggler groups have each been evaluated after it, in the order they feed each other,
Prometheus is read, not recomputed: the recorded slowdown (workload:goodput_straggler_slowdown_ratio), the records
it is judged by, and the kind from which of the three alerts is active: GoodputStraggler (worker),
GoodputStageImbalance (stage), GoodputStragglerRandom (random). An alert counts once pending: its whole condition
holds. Its `for:` (15s for GoodputStraggler in the demo, the defaults' 30m for the two tickets, which DEMO_SETTINGS
leaves alone) has not passed when it is read.

1. The replay is faithful: what Prometheus holds per rank matches the trace's aggregate (own time, waits, bubbles)
   and its role.
2. The acceptance: the recorded S within 10% of the study's (S - 1) (result-<job>.json's `blocking_slowdown`) and
   the study's culprit kind alone (AR worker, SE random, ST stage). Where the rules miss on real data it is a strict
   xfail with the figures.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from goodput_client import Telemetry
from goodput_mixin.demo.stack import DEMO_SETTINGS, Ports, Stack

TRACES = Path(__file__).resolve().parent / "straggler_traces"
JOBS = {"AR": "worker", "SE": "random", "ST": "stage"}  # the study's culprit kind of each job
KINDS = {"GoodputStraggler": "worker", "GoodputStageImbalance": "stage", "GoodputStragglerRandom": "random"}
STEP_SECONDS = 0.12  # a replayed step's mean length: about 5 s a job, the three at once
W = DEMO_SETTINGS.windows[0]  # the straggler records' window
# the straggler records' groups, each fed by the one before, and the alerts' that read them
CHAIN = ("goodput.step", "goodput.collective_wait", "goodput.straggler", "goodput.straggler_stage",
         "goodput.straggler_ratio", "goodput.straggler_cost", "goodput.alerts.collective")


@dataclass
class Replayed:
    scale: float  # the time compression: replayed seconds per trace second
    lead: float  # seconds from the clients' start to the first step: untracked, not the trace's
    began: float  # the first step's start, in seconds since the epoch
    late: float  # the most any step was reported after its trace's end (the replay's delay: untracked holds it too)
    clients: list[Telemetry]  # still open: their `end` (stamped when closed, late) would add to untracked


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


def replay(job: str, rows: list[Row], sockets: list[str], ready: Callable[[str, int], None]) -> Replayed:
    """Every rank of the job starts and says its role; once Prometheus holds every rank's counters at 0 (`ready`),
    each reports its steps in compressed time. The clients are left open."""
    steps: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        steps[row.step].append(row)
    roles = {row.rank: (row.stage, row.replica) for row in rows}
    ranks = sorted(roles)
    scale = STEP_SECONDS / statistics.fmean(row.seconds for row in rows)
    since = time.perf_counter()
    clients = {rank: Telemetry(f"trace-{job}", rank, socket_path=sockets[i * len(sockets) // len(ranks)],
                               flush_interval=0.2, timeout=10.0, captures=False, since=since)
               for i, rank in enumerate(ranks)}
    for rank, client in clients.items():
        client.role(*roles[rank])
    ready(job, len(ranks))
    began, start = time.time(), time.perf_counter()
    end, late = start, 0.0
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
        late = max(late, time.perf_counter() - end)  # every rank's events of the step were stamped this late or less
    return Replayed(scale, start - since, began, late, list(clients.values()))


def close(clients: list[Telemetry]) -> None:
    closing = [threading.Thread(target=client.close) for client in clients]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()


def result(stack: Stack, promql: str) -> list[dict]:
    body = httpx.get(f"{stack.urls['prometheus']}/api/v1/query", params={"query": promql}, timeout=5).json()
    return body["data"]["result"]


def query(stack: Stack, promql: str) -> dict[int, float]:
    return {int(s["metric"]["rank"]): float(s["value"][1]) for s in result(stack, promql)}


def scalar(stack: Stack, promql: str) -> float | None:
    found = result(stack, promql)
    assert len(found) <= 1, f"{promql}: {found}"
    return float(found[0]["value"][1]) if found else None


def evaluated(stack: Stack) -> dict[str, float]:
    """Each rule group's last evaluation, in seconds since the epoch."""
    body = httpx.get(f"{stack.urls['prometheus']}/api/v1/rules", timeout=5).json()
    return {g["name"]: datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", g["lastEvaluation"])).timestamp()
            for g in body["data"]["groups"]}


def settle(stack: Stack, since: float, timeout: float = 20.0) -> float:
    """Wait until each group of CHAIN has been evaluated after `since` and after the group that feeds it; returns
    when the last was."""
    deadline = time.monotonic() + timeout
    for group in CHAIN:
        while (last := evaluated(stack)[group]) <= since:
            assert time.monotonic() < deadline, f"{group} not evaluated since {since}"
            time.sleep(0.2)
        since = last
    return since


@dataclass
class Ranks:
    """What Prometheus holds of one replayed job, per rank, in the trace's seconds per step (the counters, which
    start at 0 with the replay, over its whole span), and each rank's role."""

    step: dict[int, float]
    own: dict[int, float]
    wait: dict[int, float]
    untracked: dict[int, float]
    role: dict[int, tuple[int, int]]
    late: float  # Replayed.late per step: the replay's own delay, which untracked may hold, not the trace's


@dataclass
class Recorded:
    """The job's straggler records and its active straggler alerts, as Prometheus holds them."""

    slowdown: float | None  # workload:goodput_straggler_slowdown_ratio
    lost_gpu_seconds: float | None  # per second: ranks x (1 - 1/S), the trace's recorded ranks (one TP rank each)
    ratio: float | None  # workload:goodput_straggler_ratio: the slowest rank's own time over its stage's median
    stage_imbalance: float | None
    variation: float | None  # workload:goodput_step_own_variation_ratio:median
    alerts: dict[str, str]  # alertname -> pending or firing

    @property
    def kinds(self) -> set[str]:
        return {KINDS[name] for name in self.alerts}


def read_ranks(stack: Stack, job: str, replayed: Replayed, steps: int) -> Ranks:
    w = f'workload="trace-{job}"'
    by = "sum by (workload, rank)"
    per_step = f" / {by} (goodput_steps_total{{{w}}}) / {replayed.scale}"
    phase = f"{by} (goodput_phase_seconds_total{{{w},phase=%r}})"
    # the own time as the rules read it: elapsed less untracked, per step, less the wait (comm_wait here) per step
    elapsed, untracked, comm = f"{by} (goodput_elapsed_seconds_total{{{w}}})", phase % "untracked", phase % "comm_wait"
    roles = {int(s["metric"]["rank"]): (int(s["metric"]["pipeline_stage"]), int(s["metric"]["data_parallel_rank"]))
             for s in result(stack, f"goodput_rank_role_info{{{w}}}")}
    return Ranks(step=query(stack, f"{by} (goodput_step_duration_seconds_sum{{{w}}}){per_step}"),
                 own=query(stack, f"(({elapsed}) - ({untracked}) - ({comm})){per_step}"),
                 wait=query(stack, f"({comm}){per_step}"),
                 untracked=query(stack, f"({untracked} - {replayed.lead}){per_step}"),
                 role=roles, late=replayed.late / steps / replayed.scale)


def read_records(stack: Stack, job: str) -> Recorded:
    w = f'workload="trace-{job}"'
    body = httpx.get(f"{stack.urls['prometheus']}/api/v1/alerts", timeout=5).json()
    alerts = {a["labels"]["alertname"]: a["state"] for a in body["data"]["alerts"]
              if a["labels"].get("workload") == f"trace-{job}" and a["labels"]["alertname"] in KINDS}
    return Recorded(
        slowdown=scalar(stack, f"workload:goodput_straggler_slowdown_ratio:rate{W}{{{w}}}"),
        lost_gpu_seconds=scalar(stack, f"workload:goodput_straggler_lost_gpu_seconds:rate{W}{{{w}}}"),
        ratio=scalar(stack, f"workload:goodput_straggler_ratio:rate{W}{{{w}}}"),
        stage_imbalance=scalar(stack, f"workload:goodput_stage_imbalance_ratio:rate{W}{{{w}}}"),
        variation=scalar(stack, f"workload:goodput_step_own_variation_ratio:median{{{w}}}"),
        alerts=alerts)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[list[Row], Ranks, Recorded]]]:
    stack = Stack(tmp_path_factory.mktemp("traces"), Ports.free(), gpus=1, ranks=0, nodes=2, job=False,
                  serving=False).start()
    replays: dict[str, Replayed] = {}
    try:
        rows = {job: trace(job) for job in JOBS}
        sockets = [node.socket_path for node in stack.nodes]

        def ready(job: str, ranks: int) -> None:
            """Prometheus holds the job's ranks, their roles and their counters at 0: the records' rates over their
            window then count the whole replay (a series born with steps already counted would miss them)."""
            w = f'workload="trace-{job}"'
            deadline = time.monotonic() + 20
            while not (len(query(stack, f"sum by (rank) (goodput_steps_total{{{w}}}) == 0")) == ranks
                       and len(query(stack, f"goodput_rank_role_info{{{w}}}")) == ranks):
                assert time.monotonic() < deadline, f"{job}: its ranks are not in Prometheus"
                time.sleep(0.2)

        threads = [threading.Thread(target=lambda j=job: replays.__setitem__(j, replay(j, rows[j], sockets, ready)))
                   for job in JOBS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(replays) == sorted(JOBS), "a replay failed"
        deadline = time.monotonic() + 20
        for job in JOBS:
            ranks = len({row.rank for row in rows[job]})
            steps = len(rows[job]) // ranks
            while True:  # the last scrape after the last step: every rank's step count in Prometheus
                counts = query(stack, f'sum by (workload, rank) (goodput_steps_total{{workload="trace-{job}"}})')
                if len(counts) == ranks and all(v == steps for v in counts.values()):
                    break
                lost = sum(c.dropped + c.unknown for c in replays[job].clients)
                assert time.monotonic() < deadline, f"{job}: steps in Prometheus {counts}; events lost {lost}"
                time.sleep(0.5)
        # before the clients' `end`, stamped late
        ranks = {job: read_ranks(stack, job, replays[job], len({row.step for row in rows[job]})) for job in JOBS}
        close([client for r in replays.values() for client in r.clients])
        settled = settle(stack, time.time())
        # the records' window still holds each job's counters at 0 before its first step: read them now
        margin = min(r.began for r in replays.values()) - (settled - float(W.removesuffix("s")))
        assert margin > 1, f"the records settled too late: their window begins {-margin:.1f} s after a replay's start"
        out = {job: (rows[job], ranks[job], read_records(stack, job)) for job in JOBS}
        yield out
    finally:
        close([client for r in replays.values() for client in r.clients])  # a failed fixture's (closing is idempotent)
        stack.stop()


def counted_untracked(mine: list[Row]) -> float:
    """The untracked seconds per step the daemon counts for a rank that reports each step's phases at the step's end
    (compute first), as the replay does: untracked grows to the rank's elapsed time less its phases after each event
    and never goes down, and right after a step's compute the elapsed time holds the rest of that step too (its
    waits, other, bubble), not reported yet. The last step's rest, at most, on top of the trace's bubbles."""
    elapsed = tracked = most = 0.0
    for row in sorted(mine, key=lambda r: r.step):
        elapsed += row.seconds
        tracked += row.compute
        most = max(most, elapsed - tracked)
        tracked += row.wait + row.other
    return max(most, elapsed - tracked) / len(mine)


@pytest.mark.parametrize("job", JOBS)
def test_replay_is_faithful(replayed: dict[str, tuple[list[Row], Ranks, Recorded]], job: str) -> None:
    """Prometheus holds, per rank and step, the trace's own time, waits and bubbles (within 2% of the step; the bubbles
    as the daemon counts a step's phases reported at its end, and the replay's own delay), and each rank's role."""
    rows, ranks, _ = replayed[job]
    by_rank: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_rank[row.rank].append(row)
    assert sorted(ranks.own) == sorted(by_rank)
    assert ranks.role == {row.rank: (row.stage, row.replica) for row in rows}
    for rank, mine in by_rank.items():
        step = statistics.fmean(r.seconds for r in mine)
        for name, got, want in (("step", ranks.step, step),
                                ("own", ranks.own, statistics.fmean(r.compute + r.other for r in mine)),
                                ("wait", ranks.wait, statistics.fmean(r.wait for r in mine)),
                                ("untracked", ranks.untracked, counted_untracked(mine))):
            slack = ranks.late if name == "untracked" else 0.0
            assert got[rank] == pytest.approx(want, abs=0.02 * step + slack), f"{job} rank {rank} {name}"


# the rules' misses on the real traces, measured (recorded S vs the study's, the kind expected vs given)
MISSES = {
    "AR": "recorded S 2.150 vs the study's 1.973 ((S-1) +18%); the kind is right: GoodputStraggler alone (worker), "
          "straggler ratio 2.35. The study's ideal keeps the pipeline's bubbles (about 2.0 s of its 23.6 s step, a "
          "floor under each rank's p2p waits and untracked time), which neither what-if of the rules holds: the "
          "clients report p2p and collective waits alike as comm_wait",
}
@pytest.mark.parametrize("job", [pytest.param(job, marks=pytest.mark.xfail(
    strict=True, reason=f"the straggler rules on real traces (issue 40, acceptance 4): {MISSES[job]}"))
    if job in MISSES else job for job in JOBS])
def test_slowdown_and_kind_match_the_study(replayed: dict[str, tuple[list[Row], Ranks, Recorded]], job: str) -> None:
    """The recorded slowdown within 10% of the study's (S - 1), and the one active straggler alert of the study's
    kind."""
    _, _, recorded = replayed[job]
    expected = study(job)
    print(f"{job}: study S={expected:.3f} {JOBS[job]}, recorded {recorded} kinds {sorted(recorded.kinds)}")
    assert recorded.slowdown is not None, f"{job}: no slowdown recorded"
    assert recorded.slowdown - 1 == pytest.approx(expected - 1, rel=0.10)
    assert recorded.kinds == {JOBS[job]}
