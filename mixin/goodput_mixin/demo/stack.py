"""The live stack on 127.0.0.1: the daemon on simulated GPUs, a simulated training job, a simulated serving engine
(vLLM's metrics, its own process, holding the GPUs the job leaves), Prometheus with the rules and Alertmanager
(Debian's `prometheus` and `prometheus-alertmanager`).

With `remote_write`, the same targets are also scraped the scale-out way (docs/scale-out.md): by Prometheus in agent
mode and by vmagent, an HA pair with `cluster` as an external label, both remote-writing to VictoriaMetrics
(deduplicated); vmalert evaluates the same rule files against it and sends to an Alertmanager of its own (Debian's
`victoria-metrics`).

With `nodes` above 1, each node is a daemon of its own (its port, events socket, flight and state folders, simulated
GPUs and fabric), all scraped by the one Prometheus as one job, each its own `instance`; the simulated job's ranks are
spread over them in order (ranks 0-1 on node 0 and 2-3 on node 1, for 4 ranks on 2 nodes). `job=False` and
`serving=False` leave the simulated job and serving engine out, for a test that runs a real job on the nodes.

Rules are rendered with DEMO_SETTINGS: the same rules with short windows and `for:` durations, so a
fault shows as an alert within a minute. The daemon runs in this process so that faults can be
injected into its simulated GPUs while it runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from exporter.assemble import build_daemon
from exporter.config import load
from exporter.core.daemon import Daemon
from exporter.core.http import ServerThread, bind, create_app
from exporter.sources.fabric.simulated import SimulatedFabric
from exporter.sources.nvml.simulated import SimulatedGpus

from ..rules.render import rule_files
from ..rules.settings import RulesSettings
from .simjob import SimulatedJob

log = logging.getLogger(__name__)

DEMO_SETTINGS = RulesSettings(
    windows=["20s", "2m"], slow_groups_interval="5s", memory_predict_window="2m", goodput_trend_window="2m",
    goodput_drop_for="20s", idle_while_allocated_for="1m", straggler_for="15s", collective_hang_seconds=20,
    dump_stale_seconds=60, rank_missing_for="5s", throttle_for="30s", memory_exhaustion_for="30s",
    exporter_down_for="20s", source_failing_for="20s", pcie_degraded_for="10s", nvlink_errors_for="10s",
    fabric_link_down_for="10s", fabric_link_down_allocated_window="2m", fabric_flap_window="30s",
    fabric_errors_for="10s", fabric_congestion_for="10s", inference_slo_fast_windows=["20s", "2m"],
    inference_slo_slow_windows=["1m", "6m"], inference_kv_cache_saturated_for="20s",
    inference_idle_while_queued_for="20s",
    # one crash of the demo job redoes CRASH_AFTER (40) steps, about 3 s a rank: over a 1m window that is 5%, 2.5x the
    # 2% that pages; a healthy run redoes nothing
    wasted_progress_window="1m", wasted_progress_ratio=0.02,
    # a rank missing from a collective across nodes: its own dump 5 s into the others' wait (the demo job dumps each
    # second)
    rank_missing_seconds=5,
    # the straggler fault (a rank 3x slower in compute: every rank's step 0.07 s -> 0.19 s) cuts the job's FLOPs per
    # second by about 60%; a crash's 4 s without steps cuts the 20s window's by about 20%, and only while it lasts
    mfu_drop_ratio=0.3, mfu_drop_for="20s",
    # an XID names the cluster layer in the verdict for a minute after it, not the default 15, so that the demo reads
    # healthy again soon after the fault clears
    bottleneck_gpu_recent_window="1m")
WORKLOAD = "demo-job"
SERVING = "demo-serve"  # the serving engine's workload: its process's TORCHELASTIC_RUN_ID, and its scrape's label
SERVING_GPUS = 2  # the serving engine holds the first two GPUs the job leaves; any others stay unallocated
# a second simulated engine beside the first (Stack(serving_engines=...)): its workload; it holds the GPU after the
# first engine's. Each engine's scrape job is its engine's name (vllm, triton).
SECOND_SERVING = "demo-serve-2"
CLUSTER = "demo"


class StackError(Exception):
    """A part of the stack could not be started; the message says which and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise StackError(f"{names[0]} is not installed (Debian: apt-get install prometheus prometheus-alertmanager "
                     "victoria-metrics; `make deps` does it)")


@dataclass
class Ports:
    exporter: int
    prometheus: int
    alertmanager: int
    serving: int = 0  # 0 here and below: any free port
    serving_second: int = 0  # a second simulated engine, where the stack runs two
    # the remote-write side (Stack(remote_write=True))
    victoria: int = 0
    agent: int = 0
    vmagent: int = 0
    vmalert: int = 0
    vm_alertmanager: int = 0

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port())

    def fill(self) -> None:
        for name, port in vars(self).items():
            if not port:
                setattr(self, name, free_port())


@dataclass
class Node:
    """One node of the stack: a daemon on its own simulated GPUs and fabric, its own port and folders."""

    index: int
    port: int
    workdir: Path  # the stack's own folder for node 0, a folder of its own below it for the others
    gpus: SimulatedGpus
    fabric: SimulatedFabric
    daemon: Daemon | None = None
    server: ServerThread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def instance(self) -> str:
        """The `instance` label Prometheus gives its series."""
        return f"127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> str:
        return str(self.workdir / "ingest.sock")

    @property
    def flight_dir(self) -> Path:
        return self.workdir / "flight"


class Stack:
    def __init__(self, workdir: str | Path, ports: Ports, gpus: int = 8, ranks: int = 4,
                 webhook_url: str | None = None, settings: RulesSettings = DEMO_SETTINGS,
                 nics: int | None = None, remote_write: bool = False, nodes: int = 1, job: bool = True,
                 serving: bool = True, serving_engines: tuple[str, ...] = ("vllm",),
                 flight_stale_after: str | None = "10s") -> None:
        """`serving_engines`: whose metrics the simulated serving engine serves (vllm, triton); a second one runs
        beside the first, as its own workload on the next GPU. `flight_stale_after`: the daemons' flight.stale_after
        (None: its default)."""
        if nodes < 1:
            raise StackError(f"nodes={nodes}: at least one")
        if not 1 <= len(serving_engines) <= 2:
            raise StackError("serving_engines: one or two of vllm, triton")
        self.workdir = Path(workdir)
        self.serving_engines = serving_engines
        self.ports = ports
        self.remote_write = remote_write
        self.ranks = ranks
        self.webhook_url = webhook_url
        self.settings = settings
        self.with_job = job
        self.with_serving = serving
        self.flight_stale_after = flight_stale_after
        self.ports.fill()
        self.nodes = [Node(i, self.ports.exporter if i == 0 else free_port(),
                           self.workdir if i == 0 else self.workdir / f"node{i}", SimulatedGpus(gpus), None)
                      for i in range(nodes)]  # type: ignore[arg-type]
        for node in self.nodes:
            # NIC i on GPU i's PCIe switch; by default one per GPU, at most 8
            node.fabric = SimulatedFabric(node.gpus.pci_bus_ids(), nics=nics)
        self.gpus = self.nodes[0].gpus
        self.fabric = self.nodes[0].fabric
        self.job: SimulatedJob | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._serving: subprocess.Popen[bytes] | None = None

    @property
    def daemon(self) -> Daemon | None:
        """Node 0's daemon."""
        return self.nodes[0].daemon

    def node_of(self, rank: int) -> Node:
        """The node the simulated job's rank runs on: the ranks in order, as many on each node."""
        return self.nodes[rank * len(self.nodes) // max(self.ranks, 1)]

    @property
    def urls(self) -> dict[str, str]:
        return {"exporter": f"http://127.0.0.1:{self.ports.exporter}",
                "prometheus": f"http://127.0.0.1:{self.ports.prometheus}",
                "alertmanager": f"http://127.0.0.1:{self.ports.alertmanager}",
                "serving": f"http://127.0.0.1:{self.ports.serving}",
                "serving_second": f"http://127.0.0.1:{self.ports.serving_second}",
                "victoria": f"http://127.0.0.1:{self.ports.victoria}",
                "vmalert": f"http://127.0.0.1:{self.ports.vmalert}",
                "vm_alertmanager": f"http://127.0.0.1:{self.ports.vm_alertmanager}"}

    # --- start and stop ----------------------------------------------------------------------------

    def start(self) -> Stack:
        try:
            for node in self.nodes:
                node.flight_dir.mkdir(parents=True, exist_ok=True)
                self._start_daemon(node)
            if self.with_serving:
                self._start_serving()
            self._write_rules()
            self._start_alertmanager("alertmanager", self.ports.alertmanager)
            self._start_prometheus()
            if self.remote_write:
                self._start_remote_write()
            self._wait_scraped()
            if self.with_job:
                nodes = [self.node_of(rank) for rank in range(self.ranks)]
                self.job = SimulatedJob(WORKLOAD, self.ranks, [n.socket_path for n in nodes],
                                        [n.flight_dir for n in nodes]).start()
                self._hold_gpus()
        except BaseException:
            self.stop()
            raise
        return self

    def _hold_gpus(self) -> None:
        """Each rank holds one GPU, as a real job's processes would: a process per rank, named by its launcher's
        variables and pinned to its GPU's CPUs, as a well-placed job is (the job's ranks are threads of this
        process, whose affinity spans every CPU, while the simulated GPUs split the CPUs into NUMA nodes: held by
        this process, every GPU would read as a NUMA mismatch)."""
        sleep = shutil.which("sleep") or "/bin/sleep"
        for rank in range(self.ranks):
            node = self.node_of(rank)
            gpu = rank - min(r for r in range(self.ranks) if self.node_of(r) is node)  # its place on its node
            holder = subprocess.Popen([sleep, "infinity"], env={"TORCHELASTIC_RUN_ID": WORKLOAD, "RANK": str(rank)})
            self._procs.append(holder)
            os.sched_setaffinity(holder.pid, node.gpus.device_cpu_affinity(node.gpus.device_handle(gpu)))
            node.gpus.attach_process(gpu, holder.pid)

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for node in self.nodes:
            if node.server is not None:
                node.server.stop()
            if node.daemon is not None:
                node.daemon.stop()

    def _start_daemon(self, node: Node) -> None:
        config = load(None, {
            "web": {"listen_address": f"127.0.0.1:{node.port}"},
            "nvml": {"interval": "1s", "slow_interval": "1s"},  # faults page within seconds
            "dcgm": {"enabled": True, "interval": "1s"}, "host": {"interval": "5s"},
            "fabric": {"interval": "1s"},
            "ingest": {"interval": "1s", "socket_path": node.socket_path, "state_dir": str(node.workdir / "state")},
            # a rank whose dumps stop ends 10 s after its last one (at once where its process is seen to end)
            "flight": {"interval": "1s", "dir": str(node.flight_dir), "rank_missing_after": "2s",
                       **({"stale_after": self.flight_stale_after} if self.flight_stale_after else {})},
            "kubelet": {"enabled": False},  # no kubelet on a laptop; the process source attributes the job
        }, environ={})
        sock = bind(config.web.listen_address)
        node.daemon = build_daemon(config, backend=node.gpus, fabric=node.fabric)
        node.daemon.start()
        node.server = ServerThread(create_app(node.daemon), [sock], f"demo-http-{node.index}")
        node.server.start()
        self._wait_ready(f"exporter of node {node.index}", f"{node.url}/readyz")

    def _servers(self) -> list[tuple[str, str, str, int, range]]:
        """(engine, workload, scrape job, port, GPUs) of each simulated serving engine."""
        first = range(self.ranks, min(self.ranks + SERVING_GPUS, self.gpus.count))
        out = [(self.serving_engines[0], SERVING, self.serving_engines[0], self.ports.serving, first)]
        if len(self.serving_engines) > 1:
            if self.serving_engines[1] == self.serving_engines[0]:
                raise StackError("serving_engines: two different engines")
            out.append((self.serving_engines[1], SECOND_SERVING, self.serving_engines[1], self.ports.serving_second,
                        range(first.stop, min(first.stop + 1, self.gpus.count))))
        return out

    def _start_serving(self) -> None:
        """Each simulated engine, in a process of its own whose launcher variable names its workload, holding up to
        SERVING_GPUS of the GPUs the job's ranks leave (the second one the next GPU; the process source attributes
        them to it)."""
        for i, (engine, workload, _, port, gpus) in enumerate(self._servers()):
            env = {**os.environ, "TORCHELASTIC_RUN_ID": workload}
            name = "serving" if i == 0 else "serving_second"
            self._spawn(name, [sys.executable, "-m", "goodput_mixin.demo.simserve", "--port", str(port),
                               "--engine", engine], env=env)
            process = self._procs[-1]
            if i == 0:
                self._serving = process
            self._wait_ready(name, f"{self.urls[name]}/metrics")
            for gpu in gpus:
                self.gpus.attach_process(gpu, process.pid)

    def overload(self, factor: float) -> None:
        """Scale the serving engine's arrival rate (1: its normal load)."""
        httpx.post(f"{self.urls['serving']}/load", params={"factor": factor}, timeout=5).raise_for_status()

    def _start_alertmanager(self, name: str, port: int) -> None:
        receiver: dict[str, object] = {"name": "default"}
        if self.webhook_url:
            receiver["webhook_configs"] = [{"url": self.webhook_url, "send_resolved": True}]
        config = {
            "route": {"receiver": "default", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h"},
            "receivers": [receiver],
        }
        path = self.workdir / f"{name}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._spawn(name, [
            _binary("prometheus-alertmanager", "alertmanager"), f"--config.file={path}",
            f"--storage.path={self.workdir / f'{name}-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="])
        self._wait_ready(name, f"http://127.0.0.1:{port}/-/ready")

    @property
    def rules_dir(self) -> Path:
        return self.workdir / "rules"

    def _write_rules(self) -> None:
        self.rules_dir.mkdir(exist_ok=True)
        for name, text in rule_files(self.settings, source="the demo's fast settings").items():
            (self.rules_dir / name).write_text(text)

    def _scrape_configs(self, cluster_as_target_label: bool) -> list[dict[str, object]]:
        """The exporter's and the serving engine's scrapes. The cluster label that rules and dashboards group by: a
        target label for a Prometheus that queries its own series (a real setup sets it by relabeling), an external
        label for the agents (set by the caller)."""
        cluster = {self.settings.cluster_label: CLUSTER} if cluster_as_target_label else {}
        return [
            {"job_name": self.settings.exporter_job, "static_configs": [
                {"targets": [node.instance for node in self.nodes], "labels": cluster}]},
            # each serving engine, as a bare-metal scrape names it: its workload (the name the process source gives
            # the GPUs it holds) as a target label, for the rules' join to its GPUs
            *({"job_name": job, "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {**cluster, "workload": workload}}]}
              for _, workload, job, port, _ in (self._servers() if self.with_serving else [])),
        ]

    def _start_prometheus(self) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.rules_dir / "*.rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{self.ports.alertmanager}"]}]}]},
            "scrape_configs": self._scrape_configs(cluster_as_target_label=True),
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._spawn("prometheus", [
            _binary("prometheus"), f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.ports.prometheus}"])
        self._wait_ready("prometheus", f"{self.urls['prometheus']}/-/ready")

    def _start_remote_write(self) -> None:
        """VictoriaMetrics; Prometheus in agent mode and vmagent scraping what Prometheus scrapes, both writing to it
        (one sample per series per second kept: the HA pair's deduplication); vmalert with the same rule files,
        sending to an Alertmanager of its own. Every part set for freshness over economy: the newest second of data
        visible to queries (VictoriaMetrics hides 30 s by default), writes sent each second."""
        victoria = self.urls["victoria"]
        self._spawn("victoria-metrics", [
            _binary("victoria-metrics"), f"-storageDataPath={self.workdir / 'victoria-data'}",
            f"-httpListenAddr=127.0.0.1:{self.ports.victoria}", "-dedup.minScrapeInterval=1s",
            "-search.latencyOffset=1s", "-search.disableCache", "-retentionPeriod=1d"])
        self._wait_ready("victoria-metrics", f"{victoria}/health")
        write = f"{victoria}/api/v1/write"
        external = {"scrape_interval": "1s", "external_labels": {self.settings.cluster_label: CLUSTER}}
        agent = self.workdir / "prometheus-agent.yml"
        agent.write_text(yaml.safe_dump({
            "global": external, "scrape_configs": self._scrape_configs(cluster_as_target_label=False),
            "remote_write": [{"url": write, "queue_config": {"batch_send_deadline": "1s"}}]}, sort_keys=False))
        self._spawn("prometheus-agent", [
            _binary("prometheus"), "--enable-feature=agent", f"--config.file={agent}",
            f"--storage.agent.path={self.workdir / 'agent-data'}",
            f"--web.listen-address=127.0.0.1:{self.ports.agent}"])
        vmagent = self.workdir / "vmagent.yml"
        vmagent.write_text(yaml.safe_dump({
            "global": external, "scrape_configs": self._scrape_configs(cluster_as_target_label=False)},
            sort_keys=False))
        self._spawn("vmagent", [
            _binary("vmagent"), f"-promscrape.config={vmagent}", f"-remoteWrite.url={write}",
            f"-remoteWrite.tmpDataPath={self.workdir / 'vmagent-data'}", "-remoteWrite.flushInterval=1s",
            f"-httpListenAddr=127.0.0.1:{self.ports.vmagent}"])
        self._start_alertmanager("vm-alertmanager", self.ports.vm_alertmanager)
        self._spawn("vmalert", [
            _binary("vmalert"), f"-rule={self.rules_dir / '*.rules.yml'}", f"-datasource.url={victoria}",
            f"-remoteWrite.url={victoria}", f"-remoteRead.url={victoria}",
            f"-notifier.url={self.urls['vm_alertmanager']}", "-evaluationInterval=1s",
            "-remoteWrite.flushInterval=1s", f"-httpListenAddr=127.0.0.1:{self.ports.vmalert}"])
        self._wait_ready("prometheus-agent", f"http://127.0.0.1:{self.ports.agent}/-/ready")
        self._wait_ready("vmagent", f"http://127.0.0.1:{self.ports.vmagent}/health")
        self._wait_ready("vmalert", f"{self.urls['vmalert']}/health")

    def _wait_scraped(self, timeout: float = 30.0) -> None:
        """Until every store holds the exporter's first scrape, so that a fault injected after start() is a change
        each of them saw happen (a counter's first sample already past 0 is no increase to Prometheus, and all of it to
        VictoriaMetrics)."""
        stores = ["prometheus", "victoria"] if self.remote_write else ["prometheus"]
        query = f'up{{job="{self.settings.exporter_job}"}} == 1'
        deadline = time.monotonic() + timeout
        for store in stores:
            while True:
                try:
                    body = httpx.get(f"{self.urls[store]}/api/v1/query", params={"query": query}, timeout=2).json()
                    if len(body.get("data", {}).get("result", [])) == len(self.nodes):  # every node's daemon
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(f"{store} had not scraped the exporter within {timeout:g}s; see {self.workdir}")
                time.sleep(0.2)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logfile = (self.workdir / f"{name}.log").open("wb")
        self._procs.append(subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, cwd=self.workdir,
                                            env=env))

    def _wait_ready(self, name: str, url: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with {proc.returncode}; see {self.workdir}/{name}.log")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StackError(f"{name} was not ready at {url} within {timeout:g}s")

    # --- looking at it -------------------------------------------------------------------------------

    def alerts(self, alertmanager: str = "alertmanager") -> list[dict[str, object]]:
        """The active alerts of an Alertmanager: Prometheus's ("alertmanager") or vmalert's ("vm_alertmanager")."""
        response = httpx.get(f"{self.urls[alertmanager]}/api/v2/alerts", timeout=5)
        response.raise_for_status()
        return response.json()
