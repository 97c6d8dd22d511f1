"""The waits real jobs hide (issue 40), paged or ticketed across two nodes: the unmodified straggler jobs of
test_instrument_waits (tests/instrument_jobs/straggler_jobs.py: gloo, CPU, one rank three times slower in its forward
pass) under goodput-instrument and torchrun as two agents, ranks 0-1 reporting to node A's daemon and 2-3 to node B's,
one Prometheus with the shipped rules (the demo's short settings) over both. test_instrument_waits checks what each
rank reports against what the job measured; this checks what the rules make of it.

1. DistributedDataParallel (with its own communication hook), FSDP2 (fully_shard), a Hugging Face Trainer (DDP
   through accelerate) and Lightning's DDP strategy, rank 3 slow in its forward pass: GoodputStraggler fires for
   rank 3 on node B and nothing else ever fires; the same jobs healthy (plain DDP's healthy run across two nodes:
   test_instrument_alerts_e2e): every rank's straggler ratio at most 1.2, no straggler alert firing while they run
   and none pending at the end.
2. A 2-stage pipeline (torch.distributed.pipelining, two replicas: rank = replica x 2 + stage): its last stage slower
   by construction (both replicas): GoodputStageImbalance (a ticket: pending is enough, its `for:` is the defaults'
   30m) and no GoodputStraggler; one rank of the last stage slowed instead (rank 3, node B): that rank paged.

The jobs run in two batches (the slow ones, then the healthy ones and the stage-imbalanced pipeline), started
STAGGER apart, each until its alert fired or its ranks' 20s records covered GoodputStraggler's window
and `for:` (15s), then stopped. Their work is sleeps (FORWARD 0.2 s a step here, so that the loaded 2-core
machine's scheduling is small beside it); their waits are real.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, free_port
from goodput_mixin.demo.stack import DEMO_SETTINGS, Node, Stack
from test_multinode_e2e import _descendants, query
from two_nodes import two_nodes

JOB = ROOT / "tests" / "instrument_jobs" / "straggler_jobs.py"
DEV_BIN = Path(sys.executable).parent  # torch, transformers, accelerate, lightning and the editable client
SLOW = 3  # rank 3: node B; of the pipeline, stage 1 of the second replica
W = DEMO_SETTINGS.windows[0]
STRAGGLER_ALERTS = ("GoodputStraggler", "GoodputStageImbalance", "GoodputStragglerRandom")
# long enough that no job ends before it is stopped: about 0.7 s a step with the slow rank
JOB_ENV = {"STEPS": "5000", "FORWARD": "0.2", "BACKWARD": "0.01", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
STAGGER = 8.0  # seconds between two jobs' starts: twenty processes importing torch at once starve the machine


@dataclass
class TwoNodeJob:
    """straggler_jobs.py under goodput-instrument and torchrun, one agent per node (per_node ranks each, node A's
    first); torchrun's run id is the workload."""

    name: str
    framework: str
    extra: dict[str, str]
    per_node: int = 2  # ranks on each node
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workdir: Path = Path()

    def start(self, stack: Stack, top: Path) -> TwoNodeJob:
        self.workdir = top / self.name
        self.workdir.mkdir()
        script = self.workdir / JOB.name  # outside the checkout: nothing of it on the job's path
        shutil.copyfile(JOB, script)
        endpoint = f"127.0.0.1:{free_port()}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_") and k != "PYTHONPATH"}
        for node in stack.nodes:
            out = self.workdir / f"node{node.index}"
            out.mkdir()
            env = {**base, **JOB_ENV, **self.extra, "FRAMEWORK": self.framework, "OUT_DIR": str(out),
                   "RUN_NAME": self.name, "GOODPUT_INGEST_SOCKET_PATH": node.socket_path}
            log = (self.workdir / f"agent{node.index}.log").open("wb")
            self.agents.append(subprocess.Popen(
                [str(DEV_BIN / "goodput-instrument"), str(DEV_BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node",
                 str(self.per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", self.name,
                 str(script)],
                env=env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(0.5)  # node A joins the rendezvous first: its ranks come first
        return self

    def alive(self, finished_ok: bool = False) -> bool:
        """Every agent running (or, with finished_ok, exited 0: the job ran to its end); else the failing agent's log
        in the error."""
        for i, agent in enumerate(self.agents):
            if agent.poll() is not None and not (finished_ok and agent.returncode == 0):
                raise AssertionError(f"{self.name}: agent {i} exited with {agent.returncode}: "
                                     + (self.workdir / f"agent{i}.log").read_text()[-3000:])
        return True

    def stop(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                for pid in [*_descendants(agent.pid), agent.pid]:
                    with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                        os.kill(pid, signal.SIGKILL)
                agent.wait(30)


def prometheus_alerts(stack: Stack, workload: str) -> list[dict[str, str]]:
    """The straggler alerts Prometheus holds for the workload now, pending or firing: their labels and state."""
    body = httpx.get(f"{stack.urls['prometheus']}/api/v1/alerts", timeout=10).json()
    return [{**a["labels"], "state": a["state"]} for a in body["data"]["alerts"]
            if a["labels"].get("workload") == workload and a["labels"]["alertname"] in STRAGGLER_ALERTS]


def ever_alerted(stack: Stack, workload: str, seconds: float) -> list[dict[str, str]]:
    """Every straggler alert Prometheus had pending or firing for the workload in the last `seconds`."""
    names = "|".join(STRAGGLER_ALERTS)
    return [s["metric"] for s in query(  # type: ignore[misc]
        stack, f'ALERTS{{alertname=~"{names}",workload="{workload}"}}[{int(seconds) + 1}s]')]


def ratios(stack: Stack, workload: str) -> dict[str, float]:
    return {s["metric"]["rank"]: float(s["value"][1])  # type: ignore[index]
            for s in query(stack, f'workload_rank:goodput_straggler_ratio:rate{W}{{workload="{workload}"}}')}


def running(stack: Stack, jobs: list[TwoNodeJob]) -> dict[str, float]:
    """Until every job's 4 ranks have steps in Prometheus; when each first did (monotonic)."""
    since: dict[str, float] = {}
    deadline = time.monotonic() + 240
    while len(since) < len(jobs):
        for job in jobs:
            if job.name not in since and job.alive() and len(
                    query(stack, f'goodput_steps_total{{workload="{job.name}"}} > 0')) == 4:
                since[job.name] = time.monotonic()
        assert time.monotonic() < deadline, f"not every job's ranks stepped within 240 s: {sorted(since)}"
        time.sleep(1)
    return since


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with two_nodes(tmp_path_factory.mktemp("waits-alerts")) as live:
        yield live


def node_b(stack: Stack) -> Node:
    return stack.nodes[1]


SLOW_JOBS = {"ddp": "ddp", "fsdp2": "fsdp2", "hf": "hf", "lightning": "lightning", "pipeline": "pipeline"}


@pytest.fixture(scope="module")
def slow(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, str]]]]:
    """Each slow job run until GoodputStraggler fired for it (or 120 s of its steps passed): the straggler alerts
    Prometheus held for it then, and every one it had while it ran."""
    top = tmp_path_factory.mktemp("slow")
    jobs = [TwoNodeJob(f"slow-{name}", framework, {"SLOW_RANK": str(SLOW)}) for name, framework in SLOW_JOBS.items()]
    found: dict[str, list[dict[str, str]]] = {}
    try:
        for job in jobs:
            job.start(stack, top)
            time.sleep(STAGGER)
        since = running(stack, jobs)
        deadline = max(since.values()) + 120
        while len(found) < len(jobs) and time.monotonic() < deadline:
            for job in jobs:
                now = prometheus_alerts(stack, job.name)
                if job.name not in found and job.alive() and any(
                        a["alertname"] == "GoodputStraggler" and a["state"] == "firing" for a in now):
                    found[job.name] = now + [{**a, "state": "ever"} for a in ever_alerted(
                        stack, job.name, time.monotonic() - since[job.name])]
                    print(f"{job.name}: fired {time.monotonic() - since[job.name]:.0f} s after its first steps; "
                          f"ratios {ratios(stack, job.name)}")
            time.sleep(1)
        for job in jobs:
            if job.name not in found:
                found[job.name] = prometheus_alerts(stack, job.name)
                print(f"{job.name}: no page within 120 s; ratios {ratios(stack, job.name)}")
    finally:
        for job in jobs:  # before the next batch starts
            job.stop()
    yield found


HEALTHY_JOBS = {"fsdp2": ("fsdp2", {}), "hf": ("hf", {}), "lightning": ("lightning", {}),
                "pipeline-stage": ("pipeline", {"STAGE_FACTOR": "3"})}
QUIET = 40  # seconds of steps a healthy job runs: GoodputStraggler's 20s window and its 15s `for:` have passed


@dataclass
class Quiet:
    ratios: dict[str, float]
    now: list[dict[str, str]]  # pending or firing at the end
    ever: list[dict[str, str]]  # every straggler alert while it ran


@pytest.fixture(scope="module")
def healthy(stack: Stack, slow: dict[str, list[dict[str, str]]],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Quiet]]:
    """The healthy jobs and the stage-imbalanced pipeline (after the slow ones: the machine runs one batch at a time),
    each run QUIET seconds past its first steps in Prometheus."""
    top = tmp_path_factory.mktemp("healthy")
    jobs = [TwoNodeJob(f"healthy-{name}", framework, extra) for name, (framework, extra) in HEALTHY_JOBS.items()]
    found: dict[str, Quiet] = {}
    try:
        for job in jobs:
            job.start(stack, top)
            time.sleep(STAGGER)
        since = running(stack, jobs)
        for job in sorted(jobs, key=lambda j: since[j.name]):
            time.sleep(max(0.0, since[job.name] + QUIET - time.monotonic()))
            job.alive()
            found[job.name] = Quiet(ratios(stack, job.name), prometheus_alerts(stack, job.name),
                                    ever_alerted(stack, job.name, time.monotonic() - since[job.name]))
            print(f"{job.name}: ratios {found[job.name].ratios}, alerts {found[job.name].now}")
    finally:
        for job in jobs:  # before the next batch starts
            job.stop()
    yield found


def fired(alerts: list[dict[str, str]]) -> set[tuple[str, str]]:
    """(alert, rank) of every straggler alert that fired (a page or a ticket sent), not only pending: a 20s window
    over a job's first steps (its start-up among them) may hold an alert pending for an evaluation or two."""
    return {(a["alertname"], a.get("rank", "")) for a in alerts if a.get("alertstate", a.get("state")) == "firing"}


@pytest.mark.parametrize("name", SLOW_JOBS)
def test_the_slow_rank_is_paged_on_its_node_and_nobody_else(stack: Stack, slow: dict[str, list[dict[str, str]]],
                                                            name: str) -> None:
    alerts = slow[f"slow-{name}"]
    now = [a for a in alerts if a["state"] != "ever"]
    firing = [(a["rank"], a["instance"]) for a in now
              if a["alertname"] == "GoodputStraggler" and a["state"] == "firing"]
    assert firing == [(str(SLOW), node_b(stack).instance)], alerts
    # nobody else, ever, and no other kind: a slow rank is neither a stage by construction nor random imbalance
    assert fired([a for a in alerts if a["state"] == "ever"]) == {("GoodputStraggler", str(SLOW))}, alerts
    assert {a["alertname"] for a in now} == {"GoodputStraggler"}, now


@pytest.mark.parametrize("name", [n for n in HEALTHY_JOBS if n != "pipeline-stage"])
def test_the_healthy_jobs_have_no_straggler_and_no_page(healthy: dict[str, Quiet], name: str) -> None:
    quiet = healthy[f"healthy-{name}"]
    assert len(quiet.ratios) == 4, quiet.ratios
    assert all(ratio <= 1.2 for ratio in quiet.ratios.values()), quiet.ratios
    assert not quiet.now and not fired(quiet.ever), (quiet.now, quiet.ever)


def test_a_stage_slower_by_construction_is_a_ticket_not_a_page(healthy: dict[str, Quiet]) -> None:
    quiet = healthy["healthy-pipeline-stage"]
    assert all(ratio <= 1.2 for ratio in quiet.ratios.values()), quiet.ratios  # each rank against its own stage
    assert [(a["alertname"], a["severity"]) for a in quiet.now] == [("GoodputStageImbalance", "warning")], quiet.now
    assert not fired(quiet.ever), quiet.ever

