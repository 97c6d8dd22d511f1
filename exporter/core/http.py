"""HTTP: the listening sockets, a quiet uvicorn server, and the daemon's endpoints (/metrics, /healthz,
/readyz and a landing page). Nothing here touches a GPU.

Sockets are opened before any server starts, so that an error names the address; the events API of the
ingest source is served by the same kind of server on its own sockets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from .exposition import CONTENT_TYPES, OPENMETRICS, TEXT
from .settings import parse_listen_address

if TYPE_CHECKING:
    from .daemon import Daemon

TICK_SECONDS = 1.0

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


def unix_socket(path: str) -> socket.socket:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        if not stat.S_ISSOCK(target.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket; not replacing it")
        target.unlink()  # left behind by an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)  # jobs run as any user; use ingest.token_file to restrict who may write
    sock.listen(512)
    return sock


# --- servers ---------------------------------------------------------------------------------------
class QuietServer(uvicorn.Server):
    """A uvicorn.Server that checks for shutdown once a second instead of every 100 ms.

    An idle exporter is mostly this loop: two servers (metrics, events) at 10 wakeups/s each cost more
    CPU than collecting 8 GPUs. Shutdown now takes up to a second longer, which nobody notices.
    """

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864_000  # on_tick refreshes the Date header when counter % 10 == 0
            await asyncio.sleep(TICK_SECONDS)
            should_exit = await self.on_tick(counter)


class ServerThread:
    """A QuietServer serving `app` on already-bound sockets from a background thread."""

    def __init__(self, app: object, sockets: list[socket.socket], name: str,
                 http: type[asyncio.Protocol] | str = "httptools") -> None:
        self.server = QuietServer(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", http=http))  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, name=name,
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
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
<li><a href="readyz">/readyz</a> &mdash; every enabled source has finished a collection</li>
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
        sources = daemon.ready()
        ready = all(sources.values())
        return JSONResponse({"ready": ready, "sources": sources}, status_code=200 if ready else 503)

    @app.get("/", response_class=HTMLResponse)
    def landing() -> str:
        return LANDING.format(version=__version__, backend=daemon.backend_name,
                              sources=", ".join(daemon.runners) or "none")

    return app
