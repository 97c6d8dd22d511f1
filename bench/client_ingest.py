"""Client hot-path cost per recorded phase, and ingest throughput over the Unix socket."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.client import Telemetry
from exporter.ingest.app import create_ingest_app
from exporter.ingest.state import IngestState
from exporter.sockets import unix_socket

BATCH = 5000
REQUESTS = 40


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
    state = IngestState(max_workloads=32, max_ranks=512, idle_timeout=600)
    sock: socket.socket = unix_socket(path)
    server = uvicorn.Server(uvicorn.Config(create_ingest_app(state, None, 64 * 2**20, 100_000),
                                           log_config=None, access_log=False, lifespan="off", http="httptools"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    events = [{"type": "phase", "workload": "bench", "rank": i % 8, "phase": "compute", "seconds": 0.01}
              for i in range(BATCH)]
    body = {"events": events}
    with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", timeout=30) as client:
        client.post("/v1/events", json=body)  # warm-up
        started = time.perf_counter()
        for _ in range(REQUESTS):
            assert client.post("/v1/events", json=body).status_code == 200
        elapsed = time.perf_counter() - started
    server.should_exit = True
    thread.join(5)
    return REQUESTS * BATCH / elapsed


if __name__ == "__main__":
    print(hot_path_microseconds(), ingest_events_per_second())
