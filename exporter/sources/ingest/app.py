"""POST /v1/events: batches of step, phase, lifecycle, request and capture events from processes on this node; the
response hands out the capture requests waiting for the ranks that sent them. GET /openapi.json describes it.

Each request is its sender's (`peer.Sender`, from the kernel): it may write only the workloads it owns, within its
uid's caps (`IngestState`); root and ingest.trusted_uids may write any."""

from __future__ import annotations

import hmac
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from goodput_client.contract import EVENTS_PATH, MAX_RANK, WORKLOAD_PATTERN
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from .captures import Captures
from .models import Accepted, CaptureEvent, EventBatch, Refused
from .peer import NO_CREDENTIALS, Sender
from .state import IngestState, Rejected

log = logging.getLogger(__name__)
MAX_DETAILS = 20
OPENAPI_PATH = "/openapi.json"
SCHEMAS = "#/components/schemas/{model}"

REFUSALS = {
    400: "The body is not JSON, or was cut short (the sender went away mid-body).",
    401: "Missing or wrong bearer token (ingest.token_file is set).",
    403: "An event names a workload that another sender owns on this node (see the README's Security section).",
    413: "The body is larger than ingest.max_body_bytes, or holds more than ingest.max_batch_events events.",
    415: "The body is not sent as JSON (Content-Type: application/json).",
    422: "An event (or the query string) is invalid: `details` names the fields.",
    429: "Over a cap of the node (ingest.max_workloads, max_ranks, max_models) or of the sender's uid "
         "(ingest.max_*_per_uid): live workloads, ranks or models.",
}


def _error(status: int, message: str, details: list[dict[str, str]] | None = None) -> JSONResponse:
    body: dict[str, object] = {"error": message}
    if details:
        body["details"] = details
    return JSONResponse(body, status_code=status)


def _query_key(request: Request) -> tuple[str, str] | str | None:
    """The (workload, rank) of `?workload=W&rank=R` (a poll names its sender there: an empty batch has no events to
    name it), None without it, or what is wrong with it."""
    workload, rank = request.query_params.get("workload"), request.query_params.get("rank")
    if workload is None and rank is None:
        return None
    if workload is None or rank is None:
        return "name both workload and rank in the query string (?workload=W&rank=R), or neither"
    if not re.fullmatch(WORKLOAD_PATTERN, workload):
        return f"query string: workload {workload!r} does not match {WORKLOAD_PATTERN}"
    if not rank.isascii() or not rank.isdigit() or int(rank) >= MAX_RANK:
        return f"query string: rank {rank!r} is not a whole number below {MAX_RANK}"
    return workload, str(int(rank))


def _operation(token: bool) -> dict[str, Any]:
    """What FastAPI cannot see of POST /v1/events, which reads its body by hand: the body and the query string."""
    return {
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": SCHEMAS.format(model="EventBatch")}}}},
        # both or neither: one parameter of two properties (form style, exploded: ?workload=W&rank=R)
        "parameters": [{
            "name": "sender", "in": "query", "required": False, "style": "form", "explode": True,
            "description": "The sender of an empty batch, polling for its capture requests: workload and rank.",
            "schema": {"type": "object", "required": ["workload", "rank"],  # other parameters are ignored
                       "properties": {
                           "workload": {"type": "string", "pattern": WORKLOAD_PATTERN},
                           "rank": {"type": "string", "pattern": rf"^[0-9]{{1,{len(str(MAX_RANK - 1))}}}$"}}}}],
        **({"security": [{"bearer": []}]} if token else {}),
    }


def _openapi(app: FastAPI, token: bool) -> dict[str, Any]:
    """FastAPI's schema, with the events' own models (pydantic's JSON schema of EventBatch) in its components."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        events = EventBatch.model_json_schema(ref_template=SCHEMAS)
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {}).update(events.pop("$defs", {}), EventBatch=events)
        if token:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
    return app.openapi_schema


def create_ingest_app(state: IngestState, token: str | None, max_body_bytes: int,
                      max_batch_events: int, captures: Captures | None = None) -> FastAPI:
    app = FastAPI(title="goodput-exporter ingest", docs_url=None, redoc_url=None, openapi_url=OPENAPI_PATH,
                  description="Events from training jobs and inference servers on this node (the goodput-client "
                  "package sends them).")
    app.openapi = lambda: _openapi(app, token is not None)  # type: ignore[method-assign]
    expected = f"Bearer {token}".encode() if token else None
    too_large = f"body larger than ingest.max_body_bytes={max_body_bytes}"
    warned: set[str] = set()  # once-only log lines

    def refuse(reason: str, status: int, message: str, details: list[dict[str, str]] | None = None) -> JSONResponse:
        state.reject(reason)  # counted in goodput_ingest_rejected_requests_total{reason}
        return _error(status, message, details)

    @app.post(EVENTS_PATH, openapi_extra=_operation(token is not None), response_model=None,
              summary="Send a batch of events", responses={
                  200: {"model": Accepted, "description": "Every event was applied."},
                  **{status: {"model": Refused, "description": f"Refused whole, nothing applied. {why}"}
                     for status, why in REFUSALS.items()}})
    async def events(request: Request) -> JSONResponse:
        # who sent it, as the kernel says (PeerCredProtocol); no credentials: a TCP sender
        sender: Sender = request.scope.get("state", {}).get("sender") or NO_CREDENTIALS
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return refuse("unauthorized", 401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        if not request.headers.get("content-type", "").startswith("application/json"):
            return refuse("invalid", 415, "send the events as JSON (Content-Type: application/json)")
        polling = _query_key(request)
        if isinstance(polling, str):
            return refuse("invalid", 422, polling)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return refuse("oversize", 413, too_large)
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_body_bytes:
                    return refuse("oversize", 413, too_large)
        except ClientDisconnect:  # the answer goes nowhere; the count and the line are what is left of it
            log.info("ingest: %s went away after %d of %s body bytes; the request is counted as truncated",
                     sender, len(body), length if length is not None else "(chunked)")
            return refuse("truncated", 400, "the body was cut short: the sender went away before its end")
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
        answers = [e for e in batch.events if isinstance(e, CaptureEvent)]
        events = [e for e in batch.events if not isinstance(e, CaptureEvent)] if answers else batch.events
        try:
            # what the request touches besides its events: capture answers, and the capture requests it polls for
            touched = {e.workload for e in answers} | ({polling[0]} if polling is not None else set())
            if touched:
                state.authorize(sender, touched)
            # the sender's PID (Unix socket only): its events declare which workload and rank it is
            state.apply(events, peer_pid=sender.pid, sender=sender)
        except Rejected as exc:
            return _error(exc.status, str(exc))  # capture answers included: the batch is all or nothing
        body_out: dict[str, object] = {"accepted": len(batch.events)}
        if answers:
            state.count_accepted("capture", len(answers))  # answers are not a rank's activity: counted here
            if captures is None:
                if "off" not in warned:
                    warned.add("off")
                    log.warning("ingest: capture answers arrive but captures are off (ingest.capture_dir is empty); "
                                "counted as accepted, nothing recorded")
            else:
                await run_in_threadpool(_answer, captures, answers)  # disk work: off the event loop
        if captures is not None and captures.has_pending():
            keys = {(e.workload, str(e.rank)) for e in batch.events}
            if polling is not None:
                keys.add(polling)
            requests = await run_in_threadpool(captures.pending, keys)
            if requests:
                body_out["captures"] = requests
        return JSONResponse(body_out)

    return app


def _answer(captures: Captures, answers: list[CaptureEvent]) -> None:
    for event in answers:
        captures.answer(event)
