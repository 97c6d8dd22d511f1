"""goodput_client's inference path against a real daemon: requests timed by the client (under a fake clock, and
in a streaming server on uvicorn read by real HTTP clients) or measured by the server become exact histograms and
SLO counts; bad request events and the model cap."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import goodput_client.telemetry as telemetry_module
import httpx
import pytest
from conftest import LiveServer, ManualClock, free_port, live_server, quick_config, samples, series, value, wait_for
from goodput_client import Telemetry
from goodput_client.contract import (
    E2E_BUCKETS,
    FINISH_REASONS,
    ITL_BUCKETS,
    MAX_COUNT,
    MAX_SECONDS,
    QUEUE_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    request_event,
)

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.ingest.models import EventBatch
from exporter.sources.ingest.state import IngestState, Rejected
from exporter.sources.nvml.simulated import SimulatedGpus

WORKLOAD = "serve"
TTFT_OBJECTIVE, TPOT_OBJECTIVE = 0.25, 0.05  # both bucket bounds: the histograms can bound the joint count


@dataclass
class Sent:
    """One request as the test sent it, and what the test expects of it, computed here independently."""

    model: str
    ttft: float | None
    tpot: float | None
    e2e: float
    gaps: list[float]
    output_tokens: int
    prompt_tokens: int
    reason: str
    ttft_objective: float = TTFT_OBJECTIVE
    tpot_objective: float = TPOT_OBJECTIVE
    queue: float | None = None


@dataclass
class Server:
    """An inference server's handler, driven by the fake clock."""

    telemetry: Telemetry
    clock: ManualClock
    sent: list[Sent] = field(default_factory=list)

    def serve(self, model: str, tokens: list[tuple[float, int]], end: float, *, prompt_tokens: int = 7,
              reason: str | None = None, raises: BaseException | None = None, queued: float | None = None,
              ttft_objective: float | None = None, tpot_objective: float | None = None,
              recorded: str | None = None) -> None:
        """A request arriving now: `tokens` (seconds after arrival, how many), ended `end` after arrival.
        `recorded`: the finish reason the daemon should see, when it is not `reason`."""
        arrival = self.clock.now
        overrides = {k: v for k, v in (("ttft_objective_seconds", ttft_objective),
                                       ("tpot_objective_seconds", tpot_objective)) if v is not None}
        try:
            with self.telemetry.request(model, prompt_tokens=prompt_tokens, **overrides) as r:
                if queued is not None:
                    self.clock.now = arrival + queued
                    r.queued()
                for at, n in tokens:
                    self.clock.now = arrival + at
                    if n == 1:
                        r.token()
                    else:
                        r.token(n)
                self.clock.now = arrival + end
                if reason is not None:
                    r.finish_reason = reason
                if raises is not None:
                    raise raises
        except BaseException as exc:
            assert exc is raises  # unchanged, not swallowed
        else:
            assert raises is None
        self.clock.now = arrival + end + 1.0  # the next one arrives later
        times = [at for at, _ in tokens]
        output = sum(n for _, n in tokens)
        expected = Sent(
            model, times[0] if times else None,
            (times[-1] - times[0]) / (output - 1) if output >= 2 else None, end,
            [b - a for a, b in itertools.pairwise(times)], output, prompt_tokens,
            recorded or reason or ("stop" if raises is None else "error"),
            ttft_objective or TTFT_OBJECTIVE, tpot_objective or TPOT_OBJECTIVE, queued)
        self.sent.append(expected)
        # what the caller reads after the block is what the daemon will count
        assert (r.ttft_seconds, r.tpot_seconds, r.e2e_seconds, r.queue_seconds) == (
            expected.ttft, expected.tpot, expected.e2e, expected.queue)
        assert (r.ttft_met, r.tpot_met, r.met) == judged(expected)
        assert r.finish_reason == expected.reason


def judged(s: Sent) -> tuple[bool | None, bool | None, bool | None]:
    ttft = None if s.ttft is None else s.ttft <= s.ttft_objective
    tpot = None if s.tpot is None else s.tpot <= s.tpot_objective
    return ttft, tpot, None if ttft is None else ttft and tpot in (True, None)


def histogram(text: str, name: str, model: str) -> tuple[dict[float, float], float, float]:
    """{le: cumulative count}, sum, count of one (workload, model) series."""
    buckets = {float(dict(labels)["le"]): v for (n, labels), v in samples(text).items()
               if n == f"{name}_bucket" and {("workload", WORKLOAD), ("model", model)} <= labels}
    return (buckets, value(text, f"{name}_sum", workload=WORKLOAD, model=model),
            value(text, f"{name}_count", workload=WORKLOAD, model=model))


def assert_histogram(text: str, name: str, model: str, bounds: tuple[float, ...], observed: list[float],
                     counts: list[int] | None = None) -> None:
    buckets, total, count = histogram(text, name, model)
    expected = {b: sum(1 for v in observed if v <= b) for b in bounds} | {math.inf: len(observed)}
    if counts is not None:  # observations that were only counted (gaps of a chunk)
        expected = {b: c for b, c in zip((*bounds, math.inf), counts, strict=True)}
    assert buckets == expected, name
    assert count == expected[math.inf], name
    assert total == pytest.approx(sum(observed), abs=1e-12), name


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    clock = ManualClock(1024.0)  # the client's perf_counter; times in 1/1024 s steps from here: exact differences
    monkeypatch.setattr(telemetry_module, "_perf", clock)
    return clock


def test_requests_become_exact_histograms_and_slo_counts(fake_clock: ManualClock) -> None:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        telemetry = Telemetry(WORKLOAD, 0, socket_path=config.ingest.socket_path, flush_interval=0.02,
                              ttft_objective_seconds=TTFT_OBJECTIVE, tpot_objective_seconds=TPOT_OBJECTIVE)
        server = Server(telemetry, fake_clock)
        k = 1 / 1024

        def steady(ttft: float, gap: float, n: int) -> list[tuple[float, int]]:
            return [(ttft + i * gap, 1) for i in range(n)]

        llama = "llama-3.1-8b@fp8"
        server.serve(llama, steady(0.125, 32 * k, 5), 1.0)  # both met
        server.serve(llama, steady(0.0625, 0.0625, 3), 0.5)  # TTFT only
        server.serve(llama, steady(0.5, 16 * k, 9), 0.75)  # TPOT only
        server.serve(llama, steady(1.0, 0.125, 4), 2.0)  # neither
        server.serve(llama, [(0.25, 1)], 0.375)  # one token, exactly at the objective: both met
        server.serve(llama, [(0.375, 1)], 0.5, reason="length")  # one token, too late
        server.serve(llama, steady(32 * k, 0.5, 2), 1.5, raises=RuntimeError("engine died"))  # error
        server.serve(llama, [], 0.25, raises=asyncio.CancelledError(), recorded="abort")  # the client went away
        server.serve(llama, [(0.1875, 4), (0.25, 4), (0.375, 2)], 0.5, queued=8 * k)  # chunks of tokens
        server.serve(llama, steady(0.0625, 48 * k, 6), 0.625, reason="tool_calls", recorded="stop")
        server.serve(llama, steady(0.0078125, 4 * k, 3), 0.125, reason="abort", raises=ValueError("x"),
                     queued=2 * k)  # the reason set in the block wins over the exception's
        server.serve(llama, [], 3.0, reason="error", queued=0.5)
        # a server that measured itself
        telemetry.record_request(llama, 0.2, 0.04, 1.5, 4, prompt_tokens=11, inter_token_seconds=[0.03, 0.05, 0.04],
                                 queue_seconds=0.01, finish_reason="length")
        server.sent.append(Sent(llama, 0.2, 0.04, 1.5, [0.03, 0.05, 0.04], 4, 11, "length", queue=0.01))
        # another model, judged against per-request objectives
        mistral = "mistral/7b-instruct:v0.3"
        server.serve(mistral, steady(0.5, 0.0625, 3), 1.0, ttft_objective=1.0, tpot_objective=0.075)  # both
        server.serve(mistral, steady(0.5, 0.0625, 3), 1.0)  # the defaults: neither
        server.serve(mistral, steady(2.0, 0.25, 2), 3.0, ttft_objective=2.5, tpot_objective=0.2)  # TTFT only
        requests = len(server.sent)
        assert telemetry.flush()
        text = live.metrics_when("goodput_ingest_events_accepted_total", requests, type="request")
        telemetry.close()
    assert (telemetry.sent, telemetry.dropped) == (requests + 2, 0)  # and start, end
    assert value(text, "goodput_workload_last_event_timestamp_seconds", workload=WORKLOAD, rank="0") > 0

    for model in (llama, mistral):
        sent = [s for s in server.sent if s.model == model]
        ttfts = [s.ttft for s in sent if s.ttft is not None]
        tpots = [s.tpot for s in sent if s.tpot is not None]
        assert_histogram(text, "goodput_inference_time_to_first_token_seconds", model, TTFT_BUCKETS, ttfts)
        assert_histogram(text, "goodput_inference_time_per_output_token_seconds", model, TPOT_BUCKETS, tpots)
        assert_histogram(text, "goodput_inference_inter_token_latency_seconds", model, ITL_BUCKETS,
                         [g for s in sent for g in s.gaps])
        assert_histogram(text, "goodput_inference_e2e_request_latency_seconds", model, E2E_BUCKETS,
                         [s.e2e for s in sent])
        assert_histogram(text, "goodput_inference_queue_time_seconds", model, QUEUE_BUCKETS,
                         [s.queue for s in sent if s.queue is not None])
        labels = {"workload": WORKLOAD, "model": model}
        assert value(text, "goodput_inference_prompt_tokens_total", **labels) == sum(s.prompt_tokens for s in sent)
        assert value(text, "goodput_inference_generation_tokens_total", **labels) == sum(
            s.output_tokens for s in sent)
        reasons = Counter(s.reason for s in sent)
        for reason in FINISH_REASONS:  # every reason, 0 included
            assert value(text, "goodput_inference_requests_total", reason=reason, **labels) == reasons[reason]
        met = [judged(s) for s in sent]
        expected = {"ttft": sum(m[0] is True for m in met), "tpot": sum(m[1] is True for m in met),
                    "both": sum(m[2] is True for m in met)}
        found = {o: value(text, "goodput_inference_slo_met_requests_total", objective=o, **labels) for o in expected}
        assert found == expected, model
        last = sent[-1]
        assert value(text, "goodput_inference_slo_objective_seconds", objective="ttft", **labels) == last.ttft_objective
        assert value(text, "goodput_inference_slo_objective_seconds", objective="tpot", **labels) == last.tpot_objective

    # llama's counts cover each case; its objectives are bucket bounds, so the histograms alone bound the
    # joint count (Frechet), and the exact count lies within: it is what two histograms cannot give
    met = [judged(s) for s in server.sent if s.model == llama]
    assert set(met) >= {(True, True, True), (True, False, False), (False, True, False),
                                (False, False, False), (True, None, True), (False, None, False),
                                (None, None, None)}
    ttft_buckets, _, n = histogram(text, "goodput_inference_time_to_first_token_seconds", llama)
    tpot_buckets, _, tpot_count = histogram(text, "goodput_inference_time_per_output_token_seconds", llama)
    a = ttft_buckets[TTFT_OBJECTIVE]
    b = tpot_buckets[TPOT_OBJECTIVE] + (n - tpot_count)  # TPOT met, or not judged (one token)
    both = value(text, "goodput_inference_slo_met_requests_total", workload=WORKLOAD, model=llama, objective="both")
    assert max(0, a + b - n) <= both <= min(a, b)
    assert max(0, a + b - n) < min(a, b)  # the histograms alone could not have told


def test_chunks_and_gaps_under_a_fake_clock(fake_clock: ManualClock) -> None:
    """token(n) counts one gap per call, n tokens; TPOT spreads the time over every token after the first."""
    telemetry = Telemetry("w", 0, socket_path="/nonexistent/goodput.sock", flush_interval=60)
    with telemetry.request("m", prompt_tokens=3) as r:
        fake_clock.now += 0.5
        r.token(3)
        for _ in range(4):
            fake_clock.now += 0.015625
            r.token()
        fake_clock.now += 2.0
        r.token(2)
    assert (r.output_tokens, r.ttft_seconds, r.e2e_seconds) == (9, 0.5, 2.5625)
    assert r.tpot_seconds == (0.0625 + 2.0) / 8
    assert (r.ttft_met, r.tpot_met, r.met) == (True, False, False)
    event = telemetry._encode(telemetry._queue[-1])
    assert event["itl_counts"][0] == 0 and event["itl_counts"][1] == 4  # 1/64 s <= 0.025
    assert event["itl_counts"][ITL_BUCKETS.index(2.5)] == 1 and sum(event["itl_counts"]) == 5
    assert event["itl_sum"] == 2.0625
    with telemetry.request("m") as r:  # no token: nothing judged
        fake_clock.now += 1.0
    assert (r.ttft_seconds, r.tpot_seconds, r.ttft_met, r.tpot_met, r.met) == (None, None, None, None, None)
    r.token("three")  # type: ignore[arg-type]  # never raises into the server
    telemetry.close(timeout=0.5)


def test_client_refuses_what_the_daemon_would_reject_and_keeps_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="ttft_objective_seconds"):
        Telemetry("w", 0, socket_path="/nonexistent/goodput.sock", ttft_objective_seconds=0)
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        telemetry = Telemetry(WORKLOAD, 1, socket_path=config.ingest.socket_path, flush_interval=60)
        telemetry.record_request("m", math.nan, None, 1.0, 1)
        telemetry.record_request("m", 0.1, None, math.inf, 1)
        telemetry.record_request("m", 0.1, None, MAX_SECONDS * 2, 1)
        telemetry.record_request("m", 0.1, None, 1.0, MAX_COUNT + 1)
        telemetry.record_request("m", 0.1, None, 1.0, 1, inter_token_seconds=[0.1, math.nan])
        telemetry.record_request("bad model", 0.1, None, 1.0, 1)
        telemetry.record_request("m", 0.1, None, None, 1)  # type: ignore[arg-type]  # e2e_seconds is required
        with telemetry.request("-bad") as r:
            r.token()
        assert telemetry.dropped == 8 and r.met is None
        telemetry.record_request("m", 0.5, 0.2, 1.0, 3, ttft_objective_seconds=-1, tpot_objective_seconds=math.nan,
                                 finish_reason="content_filter")
        telemetry.record_request("m", -0.5, None, 1.0, 1, queue_seconds=-1)  # negative times: sent as 0
        assert telemetry.flush()
        text = live.metrics_when("goodput_ingest_events_accepted_total", 2, type="request")
        telemetry.close()
    labels = {"workload": WORKLOAD, "model": "m"}
    assert value(text, "goodput_inference_requests_total", reason="stop", **labels) == 2
    assert value(text, "goodput_inference_slo_objective_seconds", objective="ttft", **labels) == 1.0  # default
    assert value(text, "goodput_inference_slo_met_requests_total", objective="ttft", **labels) == 2  # 0.5 <= 1.0
    assert value(text, "goodput_inference_slo_met_requests_total", objective="tpot", **labels) == 0  # 0.2 > 0.1
    assert value(text, "goodput_inference_queue_time_seconds_bucket", le="0.3", **labels) == 1
    assert value(text, "goodput_inference_time_to_first_token_seconds_sum", **labels) == 0.5
    assert value(text, "goodput_ingest_rejected_requests_total", reason="invalid") == 0
    assert (telemetry.sent, telemetry.dropped) == (2 + 2, 8)  # and start, end
    assert "unknown finish reason 'content_filter'" in caplog.text


# --- the daemon's side: strict validation, nothing half-applied, the model cap ---------------------------


def uds_client(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", timeout=5)


def good(workload: str = "untouched", model: str = "ok", rank: int = 0) -> dict:
    return request_event(workload, rank, model, ttft_seconds=0.1, tpot_seconds=0.02, e2e_seconds=1.0,
                         output_tokens=10, prompt_tokens=5, itl_counts=[9] + [0] * len(ITL_BUCKETS), itl_sum=0.09)


def bad(**changes: object) -> dict:
    event = {**good(model="bad"), **changes}
    return {k: v for k, v in event.items() if v is not DROP}


DROP = object()
BAD = [
    ("itl_counts too short", bad(itl_counts=[0] * len(ITL_BUCKETS)), "itl_counts"),
    ("itl_counts too long", bad(itl_counts=[0] * (len(ITL_BUCKETS) + 2)), "itl_counts"),
    ("a negative itl count", bad(itl_counts=[-1] + [0] * len(ITL_BUCKETS)), "itl_counts.0"),
    ("negative ttft", bad(ttft_seconds=-0.1), "ttft_seconds"),
    ("NaN tpot", bad(tpot_seconds=math.nan), "tpot_seconds"),
    ("infinite e2e", bad(e2e_seconds=math.inf), "e2e_seconds"),
    ("e2e over MAX_SECONDS", bad(e2e_seconds=MAX_SECONDS * 2), "e2e_seconds"),
    ("a model with a space", bad(model="llama 3"), "model"),
    ("a model starting with punctuation", bad(model="-llama"), "model"),
    ("a model too long", bad(model="m" * 257), "model"),
    ("an unknown finish reason", bad(finish_reason="tool_calls"), "finish_reason"),
    ("a zero objective", bad(ttft_objective_seconds=0.0), "ttft_objective_seconds"),
    ("a missing objective", bad(tpot_objective_seconds=DROP), "tpot_objective_seconds"),
    ("output tokens over MAX_COUNT", bad(output_tokens=MAX_COUNT + 1), "output_tokens"),
    ("a string number", bad(prompt_tokens="5"), "prompt_tokens"),
    ("another key", bad(cached_tokens=3), "cached_tokens"),
    ("a missing ttft", bad(ttft_seconds=DROP), "ttft_seconds"),
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[LiveServer, httpx.Client]]:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        yield live, client


@pytest.mark.parametrize(("name", "event", "where"), BAD, ids=[b[0] for b in BAD])
def test_bad_request_events_are_rejected_and_nothing_is_applied(daemon: tuple[LiveServer, httpx.Client], name: str,
                                                                event: dict, where: str) -> None:
    live, client = daemon
    before = value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="invalid")
    body = {"events": [{"type": "step", "workload": "untouched", "rank": 0, "duration_seconds": 0.5}, good(), event]}
    response = client.post("/v1/events", content=json.dumps(body).encode(),  # NaN and Infinity as Python writes them
                           headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert f"events.2.request.{where}" in json.dumps(response.json()), response.json()
    wait_for(lambda: value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="invalid") == before + 1)
    text = live.metrics()
    assert series(text, "goodput_inference_requests_total") == []
    assert value(text, "goodput_steps_total", workload="untouched", rank="0") is None
    assert value(text, "goodput_ingest_events_accepted_total", type="request") == 0


def test_the_model_cap_rejects_whole_batches_and_counts_them() -> None:
    config = quick_config(ingest={"max_models": 2})
    with live_server(config, backend=SimulatedGpus(1)) as live, uds_client(config.ingest.socket_path) as client:
        assert client.post("/v1/events", json={"events": [good("a", "m1"), good("a", "m2")]}).status_code == 200
        step = {"type": "step", "workload": "b", "rank": 0, "duration_seconds": 0.5}
        for events in ([step, good("a", "m3")], [good("b", "m1")]):  # a new model; the same name, another workload
            response = client.post("/v1/events", json={"events": events})
            assert response.status_code == 429 and "max_models=2" in response.json()["error"], response.text
        assert client.post("/v1/events", json={"events": [good("a", "m1", rank=1)]}).status_code == 200
        text = live.metrics_when("goodput_ingest_rejected_requests_total", 2, reason="model_cap")
    assert value(text, "goodput_inference_requests_total", workload="a", model="m1", reason="stop") == 2
    assert {(s["workload"], s["model"]) for s in series(text, "goodput_inference_requests_total")} == {
        ("a", "m1"), ("a", "m2")}
    assert value(text, "goodput_steps_total", workload="b", rank="0") is None  # nothing half-applied
    assert value(text, "goodput_ingest_events_accepted_total", type="request") == 3
    assert value(text, "goodput_ingest_events_accepted_total", type="step") == 0


def test_models_outlive_an_ended_rank_and_expire_when_idle() -> None:
    clock = ManualClock()
    state = IngestState(max_workloads=4, max_ranks=8, idle_timeout=600, clock=clock, max_models=1)

    def apply(*events: dict) -> None:
        state.apply(EventBatch.model_validate({"events": list(events)}).events)

    def models() -> set[tuple[str, str]]:
        text = Renderer().render(state.snapshot(), TEXT).decode()
        return {(s["workload"], s["model"]) for s in series(text, "goodput_inference_requests_total")}

    apply(good("w", "m"), {"type": "lifecycle", "workload": "w", "rank": 0, "event": "end"})
    clock.advance(120)  # past the ended rank's grace: the rank goes, its model stays
    assert models() == {("w", "m")}
    with pytest.raises(Rejected) as refused:
        apply(good("w", "other"))
    assert refused.value.reason == "model_cap" and refused.value.status == 429
    clock.advance(600)
    assert models() == set()
    apply(good("w", "other"))  # room again: an expired model no longer counts against the cap
    assert models() == {("w", "other")}


# --- an inference server on uvicorn, instrumented with Telemetry.request, and real streaming clients --------------

STREAMS = {  # name -> (seconds to the first token, seconds between tokens, tokens): each far from the objectives
    "fast": (0.01, 0.005, 6),
    "slow_first": (0.5, 0.005, 6),  # misses the 0.25 s TTFT objective
    "slow_decode": (0.01, 0.12, 4),  # misses the 0.05 s TPOT objective
    "one_token": (0.01, 0.0, 1),  # no time per output token: judged on TTFT only
}


def test_a_streaming_server_on_uvicorn_reports_what_its_clients_saw() -> None:
    """A FastAPI server streaming tokens, run by uvicorn, wraps each response in `telemetry.request()`; httpx
    clients read the streams (one disconnects mid-stream). The daemon's SLO counts are what the streams' timings
    imply, the disconnected request is an abort, and the exact joint count lies within the histograms' bounds."""
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        telemetry = Telemetry(WORKLOAD, 0, socket_path=config.ingest.socket_path, flush_interval=0.1,
                              ttft_objective_seconds=TTFT_OBJECTIVE, tpot_objective_seconds=TPOT_OBJECTIVE)
        app = FastAPI()

        @app.get("/generate/{kind}")
        async def generate(kind: str) -> StreamingResponse:
            first, gap, tokens = STREAMS.get(kind, (0.01, 0.2, 1000))  # anything else: a long, slow stream

            async def stream():  # type: ignore[no-untyped-def]
                with telemetry.request(model="uvicorn-llm", prompt_tokens=10) as r:
                    await asyncio.sleep(first)
                    for i in range(tokens):
                        if i:
                            await asyncio.sleep(gap)
                        r.token()
                        yield f"token{i} "

            return StreamingResponse(stream(), media_type="text/plain")

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_for(lambda: server.started, timeout=10)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for kind in STREAMS:
                    for _ in range(3):
                        assert client.get(f"/generate/{kind}").text.startswith("token0")
                with client.stream("GET", "/generate/endless") as response:  # the client goes away mid-stream
                    for _ in zip(range(3), response.iter_text(), strict=False):
                        pass
            text = live.metrics_when("goodput_inference_requests_total", 1, workload=WORKLOAD, model="uvicorn-llm",
                                     reason="abort")
            text = live.metrics_when("goodput_inference_requests_total", 12, workload=WORKLOAD, model="uvicorn-llm",
                                     reason="stop")
        finally:
            server.should_exit = True
            thread.join(10)
            telemetry.close()
    labels = {"workload": WORKLOAD, "model": "uvicorn-llm"}
    # judged: every request with a first token (13, the abort included); TPOT: those with 2 tokens or more (10)
    assert value(text, "goodput_inference_time_to_first_token_seconds_count", **labels) == 13
    assert value(text, "goodput_inference_time_per_output_token_seconds_count", **labels) == 10
    met = {o: value(text, "goodput_inference_slo_met_requests_total", objective=o, **labels)
           for o in ("ttft", "tpot", "both")}
    # TTFT met by all but slow_first (3 x 3 + the abort); TPOT by fast and slow_first (3 + 3; slow_decode's and the
    # abort's gaps are 0.12 s and 0.2 s); both by fast and one_token (3 + 3)
    assert met == {"ttft": 10, "tpot": 6, "both": 6}
    assert value(text, "goodput_inference_generation_tokens_total", **labels) >= 3 * (6 + 6 + 4 + 1) + 3
    ttft_buckets, _, ttft_count = histogram(text, "goodput_inference_time_to_first_token_seconds", "uvicorn-llm")
    tpot_buckets, _, tpot_count = histogram(text, "goodput_inference_time_per_output_token_seconds", "uvicorn-llm")
    missed_ttft, missed_tpot = ttft_count - ttft_buckets[TTFT_OBJECTIVE], tpot_count - tpot_buckets[TPOT_OBJECTIVE]
    lower, upper = 1 - (missed_ttft + missed_tpot) / ttft_count, 1 - max(missed_ttft, missed_tpot) / ttft_count
    assert lower <= met["both"] / ttft_count <= upper
