"""goodput_client: hot-path cost per recorded phase, import time, and ingest throughput over the Unix socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from goodput_client import Telemetry
from goodput_client.contract import EVENTS_PATH, batch_body, encode, phase_event
from goodput_client.transport import Transport

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from serving import ingest_server

ROOT = Path(__file__).resolve().parent.parent
BATCH = 5000
REQUESTS = 40
IMPORT_RUNS = 5


def hot_path_microseconds() -> tuple[float, float]:
    """Per `with telemetry.phase(...)` and per `record_phase`, queueing only (no daemon needed)."""
    telemetry = Telemetry("bench", 0, socket_path=os.devnull, flush_interval=3600, max_queue=10**8)
    rounds = 200_000

    def with_phase() -> None:
        with telemetry.phase("compute"):
            pass

    best_with = min(timeit.repeat(with_phase, number=rounds, repeat=5)) / rounds * 1e6
    telemetry._queue.clear()
    best_record = min(timeit.repeat(lambda: telemetry.record_phase("compute", 0.01), number=rounds,
                                    repeat=5)) / rounds * 1e6
    telemetry._queue.clear()
    telemetry.close(timeout=0.1)
    return best_with, best_record


def ingest_events_per_second() -> float:
    path = os.path.join(tempfile.mkdtemp(prefix="gp-bench-"), "ingest.sock")
    with ingest_server(path):
        return _events_per_second(path)


def _events_per_second(path: str) -> float:
    events = batch_body([phase_event("bench", i % 8, "compute", 0.01) for i in range(BATCH)])
    transport = Transport(socket_path=path, timeout=30)  # the client's own sender: one kept-alive connection
    transport.post(EVENTS_PATH, encode(events))  # warm-up
    started = time.perf_counter()
    for _ in range(REQUESTS):
        assert transport.post(EVENTS_PATH, encode(events))[0] == 200
    elapsed = time.perf_counter() - started
    transport.close()
    return REQUESTS * BATCH / elapsed


def import_microseconds() -> int:
    """`import goodput_client` as a training image has it: the package in the site-packages of a fresh venv
    (no .pth file, nothing of the checkout); the cumulative `-X importtime` figure, best of IMPORT_RUNS
    after one run that writes the bytecode. Target < 30 ms."""
    with tempfile.TemporaryDirectory(prefix="gp-import-") as top:
        venv = Path(top) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
        shutil.copytree(ROOT / "client" / "goodput_client", Path(site) / "goodput_client",
                        ignore=shutil.ignore_patterns("__pycache__"))
        runs = [_import_time(python, top) for _ in range(IMPORT_RUNS + 1)]
    return min(runs[1:])


def _import_time(python: str, cwd: str) -> int:
    result = subprocess.run([python, "-X", "importtime", "-c", "import goodput_client"], cwd=cwd, check=True,
                            capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})
    for line in result.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[2].strip() == "goodput_client":
            return int(fields[1])
    raise RuntimeError(f"no goodput_client line in:\n{result.stderr}")



def section() -> str:
    """This benchmark's part of bench/results.md."""
    with_phase, record = hot_path_microseconds()
    throughput = ingest_events_per_second()
    imported = import_microseconds()
    return "\n".join([
        "## Training client and ingest",
        "",
        "Client hot path: the cost the training loop pays per recorded phase (best of 5 x 200,000, queueing",
        f"only; target < 5 µs). Ingest: one client posting batches of {BATCH} phase events over the",
        f"Unix socket, {REQUESTS} requests, JSON encoding included (target > 50,000 events/s).",
        "Import: `python -X importtime -c 'import goodput_client'` in a fresh venv holding only the client, the",
        f"cumulative figure, best of {IMPORT_RUNS} (target < 30 ms).",
        "",
        "| measure | result |",
        "|---|---|",
        f"| `with telemetry.phase(...)` | {with_phase:.2f} µs |",
        f"| `telemetry.record_phase(...)` | {record:.2f} µs |",
        f"| ingest throughput | {throughput:,.0f} events/s |",
        f"| `import goodput_client` | {imported / 1000:.1f} ms |",
    ])

if __name__ == "__main__":
    with_phase, record = hot_path_microseconds()
    print(f"with telemetry.phase(...): {with_phase:.2f} µs; record_phase: {record:.2f} µs (target < 5 µs)")
    print(f"import goodput_client: {import_microseconds()} µs (target < 30,000 µs)")
    print(f"ingest: {ingest_events_per_second():,.0f} events/s (target > 50,000)")
