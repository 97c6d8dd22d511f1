"""Local servers for the benchmarks: a free port to start one on, waiting until it answers, reading a page of it,
settling a VictoriaMetrics store before it is measured, and the daemon's events API on a Unix socket."""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing ready on port {port}{path}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Terminate a server and wait for it; kill it if it has not ended within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def get_text(port: int, path: str, timeout: float = 120.0) -> str:
    """A GET's body; an error status raises with the start of the body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", path)
    response = conn.getresponse()
    text = response.read().decode()
    if response.status >= 300:
        raise RuntimeError(f"{path}: {response.status} {text[:500]}")
    return text


def metrics(port: int) -> dict[str, float]:
    """A /metrics page as {series: value}."""
    out = {}
    for line in get_text(port, "/metrics", timeout=30).splitlines():
        if line and line[0] != "#":
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def settle_victoria(port: int, first: float, last: float) -> None:
    """Flush a VictoriaMetrics store and merge each month's partition from `first` to `last` (Unix seconds) into one
    part, as background merges would leave it, then wait until no merge has run for 3 s: what is measured next
    (its bytes, or queries against it) meets no merge in flight."""
    get_text(port, "/internal/force_flush", timeout=600)
    days = [*range(int(first), int(last), 86400), int(last)]
    for month in sorted({time.strftime("%Y_%m", time.gmtime(t)) for t in days}):
        get_text(port, f"/internal/force_merge?partition_prefix={month}", timeout=600)
    quiet = 0
    while quiet < 3:
        time.sleep(1)
        merging = sum(v for k, v in metrics(port).items() if k.startswith("vm_active_merges"))
        quiet = quiet + 1 if merging == 0 else 0


@contextlib.contextmanager
def ingest_server(path: str) -> Iterator[None]:
    """The daemon's events API (as the ingest source serves it) on a Unix socket at `path`, in a thread, until the
    block ends."""
    import threading

    import uvicorn

    from exporter.core.http import unix_socket
    from exporter.sources.ingest.app import create_ingest_app
    from exporter.sources.ingest.state import IngestState

    state = IngestState(max_workloads=32, max_ranks=512, idle_timeout=600)
    sock = unix_socket(path)
    server = uvicorn.Server(uvicorn.Config(create_ingest_app(state, None, 64 * 2**20, 100_000),
                                           log_config=None, access_log=False, lifespan="off", http="httptools"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(5)
