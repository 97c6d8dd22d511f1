"""The daemon's CPU when nothing scrapes it: `goodput-exporter serve` at its defaults, read from /proc.

Each case starts the daemon's own command line (every default source on; its sockets and directories in a temporary
directory, so that it shares nothing with another daemon on the machine), waits WARMUP seconds, then reads the
process' CPU time (user + system, /proc/PID/stat) over WINDOW seconds. A process' own CPU time is what it ran, so
other load on the machine changes it little (some: a busy machine's caches are colder).

Cases: 8 and 64 simulated GPUs (two runs each), and a node with no NVML library at all (the real backend, whose
library cannot be loaded here), measured after its first minute, when its retries have backed off.

    python bench/idle_cpu.py [--window 60] [--only 8,64,none]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent
EXPORTER = ROOT / ".venv" / "bin" / "goodput-exporter"
WARMUP = 10.0
WINDOW = 60.0
NO_NVML_WARMUP = 60.0  # the acceptance reads a node without NVML after its first minute
TARGETS = {"8": 0.3, "64": 0.6, "none": 0.15}  # CPU seconds per minute


@dataclass
class Result:
    case: str  # "8", "64" (simulated GPUs) or "none" (no NVML library)
    runs: list[float]  # CPU seconds per minute, one per run
    rss_mb: float  # the last run's peak RSS
    warmup: float
    window: float

    @property
    def target(self) -> float:
        return TARGETS[self.case]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def private_args(work: Path) -> list[str]:
    """Flags that give a daemon its own socket and directories (the defaults are the node's, under /run)."""
    return ["--ingest.socket-path", str(work / "ingest.sock"), "--ingest.capture-dir", str(work / "captures"),
            "--flight.dir", str(work / "flight"), "--log.level", "warning"]


def start(args: list[str], work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([str(EXPORTER), "serve", *args, "--web.listen-address", f"127.0.0.1:{port}",
                             *private_args(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, "/healthz")
    return proc, port


def measure(args: list[str], warmup: float, window: float) -> tuple[float, float]:
    """CPU seconds per minute over `window` after `warmup`, and peak RSS (MB)."""
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        proc, _port = start(args, Path(tmp))
        try:
            time.sleep(warmup)
            before, began = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(window)
            used, elapsed = cpu_seconds(proc.pid) - before, time.monotonic() - began
            return used / elapsed * 60, peak_rss_mb(proc.pid)
        finally:
            stop(proc)


CASES = {"8": ["--simulate", "8"], "64": ["--simulate", "64"], "none": []}


def run(cases: tuple[str, ...] = ("8", "64", "none"), runs: int = 2, window: float = WINDOW) -> list[Result]:
    results = []
    for case in cases:
        warmup = NO_NVML_WARMUP if case == "none" else WARMUP
        figures = [measure(CASES[case], warmup, window) for _ in range(1 if case == "none" else runs)]
        results.append(Result(case, [cpu for cpu, _ in figures], figures[-1][1], warmup, window))
        print(f"idle, {label(case)}: " + ", ".join(f"{cpu:.3f}" for cpu, _ in figures) + " s/min", flush=True)
    return results


def label(case: str) -> str:
    return "no NVML library" if case == "none" else f"{case} simulated GPUs"


def markdown(results: list[Result]) -> list[str]:
    lines = [
        "",
        "## Idle CPU: nothing scraping",
        "",
        "`goodput-exporter serve` at its defaults (every default source on), nothing scraping it; the daemon's own CPU "
        "time from /proc over a window after a warm-up (`bench/idle_cpu.py`). *No NVML library*: the real backend on "
        "a node without the driver's library, read after its first minute (NVML's initialisation retried with "
        "backoff).",
        "",
        "| case | warm-up | window | CPU s/min, each run | target | peak RSS |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {label(r.case)} | {r.warmup:.0f} s | {r.window:.0f} s | "
                     f"{', '.join(f'{cpu:.3f}' for cpu in r.runs)} | < {r.target:g} | {r.rss_mb:.1f} MB |")
    return lines


def section() -> str:
    return "\n".join(markdown(run()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=WINDOW)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default="8,64,none", help="cases, comma-separated: 8, 64, none")
    args = parser.parse_args()
    print("\n".join(markdown(run(tuple(args.only.split(",")), args.runs, args.window))))


if __name__ == "__main__":
    main()
