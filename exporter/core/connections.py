"""Connection limits of the HTTP servers (exporter/core/http.py makes the servers): how many connections each keeps
open, for how long an idle one stays, how large a request's headers may be, and the process's open-files budget
that all servers share with the sources. See http.py's docstring for the policy and why uvicorn's own
`limit_concurrency` is not it."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

FD_RESERVE = 256  # open files left to the sources (dumps, /proc, NVML, gRPC) however many connections are open
LINGER_SECONDS = 2.0  # a rejected request's sender gets this long to read the answer before the connection is cut
LOG_EVERY_SECONDS = 60.0  # closures of one reason are logged at most this often
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files (RLIMIT_NOFILE) to its hard limit; returns the soft limit
    now. Connections, dumps and /proc files all count against it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
            return soft
        log.debug("open-files limit raised from %d to %d", soft, target)
        return target
    return soft


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


# --- connection limits -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one server; `of()` reads them from a settings section that has these four fields (web,
    ingest)."""

    max_connections: int
    keep_alive_timeout: float
    max_header_bytes: int
    shutdown_timeout: float

    @classmethod
    def of(cls, settings: Any) -> ServerLimits:
        return cls(settings.max_connections, settings.keep_alive_timeout, settings.max_header_bytes,
                   settings.shutdown_timeout)


class ConnectionBudget:
    """The connections all servers of this process may hold together: the open-files limit, less the files open
    when the first server registered and FD_RESERVE for the sources. It is the process's, as the limit is."""

    def __init__(self) -> None:
        self.capacity: int | None = None
        self.servers: list[Connections] = []
        self._lock = threading.Lock()

    def register(self, connections: Connections) -> None:
        with self._lock:
            if self.capacity is None:
                soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                limit = soft if soft != resource.RLIM_INFINITY else 1_048_576
                self.capacity = max(limit - _open_files() - FD_RESERVE, 16)
            self.servers = [*self.servers, connections]
            wanted = sum(server.max for server in self.servers)
        if wanted > self.capacity:
            log.warning("the servers' max_connections add up to %d, but the open-files limit (ulimit -n) leaves room "
                        "for %d connections besides the %d files kept for the sources: %d at most are kept open. Raise "
                        "the limit, or lower web.max_connections / ingest.max_connections",
                        wanted, self.capacity, FD_RESERVE, self.capacity)

    def unregister(self, connections: Connections) -> None:
        with self._lock:
            self.servers = [server for server in self.servers if server is not connections]

    def full(self) -> bool:
        return self.capacity is not None and sum(server.open for server in self.servers) >= self.capacity


OPEN_FILES = ConnectionBudget()


class Connections:
    """The open connections of one server, by peer, and the idle ones among them (oldest first): which to close to
    make room for a new one. Used only from the server's event loop."""

    def __init__(self, name: str, max_connections: int, budget: ConnectionBudget = OPEN_FILES) -> None:
        self.name = name
        self.max = max_connections
        self.budget = budget
        self.open = 0
        self.closed: Counter[str] = Counter()  # reason -> connections closed by a limit
        self._peer: dict[BoundedProtocol, str] = {}
        self._per_peer: Counter[str] = Counter()
        self._idle: dict[str, dict[BoundedProtocol, None]] = {}  # peer -> its idle connections, oldest first
        self._logged: dict[str, tuple[float, int]] = {}  # reason -> (when last logged, count then)
        budget.register(self)

    def admit(self, connection: BoundedProtocol, peer: str) -> bool:
        """Count a new connection in, closing idle ones to make room; False when it must be refused (full, and
        none idle)."""
        while self.open >= self.max or self.budget.full():
            victim = self._oldest_idle()
            if victim is None:
                self.count("refused", f"{self.max} connections open and none idle")
                return False
            self.count("evicted", f"{self.max} connections open: closed the oldest idle one of {self._peer[victim]}")
            self.remove(victim)
            victim.cut()
        self._peer[connection] = peer
        self._per_peer[peer] += 1
        self.open += 1
        return True

    def idle(self, connection: BoundedProtocol) -> None:
        peer = self._peer.get(connection)
        if peer is not None:
            waiting = self._idle.setdefault(peer, {})
            waiting.pop(connection, None)
            waiting[connection] = None  # the newest idle one

    def busy(self, connection: BoundedProtocol) -> None:
        peer = self._peer.get(connection)
        waiting = self._idle.get(peer) if peer is not None else None
        if waiting is not None:
            waiting.pop(connection, None)
            if not waiting:
                del self._idle[peer]  # type: ignore[arg-type]

    def remove(self, connection: BoundedProtocol) -> None:
        """The connection is gone (or going); again is a no-op."""
        self.busy(connection)
        peer = self._peer.pop(connection, None)
        if peer is not None:
            self.open -= 1
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]

    def _oldest_idle(self) -> BoundedProtocol | None:
        """The oldest idle connection of the peer that holds the most connections."""
        if not self._idle:
            return None
        peer = max(self._idle, key=lambda key: self._per_peer[key])
        return next(iter(self._idle[peer]))

    def count(self, reason: str, detail: str = "") -> None:
        """Count a connection closed by a limit; log it unless it is routine (idle_timeout), at most once a minute
        per reason."""
        self.closed[reason] += 1
        if reason == "idle_timeout":
            return
        now = time.monotonic()
        last, before = self._logged.get(reason, (-LOG_EVERY_SECONDS, 0))
        if now - last >= LOG_EVERY_SECONDS:
            since = self.closed[reason] - before
            log.warning("%s server: connection %s (%s)%s", self.name, reason.replace("_", " "), detail,
                        f"; {since} so since the last such message" if before else "")
            self._logged[reason] = (now, self.closed[reason])


def _peer_of(transport: asyncio.BaseTransport) -> str:
    """Who a connection is from, for fairness: the uid of a Unix-socket peer, the address of a TCP one."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        try:
            _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        except (OSError, AttributeError):
            return "unix"
        return f"uid {uid}"
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


def _answer(status: str, message: str) -> bytes:
    body = message.encode("utf-8")
    return (f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode("ascii") + body


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within its server's `ServerLimits`; `bounded_protocol` binds one to a server.
    It overrides methods of uvicorn's (internal) protocol, as peer.py does: pyproject.toml pins uvicorn."""

    tracked: ClassVar[Connections]  # this server's (uvicorn's `connections` is its own set of them)
    limits: ClassVar[ServerLimits]

    _deadline: asyncio.TimerHandle | None = None
    _header_bytes = 0  # bytes received since the request began, while its headers are incomplete
    _reading_headers = True
    _rejected = False  # answered 431 or 503: what the peer still sends is read and dropped
    _cycles: tuple[RequestResponseCycle, ...] = ()  # its requests whose responses are not done (pipelined ones too)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.tracked.admit(self, _peer_of(transport)):
            self._rejected = True
            transport.write(_answer("503 Service Unavailable", "too many connections\n"))
            transport.close()
            return
        self._set_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.tracked.remove(self)
        # uvicorn tells only the newest request that its client went away; a pipelined one running before it would
        # go on writing to the closed transport (and log an error): tell them all
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._cycles = ()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._reading_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if (self._reading_headers and self._header_bytes > self.limits.max_header_bytes
                and not self.transport.is_closing()):
            self._reject_headers()

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._header_bytes = 0
        super().on_headers_complete()
        if self.cycle is not None:
            self._cycles = (*(cycle for cycle in self._cycles if not cycle.response_complete), self.cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_headers = True
        if self._in_progress():
            self._cancel_deadline()
            self.tracked.busy(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._unset_keepalive_if_required()  # uvicorn's keep-alive timer: the deadline below does its work
        if not self._in_progress():  # closing too: a close waits until the peer has read what is unsent
            self._set_idle()

    def pause_writing(self) -> None:
        """The peer does not read what it is sent: it may be closed to make room, and is past the timeout."""
        super().pause_writing()
        if not self._rejected:
            self._set_idle()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._in_progress():
            self._cancel_deadline()
            self.tracked.busy(self)

    def cut(self) -> None:
        """Close now, dropping what is unsent (to make room, or past a deadline)."""
        self._cancel_deadline()
        self.transport.abort()

    def _in_progress(self) -> bool:
        """A whole request is in, its response is not done, and the peer reads it: the connection is busy (neither
        closed to make room nor timed out). Otherwise it is idle, for this class."""
        cycle = self.cycle
        return (cycle is not None and not cycle.response_complete and not cycle.more_body
                and not self.flow.write_paused)

    def _set_idle(self) -> None:
        self.tracked.idle(self)
        self._arm(self.limits.keep_alive_timeout)

    def _arm(self, seconds: float) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self._rejected:
            self.tracked.count("idle_timeout")
        self.tracked.remove(self)
        self.transport.abort()

    def _reject_headers(self) -> None:
        """431, then read and drop what else comes for a moment (so the sender reads the answer rather than a reset),
        then close."""
        limit = self.limits.max_header_bytes
        self.tracked.count("header_too_large", f"request headers over {limit} bytes from {_peer_of(self.transport)}")
        self._rejected = True
        self.transport.write(_answer("431 Request Header Fields Too Large",
                                     f"request line and headers are larger than {limit} bytes\n"))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.tracked.idle(self)
        self._arm(min(LINGER_SECONDS, self.limits.keep_alive_timeout))


def bounded_protocol(base: type[HttpToolsProtocol], connections: Connections,
                     limits: ServerLimits) -> type[BoundedProtocol]:
    """`base` (uvicorn's httptools protocol, or a subclass of it) within `limits`, counted in `connections`."""
    bases = (base,) if issubclass(base, BoundedProtocol) else (BoundedProtocol, base)
    return type(f"Bounded{base.__name__}", bases, {"tracked": connections, "limits": limits})
