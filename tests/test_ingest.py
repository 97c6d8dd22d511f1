"""POST /v1/events on a real Unix socket: accepted events become series; bad requests get clear 4xx."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import ManualClock, free_port, live_server, promtool, quick_config, series, value, wait_for
from goodput_client import Telemetry

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.ingest.models import EventBatch
from exporter.sources.ingest.state import IngestState, Rejected
from exporter.sources.nvml.simulated import SimulatedGpus


def uds_client(path: str, **headers: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", headers=headers,
                        timeout=5)


def step(workload: str = "llama", rank: int = 0, duration: float = 0.5, **extra: object) -> dict:
    return {"type": "step", "workload": workload, "rank": rank, "duration_seconds": duration,
            "tokens": 4096, "samples": 8, **extra}


def phase(name: str, seconds: float, workload: str = "llama", rank: int = 0) -> dict:
    return {"type": "phase", "workload": workload, "rank": rank, "phase": name, "seconds": seconds}


def test_events_become_series() -> None:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        events = [step(duration=0.3), step(duration=0.7), step(rank=1, duration=2.0),
                  phase("compute", 0.9), phase("data_wait", 0.1), phase("data_wait", 0.05),
                  {"type": "lifecycle", "workload": "llama", "rank": 0, "event": "restart"}]
        response = client.post("/v1/events", json={"events": events})
        assert response.status_code == 200 and response.json() == {"accepted": 7}
        wait_for(lambda: value(live.metrics(), "goodput_steps_total", workload="llama", rank="0") == 2)
        text = live.metrics()
        assert value(text, "goodput_tokens_total", workload="llama", rank="0") == 8192
        assert value(text, "goodput_samples_total", workload="llama", rank="1") == 8
        assert value(text, "goodput_phase_seconds_total", workload="llama", rank="0",
                     phase="data_wait") == pytest.approx(0.15)
        assert value(text, "goodput_phase_seconds_total", workload="llama", rank="0", phase="checkpoint_save") == 0
        assert value(text, "goodput_workload_restarts_total", workload="llama", rank="0") == 1
        assert value(text, "goodput_step_duration_seconds_count", workload="llama", rank="0") == 2
        assert value(text, "goodput_step_duration_seconds_sum", workload="llama", rank="0") == pytest.approx(1.0)
        assert value(text, "goodput_step_duration_seconds_bucket", workload="llama", rank="0", le="0.5") == 1
        assert value(text, "goodput_step_duration_seconds_bucket", workload="llama", rank="1", le="1.0") == 0
        assert value(text, "goodput_step_duration_seconds_bucket", workload="llama", rank="1", le="+Inf") == 1
        assert value(text, "goodput_ingest_events_accepted_total", type="phase") == 3
        result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
        assert (result.returncode, result.stdout + result.stderr) == (0, "")


BAD = [
    ("wrong type", {"events": [step(duration="fast")]}, 422, "events.1.step.duration_seconds"),
    ("string number", {"events": [step(rank="0")]}, 422, "events.1.step.rank"),
    ("negative duration", {"events": [phase("compute", -1.0)]}, 422, "greater than or equal to 0"),
    ("absurd duration", {"events": [step(duration=1e9)]}, 422, "less than or equal to 86400"),
    ("zero step", {"events": [step(duration=0)]}, 422, "greater than 0"),
    ("unknown phase", {"events": [phase("lunch", 1.0)]}, 422, "'compute', 'data_wait'"),
    ("unknown type", {"events": [{"type": "epoch", "workload": "w", "rank": 0}]}, 422, "does not match any"),
    ("unknown field", {"events": [step(gpu=3)]}, 422, "events.1.step.gpu"),
    ("bad workload name", {"events": [step(workload="a b")]}, 422, "events.1.step.workload"),
    ("negative tokens", {"events": [step(tokens=-5)]}, 422, "events.1.step.tokens"),
    ("no events key", {"evts": []}, 422, "events"),
]


@pytest.mark.parametrize(("name", "body", "status", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_events_are_rejected_and_nothing_is_applied(name: str, body: dict, status: int, message: str) -> None:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        good = step(workload="untouched")
        payload = {**body, "events": [good, *body.get("events", [])]} if "events" in body else body
        response = client.post("/v1/events", json=payload)
        assert response.status_code == status, response.text
        assert message in json.dumps(response.json()), response.json()
        wait_for(lambda: value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="invalid") == 1)
        assert value(live.metrics(), "goodput_steps_total", workload="untouched", rank="0") is None


def test_malformed_requests() -> None:
    config = quick_config(ingest={"max_body_bytes": 2048, "max_batch_events": 3})
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        response = client.post("/v1/events", content=b'{"events": [', headers={"content-type": "application/json"})
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
        response = client.post("/v1/events", content=b"events", headers={"content-type": "text/plain"})
        assert response.status_code == 415
        response = client.post("/v1/events", json={"events": [step()] * 4})
        assert response.status_code == 413 and "max_batch_events is 3" in response.json()["error"]
        response = client.post("/v1/events", json={"events": [step(workload="x" * 100)] * 3, "pad": "y" * 3000})
        assert response.status_code == 413 and "max_body_bytes=2048" in response.json()["error"]

        def chunks():  # type: ignore[no-untyped-def]
            yield b'{"events": ['
            yield b" " * 4096
            yield b"]}"

        response = client.post("/v1/events", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413  # no Content-Length: the stream is cut off at the limit
        assert client.get("/v1/events").status_code == 405
        wait_for(lambda: value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="oversize") == 3)
        assert value(live.metrics(), "goodput_exporter_source_up", source="ingest") == 1


def test_bearer_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    config = quick_config(ingest={"token_file": str(token_file)})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        with uds_client(config.ingest.socket_path) as client:
            assert client.post("/v1/events", json={"events": [step()]}).status_code == 401
        with uds_client(config.ingest.socket_path, authorization="Bearer wrong") as client:
            response = client.post("/v1/events", json={"events": [step()]})
            assert response.status_code == 401 and "bearer token" in response.json()["error"]
        with uds_client(config.ingest.socket_path, authorization="Bearer s3cret") as client:
            assert client.post("/v1/events", json={"events": [step()]}).status_code == 200
        wait_for(lambda: value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="unauthorized") == 2)


def test_caps_reject_whole_batches_and_count_them() -> None:
    config = quick_config(ingest={"max_workloads": 2, "max_ranks": 3})
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        assert client.post("/v1/events", json={"events": [step("a", 0), step("b", 0)]}).status_code == 200
        response = client.post("/v1/events", json={"events": [step("a", 1), step("c", 0)]})
        assert response.status_code == 429 and "max_workloads=2" in response.json()["error"]
        assert client.post("/v1/events", json={"events": [step("a", 1)]}).status_code == 200
        response = client.post("/v1/events", json={"events": [step("b", 1)]})
        assert response.status_code == 429 and "max_ranks=3" in response.json()["error"]
        wait_for(lambda: value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="rank_cap") == 1)
        text = live.metrics()
        assert value(text, "goodput_ingest_rejected_requests_total", reason="workload_cap") == 1
        assert value(text, "goodput_steps_total", workload="a", rank="1") == 1  # nothing half-applied
        assert value(text, "goodput_steps_total", workload="c", rank="0") is None


def test_loopback_tcp_listener() -> None:
    port = free_port()
    config = quick_config(ingest={"listen_address": f"127.0.0.1:{port}"})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        response = httpx.post(f"http://127.0.0.1:{port}/v1/events", json={"events": [step("tcp")]})
        assert response.status_code == 200
        wait_for(lambda: value(live.metrics(), "goodput_steps_total", workload="tcp", rank="0") == 1)
        assert live.client.post("/v1/events", json={"events": [step()]}).status_code == 404  # not on /metrics port


def test_unusable_socket_path_is_reported_and_metrics_still_served(tmp_path: Path) -> None:
    blocker = tmp_path / "ingest.sock"
    blocker.write_text("a regular file, not a socket")
    config = quick_config(ingest={"socket_path": str(blocker)})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="ingest") == 0)
        text = live.metrics()
        assert value(text, "goodput_exporter_source_errors_total", source="ingest", reason="listen_failed") >= 1
        assert value(text, "goodput_exporter_source_up", source="nvml") == 1
    assert blocker.read_text() == "a regular file, not a socket"  # never replaced


def test_idle_and_ended_ranks_expire() -> None:
    clock = ManualClock()
    state = IngestState(max_workloads=4, max_ranks=8, idle_timeout=600, clock=clock)
    events = EventBatch.model_validate({"events": [step("idle", 0), step("done", 0)]}).events
    state.apply(events)
    state.apply(EventBatch.model_validate(
        {"events": [{"type": "lifecycle", "workload": "done", "rank": 0, "event": "end"}]}).events)
    clock.advance(30)
    text = Renderer().render(state.snapshot(), TEXT).decode()
    assert {s["workload"] for s in series(text, "goodput_steps_total")} == {"idle", "done"}
    clock.advance(61)
    text = Renderer().render(state.snapshot(), TEXT).decode()
    assert {s["workload"] for s in series(text, "goodput_steps_total")} == {"idle"}
    clock.advance(600)
    assert series(Renderer().render(state.snapshot(), TEXT).decode(), "goodput_steps_total") == []
    state.apply(events)  # room again: expired ranks no longer count against the caps
    with pytest.raises(Rejected):
        state.apply(EventBatch.model_validate({"events": [step(f"w{i}", 0) for i in range(4)]}).events)


def test_own_variation_is_the_spread_of_each_ranks_own_time_per_step() -> None:
    """goodput_step_own_variation_ratio, from the real client's events: 0 for the same work each step whatever its
    waits (comm_wait is not the rank's own time) and whatever one odd step (a checkpoint); the spread of a rank whose
    work differs from step to step; absent below 32 steps with phases, and for steps reported without phases."""
    config = quick_config()
    with live_server(config) as live:
        ranks = {name: Telemetry("varied", rank, socket_path=config.ingest.socket_path, flush_interval=0.05,
                                 captures=False)
                 for rank, name in enumerate(("steady", "waits", "uneven", "few", "bare"))}
        try:
            for n in range(40):
                ranks["steady"].record_phase("compute", 0.2)
                if n == 10:  # one checkpoint step among forty
                    ranks["steady"].record_phase("checkpoint_save", 5.0)
                ranks["waits"].record_phase("compute", 0.2)
                ranks["waits"].record_phase("comm_wait", 0.1 * (n % 5))  # waits for its peers, differently
                ranks["uneven"].record_phase("compute", (0.1, 0.2, 0.3, 0.4)[n % 4])  # the batch differs
                ranks["uneven"].record_phase("comm_wait", 0.05)
                if n < 31:
                    ranks["few"].record_phase("compute", 0.1 * (1 + n % 2))
                    ranks["few"].record_step(0.3)
                for name in ("steady", "waits", "uneven", "bare"):
                    ranks[name].record_step(0.6)
            for telemetry in ranks.values():
                telemetry.flush()

            def published() -> dict[str, float | None]:
                text = live.metrics()
                if value(text, "goodput_steps_total", workload="varied", rank="4") != 40:
                    return {}
                return {name: value(text, "goodput_step_own_variation_ratio", workload="varied", rank=str(rank))
                        for rank, name in enumerate(ranks)}

            found = wait_for(published)
        finally:
            for telemetry in ranks.values():
                telemetry.close()
    assert found["steady"] == 0 and found["waits"] == 0, found
    # own times 0.1, 0.2, 0.3, 0.4 s ten times each: quartiles at positions 10.25 and 30.75 of 40 (0.125 s and
    # 0.375 s), median 0.25 s; a normal distribution's interquartile range is 1.349 standard deviations
    assert found["uneven"] == pytest.approx((0.375 - 0.125) / 1.349 / 0.25, rel=1e-6), found
    assert found["few"] is None and found["bare"] is None, found
