"""A simulated serving engine for the demo: serves vLLM's metrics (its current names, labels and buckets, from
`rules/engines.py`), or Triton Inference Server's with the TensorRT-LLM backend (`--engine triton`), on /metrics, with
latencies that follow a load model, and takes the `overload` fault.

The model, stepped every TICK seconds: requests arrive as a Poisson process; the scheduler admits waiting requests
while fewer than MAX_RUNNING run and their KV cache (prompt plus generated tokens) fits; a running request's first
token comes after its prefill, and each later token after one decode step, which takes longer the more requests
share the batch. When the KV cache overflows, the request admitted last is preempted (its tokens recomputed later),
as vLLM's recompute preemption does. Under overload, arrivals outrun the batch: the queue grows, time to first
token grows with it, the KV cache fills and preemptions start.

Both expositions are peers behind one interface (`running`, `waiting`, `kv`, ... and `finished_as(reason)`); what an
engine does not export (Triton: tokens, preemptions, per-request time per output token, inter-token and end-to-end
latency) is a no-op there, as on the real engine.

Run as its own process (`python -m goodput_mixin.demo.simserve --port N [--engine triton]`) so that the GPUs it holds
are attributed to it; `POST /load?factor=F` scales the arrival rate (the demo's `overload` fault is 8x).
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..rules.engines import ENGINES

TICK = 0.05
ARRIVALS_PER_SECOND = 6.0
MAX_RUNNING = 48
KV_CAPACITY_TOKENS = 32_000
PREFILL_TOKENS_PER_SECOND = 20_000.0
STEP_SECONDS = 0.012  # a decode step alone; each running request adds STEP_PER_REQUEST
STEP_PER_REQUEST = 0.0004
OVERLOAD = 8.0
MODEL = "demo/llama-3-8b"


@dataclass
class _Request:
    arrived: float
    prompt: int
    output: int
    admitted: float = 0.0  # when first admitted (0: never)
    ready: float = 0.0  # when its prefill (or, after a preemption, its recompute) is done
    first_token: float | None = None
    generated: float = 0.0  # fractional: a step spans ticks
    last_token: float = 0.0


class _Absent:
    """A series the engine does not export: observing it does nothing."""

    def observe(self, value: float) -> None:
        pass

    def inc(self, value: float = 1.0) -> None:
        pass

    def set(self, value: float) -> None:
        pass


class _Metrics:
    """vLLM's series, by their current names (ENGINES['vllm']), labelled as vLLM's V1 engine labels them: one model,
    engine "0". Each is its labelled child, made here, so that every series exists from the start at 0, as vLLM
    creates them when the engine starts."""

    def __init__(self, model: str) -> None:
        engine = ENGINES["vllm"]
        self.registry = CollectorRegistry()
        self._reason = engine.reason_label or "finished_reason"

        def native(signal: str):  # type: ignore[no-untyped-def]
            item = engine.signals[signal][0]
            labels = {name: (model if name == engine.model_label else "0") for name in item.labels
                      if name != self._reason}
            return item, labels, f"vLLM's {signal} (simulated)."

        def gauge(signal: str):  # type: ignore[no-untyped-def]
            item, labels, doc = native(signal)
            return Gauge(item.name, doc, list(labels), registry=self.registry).labels(**labels)

        def counter(signal: str):  # type: ignore[no-untyped-def]
            item, labels, doc = native(signal)
            return Counter(item.name.removesuffix("_total"), doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(signal: str):  # type: ignore[no-untyped-def]
            item, labels, doc = native(signal)
            metric = Histogram(item.name, doc, list(labels), buckets=item.buckets, registry=self.registry)
            return metric.labels(**labels)

        self.running = gauge("requests_running")
        self.waiting = gauge("requests_waiting")
        self.kv = gauge("kv_cache_usage")
        self.preemptions = counter("preemptions")
        self.prompt_tokens = counter("prompt_tokens")
        self.generation_tokens = counter("generation_tokens")
        self.ttft = histogram("time_to_first_token")
        self.tpot = histogram("time_per_output_token")
        self.itl = histogram("inter_token_latency")
        self.e2e = histogram("e2e_request_latency")
        self.queue = histogram("queue_time")
        item, labels, doc = native("requests_finished")
        self._finished = Counter(item.name.removesuffix("_total"), doc, [*labels, self._reason], registry=self.registry)
        self._finished_labels = labels
        for reason in ("stop", "length", "abort"):
            self.finished_as(reason)

    def finished_as(self, reason: str):  # type: ignore[no-untyped-def]
        return self._finished.labels(**self._finished_labels, **{self._reason: reason})

    def compute(self, seconds: float) -> None:
        """A request's time in the running batch: vLLM has no counter of it (its histograms split it)."""

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Value:
    """One Triton series: a counter or gauge value (prometheus-cpp writes no `_total`, and integers as integers)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.value = 0.0
        self.scale = scale  # the unit per second observed: microseconds 1e6

    def inc(self, value: float = 1.0) -> None:
        self.value += value * self.scale

    def observe(self, value: float) -> None:
        self.inc(value)

    def set(self, value: float) -> None:
        self.value = value


class _MsHistogram:
    """Triton's first-response histogram: seconds observed, milliseconds exposed."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        ms = seconds * 1000.0
        self.total += ms
        for i, bound in enumerate((*self.bounds, math.inf)):
            if ms <= bound:
                self.counts[i] += 1


# the first-response histogram's buckets are set per model (model_metrics histogram_options); the demo's model sets
# these milliseconds, with a bound at the 1 s objective
TRITON_FIRST_RESPONSE_MS = (50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)
TRITON_KV_BLOCKS = 2000  # KV cache blocks of the demo's engine (used ones from the simulated token count)


class _TritonMetrics:
    """Triton Inference Server's series with the TensorRT-LLM backend (ENGINES['triton']): the core's per-model
    counters and first-response histogram (model "ensemble", the pipeline clients call) and the backend's in-flight
    batcher and KV-cache gauges (model "tensorrt_llm"), as prometheus-cpp prints them."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.success, self.failure, self.canceled = _Value(), _Value(), _Value()
        self.queue, self._compute = _Value(1e6), _Value(1e6)  # microseconds
        self.pending, self.running, self.waiting, self.kv = _Value(), _Value(), _Value(), _Value()
        self.ttft = _MsHistogram(TRITON_FIRST_RESPONSE_MS)
        self.preemptions = self.prompt_tokens = self.generation_tokens = _Absent()
        self.tpot = self.itl = self.e2e = _Absent()

    def finished_as(self, reason: str) -> _Value:
        return {"stop": self.success, "length": self.success, "abort": self.canceled}.get(reason, self.failure)

    def compute(self, seconds: float) -> None:
        self._compute.inc(seconds)

    def render(self) -> bytes:
        core = f'model="{self.model}",version="1"'
        trt = 'model="tensorrt_llm",version="1"'

        def num(value: float) -> str:
            return str(int(value)) if value == int(value) else repr(value)

        used = round(self.kv.value * TRITON_KV_BLOCKS)
        lines = [
            "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
            "# TYPE nv_inference_request_success counter",
            f"nv_inference_request_success{{{core}}} {num(self.success.value)}",
            "# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes",
            "# TYPE nv_inference_request_failure counter",
            f'nv_inference_request_failure{{{core},reason="CANCELED"}} {num(self.canceled.value)}',
            f'nv_inference_request_failure{{{core},reason="BACKEND"}} {num(self.failure.value)}',
            "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds",
            "# TYPE nv_inference_queue_duration_us counter",
            f"nv_inference_queue_duration_us{{{core}}} {num(round(self.queue.value))}",
            "# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds",
            "# TYPE nv_inference_compute_infer_duration_us counter",
            f"nv_inference_compute_infer_duration_us{{{core}}} {num(round(self._compute.value))}",
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution",
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{{{core}}} {num(self.waiting.value)}",
            "# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds",
            "# TYPE nv_inference_first_response_histogram_ms histogram",
            *(f'nv_inference_first_response_histogram_ms_bucket{{{core},le="{num(bound)}"}} {count}'
              for bound, count in zip(self.ttft.bounds, self.ttft.counts, strict=False)),
            f'nv_inference_first_response_histogram_ms_bucket{{{core},le="+Inf"}} {self.ttft.counts[-1]}',
            f"nv_inference_first_response_histogram_ms_sum{{{core}}} {num(round(self.ttft.total, 3))}",
            f"nv_inference_first_response_histogram_ms_count{{{core}}} {self.ttft.counts[-1]}",
            "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
            "# TYPE nv_trt_llm_request_metrics gauge",
            *(f'nv_trt_llm_request_metrics{{{trt},request_type="{kind}"}} {num(value)}' for kind, value in (
                ("active", self.running.value), ("waiting", self.waiting.value), ("max", MAX_RUNNING))),
            "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
            "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
            *(f'nv_trt_llm_kv_cache_block_metrics{{{trt},kv_cache_block_type="{kind}"}} {num(value)}'
              for kind, value in (("max", TRITON_KV_BLOCKS), ("used", used), ("free", TRITON_KV_BLOCKS - used),
                                  ("fraction", used / TRITON_KV_BLOCKS))),
        ]
        return ("\n".join(lines) + "\n").encode()


EXPOSITIONS = {"vllm": _Metrics, "triton": _TritonMetrics}


class SimulatedServer:
    def __init__(self, model: str = MODEL, seed: int = 7, engine: str = "vllm") -> None:
        self.metrics: _Metrics | _TritonMetrics = EXPOSITIONS[engine](model)
        self.load = 1.0
        self._rng = random.Random(seed)
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="simserve", daemon=True)

    def start(self) -> SimulatedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        now = time.monotonic()
        while not self._stop.wait(TICK):
            later = time.monotonic()
            with self._lock:
                self.step(now, later)
            now = later

    def _arrivals(self, now: float, dt: float) -> None:
        # Poisson arrivals in the tick (Knuth's method: few per tick)
        limit, count, p = math.exp(-ARRIVALS_PER_SECOND * self.load * dt), 0, self._rng.random()
        while p > limit:
            count += 1
            p *= self._rng.random()
        for _ in range(count):
            self._waiting.append(_Request(now, self._rng.randint(256, 1024), self._rng.randint(64, 256)))

    def step(self, before: float, now: float) -> None:
        m = self.metrics
        dt = now - before
        self._arrivals(now, dt)
        kv = sum(r.prompt + int(r.generated) for r in self._running)
        while (self._waiting and len(self._running) < MAX_RUNNING
               and kv + self._waiting[0].prompt + int(self._waiting[0].generated) <= KV_CAPACITY_TOKENS):
            request = self._waiting.popleft()
            if request.admitted == 0.0:
                m.queue.observe(now - request.arrived)
                request.admitted = now
            # prefill; after a preemption, the recompute of the prompt and of what it had generated
            request.ready = now + (request.prompt + int(request.generated)) / PREFILL_TOKENS_PER_SECOND
            kv += request.prompt + int(request.generated)
            self._running.append(request)
        step = STEP_SECONDS + STEP_PER_REQUEST * len(self._running)
        done: list[_Request] = []
        for request in self._running:
            if now < request.ready:
                continue
            if request.first_token is None:
                request.first_token = request.last_token = now
                request.generated = 1.0
                m.ttft.observe(now - request.arrived)
                continue
            before_tokens = int(request.generated)
            request.generated += dt / step
            for _ in range(int(request.generated) - before_tokens):
                m.itl.observe(step)
            if int(request.generated) >= request.output:
                done.append(request)
        for request in done:
            self._running.remove(request)
            assert request.first_token is not None
            m.e2e.observe(now - request.arrived)
            m.compute(now - request.admitted)
            m.tpot.observe((now - request.first_token) / max(1, request.output - 1))
            m.prompt_tokens.inc(request.prompt)
            m.generation_tokens.inc(request.output)
            m.finished_as("length").inc()  # it generated its max_tokens
        # the KV cache overflows as running requests grow: preempt the last admitted, to recompute later (its
        # tokens already sent stay sent: its time to first token is observed once)
        while self._running and sum(r.prompt + int(r.generated) for r in self._running) > KV_CAPACITY_TOKENS:
            victim = self._running.pop()
            self._waiting.appendleft(victim)
            m.preemptions.inc()
        used = sum(r.prompt + int(r.generated) for r in self._running)
        m.running.set(len(self._running))
        m.waiting.set(len(self._waiting))
        m.kv.set(used / KV_CAPACITY_TOKENS)

    def exposition(self) -> bytes:
        with self._lock:
            return self.metrics.render()


def serve(server: SimulatedServer, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if urlparse(self.path).path != "/metrics":
                self.send_error(404)
                return
            body = server.exposition()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            url = urlparse(self.path)
            try:
                factor = float(parse_qs(url.query)["factor"][0])
                if url.path != "/load" or not 0 < factor <= 100:
                    raise ValueError
            except (KeyError, ValueError):
                self.send_error(400, "POST /load?factor=F, 0 < F <= 100")
                return
            server.load = factor
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=httpd.serve_forever, name="simserve-http", daemon=True).start()
    return httpd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--engine", choices=sorted(EXPOSITIONS), default="vllm",
                        help="whose metrics it serves: vLLM's or Triton's with TensorRT-LLM (default vllm)")
    args = parser.parse_args()
    server = SimulatedServer(args.model, engine=args.engine).start()
    httpd = serve(server, args.host, args.port)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.shutdown()
        server.stop()


if __name__ == "__main__":
    main()
