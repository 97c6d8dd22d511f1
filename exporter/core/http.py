"""HTTP endpoints: /metrics, /healthz, /readyz and a landing page. Nothing here touches a GPU."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from . import __version__
from .daemon import Daemon
from .exposition import CONTENT_TYPES, OPENMETRICS, TEXT

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


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(title="goodput-exporter", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)

    # async: served on the event loop's thread. The body is joined from pre-rendered blocks (no I/O), and a
    # sync handler's hop to a worker thread and back costs two more waits for the GIL while a collector
    # holds it, which showed in the p99 (bench/results.md).
    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        headers = request.headers
        fmt = OPENMETRICS if wants_openmetrics(headers.get("accept", "")) else TEXT
        compress = "gzip" in headers.get("accept-encoding", "")
        body = daemon.store.exposition(fmt, compress=compress)
        response_headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if compress else None
        return Response(body, media_type=CONTENT_TYPES[fmt], headers=response_headers)

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
        return LANDING.format(version=__version__, backend=daemon.backend.name,
                              sources=", ".join(daemon.runners) or "none")

    return app
