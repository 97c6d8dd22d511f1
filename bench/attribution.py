"""Attribution: what a refresh costs with 8 GPUs and 200 pods, and that scrapes do not notice it.

* refresh cost: the kubelet source's collection (a v1 List over the Unix socket to a real gRPC server
  answering 200 pods, 8 of them holding one GPU each, checking and matching the answer) and the
  process source's (environ and cgroup of 8 real GPU processes), median and p99;
* scrape latency: two daemons with 8 simulated GPUs scraped alternately, request by request (as
  run.py compares with node_exporter): one without the kubelet source, one whose kubelet source
  refreshes every 100 ms (busy), then the same pair while every List call hangs in the server
  (stuck). Equal percentiles in each pair mean a refresh, running or stuck, costs a scrape nothing.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving import free_port, wait_ready  # noqa: E402

from exporter.config import load  # noqa: E402
from exporter.sources.kubelet.source import KubeletSource  # noqa: E402
from exporter.sources.nvml.simulated import SimulatedGpus  # noqa: E402
from exporter.sources.nvml.source import NvmlSource  # noqa: E402
from exporter.sources.process.source import ProcessSource  # noqa: E402


def _load_kubelet_server() -> ModuleType:
    """The tests' fake kubelet, loaded from its file: tests/ itself (its conftest and helpers) stays off
    the import path, and the package ships no test helpers."""
    spec = importlib.util.spec_from_file_location("kubelet_server", ROOT / "tests" / "kubelet_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


_kubelet_server = _load_kubelet_server()
KubeletServer, Pod, gpu_pod = _kubelet_server.KubeletServer, _kubelet_server.Pod, _kubelet_server.gpu_pod

GPUS = 8
PODS = 200
REFRESHES = 200
SCRAPES = 400
HEADERS = {"Accept-Encoding": "gzip", "Accept": "text/plain"}


@dataclass
class Result:
    kubelet_ms: tuple[float, float]  # median, p99 of one kubelet refresh
    process_ms: tuple[float, float]
    scrapes: dict[str, tuple[float, float, float, float]]  # phase -> baseline p50, p99, with p50, p99 (ms)


def _pods(uuids: list[str]) -> list[Pod]:  # type: ignore[valid-type]
    pods = [gpu_pod(f"train-{i}", "ml", uuid) for i, uuid in enumerate(uuids)]
    for i in range(PODS - len(pods)):
        pods.append(Pod(f"web-{i}", f"team-{i % 20}", {"app": [("example.com/nic", [str(i % 4)])],
                                                         "sidecar": []}))
    return pods


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def refresh_costs() -> tuple[tuple[float, float], tuple[float, float]]:
    sim = SimulatedGpus(GPUS)
    uuids = [sim.device_uuid(sim.device_handle(i)) for i in range(GPUS)]
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 env={**os.environ, "TORCHELASTIC_RUN_ID": "bench", "RANK": str(i)})
                for i in range(GPUS)]
    try:
        for i, child in enumerate(children):
            sim.attach_process(i, child.pid)
        nvml = NvmlSource(sim)
        nvml.collect()
        with KubeletServer() as kubelet:
            kubelet.set_pods(_pods(uuids))
            config = load(None, {"kubelet": {"socket_path": kubelet.path}}, environ={}).kubelet
            source = KubeletSource(config, nvml.table)
            assert len(source.collect().series) == 2  # pod info and skipped devices
            kubelet_times = []
            for _ in range(REFRESHES):
                started = time.perf_counter()
                source.collect()
                kubelet_times.append((time.perf_counter() - started) * 1000)
            source.close()
        process = ProcessSource(nvml.table)
        process_times = []
        for _ in range(REFRESHES):
            started = time.perf_counter()
            batch = process.collect()
            process_times.append((time.perf_counter() - started) * 1000)
        assert len(batch.series) == 3  # workload info, processes by state, ignored declarations
        nvml.close()
    finally:
        for child in children:
            child.kill()
            child.wait()
    return _percentiles(kubelet_times), _percentiles(process_times)


def _daemon(*flags: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="gp-bench-attr-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--simulate", str(GPUS), "--web.listen-address",
         f"127.0.0.1:{port}", "--log.level", "error", "--ingest.socket-path", f"{workdir}/ingest.sock",
         "--flight.dir", f"{workdir}/flight", *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/readyz")
    except RuntimeError:
        proc.kill()
        raise
    return proc, port


def _scrape_pair(base: int, other: int) -> tuple[float, float, float, float]:
    conns = {port: http.client.HTTPConnection("127.0.0.1", port, timeout=5) for port in (base, other)}
    timings: dict[int, list[float]] = {base: [], other: []}
    for i in range(SCRAPES + 20):
        for port in (base, other) if i % 2 else (other, base):
            started = time.perf_counter()
            conns[port].request("GET", "/metrics", headers=HEADERS)
            response = conns[port].getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"port {port} answered {response.status}")
            if i >= 20:
                timings[port].append((time.perf_counter() - started) * 1000)
        time.sleep(0.005)
    return (*_percentiles(timings[base]), *_percentiles(timings[other]))


def scrape_latency() -> dict[str, tuple[float, float, float, float]]:
    sim = SimulatedGpus(GPUS)  # same seed as the daemons': the same UUIDs
    uuids = [sim.device_uuid(sim.device_handle(i)) for i in range(GPUS)]
    out = {}
    with KubeletServer() as kubelet:
        kubelet.set_pods(_pods(uuids))
        base, base_port = _daemon("--kubelet.enabled", "false")
        # kubelet.enabled is off by default: without it this daemon would not run the source at all
        with_kubelet, port = _daemon("--kubelet.enabled", "true", "--kubelet.socket-path", kubelet.path,
                                     "--kubelet.interval", "100ms",
                                     "--kubelet.timeout", "5s")
        try:
            out["busy"] = _scrape_pair(base_port, port)
            kubelet.delay = 30.0  # every List hangs in the server
            time.sleep(0.5)
            out["stuck"] = _scrape_pair(base_port, port)
            kubelet.delay = 0.0
        finally:
            for proc in (base, with_kubelet):
                proc.terminate()
                proc.wait(10)
    return out


def run() -> Result:
    kubelet_ms, process_ms = refresh_costs()
    return Result(kubelet_ms, process_ms, scrape_latency())


def markdown(result: Result) -> list[str]:
    lines = [
        "## Attribution",
        "",
        f"Refresh cost with {GPUS} GPUs and {PODS} pods ({GPUS} holding a GPU each, the others a NIC or nothing): "
        f"the kubelet source's collection against a real gRPC server on a Unix socket (List, checks, matching) and "
        f"the process source's ({GPUS} real GPU processes), {REFRESHES} refreshes each.",
        "",
        "| refresh | median | p99 |",
        "|---|---|---|",
        f"| kubelet (pod-resources List) | {result.kubelet_ms[0]:.2f} ms | {result.kubelet_ms[1]:.2f} ms |",
        f"| process (environ, cgroup) | {result.process_ms[0]:.2f} ms | {result.process_ms[1]:.2f} ms |",
        "",
        f"Scrape latency while refreshes run: {SCRAPES} scrapes each of two daemons alternately, one without the "
        "kubelet source, one refreshing every 100 ms (busy) or with every List call hanging in the server (stuck).",
        "",
        "| phase | without kubelet p50 | p99 | with kubelet p50 | p99 |",
        "|---|---|---|---|---|",
    ]
    for phase, (b50, b99, k50, k99) in result.scrapes.items():
        lines.append(f"| {phase} | {b50:.2f} ms | {b99:.2f} ms | {k50:.2f} ms | {k99:.2f} ms |")
    lines.append("")
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    print("\n".join(markdown(run())))
