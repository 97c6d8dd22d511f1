"""The events API's contract and its own hardening, on a real daemon's Unix socket: the OpenAPI schema it serves,
schemathesis fuzzing against that schema (no 5xx, every accepted event counted, every refusal counted), integers
written as floats, and a body cut short by a sender that went away."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from conftest import live_server, quick_config, samples, value, wait_for
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from exporter.sources.ingest.app import OPENAPI_PATH, SCHEMAS
from exporter.sources.ingest.models import EventBatch
from exporter.sources.nvml.simulated import SimulatedGpus

EXAMPLES = 100  # per generation mode (positive, then negative): 200 cases in all, a few seconds each mode
REQUEST_KEYS = ("method", "url", "headers", "params", "cookies", "data", "json", "files")
STATUSES = ("200", "400", "401", "403", "413", "415", "422", "429")  # what the issue asked to be documented


def uds_client(path: str, **headers: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", headers=headers,
                        timeout=10)


def total(text: str, name: str) -> float:
    return sum(v for (n, _), v in samples(text).items() if n == name)


def test_the_schema_served_is_the_validators() -> None:
    """GET /openapi.json on the events socket: POST /v1/events with EventBatch's own JSON schema as its body, its
    query string, and a body schema for every answer."""
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)), uds_client(config.ingest.socket_path) as client:
        response = client.get(OPENAPI_PATH)
        assert response.status_code == 200
        doc = response.json()
    operation = doc["paths"]["/v1/events"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": SCHEMAS.format(model="EventBatch")}
    components = doc["components"]["schemas"]
    expected = EventBatch.model_json_schema(ref_template=SCHEMAS)
    for name, schema in expected.pop("$defs").items():
        assert components[name] == schema, name
    assert components["EventBatch"] == expected
    (query,) = operation["parameters"]
    assert set(query["schema"]["properties"]) == set(query["schema"]["required"]) == {"workload", "rank"}
    assert set(STATUSES) <= set(operation["responses"])
    for status, answer in operation["responses"].items():
        ref = answer["content"]["application/json"]["schema"]["$ref"]
        assert ref.rpartition("/")[2] in components, status
    assert "securitySchemes" not in doc["components"]  # no token configured: no bearer scheme


def test_the_schema_names_the_bearer_token_when_one_is_needed(tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = quick_config(ingest={"token_file": str(token)})
    with live_server(config, backend=SimulatedGpus(1)), uds_client(config.ingest.socket_path) as client:
        doc = client.get(OPENAPI_PATH).json()  # the schema itself is public
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert doc["paths"]["/v1/events"]["post"]["security"] == [{"bearer": []}]


def test_schemathesis_finds_no_server_error_and_nothing_accepted_is_lost() -> None:
    """Cases generated from the served schema (valid ones and invalid ones), sent over the Unix socket: no 5xx;
    every answer as documented; valid data accepted, invalid data refused; and the daemon's counters account for
    every request: accepted events (the sum of the 200s' `accepted`) and refused requests alike."""
    # caps far above what the cases can reach: a valid case is then always accepted (positive_data_acceptance). The
    # sender is this process: as root it is trusted and only the node's caps apply; the per-uid ones are for others
    caps = {"max_workloads": 100_000, "max_ranks": 1_000_000, "max_models": 100_000}
    config = quick_config(ingest={**caps, **{f"{name}_per_uid": cap for name, cap in caps.items()}})
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        schema = schemathesis.openapi.from_dict(client.get(OPENAPI_PATH).json())
        operation = schema["/v1/events"]["POST"]
        before = live.metrics()
        statuses: Counter[int] = Counter()
        accepted = 0

        def exchange(case: schemathesis.Case) -> None:
            nonlocal accepted
            # schemathesis's own serialization of the case (a requests.Request), sent over the socket by httpx
            kwargs = case.as_transport_kwargs(base_url="http://goodput")
            prepared = requests.Request(**{k: v for k, v in kwargs.items() if k in REQUEST_KEYS}).prepare()
            response = client.request(prepared.method or "POST", prepared.url or "", content=prepared.body,
                                      headers={k: v for k, v in prepared.headers.items() if k.lower() != "host"})
            statuses[response.status_code] += 1
            if response.status_code == 200:
                accepted += response.json()["accepted"]
            case.validate_response(response, checks=[
                not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
                positive_data_acceptance, negative_data_rejection])

        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                           suppress_health_check=list(HealthCheck))(given(case=operation.as_strategy(mode))(exchange))
            run()

        assert not [s for s in statuses if s >= 500], statuses
        assert statuses[200] > EXAMPLES // 4, statuses  # the valid cases were accepted, not refused by a cap
        refused = sum(n for s, n in statuses.items() if s != 200)
        assert refused > EXAMPLES // 4, statuses  # and the invalid ones were sent and refused
        want = (total(before, "goodput_ingest_events_accepted_total") + accepted,
                total(before, "goodput_ingest_rejected_requests_total") + refused)
        wait_for(lambda: (total(live.metrics(), "goodput_ingest_events_accepted_total"),
                          total(live.metrics(), "goodput_ingest_rejected_requests_total")) == want)


def phase(rank: Any, seconds: Any = 1.0, **extra: Any) -> dict[str, Any]:
    return {"type": "phase", "workload": "floats", "rank": rank, "phase": "compute", "seconds": seconds, **extra}


def test_a_whole_number_written_as_a_float_is_an_integer() -> None:
    """JSON has one number type: 5.0 where an integer is expected is 5; 5.5, "5" and true are not integers."""
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        step = {"type": "step", "workload": "floats", "rank": 5.0, "duration_seconds": 0.5, "tokens": 4096.0,
                "samples": 8.0, "step": 3.0}
        response = client.post("/v1/events", json={"events": [step, phase(5.0)]})
        assert response.status_code == 200, response.text
        text = live.metrics_when("goodput_tokens_total", 4096, workload="floats", rank="5")
        assert value(text, "goodput_samples_total", workload="floats", rank="5") == 8
        assert value(text, "goodput_step_number", workload="floats", rank="5") == 3
        for bad, problem in ((5.5, "fractional part"), ("5", "valid integer"), (True, "valid integer")):
            response = client.post("/v1/events", json={"events": [phase(bad)]})
            assert response.status_code == 422, response.text
            details = response.json()["details"]
            assert details[0]["at"] == "events.0.phase.rank" and problem in details[0]["problem"], details
        live.metrics_when("goodput_ingest_rejected_requests_total", 3, reason="invalid")


def test_a_body_cut_short_is_a_counted_refusal_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """The sender goes away mid-body: counted as truncated, one log line without a traceback, and the daemon keeps
    serving."""
    config = quick_config()
    caplog.set_level(logging.INFO)
    body = json.dumps({"events": [phase(0)] * 50}).encode()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        for cut in (len(body) // 2, 0):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(config.ingest.socket_path)
                sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: goodput\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body[:cut])
                time.sleep(0.2)  # the server has read what there is, and waits for the rest
        text = live.metrics_when("goodput_ingest_rejected_requests_total", 2, reason="truncated")
        assert value(text, "goodput_ingest_events_accepted_total", type="phase") == 0
        with uds_client(config.ingest.socket_path) as client:
            assert client.post("/v1/events", json={"events": [phase(0)]}).status_code == 200
    lines = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in r.getMessage() for r in lines), [r.getMessage() for r in lines]
    assert f"of {len(body)} body bytes" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]

