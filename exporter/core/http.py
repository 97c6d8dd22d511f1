"""HTTP: the listening sockets, the bounded uvicorn servers, and the daemon's endpoints (/metrics, /healthz,
/readyz and a landing page). Nothing here touches a GPU.

Sockets are opened before any server starts, so that an error names the address; the events API of the
ingest source is served by the same kind of server on its own sockets.

Every server is bounded (`ServerLimits`, from the web and ingest settings), so that a node's other users cannot
starve or blind it:

- connections: at most `max_connections` open per server, and all servers together leave FD_RESERVE of the
  process's open-files limit to the sources. A connection over the limit closes the oldest idle connection of the
  peer (TCP address or Unix uid) that holds the most, or is answered 503 when none is idle. uvicorn's own
  `limit_concurrency` does not do this: it counts idle keep-alive connections too, closes none, and answers the
  request that comes over the limit 503, a concurrent scraper's included.
- time: a connection that has not sent a whole request `keep_alive_timeout` after it opened or after its last
  response is closed: idle keep-alive connections, connections that never send, slow senders, and clients that
  stopped reading their response.
- headers: httptools has no limit of its own (and gathers a long header by repeated concatenation); a request whose
  line and headers exceed `max_header_bytes` is answered 431 and its connection closed.
- shutdown: requests in progress and responses still being sent get `shutdown_timeout`; then their connections are
  cut, so that SIGTERM completes while a client holds a response unread.

Closed connections are counted by reason in `Connections.closed` and logged (at most once a minute per reason).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .. import __version__
from .daemon import StartRefused
from .exposition import CONTENT_TYPES, OPENMETRICS, TEXT
from .settings import WebConfig, parse_listen_address

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
FD_RESERVE = 256  # open files left to the sources (dumps, /proc, NVML, gRPC) however many connections are open
FIRST_RETRY_SECONDS = 1.0  # a listener that failed is tried again after this, then twice as long each time
SHUTDOWN_GRACE = 1.0  # after shutdown_timeout has cut the connections, their tasks get this long to end
LINGER_SECONDS = 2.0  # a rejected request's sender gets this long to read the answer before the connection is cut
LOG_EVERY_SECONDS = 60.0  # closures of one reason are logged at most this often
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


# --- sockets ---------------------------------------------------------------------------------------
def bind(address: str) -> socket.socket:
    host, port = parse_listen_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {address}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class SocketInUse(StartRefused):
    """A Unix socket that a running process still serves: it is never replaced."""


def _socket_answers(path: str) -> str | None:
    """Why the Unix socket at `path` must be left alone (something answers, or it cannot be told), or None when
    nothing listens on it (connect() refused: left behind by a process that is gone) or it is gone."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except TimeoutError:
        return "a process listens on it (its backlog is full)"
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return "a process listens on it (its backlog is full)"
        return f"cannot tell whether a process serves it: {exc.strerror}"
    finally:
        probe.close()
    return "a process accepts connections on it"


def unix_socket(path: str) -> socket.socket:
    """A listening Unix socket at `path`, mode 0666. A socket file left there by a process that is gone is replaced;
    one that a running process serves (another daemon) raises SocketInUse, anything else OSError."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        if not stat.S_ISSOCK(target.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket; not replacing it")
        reason = _socket_answers(path)
        if reason is not None:
            raise SocketInUse(f"the socket {path} is in use: {reason} (another goodput-exporter?); not replacing it. "
                              "Stop that process or give this one another ingest.socket_path")
        target.unlink()  # left behind by an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)  # jobs run as any user; use ingest.token_file to restrict who may write
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


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


# --- servers ---------------------------------------------------------------------------------------
class QuietServer(uvicorn.Server):
    """A uvicorn.Server that checks for shutdown once a second instead of every 100 ms, cuts the connections still
    open when its graceful shutdown times out, and binds listeners that failed at start later (`pending`).

    An idle exporter is mostly this loop: two servers (metrics, events) at 10 wakeups/s each cost more
    CPU than collecting 8 GPUs. Shutdown now takes up to a second longer, which nobody notices.

    `pending`: address -> why it could not be bound; tried again after FIRST_RETRY_SECONDS, then twice as long
    each time up to `retry_max`, until it binds (`not_listening` says which still wait). `on_exit`: called once
    when the server starts shutting down (the daemon's sources stop meanwhile). `shutdown_timeout`: how long the
    connections open at shutdown get to finish before they are cut.
    """

    def __init__(self, config: uvicorn.Config, pending: Mapping[str, str] | None = None, retry_max: float = 30.0,
                 on_exit: Callable[[], object] | None = None, connections: Connections | None = None,
                 shutdown_timeout: float = 5.0) -> None:
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout
        self.not_listening: dict[str, str] = dict(pending or {})  # replaced whole on change: read from other threads
        self.connections = connections
        self._retry_max = retry_max
        self._on_exit = on_exit
        self._retries: list[asyncio.Task[None]] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        loop = asyncio.get_running_loop()
        self._retries = [loop.create_task(self._listen_later(address)) for address in self.not_listening]

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864_000  # on_tick refreshes the Date header when counter % 10 == 0
            await asyncio.sleep(TICK_SECONDS)
            should_exit = await self.on_tick(counter)
        for task in self._retries:
            task.cancel()
        if self._on_exit is not None:
            self._on_exit()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's graceful shutdown, with the connections still open after `shutdown_timeout` cut: a client that
        does not read its response holds nothing up, and the response's task ends as for a client that went away
        (uvicorn's timeout_graceful_shutdown, SHUTDOWN_GRACE later, cancels what is still running after that)."""
        cutting = asyncio.get_running_loop().call_later(self.shutdown_timeout, self._cut_all)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            cutting.cancel()
            self._cut_all()
            if self.connections is not None:
                self.connections.budget.unregister(self.connections)

    def _cut_all(self) -> None:
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's startup makes them for the sockets it was given."""
        config = self.config
        return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore[call-arg]
                                          app_state=self.lifespan.state, _loop=asyncio.get_running_loop())

    async def _listen_later(self, address: str) -> None:
        loop = asyncio.get_running_loop()
        delay = min(FIRST_RETRY_SECONDS, self._retry_max)
        while True:
            await asyncio.sleep(delay)
            try:
                sock = bind(address)
            except OSError as exc:
                delay = min(delay * 2, self._retry_max)
                self.not_listening = {**self.not_listening, address: f"{exc}; next try in {delay:g}s"}
                continue
            server = await loop.create_server(self._protocol, sock=sock, backlog=self.config.backlog)
            self.servers.append(server)
            self.not_listening = {key: why for key, why in self.not_listening.items() if key != address}
            log.info("listening on %s now", address)
            return


def make_server(app: object, name: str, limits: ServerLimits | None = None,
                http: type[HttpToolsProtocol] = HttpToolsProtocol, pending: Mapping[str, str] | None = None,
                retry_max: float = 30.0, on_exit: Callable[[], object] | None = None) -> QuietServer:
    """A QuietServer for `app` within `limits` (default: the web settings' defaults), its connections counted as
    `name`'s."""
    limits = limits or ServerLimits.of(WebConfig())
    connections = Connections(name, limits.max_connections)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", loop="auto",  # type: ignore[arg-type]
        http=bounded_protocol(http, connections, limits),
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout)),  # unused: BoundedProtocol's deadline rules
        timeout_graceful_shutdown=limits.shutdown_timeout + SHUTDOWN_GRACE)  # type: ignore[arg-type]  # a float works
    return QuietServer(config, pending=pending, retry_max=retry_max, on_exit=on_exit, connections=connections,
                       shutdown_timeout=limits.shutdown_timeout)


class ServerThread:
    """A QuietServer serving `app` on already-bound sockets (and, later, the `pending` addresses) from a background
    thread."""

    def __init__(self, app: object, sockets: list[socket.socket], name: str, limits: ServerLimits | None = None,
                 http: type[HttpToolsProtocol] = HttpToolsProtocol, pending: Mapping[str, str] | None = None,
                 retry_max: float = 30.0) -> None:
        self.server = make_server(app, name, limits, http, pending, retry_max)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, name=name,
                                        daemon=True)

    @property
    def not_listening(self) -> dict[str, str]:
        """Addresses not bound yet (still retried), with why."""
        return self.server.not_listening

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Shut down gracefully; waits `timeout` at most (default: the shutdown timeout and a tick of the loop)."""
        self.server.should_exit = True
        if timeout is None:
            timeout = float(self.server.config.timeout_graceful_shutdown or 0) + TICK_SECONDS + 2.0
        if self._thread.is_alive():
            self._thread.join(timeout)


# --- the daemon's endpoints ------------------------------------------------------------------------
LANDING = """<!doctype html>
<html><head><title>goodput-exporter</title></head>
<body>
<h1>goodput-exporter {version}</h1>
<p>GPU backend: {backend}. Sources: {sources}.</p>
<ul>
<li><a href="metrics">/metrics</a> &mdash; Prometheus metrics (OpenMetrics with <code>Accept:
application/openmetrics-text</code>)</li>
<li><a href="healthz">/healthz</a> &mdash; the process is alive</li>
<li><a href="readyz">/readyz</a> &mdash; every enabled source has finished a collection and listens where it
should</li>
</ul>
</body></html>
"""


def wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


def metrics_response(daemon: Daemon, accept: str, accept_encoding: str) -> tuple[bytes, str, dict[str, str]]:
    """GET /metrics: the body, its content type, and the other response headers."""
    fmt = OPENMETRICS if wants_openmetrics(accept) else TEXT
    compress = "gzip" in accept_encoding
    body = daemon.store.exposition(fmt, compress=compress)
    return body, CONTENT_TYPES[fmt], {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if compress else {}


class MetricsFastPath:
    """GET /metrics answered as a bare ASGI middleware, ahead of FastAPI's exception handling, routing and
    dependency solving (most of a scrape's CPU on the server's thread, which is the thread that waits for the
    GIL while a collector holds it). The response is the route's: the same body and headers. Anything else
    goes on to the app, /metrics with another method included (the route answers it as before)."""

    def __init__(self, app: ASGIApp, daemon: Daemon) -> None:
        self.app = app
        self.daemon = daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        accept = accept_encoding = None
        for name, value in scope["headers"]:  # the first of each, as Request.headers.get
            if name == b"accept" and accept is None:
                accept = value.decode("latin-1")
            elif name == b"accept-encoding" and accept_encoding is None:
                accept_encoding = value.decode("latin-1")
        body, media_type, headers = metrics_response(self.daemon, accept or "", accept_encoding or "")
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw += [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", media_type.encode("latin-1"))]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": body})


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(title="goodput-exporter", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(MetricsFastPath, daemon=daemon)

    # async: served on the event loop's thread. The body is joined from pre-rendered blocks (no I/O), and a
    # sync handler's hop to a worker thread and back costs two more waits for the GIL while a collector
    # holds it, which showed in the p99 (bench/results.md). GET is answered by MetricsFastPath before this.
    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        headers = request.headers
        body, media_type, extra = metrics_response(daemon, headers.get("accept", ""),
                                                   headers.get("accept-encoding", ""))
        return Response(body, media_type=media_type, headers=extra or None)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        reasons = daemon.not_ready()
        sources = {name: name not in reasons for name in daemon.runners}
        body: dict[str, object] = {"ready": not reasons, "sources": sources}
        if reasons:
            body["reasons"] = reasons  # why each source that is not ready is not
        return JSONResponse(body, status_code=503 if reasons else 200)

    @app.get("/", response_class=HTMLResponse)
    def landing() -> str:
        return LANDING.format(version=__version__, backend=daemon.backend_name,
                              sources=", ".join(daemon.runners) or "none")

    return app
