"""One job, two nodes, end to end: two daemons (node A and node B, each its own port, events socket, flight and state
folders) scraped by one Prometheus as two instances, with the shipped rules rendered with the demo's fast settings and
an Alertmanager (Debian's prometheus and prometheus-alertmanager, on 127.0.0.1); a real PyTorch job (gloo, CPU) run by
torchrun as two agents (c10d rendezvous on 127.0.0.1), each agent's ranks reporting to its node's daemon (events
socket, flight-recorder dumps). Faults are switched in the job through its control file (tests/train_nodes.py):

1. rank 3 slowed: GoodputStraggler names rank 3 and node B, and so does `diagnose`;
2. rank 2 stalled before a collective: one collective page, naming rank 2 and node B;
3. all of node B stalled (ranks 2 and 3): one collective page naming ranks 2 and 3 and node B, none on node A; the
   workload's goodput falls below 0.2 and GoodputDrop fires and keeps firing; lifetime goodput falls;
5. the job killed: every collective alert and the collective verdict clear within 2 minutes;
4. a 2-rank job, one rank per node, the rank on node B stalled: named, node B.

One stack serves the module; the 4-rank job runs 1, 2, 3 and 5 in turn. Alertmanager's API is polled, never slept on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml
from conftest import ROOT, free_port
from goodput_mixin.demo.stack import Node, Stack
from goodput_mixin.diagnose.cli import main as diagnose
from two_nodes import two_nodes

if TYPE_CHECKING:
    from job_env import Venv

pytest_plugins = ["job_env"]  # the session's job venv: PyTorch and goodput-client only

COLLECTIVE = ("GoodputCollectiveRankMissing", "GoodputCollectiveHang")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # flight.stale_after at its default: a killed job's dumps end with its processes, not by their age
    with two_nodes(tmp_path_factory.mktemp("nodes"), gpus=2, flight_stale_after=None) as live:
        yield live


class Job:
    """train_nodes.py under torchrun, one agent per node (`per_node` ranks each), node A's agent first."""

    def __init__(self, job_env: Venv, stack: Stack, workdir: Path, name: str, per_node: int) -> None:
        self.stack, self.workdir, self.name = stack, workdir, name
        self.control_path = workdir / "control.json"
        self.control()
        script = workdir / "train_nodes.py"  # not from tests/: nothing of the checkout on the job's sys.path
        shutil.copyfile(ROOT / "tests" / "train_nodes.py", script)
        endpoint = f"127.0.0.1:{free_port()}"
        self.agents: list[subprocess.Popen[bytes]] = []
        for node in stack.nodes:
            out = workdir / f"node{node.index}"
            out.mkdir()
            log = (workdir / f"agent{node.index}.log").open("wb")
            self.agents.append(subprocess.Popen(
                [str(job_env.bin("torchrun")), "--nnodes", str(len(stack.nodes)), "--nproc-per-node", str(per_node),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", name, str(script)],
                env=job_env.environ(SOCKET=node.socket_path, FR_DIR=str(node.flight_dir), OUT_DIR=str(out),
                                    CONTROL=str(self.control_path)),
                cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(0.5)  # node A joins the rendezvous first: its ranks come first
        self.ranks = len(stack.nodes) * per_node
        self.node_of: dict[int, Node] = {}
        deadline = time.monotonic() + 120
        while len(self.node_of) < self.ranks:
            for node in stack.nodes:
                for path in (workdir / f"node{node.index}").glob("rank-*.json"):
                    try:
                        started = json.loads(path.read_text())
                    except ValueError:
                        continue  # being written
                    assert started["workload"] == name and started["socket"] == node.socket_path, started
                    self.node_of[int(path.stem.split("-")[1])] = node
            self._check_alive()
            assert time.monotonic() < deadline, "the job's ranks did not start within 120 s"
            time.sleep(0.2)

    def _check_alive(self) -> None:
        for i, agent in enumerate(self.agents):
            if agent.poll() is not None:
                raise AssertionError(f"agent {i} exited with {agent.returncode}: "
                                     + (self.workdir / f"agent{i}.log").read_text()[-3000:])

    def control(self, **faults: object) -> None:
        partial = self.control_path.with_suffix(".tmp")
        partial.write_text(json.dumps(faults))
        os.replace(partial, self.control_path)

    def kill(self) -> None:
        """SIGKILL to every agent and every process under it (torchrun starts its ranks in sessions of their own)."""
        for agent in self.agents:
            for pid in [*_descendants(agent.pid), agent.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for agent in self.agents:
            agent.wait(30)

    def stop(self) -> None:
        self.control(stop=True)
        deadline = time.monotonic() + 60
        while any(a.poll() is None for a in self.agents) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.kill()


def _descendants(pid: int) -> list[int]:
    """The processes under `pid`, children first, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.fixture
def jobs(job_env: Venv, stack: Stack, tmp_path: Path) -> Iterator[Callable[[str, int], Job]]:
    started: list[Job] = []

    def start(name: str, per_node: int) -> Job:
        job = Job(job_env, stack, tmp_path / name, name, per_node)
        started.append(job)
        return job

    (tmp_path / "unused").mkdir()
    for name in ("four", "pair"):
        (tmp_path / name).mkdir(exist_ok=True)
    yield start
    for job in started:
        job.kill()


def alerts(stack: Stack, workload: str, *names: str) -> list[dict[str, str]]:
    """The labels of the alerts Alertmanager holds active for the workload, of `names`."""
    return [a["labels"] for a in stack.alerts()
            if a["labels"].get("workload") == workload and a["labels"]["alertname"] in names]


def until(what: str, check: Callable[[], object], timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.5)


def query(stack: Stack, expr: str) -> list[dict[str, object]]:
    response = httpx.get(f"{stack.urls['prometheus']}/api/v1/query", params={"query": expr}, timeout=10)
    response.raise_for_status()
    return response.json()["data"]["result"]


def firing_description(stack: Stack, alertname: str, workload: str) -> str:
    """The description of the alert as Prometheus renders it now (Alertmanager holds the one last sent)."""
    response = httpx.get(f"{stack.urls['prometheus']}/api/v1/alerts", timeout=10)
    response.raise_for_status()
    found = [a["annotations"]["description"] for a in response.json()["data"]["alerts"]
             if a["labels"]["alertname"] == alertname and a["labels"].get("workload") == workload
             and a["state"] == "firing"]
    return found[0] if len(found) == 1 else ""


def named_ranks(description: str) -> set[str]:
    listed = re.search(r"rank\(s\) ([\d ]+)\(", description)
    return set(listed.group(1).split()) if listed else set()


def collective_alerts_on(stack: Stack, workload: str, instance: str, seconds: float) -> list[dict[str, str]]:
    """Every collective alert Prometheus had pending or firing on the node in the last `seconds`."""
    names = "|".join(COLLECTIVE)
    return [s["metric"] for s in query(  # type: ignore[misc]
        stack, f'ALERTS{{alertname=~"{names}",workload="{workload}",instance="{instance}"}}[{int(seconds)}s]')]


def test_one_job_on_two_nodes_names_the_stuck_ranks_and_their_node(
        stack: Stack, jobs: Callable[[str, int], Job], capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    job = jobs("four", 2)
    a, b = job.node_of[0], job.node_of[2]
    assert a is not b and job.node_of[1] is a and job.node_of[3] is b, "each agent runs two consecutive ranks"
    w = job.name
    # one workload across both daemons: each node's series carry its instance
    until("both nodes' ranks in Prometheus", lambda: len(query(stack, f'goodput_steps_total{{workload="{w}"}}')) == 4,
          60)

    # 1. rank 3 slowed: a straggler on node B, by its own time
    job.control(slow={"3": 0.2})
    straggler = until("GoodputStraggler for rank 3", lambda: alerts(stack, w, "GoodputStraggler"), 90)
    assert [(s["rank"], s["instance"]) for s in straggler] == [("3", b.instance)]  # type: ignore[union-attr]
    settings = stack.workdir / "rules-settings.yml"
    settings.write_text(yaml.safe_dump(stack.settings.model_dump(mode="json")))
    assert diagnose(["--prometheus", stack.urls["prometheus"], "--rules-config", str(settings), "--workload", w]) == 1
    said = capsys.readouterr().out
    assert f"culprit: rank 3 on node {b.instance}: straggler" in said, said
    # and what it costs: the share of the job's GPU time and the GPU-hours a day it would give back (the rules' what-if)
    cost = re.search(rf"culprit: rank 3 on node {re.escape(b.instance)}: straggler: .*; it costs the job (\d+)% of its "
                     r"GPU time: ([\d.]+) GPU-hours a day", said)
    assert cost and 0 < int(cost.group(1)) < 100 and float(cost.group(2)) > 0, said
    assert "culprit: rank" not in said.replace(f"culprit: rank 3 on node {b.instance}", ""), said
    shift = query(stack, f'workload:goodput_step_time_shift:info{{workload="{w}"}}')
    assert all(s["metric"]["kind"] == "straggler" for s in shift), shift  # type: ignore[index]

    # 2. rank 2 stalled before its all_reduce: one page, rank 2, node B
    job.control(stall=[2])
    missing = until("GoodputCollectiveRankMissing for node B", lambda: alerts(stack, w, *COLLECTIVE), 60)
    assert [(m["alertname"], m["instance"], m["pg"]) for m in missing] == [  # type: ignore[union-attr]
        ("GoodputCollectiveRankMissing", b.instance, "0")]
    assert named_ranks(firing_description(stack, "GoodputCollectiveRankMissing", w)) == {"2"}
    job.control()
    until("the page resolved once rank 2 went on", lambda: not alerts(stack, w, *COLLECTIVE), 60)

    # 3. all of node B stalled: one page naming ranks 2 and 3 and node B; goodput falls and GoodputDrop stays firing
    lifetime = f'workload:goodput_lifetime_ratio{{workload="{w}"}}'
    before = float(query(stack, lifetime)[0]["value"][1])  # type: ignore[index]
    job.control(stall=[2, 3])
    stalled = time.monotonic()
    missing = until("GoodputCollectiveRankMissing for node B", lambda: alerts(stack, w, *COLLECTIVE), 60)
    assert [(m["alertname"], m["instance"]) for m in missing] == [  # type: ignore[union-attr]
        ("GoodputCollectiveRankMissing", b.instance)]
    until("ranks 2 and 3 named", lambda: named_ranks(firing_description(
        stack, "GoodputCollectiveRankMissing", w)) == {"2", "3"}, 30)
    until("GoodputDrop", lambda: alerts(stack, w, "GoodputDrop"), 90)
    goodput = float(query(stack, f'workload:goodput_ratio:rate20s{{workload="{w}"}}')[0]["value"][1])  # type: ignore[index]
    assert goodput < 0.2, goodput
    verdict = query(stack, f'workload:goodput_bottleneck:info{{workload="{w}"}}')
    assert [v["metric"]["reason"] for v in verdict] == ["rank_missing"], verdict  # type: ignore[index]
    for _ in range(10):  # it keeps firing while the job hangs
        assert alerts(stack, w, "GoodputDrop") and len(alerts(stack, w, *COLLECTIVE)) == 1
        time.sleep(1)
    until("lifetime goodput falling", lambda: float(query(stack, lifetime)[0]["value"][1]) < before, 30)  # type: ignore[index]
    assert collective_alerts_on(stack, w, a.instance, time.monotonic() - started + 5) == []

    # 5. the job killed (node B still stalled): every collective alert and the verdict clear within 2 minutes
    # at the default flight.stale_after (2 minutes: no help here), the daemons see the ranks' processes gone
    job.kill()
    killed = time.monotonic()
    until("the job's collective series gone", lambda: not query(
        stack, f'goodput_collective_last_seq{{workload="{w}"}} or goodput_collective_missing_rank{{workload="{w}"}}'),
        60)
    gone = time.monotonic()
    until("collective alerts cleared", lambda: not alerts(stack, w, *COLLECTIVE), 120 - (gone - killed))
    until("the collective verdict cleared", lambda: not query(
        stack, f'workload:goodput_bottleneck:info{{workload="{w}",reason=~"rank_missing|collective_hang"}}'),
        120 - (time.monotonic() - killed))
    print(f"hang paged; its collective series gone {gone - killed:.0f} s after the kill, its alerts and verdict "
          f"cleared {time.monotonic() - killed:.0f} s after the kill; stalled for {killed - stalled:.0f} s")


def test_one_rank_per_node_the_rank_on_node_b_stalled_is_named_with_its_node(
        stack: Stack, jobs: Callable[[str, int], Job]) -> None:
    started = time.monotonic()
    job = jobs("pair", 1)
    a, b = job.node_of[0], job.node_of[1]
    assert a is not b
    w = job.name
    until("both ranks in Prometheus", lambda: len(query(stack, f'goodput_steps_total{{workload="{w}"}}')) == 2, 60)
    job.control(stall=[1])
    missing = until("GoodputCollectiveRankMissing", lambda: alerts(stack, w, *COLLECTIVE), 60)
    assert [(m["alertname"], m["instance"]) for m in missing] == [  # type: ignore[union-attr]
        ("GoodputCollectiveRankMissing", b.instance)]
    assert named_ranks(firing_description(stack, "GoodputCollectiveRankMissing", w)) == {"1"}
    assert collective_alerts_on(stack, w, a.instance, time.monotonic() - started + 5) == []
    job.control()
    job.stop()
