"""The two HTTP servers (metrics, events) under a node's other users, through the real daemon (`goodput-exporter
serve` as a child process) and real sockets: thousands of idle connections, a 64 MiB request header, a second
daemon on the same events socket, SIGTERM with a client that never reads its response, and an events port taken
at start."""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, free_port, socket_path, value, wait_for

from exporter.core.http import SocketInUse, unix_socket

IDLE = 2000  # idle connections held against each server (bench/server_limits.py holds 20,000)
CAP = 32  # max_connections of each server in these tests
HEADER = 64 * 2**20  # bytes of the oversize request header


def step(workload: str, rank: int = 0) -> dict[str, object]:
    return {"type": "step", "workload": workload, "rank": rank, "duration_seconds": 0.5, "tokens": 4096, "samples": 8}


def events_client(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", timeout=10)


def get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None


class Daemon:
    """A real daemon process: its web port, its events socket, its output once it ended."""

    def __init__(self, spawn: Callable[..., subprocess.Popen[str]], *flags: str, sock: str | None = None,
                 gpus: int = 2) -> None:
        self.port = free_port()
        self.socket = sock or socket_path()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = spawn("--simulate", str(gpus), "--web.listen-address", f"127.0.0.1:{self.port}",
                          "--ingest.socket-path", self.socket, "--ingest.interval", "200ms",
                          "--flight.dir", os.path.join(os.path.dirname(self.socket), "flight"), *flags)

    def wait_serving(self) -> None:
        def serving() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode}: {self.proc.stdout.read()}")  # type: ignore[union-attr]
            return get(f"{self.url}/healthz") is not None

        wait_for(serving, timeout=60)

    def wait_ready(self) -> None:
        self.wait_serving()
        wait_for(lambda: (r := get(f"{self.url}/readyz")) is not None and r.status_code == 200, timeout=60)

    def open_files(self) -> int:
        """The daemon's open files now; a daemon that died says why (its output)."""
        # read from /proc here, not through psutil: its procfs path is process-global, and the host source points it
        # at the fake /proc trees of other tests in this process
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.proc.returncode}: "
                                 f"{self.proc.stdout.read()[-5000:]}")  # type: ignore[union-attr]
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def metrics(self) -> str:
        response = httpx.get(f"{self.url}/metrics", timeout=10)
        assert response.status_code == 200
        return response.text

    def stop(self) -> str:
        self.proc.terminate()
        output, _ = self.proc.communicate(timeout=30)
        return output


@pytest.fixture(autouse=True)
def open_files() -> Iterator[None]:
    """Room for the idle connections the tests hold: the soft open-files limit raised to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * IDLE + 256:
        pytest.fail(f"the hard open-files limit ({hard}) leaves no room for {2 * IDLE} connections: raise ulimit -Hn")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def held(connect: Callable[[], socket.socket], count: int) -> Iterator[list[socket.socket]]:
    """`count` connections opened and left idle (nothing sent), closed at the end."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(connect())
        yield held
    finally:
        for sock in held:
            sock.close()


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has closed (readable: EOF or reset, as nothing was asked)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return len(poller.poll(0))


def tcp(port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(("127.0.0.1", port))


def unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    return connect


def test_idle_connections_neither_starve_scrapes_nor_events_nor_pile_up(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    daemon = Daemon(spawn_cli, "--web.max-connections", str(CAP), "--ingest.max-connections", str(CAP))
    daemon.wait_ready()
    with held(tcp(daemon.port), IDLE) as web_idle, held(unix(daemon.socket), IDLE) as events_idle:
        # the daemon has taken every one of them in: all but the CAP it keeps are closed (the oldest idle first)
        wait_for(lambda: closed_by_server(web_idle) >= IDLE - CAP and closed_by_server(events_idle) >= IDLE - CAP,
                 timeout=60)
        assert daemon.open_files() < IDLE // 2  # nowhere near the 2 x IDLE opened

        with httpx.Client(base_url=daemon.url, timeout=10) as scraper:  # keep-alive, as Prometheus scrapes
            statuses = [scraper.get("/metrics").status_code for _ in range(20)]
        assert statuses == [200] * 20
        with events_client(daemon.socket) as client:
            response = client.post("/v1/events", json={"events": [step("under-siege")]})
        assert response.status_code == 200, response.text
        wait_for(lambda: value(daemon.metrics(), "goodput_steps_total", workload="under-siege", rank="0") == 1)
        assert daemon.open_files() < IDLE // 2
    output = daemon.stop()
    assert "metrics server: connection evicted" in output and "events server: connection evicted" in output, output
    assert daemon.proc.returncode == 0


def test_within_a_low_open_files_limit_connections_leave_room_for_the_sources() -> None:
    hard = 512  # the daemon's own limit: its default max_connections (256 + 1024) do not fit in it
    with limited_daemon(hard // 2, hard) as daemon:
        daemon.wait_ready()
        limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text()
        assert [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")] == [
            [str(hard), str(hard)]]  # the soft limit raised to the hard one
        up_before = {source: value(daemon.metrics(), "goodput_exporter_source_up", source=source)
                     for source in ("nvml", "host", "ingest", "flight", "fabric", "process")}
        with held(tcp(daemon.port), IDLE) as web_idle, held(unix(daemon.socket), IDLE) as events_idle:
            wait_for(lambda: closed_by_server(web_idle) + closed_by_server(events_idle) >= 2 * IDLE - hard,
                     timeout=60)
            assert daemon.open_files() < hard
            time.sleep(1.0)  # a few collections with the connections held
            text = daemon.metrics()
            assert {source: value(text, "goodput_exporter_source_up", source=source)
                    for source in up_before} == up_before
            with events_client(daemon.socket) as client:
                assert client.post("/v1/events", json={"events": [step("squeezed")]}).status_code == 200
        output = daemon.stop()
    assert "Too many open files" not in output, output
    assert "the open-files limit (ulimit -n) leaves room" in output, output  # said at start, with what is kept


@contextlib.contextmanager
def limited_daemon(soft: int, hard: int) -> Iterator[Daemon]:
    """A daemon started as spawn_cli starts one, within an open-files limit of its own (set in the child)."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(*args: str) -> subprocess.Popen[str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=environment, cwd=ROOT, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
        procs.append(proc)
        return proc

    try:
        yield Daemon(spawn)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def send_oversize_header(connect: Callable[[], socket.socket]) -> bytes:
    """A GET whose one header is HEADER bytes long, sent while the answer is read; the answer's first bytes."""
    sock = connect()
    request = b"GET /metrics HTTP/1.1\r\nHost: goodput\r\nX-Padding: "

    def send() -> None:
        chunk = b"a" * 2**20
        with contextlib.suppress(OSError):  # the server closes the connection after its answer
            sock.sendall(request)
            for _ in range(HEADER // len(chunk)):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")

    sender = threading.Thread(target=send)
    sender.start()
    answer = b""
    sock.settimeout(30)
    with contextlib.suppress(OSError):
        while len(answer) < 64 and (data := sock.recv(4096)):
            answer += data
    sender.join(60)
    sock.close()
    return answer


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_oversize_header_gets_431_and_costs_no_memory(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    daemon = Daemon(spawn_cli)
    daemon.wait_ready()
    daemon.metrics()
    before = peak_rss(daemon.proc.pid)
    for connect in (tcp(daemon.port), unix(daemon.socket), tcp(daemon.port)):
        answer = send_oversize_header(connect)
        assert answer.startswith(b"HTTP/1.1 431 "), answer
    grown = peak_rss(daemon.proc.pid) - before
    assert grown < HEADER // 4, f"peak RSS grew by {grown / 2**20:.1f} MiB"  # an unbounded parser holds it all
    daemon.metrics()  # still serving
    with events_client(daemon.socket) as client:
        assert client.post("/v1/events", json={"events": [step("after")]}).status_code == 200
    assert "header too large" in daemon.stop()


def test_a_second_daemon_on_a_live_socket_exits_and_the_first_keeps_receiving(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    first = Daemon(spawn_cli)
    first.wait_ready()
    inode = os.stat(first.socket).st_ino
    second = Daemon(spawn_cli, sock=first.socket)
    output, _ = second.proc.communicate(timeout=60)
    assert second.proc.returncode == 3, output
    assert f"the socket {first.socket} is in use" in output and "Traceback" not in output, output
    assert os.stat(first.socket).st_ino == inode  # not unlinked, not replaced

    with events_client(first.socket) as client:
        assert client.post("/v1/events", json={"events": [step("first", rank=r) for r in range(3)]}).status_code == 200
    wait_for(lambda: value(first.metrics(), "goodput_steps_total", workload="first", rank="2") == 1)
    assert get(f"{first.url}/readyz").status_code == 200  # type: ignore[union-attr]
    first.stop()
    assert first.proc.returncode == 0
    assert not os.path.exists(first.socket)  # the first removes its own socket when it stops


def test_only_a_dead_socket_file_is_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "events.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(4)
    inode = os.stat(path).st_ino
    with pytest.raises(SocketInUse, match=str(path)):
        unix_socket(path)
    assert os.stat(path).st_ino == inode
    unix(path)().close()  # still answers
    live.close()  # gone, its file left behind: connect() is refused
    assert os.path.exists(path)
    replaced = unix_socket(path)
    client = unix(path)()  # the new socket answers (the old one is closed: it could not)
    accepted, _ = replaced.accept()
    for sock in (accepted, client, replaced):
        sock.close()


def stalled_reader(port: int) -> socket.socket:
    """A client that asks for /metrics uncompressed, eight times in a row on one connection, and reads nothing: a
    tiny receive buffer, so that what the kernel's buffers do not hold (one body of 64 GPUs fits) stays in the
    daemon's, and its server waits to write the next response."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: goodput\r\nAccept-Encoding: identity\r\n\r\n" * 8)
    return sock


def test_sigterm_completes_within_the_shutdown_timeout_while_a_client_does_not_read(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    # the premise: with a long shutdown timeout, the unread response holds the shutdown up
    patient = Daemon(spawn_cli, "--web.shutdown-timeout", "60s", "--web.keep-alive-timeout", "60s", gpus=64)
    patient.wait_ready()
    reader = stalled_reader(patient.port)
    time.sleep(1.0)  # the response is written into the buffers
    patient.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        patient.proc.wait(8)
    patient.proc.kill()
    patient.proc.wait(10)
    reader.close()

    timeout = 2.0
    daemon = Daemon(spawn_cli, "--web.shutdown-timeout", f"{timeout}s", gpus=64)
    daemon.wait_ready()
    reader = stalled_reader(daemon.port)
    time.sleep(1.0)
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    output, _ = daemon.proc.communicate(timeout=60)
    took = time.monotonic() - started
    reader.close()
    assert daemon.proc.returncode == 0 and "Traceback" not in output, output
    # the timeout, the server loop's 1 s tick and the sources' own stop; generous for a loaded machine
    assert took < timeout + 6.0, f"SIGTERM took {took:.1f}s with shutdown_timeout {timeout}s"


def test_an_events_port_taken_at_start_is_not_ready_then_retried_until_it_binds(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", port))
    blocker.listen(1)
    address = f"127.0.0.1:{port}"
    daemon = Daemon(spawn_cli, "--ingest.listen-address", address, "--ingest.listen-retry-interval", "1s")
    daemon.wait_serving()

    def not_ready_naming_the_port() -> bool:
        response = get(f"{daemon.url}/readyz")
        return (response is not None and response.status_code == 503
                and address in response.json().get("reasons", {}).get("ingest", ""))

    wait_for(not_ready_naming_the_port, timeout=60)
    body = httpx.get(f"{daemon.url}/readyz", timeout=5).json()
    assert body["sources"]["ingest"] is False and body["ready"] is False
    with events_client(daemon.socket) as client:  # the Unix socket serves meanwhile
        assert client.post("/v1/events", json={"events": [step("over-unix")]}).status_code == 200

    blocker.close()
    wait_for(lambda: (r := get(f"{daemon.url}/readyz")) is not None and r.status_code == 200, timeout=15)
    response = httpx.post(f"http://{address}/v1/events", json={"events": [step("over-tcp")]}, timeout=10)
    assert response.status_code == 200, response.text
    wait_for(lambda: value(daemon.metrics(), "goodput_steps_total", workload="over-tcp", rank="0") == 1)
    text = daemon.metrics()
    assert value(text, "goodput_steps_total", workload="over-unix", rank="0") == 1
    output = daemon.stop()
    assert f"listening on {address} now" in output, output
