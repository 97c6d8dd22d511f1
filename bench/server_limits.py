"""Server limits: a concurrent scraper and a job's client while another local user holds 20,000 idle connections or
sends 64 MiB request headers.

One daemon (`goodput-exporter serve`, 8 simulated GPUs, default limits) is scraped back to back over one keep-alive
connection, as Prometheus does (Accept-Encoding: gzip; a request on a kept connection that the daemon closed
meanwhile is sent again on a new one, as Go's HTTP client does, and counted as a reconnect). Meanwhile:

* idle, same address: child processes open 20,000 connections to the metrics port from 127.0.0.1 (the scraper's
  address), as fast as they can, and hold them without sending a byte;
* idle, other address: the same from 127.0.0.2 (a scraper elsewhere, an attacker on the node);
* idle events: 20,000 connections to the events socket, while the training client's transport
  (goodput_client.transport) posts a step event every 10 ms;
* 64 MiB header: requests whose one header is 64 MiB long, to the metrics port and the events socket in turn, for
  5 s; and, for comparison, one to a daemon whose bound is lifted (web.max_header_bytes 1 GiB).

For each phase: the scrape (or post) latency percentiles, failures, the daemon's most open files and its peak RSS.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "client"))

from goodput_client.transport import Transport  # noqa: E402
from serving import free_port, wait_ready  # noqa: E402

from exporter.config import load  # noqa: E402

GPUS = 8
IDLE = 20_000
ATTACKERS = 2  # child processes holding IDLE / ATTACKERS connections each (a process's open files are limited)
HOLD = 5.0  # seconds the connections are held once all are open
BASELINE = 500  # scrapes before anything happens
GAP = 0.01  # seconds between two scrapes (or posts)
HEADER = 64 * 2**20
HEADERS = {"Accept-Encoding": "gzip", "Accept": "text/plain"}

# a child process: opens COUNT connections to TARGET (unix:PATH or HOST:PORT from SOURCE), prints how many it got,
# holds them until its stdin closes
ATTACKER = r"""
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
target, source, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
held, failed = [], 0
for _ in range(count):
    try:
        if target.startswith("unix:"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(target[5:])
        else:
            host, port = target.rsplit(":", 1)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((source, 0))
            sock.connect((host, int(port)))
    except OSError:
        failed += 1
        continue
    held.append(sock)
print(len(held), failed, flush=True)
sys.stdin.read()
"""


@dataclass
class Phase:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0
    reconnects: int = 0
    fds_max: int = 0
    rss_peak_mb: float = 0.0
    note: str = ""

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class HeaderRow:
    target: str
    answers: list[str] = field(default_factory=list)  # each answer's status code, or what happened
    seconds: list[float] = field(default_factory=list)  # from the first byte sent to the answer
    rss_growth_mb: float = 0.0  # of the daemon's peak RSS over all of them


@dataclass
class Result:
    phases: list[Phase]
    headers: list[HeaderRow]
    limits: dict[str, str]


class Daemon:
    def __init__(self, *flags: str) -> None:
        self.workdir = tempfile.mkdtemp(prefix="gp-bench-limits-")
        self.socket = f"{self.workdir}/ingest.sock"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--simulate", str(GPUS), "--web.listen-address",
             f"127.0.0.1:{self.port}", "--log.level", "error", "--ingest.socket-path", self.socket,
             "--flight.dir", f"{self.workdir}/flight", *flags],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(self.port, "/readyz", timeout=60)
        except RuntimeError:
            self.stop()
            raise

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Scraper(threading.Thread):
    """Scrapes /metrics back to back on one kept connection until stopped; a kept connection that the daemon
    closed meanwhile is replaced and the request sent again (a reconnect), as Prometheus's client does."""

    def __init__(self, port: int, phase: Phase) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.phase = phase
        self.halt = threading.Event()
        self.conn: http.client.HTTPConnection | None = None

    def _once(self) -> None:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.conn.request("GET", "/metrics", headers=HEADERS)
        response = self.conn.getresponse()
        response.read()
        if response.status != 200:
            raise http.client.HTTPException(f"status {response.status}")

    def scrape(self) -> None:
        started = time.perf_counter()
        reused = self.conn is not None
        try:
            self._once()
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            if not reused:
                self.phase.failed += 1
                return
            self.phase.reconnects += 1
            try:
                self._once()
            except (OSError, http.client.HTTPException):
                self.phase.failed += 1
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                return
        self.phase.latencies_ms.append((time.perf_counter() - started) * 1000)

    def run(self) -> None:
        while not self.halt.is_set():
            self.scrape()
            time.sleep(GAP)


class Poster(threading.Thread):
    """Posts one step event every GAP seconds through the training client's own transport."""

    def __init__(self, path: str, phase: Phase) -> None:
        super().__init__(daemon=True)
        self.transport = Transport(socket_path=path, timeout=10)
        self.phase = phase
        self.halt = threading.Event()

    def run(self) -> None:
        step = 0
        while not self.halt.is_set():
            step += 1
            body = json.dumps({"events": [{"type": "step", "workload": "bench", "rank": 0, "step": step,
                                           "duration_seconds": 0.5}]}).encode()
            started = time.perf_counter()
            try:
                status, _ = self.transport.post("/v1/events", body)
            except Exception:
                self.phase.failed += 1
            else:
                if status == 200:
                    self.phase.latencies_ms.append((time.perf_counter() - started) * 1000)
                else:
                    self.phase.failed += 1
            time.sleep(GAP)
        self.transport.close()


class Monitor(threading.Thread):
    def __init__(self, daemon: Daemon, phase: Phase) -> None:
        super().__init__(daemon=True)
        self.target = daemon
        self.phase = phase
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self.phase.fds_max = max(self.phase.fds_max, self.target.fds())

    def finish(self) -> None:
        self.halt.set()
        self.join()
        self.phase.rss_peak_mb = self.target.status("VmHWM") / 2**20


def _attack(target: str, source: str = "127.0.0.1") -> tuple[list[subprocess.Popen[str]], int, int]:
    """Open IDLE connections to `target` from child processes; returns them, how many opened and failed."""
    children = [subprocess.Popen([sys.executable, "-c", ATTACKER, target, source, str(IDLE // ATTACKERS)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(ATTACKERS)]
    opened = failed = 0
    for child in children:
        assert child.stdout is not None
        got, lost = child.stdout.readline().split()
        opened, failed = opened + int(got), failed + int(lost)
    return children, opened, failed


def _release(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)


def _measured(daemon: Daemon, name: str, during: Callable[[Phase], None], poster: bool = False) -> Phase:
    phase = Phase(name)
    worker: Scraper | Poster = Poster(daemon.socket, phase) if poster else Scraper(daemon.port, phase)
    monitor = Monitor(daemon, phase)
    worker.start()
    monitor.start()
    try:
        during(phase)
    finally:
        worker.halt.set()
        worker.join()
        monitor.finish()
    return phase


def _idle(target: str, source: str = "127.0.0.1") -> Callable[[Phase], None]:
    def during(phase: Phase) -> None:
        started = time.monotonic()
        children, opened, failed = _attack(target, source)
        took = time.monotonic() - started
        time.sleep(HOLD)
        _release(children)
        phase.note = f"{opened:,} opened in {took:.1f}s" + (f", {failed:,} refused" if failed else "")

    return during


def send_header(connect: Callable[[], socket.socket]) -> tuple[str, float]:
    """A request whose one header is HEADER bytes, sent while its answer is read: the answer's status code and the
    seconds from the first byte sent to the answer."""
    sock = connect()
    sock.settimeout(120)

    def send() -> None:
        chunk = b"a" * 2**20
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: goodput\r\nX-Padding: ")
            for _ in range(HEADER // len(chunk)):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass  # closed after its answer

    sender = threading.Thread(target=send, daemon=True)
    started = time.perf_counter()
    sender.start()
    answer = b""
    try:
        while b"\r\n" not in answer and (data := sock.recv(4096)):
            answer += data
    except OSError as exc:
        answer = answer or f"{exc.__class__.__name__}".encode()
    took = time.perf_counter() - started
    sender.join(120)
    sock.close()
    first = answer.split(b"\r\n", 1)[0].decode("latin-1")
    return (first.split()[1] if first.startswith("HTTP/") else first or "closed"), took


def _tcp(port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(("127.0.0.1", port))


def _unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    return connect


def run() -> Result:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    headers: list[HeaderRow] = []
    daemon = Daemon()
    try:
        config = load(None, {}, environ={})
        limits = {"web.max_connections": str(config.web.max_connections),
                  "ingest.max_connections": str(config.ingest.max_connections),
                  "web.keep_alive_timeout": f"{config.web.keep_alive_timeout:g}s",
                  "max_header_bytes": f"{config.web.max_header_bytes:,}",
                  "daemon open-files limit": f"{hard:,}"}
        baseline = _measured(daemon, "baseline", lambda phase: wait_until(lambda: len(phase.latencies_ms) >= BASELINE))
        same = _measured(daemon, f"{IDLE:,} idle to /metrics from the scraper's address",
                         _idle(f"127.0.0.1:{daemon.port}"))
        other = _measured(daemon, f"{IDLE:,} idle to /metrics from another address",
                          _idle(f"127.0.0.1:{daemon.port}", "127.0.0.2"))
        events = _measured(daemon, f"{IDLE:,} idle to the events socket (posts)", _idle(f"unix:{daemon.socket}"),
                           poster=True)

        def oversize(phase: Phase) -> None:
            rows = {"metrics": HeaderRow("metrics"), "events": HeaderRow("events")}
            connects = {"metrics": _tcp(daemon.port), "events": _unix(daemon.socket)}
            before = daemon.status("VmHWM")
            started = time.monotonic()
            while time.monotonic() - started < HOLD:
                for name, row in rows.items():
                    answer, took = send_header(connects[name])
                    row.answers.append(answer)
                    row.seconds.append(took)
            for row in rows.values():
                row.rss_growth_mb = (daemon.status("VmHWM") - before) / 2**20
                headers.append(row)
            phase.note = f"{sum(len(row.answers) for row in rows.values())} requests with a 64 MiB header"

        header = _measured(daemon, "64 MiB headers", oversize)
    finally:
        daemon.stop()
    unbounded = Daemon("--web.max-header-bytes", str(2**30))
    try:
        row = HeaderRow("metrics, bound lifted (web.max_header_bytes 1 GiB)")
        before = unbounded.status("VmHWM")
        answer, took = send_header(_tcp(unbounded.port))
        row.answers.append(answer)
        row.seconds.append(took)
        row.rss_growth_mb = (unbounded.status("VmHWM") - before) / 2**20
        headers.append(row)
    finally:
        unbounded.stop()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return Result([baseline, same, other, events, header], headers, limits)


def wait_until(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.05)


def markdown(result: Result) -> list[str]:
    settings = ", ".join(f"{key} {value}" for key, value in result.limits.items())
    lines = [
        "### Server limits: idle connections and oversize headers (bench/server_limits.py)",
        "",
        f"A daemon with {GPUS} simulated GPUs and the default limits ({settings}), scraped back to back on one kept "
        "connection (gzip) while child processes open and hold idle connections, or send 64 MiB request headers. "
        "A reconnect is a scrape whose kept connection the daemon had closed to make room, sent again on a new one "
        "(as Prometheus's client does); failed: no 200 even so. The events row is the training client's transport "
        "posting a step every 10 ms.",
        "",
        "| phase | requests | p50 ms | p99 ms | max ms | failed | reconnects | daemon's most open files | "
        "daemon peak RSS MiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for phase in result.phases:
        lines.append(f"| {phase.name} | {len(phase.latencies_ms)} | {phase.percentile(0.5):.1f} | "
                     f"{phase.percentile(0.99):.1f} | {max(phase.latencies_ms, default=float('nan')):.1f} | "
                     f"{phase.failed} | {phase.reconnects} | {phase.fds_max} | {phase.rss_peak_mb:.0f} | "
                     f"{phase.note} |")
    lines += ["", "| 64 MiB header to | requests | answers | slowest answer s | daemon peak RSS growth MiB |",
              "|---|---:|---|---:|---:|"]
    for row in result.headers:
        answers = ", ".join(f"{answer} x{row.answers.count(answer)}" for answer in sorted(set(row.answers)))
        lines.append(f"| {row.target} | {len(row.answers)} | {answers} | {max(row.seconds):.2f} | "
                     f"{row.rss_growth_mb:.1f} |")
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    print("\n".join(markdown(run())))
