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

    python bench/soak.py [minutes] [--no-flight] [--tracemalloc DIR]   # default 60 minutes; prints the section

The daemon's RSS is its own; its children's (the flight parser process) is shown beside it. --tracemalloc runs the
daemon under tracemalloc (bench/traced_daemon.py), takes a snapshot at minutes 10, 20, 30, 45 and the end into DIR, and
prints what grew most between the last two, by where it was allocated.
"""

from __future__ import annotations

import contextlib
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
    children_mib: float
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


def _children_rss_mib(pid: int) -> float:
    """The summed RSS of the process's children (the flight parser), 0 when it has none."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            with contextlib.suppress(OSError, RuntimeError):  # the child may have just exited
                total += _rss_mib(int(child))
    return total


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


SNAPSHOT_MINUTES = (10, 20, 30, 45)  # with --tracemalloc, and one more at the end


def _snapshot(folder: Path, name: str) -> None:
    """Ask bench/traced_daemon.py for a snapshot and wait until it is written."""
    (folder / f"take-{name}").touch()
    deadline = time.monotonic() + 300
    while (folder / f"take-{name}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)


def run(minutes: float, flight: bool = True, traced: Path | None = None) -> tuple[list[Sample], Churn, float]:
    """The churn for `minutes`; returns the samples, the driver's totals and the daemon's CPU seconds.
    `traced`: a folder for tracemalloc snapshots (the daemon then runs under bench/traced_daemon.py)."""
    with tempfile.TemporaryDirectory(prefix="goodput-soak-") as tmp:
        work = Path(tmp)
        sock, port = str(work / "events.sock"), free_port()
        (work / "flight").mkdir()
        launcher = [sys.executable, "-m", "exporter"] if traced is None else \
            [sys.executable, str(Path(__file__).resolve().parent / "traced_daemon.py"), str(traced)]
        if traced is not None:
            traced.mkdir(parents=True, exist_ok=True)
        snapshots = [m for m in SNAPSHOT_MINUTES if m < minutes] if traced is not None else []
        proc = subprocess.Popen(
            [*launcher, "serve", "--simulate", "8", "--web.listen-address", f"127.0.0.1:{port}",
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
                    samples.append(Sample((now - start) / 60, _rss_mib(proc.pid), _children_rss_mib(proc.pid),
                                          _series(page), len(os.listdir(f"/proc/{proc.pid}/fd")), sent, dropped))
                    next_sample += 60
                    due = bool(snapshots) and samples[-1].minute >= snapshots[0]
                    if traced is not None and (due or now >= stop_at):
                        _snapshot(traced, f"{round(samples[-1].minute):03d}")
                        snapshots = snapshots[1:] if due else snapshots
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


def growth(folder: Path, top: int = 15) -> str:
    """What grew most between the last two tracemalloc snapshots in `folder`, by allocation site."""
    import tracemalloc

    names = sorted(folder.glob("*.snap"))
    if len(names) < 2:
        return f"(fewer than two snapshots in {folder})"
    old, new = (tracemalloc.Snapshot.load(str(p)) for p in names[-2:])
    lines = [f"tracemalloc: {names[-2].stem} -> {names[-1].stem} minutes, traced total "
             f"{sum(s.size for s in old.statistics('filename')) / 2**20:.1f} -> "
             f"{sum(s.size for s in new.statistics('filename')) / 2**20:.1f} MiB"]
    for stat in new.compare_to(old, "traceback")[:top]:
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks (now {stat.size / 1024:.1f} KiB)")
        lines += [f"      {frame}" for frame in stat.traceback.format(limit=6)]
    return "\n".join(lines)


def section(minutes: float = 60.0, flight: bool = True, traced: Path | None = None) -> str:
    """The soak's markdown section for results.md (`flight`: with the flight-recorder folders' churn)."""
    samples, churn, cpu = run(minutes, flight, traced)
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
        f"peak RSS **{peak:.1f} MiB**. The flight parser process beside it: {window[0].children_mib:.1f} -> "
        f"{last.children_mib:.1f} MiB over the same minutes "
        f"(slope {_slope([(s.minute, s.children_mib) for s in window]):+.3f} MiB/min).",
        "",
        "| minute | RSS MiB | parser MiB | series | open files | events sent | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {s.minute:.0f} | {s.rss_mib:.1f} | {s.children_mib:.1f} | {s.series} | {s.open_files} | {s.sent} "
              f"| {s.dropped} |" for s in samples]
    if churn.errors:
        lines += ["", f"First client error: `{churn.errors[0]}`"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    traced_dir = Path(args[args.index("--tracemalloc") + 1]) if "--tracemalloc" in args else None
    numbers = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--tracemalloc")]
    print(section(float(numbers[0]) if numbers else 60.0, flight="--no-flight" not in args, traced=traced_dir))
    if traced_dir is not None:
        print(growth(traced_dir))
