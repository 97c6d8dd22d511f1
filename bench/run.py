"""`make bench`: scrape latency, CPU, memory and idle accuracy; writes bench/results.md.

Latency is measured side by side in one run against Debian's prometheus-node-exporter on the same
machine, scraped the same way (keep-alive HTTP/1.1, Accept-Encoding: gzip, as Prometheus does),
alternating request by request so both see the same machine noise.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adaptive
import attribution
import backend_cost
import changepoint
import client_ingest
import cpu_split
import dcgm_parse
import fabric_collect
import flight_parse
import idle_accuracy
import rules_scale
import server_limits
from serving import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.md"
WORK = ROOT / "bench" / ".work"
REQUESTS = 1500
GAP = 0.01  # seconds between request pairs; snapshots change every second meanwhile
CPU_WINDOW = 60.0
HEADERS = {"Accept-Encoding": "gzip", "Accept": "text/plain"}


def count_series(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_exporter(gpus: int, profile_to: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon's own command line; with `profile_to`, under bench/cpu_split.py's sampler."""
    port = free_port()
    launcher = ([str(ROOT / ".venv" / "bin" / "goodput-exporter")] if profile_to is None else
                [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "bench" / "cpu_split.py"), str(profile_to)])
    proc = subprocess.Popen(
        [*launcher, "serve", "--simulate", str(gpus),
         "--nvml.interval", "1s", "--host.interval", "1s", "--web.listen-address", f"127.0.0.1:{port}",
         "--log.level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, "/readyz")
    return proc, port


def latency_pair(ours: int, theirs: int) -> tuple[list[float], list[float]]:
    conns = {port: http.client.HTTPConnection("127.0.0.1", port, timeout=5) for port in (ours, theirs)}
    timings: dict[int, list[float]] = {ours: [], theirs: []}
    for i in range(REQUESTS + 50):
        for port in (ours, theirs) if i % 2 else (theirs, ours):
            conn = conns[port]
            started = time.perf_counter()
            conn.request("GET", "/metrics", headers=HEADERS)
            response = conn.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                raise RuntimeError(f"port {port} answered {response.status}")
            if i >= 50:  # warm-up excluded
                timings[port].append(elapsed * 1000)
        time.sleep(GAP)
    return timings[ours], timings[theirs]


def scrape_every_15s(port: int) -> float:
    """Scrapes every 15 s over CPU_WINDOW, as Prometheus does; returns the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < CPU_WINDOW:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics", headers=HEADERS)
        conn.getresponse().read()
        time.sleep(min(15.0, max(0.0, CPU_WINDOW - (time.monotonic() - began))))
    return time.monotonic() - began


def cpu_per_minute(proc: subprocess.Popen[bytes], port: int) -> float:
    """Daemon CPU over CPU_WINDOW with a scrape every 15 s, as under Prometheus."""
    start = cpu_seconds(proc.pid)
    elapsed = scrape_every_15s(port)
    return (cpu_seconds(proc.pid) - start) / elapsed * 60


def profiled_split(gpus: int) -> dict:
    """The daemon under bench/cpu_split.py's sampler, over the same load as `cpu_per_minute`: its CPU by
    category (simulator, sources, core, http, other)."""
    WORK.mkdir(parents=True, exist_ok=True)
    out = WORK / f"cpu-split-{gpus}.json"
    out.unlink(missing_ok=True)
    proc, port = start_exporter(gpus, profile_to=out)
    try:
        time.sleep(3)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.1)
        scrape_every_15s(port)
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # written by the daemon's main thread: let it finish
        return json.loads(out.read_text())
    finally:
        proc.terminate()
        proc.wait(10)


def daemon_rows(gpu_counts: list[int]) -> tuple[list, list]:
    """Latency side by side with node_exporter, CPU and RSS per GPU count; then the CPU split of a profiled run."""
    node_exporter = shutil.which("prometheus-node-exporter")
    if node_exporter is None:
        sys.exit("prometheus-node-exporter not installed: run `make deps`")
    node_port = free_port()
    node = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{node_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_ready(node_port, "/metrics")
        node_series = count_series(node_port)
        for gpus in gpu_counts:
            proc, port = start_exporter(gpus)
            try:
                time.sleep(3)
                ours_series = count_series(port)
                ours, theirs = latency_pair(port, node_port)
                cpu = cpu_per_minute(proc, port)
                rows.append((gpus, ours_series, ours, node_series, theirs, cpu, peak_rss_mb(proc.pid)))
                print(f"{gpus} GPUs: p99 ours {percentile(ours, 0.99):.2f} ms, node_exporter "
                      f"{percentile(theirs, 0.99):.2f} ms; CPU {cpu:.3f} s/min; peak RSS "
                      f"{peak_rss_mb(proc.pid):.1f} MB", flush=True)
            finally:
                proc.terminate()
                proc.wait(10)
    finally:
        node.terminate()
        node.wait(10)
    splits = []
    for gpus in gpu_counts:
        split = profiled_split(gpus)
        splits.append((gpus, split))
        shares = split_shares(split)
        print(f"{gpus} GPUs, CPU split: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()), flush=True)
    return rows, splits


def split_shares(split: dict) -> dict[str, float]:
    categories = split["categories"]
    total = sum(categories.values()) or 1.0
    return {name: categories[name] / total for name in cpu_split.CATEGORIES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemon-only", action="store_true",
                        help="only the daemon's latency, CPU, memory and CPU split; print them, leave results.md")
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64], help="simulated GPU counts (default 8 64)")
    args = parser.parse_args()
    rows, splits = daemon_rows(args.gpus)
    if args.daemon_only:
        print("\n".join(daemon_markdown(rows, splits)))
        return
    accuracy = idle_accuracy.run()
    client_costs = client_ingest.hot_path_microseconds()
    throughput = client_ingest.ingest_events_per_second()
    imported = client_ingest.import_microseconds()
    flight = flight_parse.run()
    dcgm = dcgm_parse.run()
    fabric = fabric_collect.run()
    scale = rules_scale.run()
    cost = backend_cost.run()
    limits = server_limits.run()
    attributed = attribution.run()
    adapted = adaptive.run()
    steps = changepoint.run()
    write(rows, splits, accuracy, client_costs, throughput, imported, flight, dcgm, fabric, scale, cost, attributed,
          adapted, steps, limits)
    print(f"wrote {RESULTS.relative_to(ROOT)}")


def daemon_markdown(rows: list, splits: list) -> list[str]:
    lines = [
        "## Scrape latency, side by side with node_exporter",
        "",
        f"{REQUESTS} scrapes each, alternating between the two servers request by request, keep-alive, "
        "`Accept-Encoding: gzip`. Targets: p99 < 2 ms at 8 GPUs, < 10 ms at 64.",
        "",
        "| GPUs | our series | our p50 | our p99 | node_exporter series | node_exporter p50 | "
        "node_exporter p99 | p99 ratio (ours / node_exporter) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gpus, ours_series, ours, node_series, theirs, _cpu, _rss in rows:
        lines.append(
            f"| {gpus} | {ours_series} | {percentile(ours, 0.5):.2f} ms | {percentile(ours, 0.99):.2f} ms | "
            f"{node_series} | {percentile(theirs, 0.5):.2f} ms | {percentile(theirs, 0.99):.2f} ms | "
            f"{percentile(ours, 0.99) / percentile(theirs, 0.99):.2f} |")
    lines += [
        "",
        "## Daemon CPU and memory",
        "",
        f"CPU seconds per minute over {CPU_WINDOW:.0f} s with a scrape every 15 s (target < 0.3 s/min at 8 GPUs); "
        "peak RSS is VmHWM at the end of the run (target < 80 MB).",
        "",
        "| GPUs | CPU s/min | share of one core | peak RSS |",
        "|---|---|---|---|",
    ]
    for gpus, _s, _o, _n, _t, cpu, rss in rows:
        lines.append(f"| {gpus} | {cpu:.3f} | {cpu / 60:.2%} | {rss:.1f} MB |")
    cpu_by_gpus = {row[0]: row[5] for row in rows}
    lines += [
        "",
        "### CPU split: simulator vs exporter",
        "",
        "The simulated GPUs run inside the daemon, so the CPU above includes them. A second daemon per GPU count ran "
        f"the same {CPU_WINDOW:.0f} s load under `bench/cpu_split.py`, which times the boundaries between the parts "
        "on each thread's own CPU clock and charges every call to the innermost part (the timing's own cost, "
        "calibrated, taken off): *simulator* (the simulated NVML/DCGM backends' methods), *sources* (each source's "
        "`collect()` less the simulator calls in it), *core* (`exporter/core/`: rendering and publishing a batch, "
        "the self-metrics, joining and compressing for a scrape), *HTTP* (the rest of the server's thread: uvicorn, "
        "starlette, asyncio), *other* (the rest: runner loops, executor threads). The shares are the profiled run's; "
        "*exporter alone* applies the non-simulator share to the unprofiled CPU figure above.",
        "",
        "| GPUs | profiled CPU s/min | simulator | sources | core | HTTP | other | exporter alone, s/min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gpus, split in splits:
        shares = split_shares(split)
        profiled = split["process_cpu_s"] / split["window_s"] * 60
        alone = cpu_by_gpus.get(gpus, float("nan")) * (1 - shares["simulator"])
        cells = " | ".join(f"{shares[name]:.1%}" for name in cpu_split.CATEGORIES)
        lines.append(f"| {gpus} | {profiled:.3f} | {cells} | {alone:.3f} |")
    return lines


def dcgm_markdown(costs: list[dcgm_parse.Result], latencies: list[dcgm_parse.Latency]) -> list[str]:
    lines = [
        "",
        "## dcgm-exporter bodies: parse cost, and our /metrics meanwhile",
        "",
        "A real dcgm-exporter output (an L40S node, tests/dcgm_corpus/) grown as `--kubernetes` grows it on a "
        "shared node (each series repeated per pod) to 1 MB and 15 MB (the cap is 16 MiB). CPU per parse, "
        f"median of {dcgm_parse.ROUNDS}, ours against prometheus-client's parser line by line (the former "
        "parse). Then a daemon reading that body every second (dcgm.mode=exporter) is scraped "
        f"{dcgm_parse.SCRAPES} times. Target: linear, and /metrics unaffected.",
        "",
        "| body | lines | our parse | prometheus-client | ratio | our /metrics p50 | p99 | fetches meanwhile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cost, latency in zip(costs, latencies, strict=True):
        lines.append(f"| {cost.size / 1e6:.1f} MB | {cost.lines:,} | {cost.ours_ms:.0f} ms | {cost.client_ms:.0f} ms | "
                     f"{cost.ratio:.1f}x | {latency.p50_ms:.2f} ms | {latency.p99_ms:.2f} ms | {latency.collections} |")
    return lines


def write(rows: list, splits: list, accuracy: list[idle_accuracy.Result], client_costs: tuple[float, float],
          throughput: float, imported: int, flight: list[flight_parse.Result],
          dcgm: tuple[list[dcgm_parse.Result], list[dcgm_parse.Latency]], fabric: fabric_collect.Result,
          scale: rules_scale.Result, cost: backend_cost.Result, attributed: attribution.Result,
          adapted: adaptive.Result, steps: changepoint.Result, limits: server_limits.Result) -> None:
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {datetime.date.today()} on this machine: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.machine()}. Simulated GPUs (the simulator's own "
        "cost is included in the exporter's CPU figures, and shown apart under *CPU split*), sources at 1 s "
        "intervals.",
        "",
    ]
    lines += daemon_markdown(rows, splits)
    lines += [
        "",
        "## Idle fraction: integrated counter vs utilization-gauge average",
        "",
        "One simulated hour per pattern, NVML polled every 1 s, scraped every 15 s. *Integrated* is",
        "`rate(goodput_gpu_idle_seconds_total) / rate(goodput_gpu_sampled_seconds_total)`; *gauge* is",
        "`1 - avg_over_time(goodput_gpu_utilization_ratio)` from the scraped samples. Errors are in",
        "percentage points of idle fraction.",
        "",
        "| pattern | true idle | integrated | error | gauge average | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in accuracy:
        lines.append(
            f"| {r.pattern} | {r.truth:.2%} | {r.integrated:.2%} | {r.integrated_error * 100:+.2f} pp | "
            f"{r.gauge:.2%} | {r.gauge_error * 100:+.2f} pp |")
    lines += [
        "",
        "## Training client and ingest",
        "",
        "Client hot path: the cost the training loop pays per recorded phase (best of 5 x 200,000, queueing",
        f"only; target < 5 µs). Ingest: one client posting batches of {client_ingest.BATCH} phase events over the",
        f"Unix socket, {client_ingest.REQUESTS} requests, JSON encoding included (target > 50,000 events/s).",
        "Import: `python -X importtime -c 'import goodput_client'` in a fresh venv holding only the client, the",
        f"cumulative figure, best of {client_ingest.IMPORT_RUNS} (target < 30 ms).",
        "",
        "| measure | result |",
        "|---|---|",
        f"| `with telemetry.phase(...)` | {client_costs[0]:.2f} µs |",
        f"| `telemetry.record_phase(...)` | {client_costs[1]:.2f} µs |",
        f"| ingest throughput | {throughput:,.0f} events/s |",
        f"| `import goodput_client` | {imported / 1000:.1f} ms |",
        "",
        "## Flight-recorder dumps: safe parse vs pickle.load",
        "",
        f"{flight_parse.RANKS} ranks x {flight_parse.ENTRIES:,}-entry dumps, real (PyTorch's gloo flight recorder "
        f"after {flight_parse.ENTRIES:,}+ collectives), median of {flight_parse.ROUNDS} rounds over all files. "
        "*Safe parse* is what the daemon does with a new dump: sent to",
        "its memory-limited parser process, the restricted unpickler, the schema check, the extraction and "
        "the counting with the garbage collector paused, and a summary sent back. "
        "Target: within 1.5x of plain `pickle.load`.",
        "",
        "| dump | size per file | `pickle.load` | `pickle.load`, GC paused | safe parse | ratio | ratio to GC-paused "
        "| flight source, first pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in flight:
        lines.append(
            f"| {r.variant} | {r.file_bytes / 1024:.0f} KiB | {r.plain_ms:.0f} ms | {r.paused_ms:.0f} ms | "
            f"{r.safe_ms:.0f} ms | {r.ratio:.2f} | {r.paused_ratio:.2f} | {r.source_ms:.0f} ms |")
    lines += dcgm_markdown(*dcgm)
    lines += fabric_collect.markdown(fabric)
    lines += ["", *rules_scale.markdown(scale)]
    lines += backend_cost.markdown(cost)
    lines += attribution.markdown(attributed)
    lines += adaptive.markdown(adapted)
    lines += changepoint.markdown(steps)
    lines += server_limits.markdown(limits)
    RESULTS.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
