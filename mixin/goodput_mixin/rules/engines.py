"""The serving engines' own Prometheus series, as data: which native series gives each normalized signal.

Every name, label, bucket bound and observation rule below was read from the engine's source at the release
named in `Engine.version` (and, for the renamed or older names, at the release named in that `Native.source`):

- vLLM: the PyPI source distributions `vllm-<version>.tar.gz` (built from the release tags); the V1 stat logger
  `vllm/v1/metrics/loggers.py` (with `vllm/v1/metrics/buckets.py` and `stats.py`) and the V0 one
  `vllm/engine/metrics.py` (with `vllm/engine/llm_engine.py`). Tags 0.6.6 to 0.33.0 were compared.
- SGLang: the PyPI distributions `sglang-<version>` (sdists to 0.5.10, wheels after); the collectors in
  `python/sglang/srt/observability/metrics_collector.py` (`python/sglang/srt/metrics/collector.py` up to 0.5.9)
  and the callers in `managers/tokenizer_manager.py` and `observability/req_time_stats.py`. 0.3.6 to 0.5.23 compared.
- TGI: the git tags of huggingface/text-generation-inference (`router/src/server.rs`, `router/src/infer/mod.rs`,
  `router/src/validation.rs`, `backends/v3/src/{backend,queue,lib}.rs`), v1.0.0 to v3.3.7, and the exposition code
  of the Rust crate it uses, metrics-exporter-prometheus 0.15.3 (metrics-rs/metrics, `src/recorder.rs`,
  `src/formatting.rs`).
- vLLM under Ray Serve: vLLM's own names (above) through `vllm/v1/metrics/ray_wrappers.py`, with the prefix and
  labels Ray's metrics agent adds, as Ray's Serve LLM Grafana panels query them
  (`python/ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py`). No real scrape was found.
- Triton Inference Server: triton-inference-server/core `src/metric_model_reporter.cc` and the server's
  `docs/user_guide/metrics.md` (r24.04); the TensorRT-LLM backend's `nv_trt_llm_*` gauges from its README's sample
  output (tensorrtllm_backend `README.md`, "Triton Metrics") and `inflight_batcher_llm/src/custom_metrics_reporter`.

Conventions: `Native.name` is the series name as a scrape shows it: counters with the `_total` that the Python
client (prometheus_client) appends to every counter, whether or not the source spelled it (vLLM renamed
`num_preemptions_total` to `num_preemptions` in code in 0.9 and the exposed name did not change); TGI's Rust
exporter appends nothing, so its counters have no `_total`. Histograms are named without `_bucket`/`_sum`/`_count`.
`buckets` are the default upper bounds (no +Inf), as floats. Where a native was renamed, the current name comes
first in its signal's tuple and the older ones after it, each with the buckets it had last.

Formatting of `le` ("le_format"):
- "python" (prometheus_client, utils.floatToGoString): repr of the float, so 1 -> "1.0", 0.1 -> "0.1",
  2560 -> "2560.0", 5e-05 -> "5e-05"; from 1e6 up Go's exponent form, 1e6 -> "1e+06", 1.1e6 -> "1.1e+06" (vLLM's
  token-count histograms reach it with max_model_len >= 1M, SGLang's prompt/generation token histograms by
  default). `+Inf` as "+Inf". This is also the form Prometheus 3 normalizes every classic-histogram `le` to on
  ingestion (prometheus model/labels/float.go FormatOpenMetricsFloat: integers get ".0").
- "rust" (metrics-exporter-prometheus 0.15.x, f64 Display): the shortest decimal that round-trips, never an
  exponent and no ".0" on integers (1 -> "1"); TGI's duration bounds are non-terminating products of 0.0001 * 1.5^n
  and come out as e.g. "0.00015000000000000001", the same digits as Python's repr (checked for all 35 bounds).
  Prometheus 2 stores text-format `le` as exposed; Prometheus 3 rewrites integer bounds to "1.0" form.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Native:
    """One series family an engine exposes."""

    name: str  # as exposed: counters with the suffix they are scraped with, histograms without _bucket/_sum/_count
    kind: str  # "counter" | "gauge" | "histogram"
    labels: tuple[str, ...]  # the engine's own labels on it (conditional ones included), not target labels
    buckets: tuple[float, ...] = ()  # histogram upper bounds (default), without +Inf, as in the source
    note: str = ""  # observation rule (per request / per token), version history, caveats
    source: str = ""  # "path/in/repo@tag" where it was read
    match: str = ""  # extra matchers selecting its series (Triton's one family per gauge: request_type="active")
    over: str = ""  # a gauge read as a ratio: matchers of the same family's denominator (used over max blocks)
    reason: str = ""  # requests_finished: the normalized finish reason of its series that name none themselves
    less: str = ""  # requests_finished: a counter (same labels) whose rate is taken off its own (SGLang's aborts)
    per: float = 1.0  # its value's unit per the normalized one: Triton's microsecond counters 1e6
    le_per: float = 1.0  # its bucket bounds' unit per second: Triton's millisecond histogram 1e3
    older: tuple[tuple[float, ...], ...] = ()  # earlier releases' default bucket lists (their bounds judge too)
    # a gauge read only where the target does not expose this one (a selector with one label matcher) for the same
    # labels but that matcher's: Triton's pending requests where the in-flight batcher counts its own waiting ones
    unless: str = ""


@dataclass(frozen=True)
class Engine:
    """A serving engine and the native series that give each normalized signal."""

    name: str  # "vllm" | "sglang" | "tgi"
    title: str
    version: str  # the release the current names were read at
    model_label: str | None  # the engine's label naming the served model; None: the engine has none
    le_format: str  # how its client library writes `le`: "python" or "rust" (see the module docstring)
    signals: dict[str, tuple[Native, ...]]  # normalized signal -> natives giving it: current name, then older ones
    reason_label: str | None = None  # label on the finished-requests counter naming why a request finished
    reasons: tuple[tuple[str, str], ...] = ()  # (regex of the engine's reason values, the normalized reason)
    yields_to: str = ""  # a native series of another engine: a target exposing it is that engine's, not this one's
    # its model names are the same in every deployment (Triton's TensorRT-LLM repository: ensemble, tensorrt_llm, ...):
    # a target without a workload label is given its pod's owner as one, so that two deployments never merge
    generic_models: bool = False


# --- vLLM ---------------------------------------------------------------------------------------------------------
# Current: the V1 engine (default since 0.8.0; V0's vllm/engine/metrics.py read for the old names).
# vLLM has every normalized signal. Before 0.11.0 it had no per-request TPOT histogram: the old
# vllm:time_per_output_token_seconds is observed once per output step (an inter-token gap), never per request, so
# it belongs to inter_token_latency, not time_per_output_token.

_VLLM = "vllm/v1/metrics/loggers.py@v0.33.0"
_VLLM_BUCKETS = "vllm/v1/metrics/buckets.py@v0.33.0"
_VLLM_V0 = "vllm/engine/metrics.py@v0.7.3"
_VLLM_LABELS = ("model_name", "engine")
_VLLM_LABEL_NOTE = ("Labels: model_name (--served-model-name) and engine (the data-parallel engine index, '0', "
                    "'1', ...) since 0.8.3; model_name only in V0 and in V1 up to 0.8.2.")

# request_latency family: e2e, queue, inference, prefill and decode times (0.8.4 on; 0.6.4-0.8.3 it stopped at 60.0)
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# time_to_first_token family (0.8.4 on; up to 0.8.3 it stopped at 10.0)
VLLM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
# inter_token_latency family: ITL, the per-request TPOT and the old time_per_output_token (0.8.4 on; up to 0.8.3
# the old histogram stopped at 2.5)
VLLM_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
_VLLM_CUSTOM = (" Buckets are the defaults of the '{}' family; since 0.32.0 --custom-histogram-buckets "
                "(ObservabilityConfig.custom_histogram_buckets) can replace them per family.")

VLLM = Engine(
    "vllm", "vLLM", "v0.33.0", "model_name", "python", {
        "time_to_first_token": (
            Native("vllm:time_to_first_token_seconds", "histogram", _VLLM_LABELS, VLLM_TTFT_BUCKETS,
                   "Per request: arrival to the first output token (observed when the first token comes out of "
                   "prefill). Up to 0.8.3 (V0 and V1) the buckets stopped at 10.0: (0.001, 0.005, 0.01, 0.02, 0.04, "
                   "0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)." + _VLLM_CUSTOM.format(
                       "time_to_first_token") + " " + _VLLM_LABEL_NOTE,
                   f"{_VLLM}; {_VLLM_BUCKETS}"),
        ),
        "time_per_output_token": (
            Native("vllm:request_time_per_output_token_seconds", "histogram", _VLLM_LABELS, VLLM_ITL_BUCKETS,
                   "Per request (one observation per finished request, every finish reason): decode_time / "
                   "(generation tokens - 1), decode_time being first to last token; observed as 0 when the "
                   "request generated at most one token (vllm/v1/metrics/stats.py). New in 0.11.0; earlier "
                   "versions have no per-request TPOT. Shares the inter_token_latency bucket family."
                   + _VLLM_CUSTOM.format("inter_token_latency"),
                   f"{_VLLM}; vllm/v1/metrics/stats.py@v0.33.0"),
        ),
        "inter_token_latency": (
            Native("vllm:inter_token_latency_seconds", "histogram", _VLLM_LABELS, VLLM_ITL_BUCKETS,
                   "Per output step of a request after its first token: the gap since the previous output "
                   "(IterationStats.inter_token_latencies_iter). With speculative decoding one step can carry "
                   "several tokens, so this is per output event, not strictly per token. New in 0.10.2 (replaces "
                   "time_per_output_token_seconds)." + _VLLM_CUSTOM.format("inter_token_latency"),
                   f"{_VLLM}; vllm/v1/metrics/stats.py@v0.33.0"),
            Native("vllm:time_per_output_token_seconds", "histogram", _VLLM_LABELS, VLLM_ITL_BUCKETS,
                   "OLD NAME, per output step, not per request: V1 observed exactly the same values as "
                   "inter_token_latency_seconds (0.11.0 loggers.py observes both in one loop); V0 observed "
                   "seq_group.get_last_latency() once per decode step per sequence group. Deprecated in 0.11 "
                   "(0.10.2 added the replacement), hidden from 0.12.0 (only with --show-hidden-metrics-for-version="
                   "<previous minor>), still in the code through 0.14.x, gone by 0.16.0 (0.15.x published no sdist). "
                   "Up to 0.8.3 the buckets stopped at 2.5: (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, "
                   "0.75, 1.0, 2.5). V0 labels: model_name only.",
                   "vllm/v1/metrics/loggers.py@v0.14.0; vllm/v1/metrics/loggers.py@v0.11.0; " + _VLLM_V0),
        ),
        "e2e_request_latency": (
            Native("vllm:e2e_request_latency_seconds", "histogram", _VLLM_LABELS, VLLM_REQUEST_LATENCY_BUCKETS,
                   "Per finished request: arrival to finish. 0.6.4-0.8.3 the request_latency buckets stopped at "
                   "60.0: (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0); up to "
                   "0.6.3 (V0) they were (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)."
                   + _VLLM_CUSTOM.format("request_latency"),
                   f"{_VLLM}; {_VLLM_BUCKETS}"),
        ),
        "queue_time": (
            Native("vllm:request_queue_time_seconds", "histogram", _VLLM_LABELS, VLLM_REQUEST_LATENCY_BUCKETS,
                   "Per finished request: first QUEUED to first SCHEDULED event (re-queueing after a preemption "
                   "is not added). In V0 since 0.6.4; V0 also had vllm:time_in_queue_requests with the same "
                   "buckets (deprecated, not a rename)." + _VLLM_CUSTOM.format("request_latency"),
                   f"{_VLLM}; vllm/v1/metrics/stats.py@v0.33.0"),
        ),
        "requests_running": (
            Native("vllm:num_requests_running", "gauge", _VLLM_LABELS, (),
                   "Requests in the engine's running batch, per engine (multiprocess_mode=mostrecent).", _VLLM),
        ),
        "requests_waiting": (
            Native("vllm:num_requests_waiting", "gauge", _VLLM_LABELS, (),
                   "Requests waiting to be scheduled, per engine. 0.33.0 adds "
                   "vllm:num_requests_waiting_by_reason{reason=capacity|deferred} summing to it.", _VLLM),
        ),
        "kv_cache_usage": (
            Native("vllm:kv_cache_usage_perc", "gauge", _VLLM_LABELS, (),
                   "A ratio 0..1 despite the _perc name ('1 means 100 percent usage'). New in 0.9.2 (not in 0.9.1).",
                   _VLLM),
            Native("vllm:gpu_cache_usage_perc", "gauge", _VLLM_LABELS, (),
                   "OLD NAME, ratio 0..1. V0 (all versions) and V1 up to 0.10.x; deprecated in 0.9.2 in favour of "
                   "kv_cache_usage_perc, hidden in 0.11.x (--show-hidden-metrics-for-version=0.10), removed in "
                   "0.12.0. V0 labels: model_name only.",
                   f"vllm/v1/metrics/loggers.py@v0.11.0; {_VLLM_V0}"),
        ),
        "preemptions": (
            Native("vllm:num_preemptions_total", "counter", _VLLM_LABELS, (),
                   "Cumulative preemptions. Spelled num_preemptions_total in the code up to 0.8.x and "
                   "num_preemptions from 0.9; the exposed name is vllm:num_preemptions_total either way. V1 0.7.x "
                   "did not have it (added to V1 in 0.8.0); V0 always had it.", _VLLM),
        ),
        "prompt_tokens": (
            Native("vllm:prompt_tokens_total", "counter", _VLLM_LABELS, (),
                   "Prefill (prompt) tokens processed, counted per engine step. Exposed name unchanged across "
                   "versions (code spelling prompt_tokens_total -> prompt_tokens in 0.9).", _VLLM),
        ),
        "generation_tokens": (
            Native("vllm:generation_tokens_total", "counter", _VLLM_LABELS, (),
                   "Generated tokens, counted per engine step. Exposed name unchanged across versions.", _VLLM),
        ),
        "requests_finished": (
            Native("vllm:request_success_total", "counter", (*_VLLM_LABELS, "finished_reason"), (),
                   "Finished requests by finished_reason: stop, length, abort (0.11.0); 0.33.0 adds error and "
                   "repetition. Despite the name it counts every finish reason. Requests aborted from the "
                   "frontend (client gone) are dropped in output_processor.abort_requests without passing "
                   "_update_stats_from_finished, so they may not be counted.",
                   f"{_VLLM}; vllm/v1/engine/__init__.py@v0.33.0; vllm/v1/engine/output_processor.py@v0.33.0"),
        ),
    }, reason_label="finished_reason", reasons=(("repetition", "stop"),))


# --- SGLang -------------------------------------------------------------------------------------------------------
# Metrics are off unless the server runs with --enable-metrics. Two collectors label differently:
# - TokenizerMetricsCollector (TTFT, ITL, TPOT, e2e, token and request counters): model_name, engine_type
#   (unified|prefill|decode, the PD-disaggregation role; since 0.5.11), priority (with --enable-priority-scheduling),
#   the --tokenizer-metrics-allowed-custom-labels, the --extra-metric-labels, and is_streaming on some (0.5.17 on);
# - SchedulerMetricsCollector (running/queued requests, token_usage, queue time, retractions): model_name,
#   engine_type, tp_rank, pp_rank, moe_ep_rank, dp_rank (with data-parallel attention), priority, extra labels.
#   By default only the scheduler with attn_tp_rank 0 and attn_cp_rank 0 reports (every one with
#   --enable-metrics-for-all-schedulers); each pipeline stage and each DP rank has its own scheduler.
# SGLang has every normalized signal at 0.5.23, but before 0.5.22 no per-request TPOT (see time_per_output_token),
# before 0.5.2 no queue-time histogram (only the gauge sglang:avg_request_queue_latency, 0.4.6-0.5.2), before 0.5.7
# no retraction (preemption) counter (only gauges: sglang:num_retracted_reqs, and sglang:total_retracted_reqs in
# 0.5.0-0.5.2), and up to 0.4.4 the histogram sglang:time_per_output_token_seconds, which is neither per token nor
# per request (see the note of inter_token_latency) and is left out of the signals.

_SG = "python/sglang/srt/observability/metrics_collector.py@v0.5.23"
_SG_TOK = ("model_name", "engine_type", "priority")
_SG_TOK_STREAM = (*_SG_TOK, "is_streaming")
_SG_SCHED = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "priority")
_SG_SCHED_NOTE = (" Scheduler series: one per reporting scheduler (labels tp_rank, pp_rank, moe_ep_rank, and dp_rank "
                  "with DP attention); dp_rank and priority only appear when DP attention / priority scheduling is "
                  "on. With pipeline parallelism or --enable-metrics-for-all-schedulers several ranks report the "
                  "same requests.")

SGLANG_TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
)
SGLANG_ITL_BUCKETS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
    0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)
SGLANG_E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
    600.0, 1200.0, 1800.0, 2400.0,
)
SGLANG_QUEUE_BUCKETS: tuple[float, ...] = (
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0,
    1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)
_SG_QUEUE_OLD_BUCKETS: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0,
    100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0,
    2000.0, 2500.0, 3000.0,
)

SGLANG = Engine(
    "sglang", "SGLang", "v0.5.23", "model_name", "python", {
        "time_to_first_token": (
            Native("sglang:time_to_first_token_seconds", "histogram", _SG_TOK_STREAM, SGLANG_TTFT_BUCKETS,
                   "Per request, observed in the tokenizer manager when its first output arrives (request "
                   "created -> first token); not for aborted requests nor on PD prefill workers. Default buckets "
                   "(0.4.5 on), replaced by --bucket-time-to-first-token. Earlier: 0.3.x-0.4.0 (0.001, 0.005, 0.01, "
                   "0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0); "
                   "0.4.3 (0.1, 0.25, 0.5, 0.75, 1, 2, 5, 10, 20, 40, 60, 80, 120, 160); 0.4.4 (0.1, 0.3, 0.5, 0.7, "
                   "0.9, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160). is_streaming (true|false) since 0.5.17; "
                   "engine_type since 0.5.11.",
                   f"{_SG}; python/sglang/srt/managers/tokenizer_manager.py@v0.5.23", older=(
                       (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                        15.0, 20.0, 25.0, 30.0),
                       (0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0),
                       (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0))),
        ),
        "time_per_output_token": (
            Native("sglang:request_time_per_output_token_seconds", "histogram", _SG_TOK_STREAM, SGLANG_ITL_BUCKETS,
                   "Per request: (finished_time - first_token_time) / (completion_tokens - 1), observed only for "
                   "requests that finished with stop or length, generated more than one token, and not on PD "
                   "prefill workers (ReqTimeStats.get_time_per_output_token). New in 0.5.22. Shares the "
                   "--bucket-inter-token-latency buckets.",
                   f"{_SG}; python/sglang/srt/observability/req_time_stats.py@v0.5.23; "
                   "python/sglang/srt/managers/tokenizer_manager.py@v0.5.23"),
        ),
        "inter_token_latency": (
            Native("sglang:inter_token_latency_seconds", "histogram", _SG_TOK, SGLANG_ITL_BUCKETS,
                   "Per output token: each streamed chunk's interval is divided by the chunk's new tokens and "
                   "observed once per token (the bucket count grows by num_new_tokens, the sum by the interval). "
                   "New in 0.4.4 (0.4.4 buckets: 0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, "
                   "0.035, 0.040, 0.050, 0.075, 0.100, 0.150, 0.200, 0.300, 0.400, 0.500, 0.750, 1.000, 2.000); "
                   "current defaults since 0.4.5, replaced by --bucket-inter-token-latency. Its predecessor "
                   "sglang:time_per_output_token_seconds (0.3.x-0.4.4) observed, on every streamed chunk after the "
                   "first, the running mean (now - first_token) / (completion_tokens - 1), and once per "
                   "non-streaming request e2e / completion_tokens: neither per token nor per request.",
                   f"{_SG}; python/sglang/srt/metrics/collector.py@v0.4.4; "
                   "python/sglang/srt/managers/tokenizer_manager.py@v0.4.3"),
        ),
        "e2e_request_latency": (
            Native("sglang:e2e_request_latency_seconds", "histogram", _SG_TOK_STREAM, SGLANG_E2E_BUCKETS,
                   "Per finished request (aborted ones included), request created -> finished. Defaults since "
                   "0.5.2, replaced by --bucket-e2e-request-latency; 0.4.5-0.5.1 stopped at 800 (..., 200, 400, "
                   "800); 0.4.4: (0.1, 0.2, 0.4, 0.8, 1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, "
                   "500, 1000).",
                   f"{_SG}; python/sglang/srt/managers/tokenizer_manager.py@v0.5.23"),
        ),
        "queue_time": (
            Native("sglang:queue_time_seconds", "histogram", _SG_SCHED, SGLANG_QUEUE_BUCKETS,
                   "Per request, one sample: wait-queue entry -> first forward pass (set_forward_entry_time). "
                   "Named so since 0.5.3; the 0.001-0.05 bounds were added in 0.5.12." + _SG_SCHED_NOTE,
                   f"{_SG}; python/sglang/srt/observability/req_time_stats.py@v0.5.23"),
            Native("sglang:queue_time_s", "histogram", _SG_SCHED, _SG_QUEUE_OLD_BUCKETS,
                   "OLD NAME, only in 0.5.2 (renamed queue_time_seconds in 0.5.3).",
                   "python/sglang/srt/metrics/collector.py@v0.5.2"),
        ),
        "requests_running": (
            Native("sglang:num_running_reqs", "gauge", _SG_SCHED, (), "Requests in the running batch." + _SG_SCHED_NOTE,
                   _SG),
        ),
        "requests_waiting": (
            Native("sglang:num_queue_reqs", "gauge", _SG_SCHED, (),
                   "Requests in the waiting queue (PD-disaggregation queues have gauges of their own)."
                   + _SG_SCHED_NOTE, _SG),
        ),
        "kv_cache_usage": (
            Native("sglang:token_usage", "gauge", _SG_SCHED, (),
                   "A ratio 0..1 (used / max_total_num_tokens), rounded to 2 decimals; in 0.5.23 the max over the "
                   "full-attention, SWA and mamba pools (sglang:full_token_usage, sglang:swa_token_usage, "
                   "sglang:mamba_usage give each)." + _SG_SCHED_NOTE,
                   f"{_SG}; python/sglang/srt/managers/scheduler_components/pool_stats_observer.py@v0.5.23"),
        ),
        "preemptions": (
            Native("sglang:num_retracted_requests_total", "counter", _SG_SCHED, (),
                   "Retracted requests (SGLang's preemption: a running request pushed back to the queue when KV "
                   "memory runs out). New in 0.5.7; before it only gauges (sglang:num_retracted_reqs, the count "
                   "of the last log interval) existed." + _SG_SCHED_NOTE, _SG),
        ),
        "prompt_tokens": (
            Native("sglang:prompt_tokens_total", "counter", _SG_TOK_STREAM, (),
                   "Prompt tokens, counted once per finished request (aborted ones included). is_streaming since "
                   "0.5.17.", _SG),
        ),
        "generation_tokens": (
            Native("sglang:generation_tokens_total", "counter", _SG_TOK_STREAM, (),
                   "Generated tokens, counted once per finished request. is_streaming since 0.5.17.", _SG),
        ),
        "requests_finished": (
            Native("sglang:num_requests_total", "counter", _SG_TOK_STREAM, (),
                   "Finished requests, every outcome (those finishing with an abort reason included); no reason "
                   "label: the aborted ones are taken off (where the aborted counter has the same labels) and the "
                   "rest have no reason. New in 0.4.2.",
                   f"{_SG}; python/sglang/srt/managers/tokenizer_manager.py@v0.5.23",
                   less="sglang:num_aborted_requests_total"),
            Native("sglang:num_aborted_requests_total", "counter", _SG_TOK_STREAM, (),
                   "Aborted requests (spelled num_aborted_requests in code up to 0.5.2, same exposed name); counted "
                   "as reason abort.", _SG, reason="abort"),
            Native("sglang:e2e_request_latency_seconds_count", "counter", _SG_TOK_STREAM, (),
                   "FALLBACK before 0.4.2 (no num_requests_total): the end-to-end histogram's count, one per finished "
                   "request (aborted ones included), where no request counter exists.",
                   "python/sglang/srt/metrics/collector.py@v0.3.6"),
        ),
    })


# --- TGI ----------------------------------------------------------------------------------------------------------
# TGI lacks: a time-to-first-token histogram (only the stages: tgi_request_queue_duration, and per batch
# tgi_batch_forward_duration{method="prefill"}), an inter-token-latency histogram (tgi_batch_forward_duration
# {method="decode"} is per batch step), a KV-cache usage gauge (tgi_batch_current_max_tokens over
# tgi_batch_max_total_tokens is the batch's token budget, not KV usage), a preemption counter, and any model label.
# Its token counts are histograms; their _sum series are monotonic and stand in for counters here.
# Histograms without configured buckets are rendered as summaries by metrics-exporter-prometheus (e.g.
# tgi_request_skipped_tokens); every histogram whose name ends in "duration" gets the duration buckets below.

_TGI = "router/src/server.rs@v3.3.7"


def _tgi_duration_buckets() -> tuple[float, ...]:
    """router/src/server.rs: 35 bounds, value = 0.0001 then value *= 1.5 before each push (f64, as Python float)."""
    value, bounds = 0.0001, []
    for _ in range(35):
        value *= 1.5
        bounds.append(value)
    return tuple(bounds)


# 0.00015000000000000001 ... 145.61096060497135; unchanged from v1.0.0 to v3.3.7
TGI_DURATION_BUCKETS: tuple[float, ...] = _tgi_duration_buckets()
_TGI_DUR = (" Buckets: Matcher::Suffix(\"duration\") in router/src/server.rs, 35 bounds 0.0001 * 1.5^n, n = 1..35 "
            "(0.00015000000000000001 to 145.61096060497135), the same since v1.0.0. Recorded only for successful "
            "requests (generate, generate_stream).")

TGI = Engine(
    "tgi", "Text Generation Inference", "v3.3.7", None, "rust", {
        "time_per_output_token": (
            Native("tgi_request_mean_time_per_token_duration", "histogram", (), TGI_DURATION_BUCKETS,
                   "Per request: inference_time / generated_tokens, inference_time running from the request's "
                   "batch start (prefill included) to its end, divided by all generated tokens (not n-1); so it "
                   "includes the prefill, unlike vLLM's and SGLang's TPOT. TGI's docs call it inter-token latency."
                   + _TGI_DUR, _TGI),
        ),
        "e2e_request_latency": (
            Native("tgi_request_duration", "histogram", (), TGI_DURATION_BUCKETS,
                   "Per request: router arrival -> response (validation + queue + inference)." + _TGI_DUR, _TGI),
        ),
        "queue_time": (
            Native("tgi_request_queue_duration", "histogram", (), TGI_DURATION_BUCKETS,
                   "Per request: queued (after validation) -> its batch starts." + _TGI_DUR, _TGI),
        ),
        "requests_running": (
            Native("tgi_batch_current_size", "gauge", (), (),
                   "Requests in the running batch (set when a batch forms, 0 when it ends).",
                   "backends/v3/src/backend.rs@v3.3.7"),
        ),
        "requests_waiting": (
            Native("tgi_queue_size", "gauge", (), (), "Requests in the queue.", "backends/v3/src/queue.rs@v3.3.7"),
        ),
        "prompt_tokens": (
            Native("tgi_request_input_length_sum", "counter", (), (),
                   "No counter exists: the _sum series of the histogram tgi_request_input_length (recorded in "
                   "validation once the length checks pass, so requests failing later count too) is monotonic and "
                   "used as the counter. That histogram's buckets depend on --max-input-tokens: "
                   "(max_input_tokens / 100) * k, k = 1..100.", f"router/src/validation.rs@v3.3.7; {_TGI}"),
        ),
        "generation_tokens": (
            Native("tgi_request_generated_tokens_sum", "counter", (), (),
                   "No counter exists: the _sum series of the histogram tgi_request_generated_tokens (recorded per "
                   "successful request only) is used as the counter. That histogram's buckets depend on "
                   "--max-total-tokens: (max_total_tokens / 100) * k, k = 1..100.", _TGI),
        ),
        "requests_finished": (
            Native("tgi_request_success", "counter", (), (),
                   "Successful requests; exposed without _total (metrics-exporter-prometheus appends no suffix). "
                   "Failures are a separate counter, tgi_request_failure{err=overloaded|validation|template|"
                   "incomplete|dropped|generation}; tgi_request_count counts requests received.",
                   f"{_TGI}; router/src/infer/mod.rs@v3.3.7; backends/v3/src/backend.rs@v3.3.7"),
            Native("tgi_request_failure", "counter", ("err",), (),
                   "Failed requests by err (overloaded, validation, template, incomplete, dropped, generation): "
                   "reason error.", f"{_TGI}; router/src/infer/mod.rs@v3.3.7", reason="error"),
        ),
    }, yields_to="vllm:num_requests_running")


# --- vLLM under Ray Serve ---------------------------------------------------------------------------------------
# vLLM's RayPrometheusStatLogger (vllm/v1/metrics/ray_wrappers.py) forwards the same metrics through ray.util.metrics;
# each Ray node's metrics agent exports them with Ray's prefix `ray_` (ray_vllm:num_requests_running, counters with
# `_total`, as Ray's own Serve LLM dashboard queries them: ray_vllm:request_success_total,
# ray_vllm:generation_tokens_total) and Ray's labels: WorkerId (the replica's worker process) and the agent's
# SessionName, Version, NodeAddress, Component, and ReplicaId where vLLM adds it. The target is the Ray node (its pod:
# the one holding the replica's GPUs), so the GPU join works on the target's namespace and pod as for a plain vLLM.

_RAY_LABELS = ("WorkerId", "ReplicaId", "NodeAddress", "SessionName", "Version", "Component")
_RAY_SOURCE = ("python/ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py (ray-project/ray); "
               "vllm/v1/metrics/ray_wrappers.py@v0.33.0")


def _ray(native: Native) -> Native:
    return Native("ray_" + native.name, native.kind, (*native.labels, *_RAY_LABELS), native.buckets,
                  "vLLM's " + native.name + " through Ray's metrics agent. " + native.note,
                  f"{native.source}; {_RAY_SOURCE}", native.match, native.over, native.reason, native.less,
                  native.per, native.le_per, native.older)


RAY_VLLM = Engine("ray_vllm", "vLLM under Ray Serve", VLLM.version, VLLM.model_label, "python",
                  {signal: tuple(_ray(n) for n in natives) for signal, natives in VLLM.signals.items()},
                  reason_label=VLLM.reason_label, reasons=VLLM.reasons)


# --- Triton Inference Server (TensorRT-LLM backend) -------------------------------------------------------------
# Triton core (src/metric_model_reporter.cc, src/metrics.cc) gives per model and version: request success and failure
# counters, cumulative queue and compute times in microseconds (counters), the pending-request gauge, and, with
# --metrics-config histogram_latencies=true on decoupled (streaming) models, nv_inference_first_response_histogram_ms
# (milliseconds; its buckets are set per model in model_metrics, no default is read here). The TensorRT-LLM backend
# (inflight_batcher_llm/src/custom_metrics_reporter) adds gauges labelled by kind: nv_trt_llm_request_metrics
# {request_type=active|max|scheduled|context|waiting}, nv_trt_llm_kv_cache_block_metrics
# {kv_cache_block_type=max|free|used|tokens_per|fraction}, nv_trt_llm_inflight_batcher_metrics{...}. Triton has no
# per-request time per output token, no end-to-end histogram and no token counters: those objectives and figures are
# absent, and the "unmeasured" alert says so.

_TRITON = "src/metric_model_reporter.cc@r24.04 (triton-inference-server/core); docs/user_guide/metrics.md@r24.04"
_TRT = "inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc (tensorrtllm_backend)"
_TRITON_LABELS = ("model", "version")

TRITON = Engine(
    "triton", "Triton Inference Server (TensorRT-LLM)", "r24.04", "model", "python", {
        "time_to_first_token": (
            Native("nv_inference_first_response_histogram_ms", "histogram", _TRITON_LABELS, (),
                   "Per request of a decoupled (streaming) model: request -> its first response, in MILLISECONDS "
                   "(le=\"1000\" is 1 s). Only with --metrics-config histogram_latencies=true; buckets per model "
                   "(model_metrics.metric_control.histogram_options). Judged at the bound (in ms) at or below the "
                   "objective; its bucket rates are not in the seconds-based bucket records.", _TRITON, le_per=1e3),
        ),
        "queue_seconds": (
            Native("nv_inference_queue_duration_us", "counter", _TRITON_LABELS, (),
                   "Cumulative queueing time of every request, microseconds (so its rate is queued requests on "
                   "average).", _TRITON, per=1e6),
        ),
        "compute_seconds": (
            Native("nv_inference_compute_infer_duration_us", "counter", _TRITON_LABELS, (),
                   "Cumulative model execution time, microseconds.", _TRITON, per=1e6),
        ),
        "requests_running": (
            Native("nv_trt_llm_request_metrics", "gauge", (*_TRITON_LABELS, "request_type"), (),
                   "request_type=\"active\": requests the in-flight batcher holds.", _TRT,
                   match='request_type="active"'),
        ),
        "requests_waiting": (
            Native("nv_trt_llm_request_metrics", "gauge", (*_TRITON_LABELS, "request_type"), (),
                   "request_type=\"waiting\" (newer backends): requests waiting in the batcher.", _TRT,
                   match='request_type="waiting"'),
            Native("nv_inference_pending_request_count", "gauge", _TRITON_LABELS, (),
                   "Requests accepted by Triton and not yet executing (its scheduler queue); read only where the "
                   "in-flight batcher has no waiting gauge for the model.", _TRITON,
                   unless='nv_trt_llm_request_metrics{request_type="waiting"}'),
        ),
        "kv_cache_usage": (
            Native("nv_trt_llm_kv_cache_block_metrics", "gauge", (*_TRITON_LABELS, "kv_cache_block_type"), (),
                   "kv_cache_block_type=\"fraction\": used over max KV-cache blocks, 0..1 (the used, free and max "
                   "block counts are its siblings).", _TRT, match='kv_cache_block_type="fraction"'),
            Native("nv_trt_llm_kv_cache_block_metrics", "gauge", (*_TRITON_LABELS, "kv_cache_block_type"), (),
                   "Backends without the fraction (the 23.11-24.x README's sample): used over max blocks.", _TRT,
                   match='kv_cache_block_type="used"', over='kv_cache_block_type="max"'),
        ),
        "requests_finished": (
            Native("nv_inference_request_success", "counter", _TRITON_LABELS, (),
                   "Successful requests (no reason: Triton does not say stop or length).", _TRITON),
            Native("nv_inference_request_failure", "counter", (*_TRITON_LABELS, "reason"), (),
                   "Failed requests; reason (REJECTED, CANCELED, BACKEND, OTHER) since 24.x: CANCELED counts as "
                   "abort, the rest as error.", _TRITON, reason="error"),
        ),
    }, reason_label="reason", reasons=(("CANCELED", "abort"), ("REJECTED|BACKEND|OTHER", "error")), generic_models=True)

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM, SGLANG, TGI, RAY_VLLM, TRITON)}
