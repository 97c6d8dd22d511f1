"""Backend cost per GPU: series, samples per second and bytes per sample at a remote-write store, for the default
settings and for each optional source, and the churn a job start causes.

Each configuration is one node of 8 simulated GPUs: the daemon built as the demo builds it (so that processes can
hold its simulated GPUs, as a job's ranks do), in a process of its own, scraped by a vmagent of its own that
remote-writes to a fresh VictoriaMetrics 1.79 of its own; all CONFIGS side by side for RUN seconds, so each store's
figures are its node's alone. The configurations add one source at a time:

* default: the default settings on a node where the fabric source finds no NIC (nvml, host, process, ingest and
  flight on, the last two with nothing to read; dcgm and kubelet off);
* fabric: the default settings on a node with 8 RDMA NICs (the fabric source is on by default: one RoCE port per
  NIC, simulated, read through the real sysfs parsing);
* dcgm: the default node with the dcgm source on (simulated DCGM);
* job: the default node with a training job of one rank per GPU sending its events to the ingest socket (the
  demo's simulated job: steps, phases, checkpoints), each rank a process holding its GPU and named by torchrun's
  variables (the process source's workload info); the flight source off, so its dumps are not read;
* flight: that job with the flight source reading its flight-recorder dumps;
* kubelet: that job and its dumps with the kubelet source on, asking a pod-resources server (the tests' real gRPC
  one, on a Unix socket) that gives each rank's GPU to a pod of its own. Pod labels (`kubelet.pod_labels`) are
  left out: they need a Kubernetes API server.

Every source collects every second and vmagent scrapes every second (SCRAPE), so that a store holds enough samples
of each series for its compression to be what it is on a long-running store (a VictoriaMetrics block holds up to
8,192 samples of a series; its per-block overhead spread over a few dozen samples would be most of the figure).
At a 15 s scrape each sample would also be a fresh collection, but a counter would grow 15 times more between two
samples: a few more bits per sample. So the bytes per sample are measured at 1 s, and, as a bound from the other
side, also for the default node scraped every 15 s by a second vmagent into a store of its own over the same
minutes (PROD_SCRAPE; its few samples per series carry the per-block overhead). Samples per second are given at
the 15 s scrape. After RUN seconds the agents stop; each store is flushed (`/internal/force_flush`) and merged into
one part per month (`/internal/force_merge`); then its rows (`vm_rows`), its bytes on disk (`vm_data_size_bytes`:
the data parts, and the index apart) and its series (`vm_new_timeseries_created_total`) are read from its /metrics.

Churn: on the kubelet node (every source that carries a workload or pod label on), the job is stopped and a job of
another workload name started in new pods on the same GPUs, as a scheduler starts the next job; the series the node
exposes that it did not expose before are new series at the store, counted per GPU of the job (the old job's series
stay until ingest.idle_timeout, 10m, and its accounting series for ingest.restart_window, 6h). Run alone with
`python bench/backend_cost.py`.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serving import free_port, settle_victoria, stop, wait_ready  # noqa: E402
from serving import metrics as serving_metrics  # noqa: E402

WORK = ROOT / "bench" / ".work" / "backend-cost"
GPUS = 8
SCRAPE = 1  # s, every source's interval too
PROD_SCRAPE = 15  # s: the samples per second are given at this scrape interval, as deployed
RUN = 240  # s of scraping
CHURN_WINDOW = 45  # s at most after the job switch; it ends once no new series has shown for CHURN_QUIET s
CHURN_QUIET = 10
WORKLOAD, NEXT_WORKLOAD = "llama-pretrain-7", "llama-pretrain-8"
# name -> (what it is, simulated NICs, the daemon's settings over the defaults, a job, its flight dumps read,
# kubelet); each optional source's row is compared with BASE_OF's
CONFIGS: dict[str, tuple[str, int, dict[str, Any], bool, bool, bool]] = {
    "default": ("default settings, no NIC", 0, {}, False, False, False),
    "fabric": ("+ fabric: 8 RoCE NICs", 8, {}, False, False, False),
    "dcgm": ("+ dcgm", 0, {"dcgm": {"enabled": True}}, False, False, False),
    "job": (f"+ a training job, {GPUS} ranks (ingest, process)", 0, {"flight": {"enabled": False}}, True, False,
            False),
    "flight": ("+ its flight-recorder dumps", 0, {}, True, True, False),
    "kubelet": ("+ kubelet pod info", 0, {"kubelet": {"enabled": True}}, True, True, True),
}
BASE_OF = {"fabric": "default", "dcgm": "default", "job": "default", "flight": "job", "kubelet": "flight"}


@dataclass
class Store:
    series: int  # series created at the store
    rows: int  # samples stored
    data_bytes: int  # the data parts on disk, after the merge
    index_bytes: int  # the index on disk
    seconds: float  # scraped for this long

    @property
    def bytes_per_sample(self) -> float:
        return self.data_bytes / self.rows if self.rows else float("nan")


@dataclass
class Result:
    stores: dict[str, Store]  # configuration -> its store, at SCRAPE
    prod: Store  # the default node at PROD_SCRAPE
    churn_series: int  # new series the job switch caused on the kubelet node
    churn_names: dict[str, int] = field(default_factory=dict)  # metric name -> its new series

    def per_gpu(self, name: str) -> tuple[float, float, float]:
        """Series per GPU, samples per second per GPU at PROD_SCRAPE, bytes per sample."""
        store = self.stores[name]
        return store.series / GPUS, store.series / GPUS / PROD_SCRAPE, store.bytes_per_sample

    def added(self, name: str) -> tuple[float, float, float]:
        """What the configuration adds to the one it builds on: series and samples per second per GPU, and the bytes
        per sample of what it adds (its store's growth over the other's, per added sample)."""
        store, base = self.stores[name], self.stores[BASE_OF[name]]
        rows = store.rows - base.rows * store.seconds / base.seconds
        data = store.data_bytes - base.data_bytes * store.seconds / base.seconds
        series = (store.series - base.series) / GPUS
        return series, series / PROD_SCRAPE, data / rows if rows > 0 else float("nan")


# --- the node, in a process of its own ---------------------------------------------------------------------------


def _node_main(spec: dict[str, Any]) -> None:
    """One simulated node: the daemon, and with `job` a job holding its GPUs; reads commands on stdin."""
    import threading

    from goodput_mixin.demo.simjob import SimulatedJob

    from exporter.assemble import build_daemon
    from exporter.config import load
    from exporter.core.http import ServerThread, bind, create_app
    from exporter.sources.fabric.simulated import SimulatedFabric
    from exporter.sources.nvml.simulated import SimulatedGpus

    workdir = Path(spec["workdir"])
    gpus = SimulatedGpus(GPUS)
    fabric = SimulatedFabric(gpus.pci_bus_ids(), nics=spec["nics"])
    interval = f"{SCRAPE}s"
    settings: dict[str, Any] = {
        "web": {"listen_address": f"127.0.0.1:{spec['port']}"}, "log": {"level": "warning"},
        **{source: {"interval": interval} for source in ("nvml", "dcgm", "fabric", "host", "process", "ingest",
                                                          "flight", "kubelet")}}
    settings["ingest"]["socket_path"] = str(workdir / "ingest.sock")
    settings["flight"]["dir"] = str(workdir / "flight")
    for section, values in spec["settings"].items():
        settings[section].update(values)
    kubelet = None
    if spec["kubelet"]:
        kubelet = _kubelet_server().KubeletServer(str(workdir / "kubelet.sock")).start()
        settings["kubelet"]["socket_path"] = kubelet.path
    config = load(None, settings, environ={})
    sock = bind(config.web.listen_address)
    daemon = build_daemon(config, backend=gpus, fabric=fabric)
    daemon.start()
    server = ServerThread(create_app(daemon), [sock], "bench-http")
    server.start()
    (workdir / "flight").mkdir(exist_ok=True)
    job: Any = None
    holders: list[subprocess.Popen[bytes]] = []

    def start_job(workload: str) -> None:
        nonlocal job
        if kubelet is not None:
            uuids = [gpus.device_uuid(gpus.device_handle(i)) for i in range(GPUS)]
            kubelet.set_pods(_kubelet_server().gpu_pod(f"{workload}-worker-{rank}", "ml", uuid)
                             for rank, uuid in enumerate(uuids))
        for rank in range(GPUS):  # each rank a process holding its GPU, named by torchrun's variables
            holder = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "infinity"],
                                      env={"TORCHELASTIC_RUN_ID": workload, "RANK": str(rank)})
            holders.append(holder)
            # pinned to its GPU's CPUs, as a well-placed job is (those of them this machine has)
            mine = gpus.device_cpu_affinity(gpus.device_handle(rank)) & os.sched_getaffinity(0)
            os.sched_setaffinity(holder.pid, mine or os.sched_getaffinity(0))
            gpus.attach_process(rank, holder.pid)
        job = SimulatedJob(workload, GPUS, str(workdir / "ingest.sock"), workdir / "flight").start()

    def stop_job() -> None:
        if job is not None:
            job.stop()
        for rank, holder in enumerate(holders):
            gpus.detach_process(rank, holder.pid)
            holder.terminate()
            holder.wait(10)
        holders.clear()

    try:
        if spec["job"]:
            start_job(WORKLOAD)
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.split()
            if command[:1] == ["switch"]:
                stop_job()
                start_job(command[1])
                print("switched", flush=True)
            elif command[:1] == ["stop"]:
                break
    finally:
        stop_job()
        threading.Thread(target=server.stop, daemon=True).start()
        daemon.stop()
        if kubelet is not None:
            kubelet.stop()


def _kubelet_server() -> Any:
    """The tests' pod-resources server, loaded from its file as bench/attribution.py loads it."""
    import attribution
    return attribution._kubelet_server


class _Node:
    def __init__(self, name: str, workdir: Path) -> None:
        _, nics, settings, job, flight, kubelet = CONFIGS[name]
        if job and not flight:
            settings = {**settings, "flight": {"enabled": False}}
        self.port = free_port()
        workdir.mkdir(parents=True)
        spec = {"port": self.port, "workdir": str(workdir), "nics": nics, "settings": settings, "job": job,
                "kubelet": kubelet}
        self.proc = subprocess.Popen([sys.executable, __file__, "--node", json.dumps(spec)], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=(workdir / "node.log").open("wb"), text=True)

    def ready(self) -> None:
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"node on port {self.port} did not start")
        wait_ready(self.port, "/readyz")

    def switch(self, workload: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"switch {workload}\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "switched":
            raise RuntimeError("the job switch failed")

    def series(self) -> set[str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        return {line.rpartition(" ")[0] for line in text.splitlines() if line and line[0] != "#"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


# --- the agents and the stores -----------------------------------------------------------------------------------


class _Store:
    """A fresh VictoriaMetrics (as docs/scale-out.md runs it, less -dedup.minScrapeInterval, which would keep one
    sample in 15 of a 1 s scrape) and a vmagent scraping one node into it."""

    def __init__(self, workdir: Path, node_port: int, scrape: int) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port, agent_port = free_port(), free_port()
        self.procs = [subprocess.Popen(
            ["victoria-metrics", f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{self.port}",
             "-retentionPeriod=90d"], stdout=(workdir / "victoria-metrics.log").open("wb"), stderr=subprocess.STDOUT)]
        (workdir / "vmagent.yml").write_text(json.dumps({
            "global": {"scrape_interval": f"{scrape}s", "scrape_timeout": f"{scrape}s",
                       "external_labels": {"cluster": "bench"}},
            "scrape_configs": [{"job_name": "goodput-exporter", "static_configs": [
                {"targets": [f"127.0.0.1:{node_port}"], "labels": {"instance": "node-0", "node": "node-0"}}]}]}))
        wait_ready(self.port, "/health")
        self.procs.append(subprocess.Popen(
            ["vmagent", f"-promscrape.config={workdir / 'vmagent.yml'}",
             f"-remoteWrite.url=http://127.0.0.1:{self.port}/api/v1/write",
             f"-remoteWrite.tmpDataPath={workdir / 'vmagent-data'}", f"-httpListenAddr=127.0.0.1:{agent_port}"],
            stdout=(workdir / "vmagent.log").open("wb"), stderr=subprocess.STDOUT))
        self.started = time.monotonic()
        self.stopped = 0.0

    def stop_agent(self) -> None:
        self.procs[1].terminate()
        self.procs[1].wait(30)
        self.stopped = time.monotonic()

    def measure(self) -> Store:
        """Flushed and merged: its series, rows and bytes."""
        settle_victoria(self.port, time.time() - RUN - 60, time.time())
        metrics = serving_metrics(self.port)
        storage = ('{type="storage/small"}', '{type="storage/big"}')
        return Store(int(metrics["vm_new_timeseries_created_total"]),
                     int(sum(metrics[f"vm_rows{kind}"] for kind in storage)),
                     int(sum(metrics[f"vm_data_size_bytes{kind}"] for kind in storage)),
                     int(metrics['vm_data_size_bytes{type="indexdb"}']), self.stopped - self.started)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                stop(proc)


def _churn(node: _Node) -> tuple[int, dict[str, int]]:
    """New series on the node after its job is replaced by one of another name in new pods."""
    before: set[str] = set()
    for _ in range(3):
        before |= node.series()
        time.sleep(1)
    node.switch(NEXT_WORKLOAD)
    after: set[str] = set()
    began = last_new = time.monotonic()
    while time.monotonic() - began < CHURN_WINDOW and time.monotonic() - last_new < CHURN_QUIET:
        grown = node.series() - before - after
        if grown:
            after |= grown
            last_new = time.monotonic()
        time.sleep(1)
    names: dict[str, int] = {}
    for series in after:
        name = series.partition("{")[0]
        names[name] = names.get(name, 0) + 1
    return len(after), dict(sorted(names.items(), key=lambda item: -item[1]))


def run() -> Result:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    nodes = {name: _Node(name, WORK / "nodes" / name) for name in CONFIGS}
    stores: dict[str, _Store] = {}
    try:
        for node in nodes.values():
            node.ready()
        time.sleep(3)  # the jobs' first steps and dumps
        for name, node in nodes.items():
            stores[name] = _Store(WORK / name, node.port, SCRAPE)
        stores["prod"] = _Store(WORK / "default-15s", nodes["default"].port, PROD_SCRAPE)
        time.sleep(RUN)
        for store in stores.values():
            store.stop_agent()
        measured = {name: store.measure() for name, store in stores.items()}
        for store in stores.values():
            store.stop()
        churn, names = _churn(nodes["kubelet"])
    finally:
        for store in stores.values():
            store.stop()
        for node in nodes.values():
            node.stop()
    prod = measured.pop("prod")
    return Result(measured, prod, churn, names)


def markdown(result: Result) -> list[str]:
    default = result.stores["default"]
    lines = [
        "## Backend cost per GPU",
        "",
        f"One node of {GPUS} simulated GPUs per configuration, each in its own process, scraped by its own vmagent "
        f"into its own fresh VictoriaMetrics 1.79, all side by side for {RUN / 60:g} minutes (details in "
        "`bench/backend_cost.py`). Series are those the store created (vmagent's `up` and `scrape_*` series "
        f"included); samples per second are at a {PROD_SCRAPE} s scrape; bytes per sample are the store's data "
        f"parts on disk after a flush and a merge, over its rows, with every source collecting and vmagent "
        f"scraping every {SCRAPE} s ({RUN // SCRAPE} samples a series); disk per day is samples per second x "
        "86,400 x bytes per sample. Each configuration adds one thing to the default node or to the row above "
        "(flight and kubelet build on the job); *adds* is the difference, per GPU.",
        "",
        "| configuration | series per GPU | samples/s per GPU | bytes per sample | disk per day per GPU "
        "| adds: series per GPU | samples/s per GPU | bytes per sample |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (title, *_rest) in CONFIGS.items():
        series, rate, per_sample = result.per_gpu(name)
        if name in BASE_OF:
            added_series, added_rate, added_bytes = result.added(name)
            small = added_series * GPUS < 0.03 * result.stores[BASE_OF[name]].series
            adds = (f"{added_series:.1f} | {added_rate:.2f} | "
                    + ("too few to tell" if small else f"{added_bytes:.2f}"))
        else:
            adds = "— | — | —"
        lines.append(f"| {title} | {series:.1f} | {rate:.2f} | {per_sample:.2f} | "
                     f"{rate * 86400 * per_sample / 1e6:.2f} MB | {adds} |")
    prod = result.prod
    index = [store.index_bytes / store.series for store in result.stores.values()]
    many = {name: count for name, count in result.churn_names.items() if count != GPUS}
    lines += [
        "",
        f"The index takes {min(index):.0f} to {max(index):.0f} bytes per series on disk (the series' first day). The "
        f"default node scraped every {PROD_SCRAPE} s over the same minutes ({prod.rows // max(prod.series, 1)} "
        f"samples a series) stored {prod.bytes_per_sample:.2f} bytes per sample, against "
        f"{default.bytes_per_sample:.2f} at {SCRAPE} s. A long-running store at {PROD_SCRAPE} s lies between the "
        "two: its blocks hold thousands of samples a series, so their headers weigh nothing, but each counter sample "
        f"grows {PROD_SCRAPE / SCRAPE:g} times more than at {SCRAPE} s, which takes up to about "
        f"{math.log2(PROD_SCRAPE / SCRAPE):.0f} bits more; gauges that change every collection cost the same at "
        "either interval.",
        "",
        f"Churn: a job start (the job of {GPUS} ranks on the kubelet node replaced by one of another workload name, "
        f"in new pods) created {result.churn_series} new series, {result.churn_series / GPUS:.1f} per GPU of the "
        "job: "
        + ", ".join(f"`{name}` {count}" for name, count in many.items())
        + f", and one per rank of {len(result.churn_names) - len(many)} more names (the job's counters, gauges and "
        "info series, `goodput_gpu_workload_info` and `goodput_gpu_pod_info` among them). The old job's series end "
        "when ingest.idle_timeout (10m) passes; its accounting series (elapsed, phases, downtime, redone steps, model "
        "FLOPs) stay for ingest.restart_window (6h).",
        "",
    ]
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--node":
        _node_main(json.loads(sys.argv[2]))
    else:
        print("\n".join(markdown(run())))
