from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from exporter.assemble import build_daemon
from exporter.config import Config, load
from exporter.core.daemon import Daemon
from exporter.core.http import bind, create_app

ROOT = Path(__file__).resolve().parent.parent


class ManualClock:
    def __init__(self, start: float = 1_760_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse an exposition with prometheus-client's parser: {(name, labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def check_openmetrics(body: str) -> None:
    """A daemon's OpenMetrics /metrics body parses with prometheus-client's OpenMetrics parser and names no series
    twice (every live server of the suite is checked so at its end, after its test)."""
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for family in openmetrics_families(body):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in seen, f"series twice in /metrics: {sample.name}{sample.labels}"
            seen.add(key)


def value(text: str, name: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples(text).items() if n == name and wanted <= ls]
    if len(found) > 1:
        raise AssertionError(f"{name}{labels} matches {len(found)} series")
    return found[0] if found else None


def series(text: str, name: str) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls) in samples(text) if n == name]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class LiveServer:
    def __init__(self, daemon: Daemon, base_url: str) -> None:
        self.daemon = daemon
        self.url = base_url
        self.client = httpx.Client(base_url=base_url, timeout=5.0)

    def metrics(self) -> str:
        response = self.client.get("/metrics")
        response.raise_for_status()
        return response.text

    def metrics_when(self, name: str, expected: float, timeout: float = 15.0, **labels: str) -> str:
        """Poll /metrics until `name{labels}` equals `expected`; return that exposition."""
        found: list[str] = []

        def check() -> bool:
            text = self.metrics()
            found[:] = [text]
            return value(text, name, **labels) == expected

        wait_for(check, timeout=timeout)
        return found[0]


@contextmanager
def live_server(config: Config, backend=None, dcgm_backend=None) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """The daemon with a real uvicorn server on a loopback port, in this process."""
    sock = bind("127.0.0.1:0")
    port = sock.getsockname()[1]
    daemon = build_daemon(config, backend=backend, dcgm_backend=dcgm_backend)
    daemon.start()
    server = uvicorn.Server(uvicorn.Config(
        create_app(daemon), log_config=None, access_log=False, lifespan="off", http="httptools"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    live = LiveServer(daemon, f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: server.started, timeout=10)
        yield live
        check_openmetrics(live.client.get("/metrics", headers={"Accept": "application/openmetrics-text"}).text)
    finally:
        live.client.close()
        server.should_exit = True
        thread.join(5)
        daemon.stop()
        sock.close()


def socket_path() -> str:
    """A fresh Unix socket path (short: AF_UNIX paths are limited to 107 bytes)."""
    return os.path.join(tempfile.mkdtemp(prefix="gp-"), "ingest.sock")


def quick_config(**overrides: object) -> Config:
    base = {"nvml": {"interval": "100ms", "timeout": "1s"}, "host": {"interval": "100ms", "timeout": "1s"},
            "ingest": {"interval": "100ms", "socket_path": socket_path()},
            # stale_after: the stored dumps of tests/flight keep the times they were written at, long past
            "flight": {"interval": "100ms", "dir": os.path.join(tempfile.mkdtemp(prefix="gp-fr-"), "flight"),
                       "stale_after": "0s"},
            # never the node's real kubelet, even where a test turns the source on without naming a socket
            "kubelet": {"socket_path": os.path.join(tempfile.mkdtemp(prefix="gp-kl-"), "kubelet.sock")}}
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value  # type: ignore[dict-item]
    return load(None, base, environ={})


@pytest.fixture
def spawn_cli() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `goodput-exporter` as a real child process; all are killed at the end."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
        environment.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=environment, cwd=ROOT)
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package")
    return path
