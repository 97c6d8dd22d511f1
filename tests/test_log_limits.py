"""Repeated log lines are rate-limited and summarised with a count: a flood of bad requests to the events socket
leaves a few lines in the daemon's log, not one per request, and every refusal is still counted."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess

import httpx
from conftest import ManualClock, free_port, socket_path, value, wait_for

from exporter.core.logs import RepeatFilter

FLOOD = 10_000
MOST_LINES = 300


def test_alike_lines_are_written_a_few_per_window_and_then_counted() -> None:
    clock = ManualClock()
    limiter = RepeatFilter(burst=3, window=60.0, clock=clock)
    written: list[str] = []

    def log(template: str, *args: object, level: int = logging.INFO) -> None:
        record = logging.LogRecord("exporter.x", level, __file__, 1, template, args, None)
        if limiter.filter(record):
            written.append(record.getMessage())

    for n in range(1000):
        log("ingest: %s went away after %d bytes", f"uid {n}", n)
    log("another line")
    log("ingest: %s went away after %d bytes", "uid 0", 0, level=logging.WARNING)  # another level: not alike
    assert written == ["ingest: uid 0 went away after 0 bytes", "ingest: uid 1 went away after 1 bytes",
                       "ingest: uid 2 went away after 2 bytes", "another line", "ingest: uid 0 went away after 0 bytes"]
    clock.advance(60.0)
    log("ingest: %s went away after %d bytes", "uid 7", 7)
    assert written[-1] == "ingest: uid 7 went away after 7 bytes [997 more like this in the last 60s were not logged]"
    log("ingest: %s went away after %d bytes", "uid 8", 8)
    assert written[-1] == "ingest: uid 8 went away after 8 bytes"


def _send(path: str, data: bytes, answer: bool = True) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(data)
        if answer:
            sock.settimeout(5)
            while sock.recv(65536):
                pass


def _post(content_type: bytes, body: bytes, length: int | None = None) -> bytes:
    size = str(len(body) if length is None else length).encode()
    return (b"POST /v1/events HTTP/1.1\r\nHost: goodput\r\nContent-Type: " + content_type + b"\r\nContent-Length: " +
            size + b"\r\nConnection: close\r\n\r\n" + body)


BAD = [
    _post(b"application/json", b"{not json"),  # 400 invalid
    _post(b"application/json", b'{"events": [{"type": "step", "workload": "w", "rank": 0, "duration_seconds": -1}]}'),
    _post(b"text/plain", b"{}"),  # 415
    b"NOT HTTP \x00\x01\r\n\r\n",  # refused by the HTTP parser ("Invalid HTTP request received.")
]
TRUNCATED = _post(b"application/json", b'{"ev', length=100)  # the sender goes away mid-body


def test_a_flood_of_bad_requests_writes_a_few_hundred_lines_at_most(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    sock, port = socket_path(), free_port()
    proc: subprocess.Popen[str] = spawn_cli(
        "--web.listen-address", f"127.0.0.1:{port}", "--ingest.socket-path", sock,
        *(arg for name in ("nvml", "host", "fabric", "flight", "kubelet", "process") for arg in (f"--{name}.enabled",
                                                                                               "false")))

    def ready() -> bool:
        assert proc.poll() is None
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, timeout=30)
    for n in range(FLOOD):
        kind = n % 5
        if kind == 4:
            _send(sock, TRUNCATED, answer=False)
        else:
            _send(sock, BAD[kind])

    def counted() -> bool:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        refused = sum(value(text, "goodput_ingest_rejected_requests_total", reason=r) or 0
                      for r in ("invalid", "truncated"))
        return refused == FLOOD // 5 * 4  # the HTTP parser's refusals (one in 5) never reach the app
    wait_for(counted, timeout=30)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    lines = output.splitlines()
    assert len(lines) <= MOST_LINES, f"{len(lines)} log lines:\n" + "\n".join(lines[:50])
    # each kind of line a few times in the flood's minute (RepeatFilter's burst), not once per request
    assert sum("went away" in line for line in lines) <= 5
    assert sum("Invalid HTTP request" in line for line in lines) <= 5
