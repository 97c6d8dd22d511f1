"""The daemon's cost, side by side with node_exporter: scrape latency, CPU with a scrape every 15 s, peak RSS, and
where the CPU goes (bench/cpu_split.py), at 8 and 64 simulated GPUs, every source at its default interval.

Latency is measured side by side in one run against Debian's prometheus-node-exporter on the same machine, scraped
the same way (keep-alive HTTP/1.1, Accept-Encoding: gzip, as Prometheus does), alternating request by request so
both see the same machine noise.

    python bench/daemon_cost.py [--gpus 8 64]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_split
from idle_cpu import cpu_seconds, peak_rss_mb, private_args
from serving import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work"
REQUESTS = 1500
GAP = 0.01  # seconds between request pairs
CPU_WINDOW = 60.0
HEADERS = {"Accept-Encoding": "gzip", "Accept": "text/plain"}
GPU_COUNTS = (8, 64)
TARGETS = {8: 0.3, 64: 0.6}  # CPU seconds per minute


def count_series(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_exporter(gpus: int, profile_to: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon's own command line at its defaults (its socket and directories its own: `idle_cpu.private_args`);
    with `profile_to`, under bench/cpu_split.py's sampler."""
    port = free_port()
    launcher = ([str(ROOT / ".venv" / "bin" / "goodput-exporter")] if profile_to is None else
                [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "bench" / "cpu_split.py"), str(profile_to)])
    WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="daemon-", dir=WORK))  # bench/.work: `make clean` removes it
    proc = subprocess.Popen(
        [*launcher, "serve", "--simulate", str(gpus), "--web.listen-address", f"127.0.0.1:{port}",
         *private_args(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def daemon_markdown(rows: list, splits: list) -> list[str]:
    lines = [
        "## Scrape latency, side by side with node_exporter",
        "",
        "`goodput-exporter serve --simulate N` at its defaults (every default source on, each at its default "
        "interval). "
        f"{REQUESTS} scrapes each, alternating between the two servers request by request, keep-alive, "
        "`Accept-Encoding: gzip`. Targets: p99 < 2 ms at 8 GPUs, < 10 ms at 64, and at least 4x faster than "
        "node_exporter.",
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
        f"The daemon's CPU seconds per minute (its own, from /proc) over {CPU_WINDOW:.0f} s with a scrape every 15 s, "
        "as under Prometheus, after the latency run above; peak RSS is VmHWM at the end of the run. Targets: "
        + ", ".join(f"< {target:g} s/min at {gpus} GPUs" for gpus, target in TARGETS.items())
        + "; RSS < 80 MB. With nothing scraping: *Idle CPU* below.",
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


def section(gpu_counts: tuple[int, ...] = GPU_COUNTS) -> str:
    return "\n".join(daemon_markdown(*daemon_rows(list(gpu_counts))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=list(GPU_COUNTS), help="simulated GPU counts")
    print(section(tuple(parser.parse_args().gpus)))


if __name__ == "__main__":
    main()
