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
import socket
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .. import __version__
from .connections import Connections, ServerLimits, bounded_protocol
from .daemon import StartRefused
from .exposition import CONTENT_TYPES, OPENMETRICS, TEXT
from .settings import WebConfig, parse_listen_address

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
FIRST_RETRY_SECONDS = 1.0  # a listener that failed is tried again after this, then twice as long each time
SHUTDOWN_GRACE = 1.0  # after shutdown_timeout has cut the connections, their tasks get this long to end


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
