"""The cost of reading a large dcgm-exporter body: CPU per collection, and our /metrics meanwhile.

The body is real dcgm-exporter text (tests/dcgm_corpus/k8s-ai-conformance-upcloud-l40s.txt, an L40S
node's full scrape) grown the way dcgm-exporter --kubernetes grows it on a shared node: each series
repeated once per pod holding the GPU (identical values, pod labels differing), until the body is
1 MB or 15 MB (under the source's 16 MiB cap). Each size is parsed:

- by our parse (`exporter.sources.dcgm.scrape.parse`), CPU time, median of ROUNDS;
- by prometheus-client's parser line by line, as the source did before (every DCGM_FI_PROF_* line
  through `text_string_to_metric_families`), for the ratio, same rounds interleaved.

Then a daemon (8 simulated GPUs whose UUIDs are the body's, dcgm.mode=exporter every second) reads a
local server serving the 15 MB body, and its /metrics is scraped SCRAPES times: p50/p99 against the
same daemon reading the 1 MB body. Run alone with `python bench/dcgm_parse.py`.
"""

from __future__ import annotations

import http.client
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from idle_cpu import private_args
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port, wait_ready

from exporter.sources.dcgm import scrape

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work"  # the daemons' own sockets and directories
SAMPLE = ROOT / "tests" / "dcgm_corpus" / "k8s-ai-conformance-upcloud-l40s.txt"
SIZES = (1_000_000, 15_000_000)
ROUNDS = 5
SCRAPES = 300


@dataclass
class Result:
    size: int
    lines: int
    ours_ms: float
    client_ms: float

    @property
    def ratio(self) -> float:
        return self.client_ms / self.ours_ms


@dataclass
class Latency:
    size: int
    p50_ms: float
    p99_ms: float
    collections: int


def body(size: int) -> str:
    """The real sample, its series repeated per pod (pod labels added) until `size` bytes."""
    lines = [line for line in SAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    out: list[str] = []
    total, pod = 0, 0
    while total < size:
        for line in lines:
            tagged = re.sub(r"\{", f'{{pod="job-{pod}-worker",namespace="train",container="main",', line, count=1)
            out.append(tagged)
            total += len(tagged) + 1
        pod += 1
    return "\n".join(out) + "\n"


def client_parse(text: str) -> int:
    """The former parse: each profiling line through prometheus-client's parser."""
    taken = 0
    for line in text.splitlines():
        if line.startswith("DCGM_FI_PROF_"):
            families = list(text_string_to_metric_families(line + "\n"))
            taken += len(families[0].samples)
    return taken


def parse_costs() -> list[Result]:
    results = []
    for size in SIZES:
        text = body(size)
        ours, theirs = [], []
        for _ in range(ROUNDS):
            started = time.process_time()
            scrape.parse(text)
            ours.append(time.process_time() - started)
            started = time.process_time()
            client_parse(text)
            theirs.append(time.process_time() - started)
        results.append(Result(len(text), text.count("\n"), statistics.median(ours) * 1000,
                              statistics.median(theirs) * 1000))
        print(f"dcgm body {len(text) / 1e6:.1f} MB: ours {results[-1].ours_ms:.0f} ms, prometheus-client "
              f"{results[-1].client_ms:.0f} ms", flush=True)
    return results


class _Server:
    def __init__(self) -> None:
        self.body = b""
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _workdir() -> Path:
    WORK.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="dcgm-parse-", dir=WORK))


def latency_while_parsing() -> list[Latency]:
    server = _Server()
    results = []
    for size in SIZES:
        server.body = body(size).encode()
        port = free_port()
        proc = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "goodput-exporter"), "serve", "--simulate", "8",
             "--nvml.enabled", "false", "--dcgm.enabled", "true", "--dcgm.mode", "exporter",
             "--dcgm.exporter-url", server.url, "--dcgm.interval", "1s", "--dcgm.timeout", "10s",
             "--web.listen-address", f"127.0.0.1:{port}", *private_args(_workdir()),
             "--log.level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/readyz")
            time.sleep(2)
            before = server.requests
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            timings = []
            for _ in range(SCRAPES):
                started = time.perf_counter()
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                conn.getresponse().read()
                timings.append((time.perf_counter() - started) * 1000)
                time.sleep(0.02)
            timings.sort()
            results.append(Latency(len(server.body), statistics.median(timings),
                                   timings[min(len(timings) - 1, int(0.99 * len(timings)))],
                                   server.requests - before))
            print(f"/metrics while reading a {len(server.body) / 1e6:.1f} MB body: p50 {results[-1].p50_ms:.2f} ms, "
                  f"p99 {results[-1].p99_ms:.2f} ms", flush=True)
        finally:
            proc.terminate()
            proc.wait(10)
    server.server.shutdown()
    return results


def run() -> tuple[list[Result], list[Latency]]:
    return parse_costs(), latency_while_parsing()



def markdown(costs: list[Result], latencies: list[Latency]) -> list[str]:
    lines = [
        "## dcgm-exporter bodies: parse cost, and our /metrics meanwhile",
        "",
        "A real dcgm-exporter output (an L40S node, tests/dcgm_corpus/) grown as `--kubernetes` grows it on a "
        "shared node (each series repeated per pod) to 1 MB and 15 MB (the cap is 16 MiB). CPU per parse, "
        f"median of {ROUNDS}, ours against prometheus-client's parser line by line (the former "
        "parse). Then a daemon reading that body every second (dcgm.mode=exporter) is scraped "
        f"{SCRAPES} times. Target: linear, and /metrics unaffected.",
        "",
        "| body | lines | our parse | prometheus-client | ratio | our /metrics p50 | p99 | fetches meanwhile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cost, latency in zip(costs, latencies, strict=True):
        lines.append(f"| {cost.size / 1e6:.1f} MB | {cost.lines:,} | {cost.ours_ms:.0f} ms | {cost.client_ms:.0f} ms | "
                     f"{cost.ratio:.1f}x | {latency.p50_ms:.2f} ms | {latency.p99_ms:.2f} ms | {latency.collections} |")
    return lines


def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(*run()))

if __name__ == "__main__":
    run()
