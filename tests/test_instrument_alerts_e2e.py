"""Every shipped alert that reads job metrics fires for an unmodified job (issue 31): a 4-rank PyTorch job (gloo, CPU)
with nothing of goodput in it (tests/instrument_jobs/remote_data_ddp.py), run by torchrun as two agents under
goodput-instrument, ranks 0-1 reporting to node A's daemon and 2-3 to node B's, one Prometheus with the shipped rules
(the demo's fast settings) and an Alertmanager. The ranks hold the nodes' simulated GPUs (so the job has a peak to
measure its MFU against), as a GPU job's processes would.

The faults are the job's environment's, never its code's: it reads its training data from a data service (this
test's), which can answer one rank slowly or not at all, and a rank's process can be killed.

1. rank 3's data slow (a straggler on node B): GoodputStraggler names rank 3 and node B; the job's goodput and FLOPs
   rate fall: GoodputDrop and GoodputMFUDrop fire;
2. rank 2's data stopped (rank 2 stuck before its next collective): GoodputCollectiveRankMissing names rank 2, node B;
3. a rank's process killed some seconds after a checkpoint (as the kernel's OOM killer would): torchrun restarts the
   job, which resumes from its checkpoint and redoes the steps since: GoodputWastedProgress. This one runs as a second
   job beside the first, one rank on node B under torchrun: restarted with more than one rank on
   this loaded 2-core machine, torch 2.13's gloo often gave up connecting the new ranks to each other (three tries a
   few milliseconds apart, while the peer was still starting) and the job failed instead of resuming.

4. the fabric between rank 3 and its peers cut (tests/fabric_cut.py: the kernel drops every packet of their TCP
   connections) while every rank waits for its data: each enters its next all_reduce, which never completes, every
   process alive and dumping its flight recorder: one GoodputCollectiveHang for the job, counting its 4 ranks, and
   no rank missing. Needs root and iptables (`make deps`); where the machine has neither, this case is skipped,
   saying why, after the others passed.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socketserver
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fabric_cut
import pytest
from conftest import free_port
from goodput_mixin.demo.stack import Node, Stack
from test_multinode_e2e import Job, _descendants, alerts, firing_description, named_ranks, query, until
from two_nodes import two_nodes

if TYPE_CHECKING:
    from job_env import Venv

pytest_plugins = ["job_env"]  # the session's job venv: PyTorch and goodput-client only

JOB = Path(__file__).parent / "instrument_jobs" / "remote_data_ddp.py"
BATCH_VALUES = 4 * 16 + 4
LATENCY = 0.05  # the data service's answer time for a healthy rank: the job's pace
SAVE_EVERY = 200  # steps between checkpoints: about 10 s of a healthy job


class DataService:
    """The job's data over HTTP: GET /<rank>/<index> answers that rank's batch `index` (fixed values of its own) after
    LATENCY, or after `slow[rank]` seconds, or not while `stalled` holds the rank."""

    def __init__(self) -> None:
        self.slow: dict[int, float] = {}
        self.stalled: set[int] = set()
        self.changed = threading.Condition()
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                _, rank_text, index_text = self.path.split("/")
                rank, index = int(rank_text), int(index_text)
                with service.changed:
                    while rank in service.stalled:
                        service.changed.wait(0.5)
                    delay = service.slow.get(rank, LATENCY)
                time.sleep(delay)
                body = struct.pack(f"<{BATCH_VALUES}f", *((rank * 7 + index * 3 + i) % 17 / 17 - 0.5
                                                          for i in range(BATCH_VALUES)))
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the rank asking was killed meanwhile

            def log_message(self, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, slow: dict[int, float] | None = None, stalled: set[int] | None = None) -> None:
        with self.changed:
            self.slow, self.stalled = dict(slow or {}), set(stalled or ())
            self.changed.notify_all()

    def close(self) -> None:
        self.set()
        self.server.shutdown()
        self.server.server_close()


class UnmodifiedJob(Job):
    """remote_data_ddp.py under goodput-instrument and torchrun (its run id the workload), `per_node` ranks per node:
    across both nodes (one agent each, node A's first), or on one node `on`, with torchrun restarting it once. Each
    rank's process holds one of its node's simulated GPUs."""

    def __init__(self, job_env: Venv, stack: Stack, workdir: Path, name: str, data: DataService,
                 on: Node | None = None, per_node: int = 2) -> None:
        self.stack, self.workdir, self.name = stack, workdir, name
        workdir.mkdir()
        script = workdir / JOB.name  # outside the checkout: nothing of it on the job's path
        shutil.copyfile(JOB, script)
        nodes = stack.nodes if on is None else [on]
        launch = ["--nnodes", str(len(nodes)), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                  "--rdzv-id", name]  # the workload: torchrun's run id
        if on is not None:
            launch += ["--max-restarts", "1"]
        self.agents: list[subprocess.Popen[bytes]] = []
        for node in nodes:
            out = workdir / f"node{node.index}"
            out.mkdir()
            log = (workdir / f"agent{node.index}.log").open("wb")
            env = job_env.environ(GOODPUT_INGEST_SOCKET_PATH=node.socket_path, GOODPUT_FLIGHT_DIR=str(node.flight_dir),
                                  GOODPUT_FLIGHT_INTERVAL="1", GOODPUT_FLOPS="measure", OUT_DIR=str(out),
                                  DATA_URL=data.url, SAVE_EVERY=str(SAVE_EVERY))
            self.agents.append(subprocess.Popen(
                [str(job_env.bin("goodput-instrument")), str(job_env.bin("torchrun")),
                 "--nproc-per-node", str(per_node), *launch, str(script)],
                env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(0.5)  # node A joins the rendezvous first: its ranks come first
        self.ranks, self.per_node = per_node * len(nodes), per_node
        self.node_of = {rank: nodes[rank // per_node] for rank in range(self.ranks)}
        self.held: dict[int, tuple[Node, int, int]] = {}  # rank -> the node, GPU and process holding it

    def ranks_now(self) -> dict[int, int]:
        """{rank: pid} of the job's rank processes now (torchrun's RANK in their environment)."""
        found: dict[int, int] = {}
        for agent in self.agents:
            for pid in _descendants(agent.pid):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                variables = dict(v.split(b"=", 1) for v in environ if b"=" in v)
                if JOB.name.encode() in command and b"RANK" in variables:
                    found[int(variables[b"RANK"])] = pid
        return found

    def started(self) -> None:
        """Until every rank runs; then each holds a GPU of its node (its local rank's), as a GPU job's ranks would."""
        until(f"{self.name}'s {self.ranks} ranks", lambda: self._check_alive() or len(self.ranks_now()) == self.ranks,
              120)
        for rank, pid in self.ranks_now().items():
            node, gpu = self.node_of[rank], rank % self.per_node
            node.gpus.attach_process(gpu, pid)
            self.held[rank] = (node, gpu, pid)

    def kill(self) -> None:
        super().kill()
        for node, gpu, pid in self.held.values():
            node.gpus.detach_process(gpu, pid)
        self.held.clear()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with two_nodes(tmp_path_factory.mktemp("unmodified"), gpus=2) as live:
        yield live


def test_an_unmodified_job_on_two_nodes_fires_every_job_alert(job_env: Venv, stack: Stack,
                                                              tmp_path: Path) -> None:
    data, restart_data = DataService(), DataService()
    began = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - began:5.0f} s  {what}")

    a, b = stack.nodes
    job = UnmodifiedJob(job_env, stack, tmp_path / "unmodified", "unmodified", data)
    restarted = UnmodifiedJob(job_env, stack, tmp_path / "restarted", "restarted", restart_data, on=b, per_node=1)
    w = job.name
    try:
        job.started()
        restarted.started()
        until("every rank's steps in Prometheus",
              lambda: len(query(stack, f'goodput_steps_total{{workload="{w}"}} > 0')) == 4, 90)
        ranks = {(s["metric"]["rank"], s["metric"]["instance"])  # type: ignore[index]
                 for s in query(stack, f'goodput_steps_total{{workload="{w}"}}')}
        assert ranks == {("0", a.instance), ("1", a.instance), ("2", b.instance), ("3", b.instance)}
        until("the job's MFU", lambda: query(stack, f'workload:goodput_mfu_ratio:rate2m{{workload="{w}"}} > 0'), 60)
        time.sleep(15)  # a healthy baseline for the drop alerts' long window
        assert not alerts(stack, w, "GoodputStraggler", "GoodputDrop", "GoodputMFUDrop",
                          "GoodputCollectiveRankMissing", "GoodputCollectiveHang", "GoodputWastedProgress")
        mark("healthy")

        # 3. (beside the others) the one-node job's rank killed some seconds after its checkpoint
        checkpoint = restarted.workdir / f"node{b.index}" / "checkpoint-rank-0.pt"
        until("the one-node job's checkpoint", checkpoint.exists, 60)
        saved = checkpoint.stat().st_mtime
        until("the one-node job's next checkpoint", lambda: checkpoint.stat().st_mtime > saved, 60)
        time.sleep(4)  # then 4 s of steps that the restart redoes (the alert pages for 1.2 s over a minute)
        killed = restarted.held[0][2]
        os.kill(killed, signal.SIGKILL)
        mark("the one-node job's rank killed")

        # 1. rank 3's data slow: a straggler on node B; the job's goodput and its FLOPs rate fall
        data.set(slow={3: 0.25})
        straggler = until("GoodputStraggler", lambda: alerts(stack, w, "GoodputStraggler"), 90)
        assert [(s["rank"], s["instance"]) for s in straggler] == [("3", b.instance)]  # type: ignore[union-attr]
        until("GoodputDrop", lambda: alerts(stack, w, "GoodputDrop"), 90)
        until("GoodputMFUDrop", lambda: alerts(stack, w, "GoodputMFUDrop"), 90)
        mark("straggler, drop, MFU drop")

        # 2. rank 2's data stopped: rank 2 stuck before its next all_reduce, named with its node
        data.set(stalled={2})
        missing = until("GoodputCollectiveRankMissing", lambda: alerts(stack, w, "GoodputCollectiveRankMissing"), 60)
        assert [m["instance"] for m in missing] == [b.instance]  # type: ignore[union-attr]
        assert named_ranks(firing_description(stack, "GoodputCollectiveRankMissing", w)) == {"2"}
        data.set()
        mark("rank missing")

        # 3. torchrun restarted the one-node job, which resumed from its checkpoint and redid the steps since: the
        # page fired while the redone steps were in its window (by now, maybe past it)
        assert restarted.ranks_now().get(0) not in (None, killed), "torchrun did not restart the one-node job"

        def fired(workload: str) -> list[dict[str, str]]:
            return [s["metric"] for s in query(  # type: ignore[misc]
                stack, f'ALERTS{{alertname="GoodputWastedProgress",alertstate="firing",workload="{workload}"}}'
                       f'[{int(time.monotonic() - began) + 5}s]')]

        try:
            wasted = until("GoodputWastedProgress", lambda: fired("restarted"), 60)
        except AssertionError as exc:
            seen = {expr: [(r["metric"], r["value"][1]) for r in query(stack, expr)] for expr in (  # type: ignore[index]
                'goodput_steps_total{workload="restarted"}', 'goodput_wasted_steps_total{workload="restarted"}',
                'goodput_workload_restarts_total{workload="restarted"}',
                '{__name__=~"workload:goodput_wasted_seconds:.*",workload="restarted"}')}
            raise AssertionError(f"{exc}; {seen}") from None
        assert {x["severity"] for x in wasted} == {"warning"}  # type: ignore[union-attr]
        redone = query(stack, 'goodput_wasted_steps_total{workload="restarted"} > 0')
        assert [r["metric"]["instance"] for r in redone] == [b.instance]  # type: ignore[index]
        assert not fired(w)
        mark("wasted progress")

        # 4. the fabric between rank 3 and its peers cut while every rank waits for its next batch: the next
        # all_reduce, which every rank enters, never completes
        cannot = fabric_cut.unavailable()
        if cannot:
            pytest.skip(f"cases 1-3 passed; GoodputCollectiveHang not checked: {cannot}")
        data.set(stalled=set(range(job.ranks)))
        time.sleep(2)  # every collective that every rank entered has completed
        pids = job.ranks_now()
        with fabric_cut.FabricCut(pids[3], [pid for rank, pid in pids.items() if rank != 3]) as cut:
            assert len(cut.links) >= 3, cut.links  # gloo's full mesh: one connection to each peer at least
            data.set()
            hang = until("GoodputCollectiveHang", lambda: alerts(stack, w, "GoodputCollectiveHang"), 90)
            assert len(hang) == 1, hang  # one page for the job's process group
            assert not alerts(stack, w, "GoodputCollectiveRankMissing")
            assert " in 4 ranks" in firing_description(stack, "GoodputCollectiveHang", w)
        mark("collective hang")
    finally:
        job.kill()
        restarted.kill()
        data.close()
        restart_data.close()
