"""Soak: a daemon on a node whose jobs come and go, for an hour. Does its memory level off?

One daemon (`goodput-exporter serve --simulate 8 --ingest.idle-timeout 60s`, a state directory and a flight
directory, everything else default) takes a new training workload every 2 s from the real client
(`goodput_client.Telemetry`): 4 ranks (threads of one driver process), about 20 steps each of a 50 ms compute
phase, then `end`. Every 10 s a new workload's flight-recorder folder appears (real PyTorch dumps from
tests/flight/dumps/healthy2, copied under a new name). /metrics is scraped every 5 s, as Prometheus would.

Every minute: the daemon's RSS (VmRSS of /proc/PID/status), its series count (the /metrics page's sample lines),
its open files (/proc/PID/fd) and the client's sent/dropped events. The result: RSS every minute, the least-squares
slope of the last 30 minutes (or of the second half of a shorter run), the peak RSS, and series and open files over
time.

    python bench/soak.py [minutes] [--no-flight]   # default 60 minutes; prints the markdown section
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "client"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goodput_client import Telemetry  # noqa: E402
from serving import free_port, get_text, stop, wait_ready  # noqa: E402

WORKLOAD_EVERY = 2.0  # seconds between two new workloads
RANKS = 4
STEPS = 20
COMPUTE = 0.05  # seconds of each step's compute phase
FLIGHT_EVERY = 10.0  # seconds between two new flight-recorder folders
FLIGHT_SCENARIO = ROOT / "tests" / "flight" / "dumps" / "healthy2"
SCRAPE_EVERY = 5.0
SLOPE_MINUTES = 30


@dataclass
class Sample:
    minute: float
    rss_mib: float
    series: int
    open_files: int
    sent: int
    dropped: int


@dataclass
class Churn:
    """The driver's totals, shared by its threads."""

    sent: int = 0
    dropped: int = 0
    workloads: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _rank(name: str, rank: int, sock: str, churn: Churn) -> None:
    try:
        telemetry = Telemetry(name, rank, socket_path=sock, flush_interval=0.2, captures=False)
        for _ in range(STEPS):
            with telemetry.step(tokens=4096, samples=8), telemetry.phase("compute"):
                time.sleep(COMPUTE)
        telemetry.close()
        with churn.lock:
            churn.sent += telemetry.sent
            churn.dropped += telemetry.dropped
    except Exception as exc:  # counted and shown: the soak goes on
        with churn.lock:
            churn.errors.append(f"{name}/{rank}: {exc!r}")


def _workloads(sock: str, churn: Churn, stop_at: float) -> None:
    threads: list[threading.Thread] = []
    n = 0
    next_at = time.monotonic()
    while time.monotonic() < stop_at:
        name = f"soak-{n:06d}"
        for rank in range(RANKS):
            thread = threading.Thread(target=_rank, args=(name, rank, sock, churn), daemon=True)
            thread.start()
            threads.append(thread)
        n += 1
        with churn.lock:
            churn.workloads = n
        threads = [t for t in threads if t.is_alive()]
        next_at += WORKLOAD_EVERY
        time.sleep(max(0.0, next_at - time.monotonic()))
    for thread in threads:
        thread.join(30)


def _flight(root: Path, stop_at: float) -> None:
    n = 0
    while time.monotonic() < stop_at:
        target = root / f"soak-flight-{n:06d}"
        shutil.copytree(FLIGHT_SCENARIO, target)
        now = time.time()
        for path in target.iterdir():
            os.utime(path, (now, now))
        n += 1
        time.sleep(FLIGHT_EVERY)


def _series(page: str) -> int:
    return sum(1 for line in page.splitlines() if line and line[0] != "#")


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def run(minutes: float, flight: bool = True) -> tuple[list[Sample], Churn, float]:
    """The churn for `minutes`; returns the samples, the driver's totals and the daemon's CPU seconds."""
    with tempfile.TemporaryDirectory(prefix="goodput-soak-") as tmp:
        work = Path(tmp)
        sock, port = str(work / "events.sock"), free_port()
        (work / "flight").mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--simulate", "8", "--web.listen-address", f"127.0.0.1:{port}",
             "--ingest.socket-path", sock, "--ingest.idle-timeout", "60s", "--ingest.state-dir", str(work / "state"),
             "--flight.dir", str(work / "flight")],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/readyz", timeout=60)
            start = time.monotonic()
            stop_at = start + minutes * 60
            churn = Churn()
            driver = threading.Thread(target=_workloads, args=(sock, churn, stop_at), daemon=True)
            driver.start()
            flights = threading.Thread(target=_flight, args=(work / "flight", stop_at), daemon=True)
            if flight:
                flights.start()
            samples: list[Sample] = []
            next_sample = start
            page = ""
            while True:
                now = time.monotonic()
                if now >= next_sample:
                    with churn.lock:
                        sent, dropped = churn.sent, churn.dropped
                    page = get_text(port, "/metrics", timeout=30)
                    samples.append(Sample((now - start) / 60, _rss_mib(proc.pid), _series(page),
                                          len(os.listdir(f"/proc/{proc.pid}/fd")), sent, dropped))
                    next_sample += 60
                    if now >= stop_at:
                        break
                else:
                    get_text(port, "/metrics", timeout=30)
                time.sleep(min(SCRAPE_EVERY, max(0.0, next_sample - time.monotonic())))
            driver.join(60)
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        finally:
            stop(proc)
    return samples, churn, cpu


def section(minutes: float = 60.0, flight: bool = True) -> str:
    """The soak's markdown section for results.md (`flight`: with the flight-recorder folders' churn)."""
    samples, churn, cpu = run(minutes, flight)
    last = samples[-1]
    window = [s for s in samples if s.minute >= last.minute - SLOPE_MINUTES] if last.minute >= 2 * SLOPE_MINUTES \
        else samples[len(samples) // 2:]
    slope = _slope([(s.minute, s.rss_mib) for s in window])
    peak = max(s.rss_mib for s in samples)
    lines = [
        "## Soak: RSS under workload churn",
        "",
        f"`python bench/soak.py {minutes:g}`: one daemon (`serve --simulate 8 --ingest.idle-timeout 60s`, a state "
        f"and a flight directory), a new workload every {WORKLOAD_EVERY:g} s from the real client ({RANKS} ranks, "
        f"{STEPS} steps, then `end`), "
        + (f"a new flight-recorder folder every {FLIGHT_EVERY:g} s" if flight else "no flight-recorder folders")
        + f", /metrics scraped every "
        f"{SCRAPE_EVERY:g} s. {churn.workloads} workloads, {churn.sent} events accepted, {churn.dropped} dropped, "
        f"{len(churn.errors)} client errors; daemon CPU {cpu / max(last.minute, 1e-9):.1f} s/min.",
        "",
        f"RSS slope over minutes {window[0].minute:.0f}-{last.minute:.0f}: **{slope:+.3f} MiB/min**; "
        f"peak RSS **{peak:.1f} MiB**.",
        "",
        "| minute | RSS MiB | series | open files | events sent | dropped |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {s.minute:.0f} | {s.rss_mib:.1f} | {s.series} | {s.open_files} | {s.sent} | {s.dropped} |"
              for s in samples]
    if churn.errors:
        lines += ["", f"First client error: `{churn.errors[0]}`"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    print(section(float(numbers[0]) if numbers else 60.0, flight="--no-flight" not in sys.argv[1:]))
