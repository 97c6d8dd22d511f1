"""Fetching a dcgm-exporter's /metrics: one GET under a hard overall deadline, aborted cleanly when the
source closes."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from urllib.parse import urlsplit

MAX_BODY_BYTES = 16 * 2**20  # dcgm-exporter's output for 8 GPUs with every field is well under 1 MiB


class ScrapeError(Exception):
    """The dcgm-exporter could not be read at all; `reason` becomes the source's error label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Fetcher:
    """GETs one URL, abandoned after a hard overall deadline: a server that hangs, or trickles its
    headers or body a byte at a time, is cut off when the deadline passes, not when one read times out.

    The connection's socket is shut down by a timer thread, which wakes a read blocked in any phase.
    `close()` (from another thread, when the daemon stops) aborts a request in flight the same way;
    the socket itself is only closed by the thread that reads from it.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._lock = threading.Lock()  # guards _sock, _closed
        self._sock: socket.socket | None = None
        self._closed = False

    def fetch(self, deadline: float) -> str:
        url = self.url
        connection_class = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_class(self._host, self._port, timeout=deadline)
        aborted = threading.Event()
        timer = threading.Timer(deadline, self._abort, (aborted,))
        timer.daemon = True
        timer.start()
        started = time.monotonic()
        try:
            connection.connect()
            with self._lock:
                if self._closed:
                    raise ScrapeError("dcgm_exporter_closed", f"{url}: the source is closing")
                self._sock = connection.sock
            if aborted.is_set():  # the deadline passed while connecting
                raise TimeoutError
            connection.request("GET", self._target, headers={"Accept": "text/plain"})
            response = connection.getresponse()
            if response.status != 200:
                raise ScrapeError("dcgm_exporter_http_error", f"{url} answered HTTP {response.status}")
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError("dcgm_exporter_too_large", f"{url} sent more than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            if aborted.is_set():  # the shutdown may read as a clean end of the body
                raise TimeoutError
        except ScrapeError:
            raise
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            if aborted.is_set() or isinstance(exc, TimeoutError):
                raise ScrapeError("dcgm_exporter_timeout", f"{url} did not answer in full within {deadline:g}s "
                                  f"(gave up after {time.monotonic() - started:.1f}s)") from None
            if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and self._sock is None):
                raise ScrapeError("dcgm_exporter_unreachable", f"cannot connect to {url}: {exc}: is dcgm-exporter "
                                  "running on this node, and is dcgm.exporter_url its address?") from None
            raise ScrapeError("dcgm_exporter_bad_response", f"{url}: {exc.__class__.__name__}: {exc}") from None
        finally:
            timer.cancel()
            with self._lock:
                self._sock = None
            connection.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _abort(self, aborted: threading.Event | None = None) -> None:
        if aborted is not None:
            aborted.set()
        with self._lock:
            sock = self._sock
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed by the reading thread
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._abort()
