"""HTTP/1.1 POST to the daemon, over its Unix socket or to an http(s):// URL, with the standard library.

One connection is kept open across posts (keep-alive). One that failed is closed, and the next post
opens a new one; so is an idle one the daemon has closed meanwhile (found before it is written to, so
a batch is never sent twice). Errors are raised (OSError, http.client.HTTPException): the caller
decides what a failure costs.
"""

from __future__ import annotations

import http.client
import select
import socket
from urllib.parse import urlsplit

UNIX_HOST = "goodput"  # the Host header of requests over the Unix socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over an AF_UNIX stream socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__(UNIX_HOST, timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _closed_by_peer(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection can no longer be used: between requests nothing may be
    readable on it, so anything readable is the peer's close (or garbage)."""
    sock = connection.sock
    if sock is None:
        return False  # not open: http.client opens it on the next request
    try:
        if hasattr(select, "poll"):  # any descriptor number, unlike select() (a job may hold > 1024 files)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class NoAnswer(Exception):
    """The request was sent whole and no answer came (timed out, or the connection closed): the daemon may or may
    not have applied it."""


class Transport:
    """POSTs to one daemon. Not thread-safe: one sender thread uses it."""

    def __init__(self, *, socket_path: str | None = None, url: str | None = None, token: str | None = None,
                 timeout: float = 2.0) -> None:
        if (socket_path is None) == (url is None):
            raise ValueError("give exactly one of socket_path and url")
        self.socket_path = socket_path
        self.url = url
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._prefix = urlsplit(url).path.rstrip("/") if url else ""
        self._connection: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return UnixHTTPConnection(self.socket_path, self.timeout)
        parts = urlsplit(self.url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise http.client.InvalidURL(f"{self.url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.hostname, parts.port, timeout=self.timeout)

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
        """POST `body` to `path`; returns the status and the response's text. Raises NoAnswer when the request
        went out whole but no answer came, anything else when it did not go out."""
        connection = self._connection
        if connection is None or _closed_by_peer(connection):
            self.close()
            connection = self._connection = self._open()
        try:
            connection.request("POST", self._prefix + path, body=body,
                               headers={"Content-Type": content_type, **self.headers})
        except BaseException:
            self.close()
            raise
        try:
            response = connection.getresponse()
            text = response.read().decode("utf-8", "replace")
        except Exception as exc:
            self.close()
            raise NoAnswer(f"{exc.__class__.__name__}: {exc}") from exc
        except BaseException:
            self.close()
            raise
        return response.status, text

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
