"""POST /v1/events: batches of step, phase and lifecycle events from processes on this node."""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from goodput_client.contract import EVENTS_PATH
from pydantic import ValidationError

from .models import EventBatch
from .state import IngestState, Rejected

log = logging.getLogger(__name__)
MAX_DETAILS = 20


def _error(status: int, message: str, details: list[dict[str, str]] | None = None) -> JSONResponse:
    body: dict[str, object] = {"error": message}
    if details:
        body["details"] = details
    return JSONResponse(body, status_code=status)


def create_ingest_app(state: IngestState, token: str | None, max_body_bytes: int,
                      max_batch_events: int) -> FastAPI:
    app = FastAPI(title="goodput-exporter ingest", docs_url=None, redoc_url=None, openapi_url=None)
    expected = f"Bearer {token}".encode() if token else None
    too_large = f"body larger than ingest.max_body_bytes={max_body_bytes}"

    def refuse(reason: str, status: int, message: str, details: list[dict[str, str]] | None = None) -> JSONResponse:
        state.reject(reason)  # counted in goodput_ingest_rejected_requests_total{reason}
        return _error(status, message, details)

    @app.post(EVENTS_PATH)
    async def events(request: Request) -> JSONResponse:
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return refuse("unauthorized", 401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        if not request.headers.get("content-type", "").startswith("application/json"):
            return refuse("invalid", 415, "send the events as JSON (Content-Type: application/json)")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return refuse("oversize", 413, too_large)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                return refuse("oversize", 413, too_large)
        try:
            batch = EventBatch.model_validate_json(bytes(body))
        except ValidationError as exc:
            problems = exc.errors(include_url=False)
            if problems and problems[0]["type"] == "json_invalid":
                return refuse("invalid", 400, f"body is not valid JSON: {problems[0]['msg']}")
            details = [{"at": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                       for e in problems[:MAX_DETAILS]]
            return refuse("invalid", 422, f"{len(problems)} invalid field(s); nothing was applied", details)
        if len(batch.events) > max_batch_events:
            return refuse("oversize", 413,
                          f"{len(batch.events)} events in one request; ingest.max_batch_events is {max_batch_events}")
        try:
            # the sender's PID (Unix socket only): its events declare which workload and rank it is
            state.apply(batch.events, peer_pid=request.scope.get("state", {}).get("peer_pid"))
        except Rejected as exc:
            return _error(exc.status, str(exc))
        return JSONResponse({"accepted": len(batch.events)})

    return app
