"""POST /v1/events: batches of step, phase, lifecycle, request and capture events from processes on this node; the
response hands out the capture requests waiting for the ranks that sent them."""

from __future__ import annotations

import hmac
import logging
import re

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from goodput_client.contract import EVENTS_PATH, MAX_RANK, WORKLOAD_PATTERN
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from .captures import Captures
from .models import CaptureEvent, EventBatch
from .state import IngestState, Rejected

log = logging.getLogger(__name__)
MAX_DETAILS = 20


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


def create_ingest_app(state: IngestState, token: str | None, max_body_bytes: int,
                      max_batch_events: int, captures: Captures | None = None) -> FastAPI:
    app = FastAPI(title="goodput-exporter ingest", docs_url=None, redoc_url=None, openapi_url=None)
    expected = f"Bearer {token}".encode() if token else None
    too_large = f"body larger than ingest.max_body_bytes={max_body_bytes}"
    warned: set[str] = set()  # once-only log lines

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
        polling = _query_key(request)
        if isinstance(polling, str):
            return refuse("invalid", 422, polling)
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
        answers = [e for e in batch.events if isinstance(e, CaptureEvent)]
        events = [e for e in batch.events if not isinstance(e, CaptureEvent)] if answers else batch.events
        try:
            # the sender's PID (Unix socket only): its events declare which workload and rank it is
            state.apply(events, peer_pid=request.scope.get("state", {}).get("peer_pid"))
        except Rejected as exc:
            return _error(exc.status, str(exc))  # capture answers included: the batch is all or nothing
        body: dict[str, object] = {"accepted": len(batch.events)}
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
                body["captures"] = requests
        return JSONResponse(body)

    return app


def _answer(captures: Captures, answers: list[CaptureEvent]) -> None:
    for event in answers:
        captures.answer(event)
