"""The inference rules on a live Prometheus (issue 18): Prometheus scrapes a replay server serving each engine's
exposition, evolving in time, and the daemon, fed by the real client; every normalized series and the SLO figures
must be what the replayed data implies, computed here from the slopes and values the test chose (never by running
PromQL).

Targets (tests/inference_replay.py serves them; each counter and histogram part grows linearly, gauges hold):
- the six real expositions of tests/serving_corpus/ (PROVENANCE.md), every line kept, values evolving. They
  are excerpts: histograms lack buckets, `_count`, or the bucket at an objective's threshold, and what the rules
  cannot derive from them must be absent (no attainment without a count, no met count without the threshold's
  bucket);
- complete expositions written from the catalog (mixin/goodput_mixin/rules/engines.py), for the SLO chain:
  vLLM 0.11 with the hidden metrics of 0.10 shown (old and new names side by side on one engine: the new one must
  win), as two pods of one model (the second twice as busy); a vLLM V0 (0.6.x: old names only, so TTFT is its only
  objective and its KV cache is gpu_cache_usage_perc); SGLang 0.5 (tokenizer series split by is_streaming,
  scheduler series by dp_rank);
- TGI: no real TGI exposition was found (PROVENANCE.md), so it is constructed from the catalog's TGI entry in its
  Rust exporter's format (`le="0.00015000000000000001"`, integers without ".0", counters without `_total`); its
  model comes from a target label, as the rules expect for an engine without a model label.
Some targets carry Kubernetes target labels (namespace, pod), the others a `workload` label; all carry
cluster="test".

The client path: goodput_client.Telemetry(url=...) sends one batch of ten requests every half second to a real
daemon, with a known mix (met both, one objective, neither, a single token, two aborted before their first token).
Its counters move in steps, so a rate is the batch's count times the batch rate, which the test reads from one
series of each record: every other series of it must agree exactly, and the attainment figures, ratios, exactly.

Rates are exact: each scrape serves the next whole step of replayed time and Prometheus aligns scrape timestamps
(--scrape.timestamp-tolerance), so a 20 s rate is the chosen slope to float rounding. The long windows (1m, 2m,
6m) average what the 20 s rules recorded since the start, so only their ratios (attainment, bounds, error ratio)
are exact; their request rates are checked to lie in (0, the 20 s rate].
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, free_port, live_server, quick_config, wait_for
from goodput_client import Telemetry
from goodput_client.contract import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from goodput_mixin.rules.engines import (
    SGLANG,
    TGI,
    TGI_DURATION_BUCKETS,
    VLLM,
    Engine,
    Native,
)
from goodput_mixin.rules.inference import candidates
from goodput_mixin.rules.objectives import resolve
from goodput_mixin.rules.render import rule_files
from goodput_mixin.rules.settings import RulesSettings
from inference_replay import (
    INF,
    Chooser,
    Exposition,
    Family,
    ReplayServer,
    Series,
    catalog_exposition,
    le_value,
    python_float,
    tgi_exposition,
)

from exporter.sources.nvml.simulated import SimulatedGpus

SETTINGS = RulesSettings(windows=["20s", "2m"], slow_groups_interval="5s", inference_slo_fast_windows=["20s", "2m"],
                         inference_slo_slow_windows=["1m", "6m"])
SHORT = "20s"
LONG = ("1m", "2m", "6m")
CLUSTER = "test"
ENGINES_DIR = ROOT / "tests" / "serving_corpus"
REL = 1e-6  # relative tolerance; the replayed rates are exact to float rounding

# each engine's objectives as the settings resolve them (TGI's TPOT: its bucket bound nearest 0.1 s), for the
# objectives it can judge (TGI has no time-to-first-token histogram)
OBJECTIVES = {engine: resolve(SETTINGS, engine) for engine in ("vllm", "sglang", "tgi")}
THRESHOLDS = {engine: {o: getattr(OBJECTIVES[engine], f"{o}_seconds") for o in objectives}
              for engine, objectives in (("vllm", ("ttft", "tpot")), ("sglang", ("ttft", "tpot")), ("tgi", ("tpot",)))}
SIGNALS = {"ttft": "time_to_first_token", "tpot": "time_per_output_token"}
HISTOGRAMS = {"time_to_first_token": "time_to_first_token_seconds",
              "time_per_output_token": "time_per_output_token_seconds",
              "inter_token_latency": "inter_token_latency_seconds",
              "e2e_request_latency": "e2e_request_latency_seconds", "queue_time": "queue_time_seconds"}
GAUGES = {"requests_running": ("requests_running", "sum"), "requests_waiting": ("requests_waiting", "sum"),
          "kv_cache_usage": ("kv_cache_usage_ratio", "max")}
COUNTERS = {"preemptions": "preemptions", "prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
            "requests_finished": "requests", "queue_seconds": "queue_seconds", "compute_seconds": "compute_seconds"}
KEYS = ("cluster", "namespace", "workload", "model")

# every record name of the inference rules but the serving GPUs' (no GPU is assigned to these servers)
RECORDS = sorted(
    [f"server:goodput_inference_{name}:{fn}" for name, fn in GAUGES.values()]
    + [f"workload:goodput_inference_{name}:{fn}" for name, fn in GAUGES.values()]
    + [f"{level}:goodput_inference_{name}:rate{SHORT}" for name in COUNTERS.values()
       for level in ("server", "workload")]
    + [f"workload:goodput_inference_{name}_bucket:rate{SHORT}" for name in HISTOGRAMS.values()]
    + ["workload:goodput_inference_slo_error_budget:ratio", f"workload:goodput_inference_slo_goodput:rate{SHORT}",
       "workload:goodput_inference_slo_judged_bound_seconds:min",
       f"workload:goodput_inference_slo_unjudged_requests:rate{SHORT}"]
    + [f"workload:goodput_inference_slo_{kind}:rate{w}" for w in (SHORT, *LONG)
       for kind in ("requests", "met_requests", "attainment_ratio", "joint_attainment_ratio", "error_ratio")])


# --- the targets ------------------------------------------------------------------------------------------------

@dataclass
class Target:
    name: str  # scrape job and replay path
    engine: Engine
    exposition: Exposition
    labels: dict[str, str]  # target labels, cluster included
    instance: str = ""  # host:port, once the replay server listens


REAL_FILES = {"vllm-0.10.2": "vllm_v0.10.2-era_pr22227.prom", "vllm-0.5.1": "vllm_v0.5.1_issue6337.prom",
              "vllm-0.5.4": "vllm_v0.5.4-0.5.5_2024-08-31_qwen2vl.prom",
              "sglang-0.4.4": "sglang_v0.4.4_2025-03-15_pr4444.prom", "sglang-0.4.7": "sglang_v0.4.7-era_pr7317.prom",
              "sglang-0.4.9": "sglang_v0.4.9-era_pr7944.prom"}


def _real(name: str, engine: Engine, labels: dict[str, str], **chooser: Any) -> Target:
    text = (ENGINES_DIR / REAL_FILES[name]).read_text()
    return Target(name, engine, Exposition(text, Chooser(name, **chooser)), {"cluster": CLUSTER, **labels})


def _cumulative_share(threshold: float, below: float, above: float) -> Callable[[list[str]], list[float]]:
    """Per-bucket slopes: `below` for each bucket up to the threshold, `above` for each after (+Inf included)."""
    return lambda les: [below if le_value(le) <= threshold else above for le in les]


def _natives(engine: Engine, *signals: str) -> list[Native]:
    return [n for s in signals for n in engine.signals[s]]


def _families(natives: list[Native], label_sets: Callable[[Native], list[dict[str, str]]],
              buckets: dict[str, tuple[float, ...]] | None = None) -> list[Family]:
    return [Family(n.name, n.kind, label_sets(n), (buckets or {}).get(n.name, n.buckets), n.note[:60])
            for n in natives]


VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_OLD_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
VLLM_OLD_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
VLLM_V0_E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def vllm_011_text() -> str:
    """vLLM 0.11 (V1, two data-parallel engines) with --show-hidden-metrics-for-version=0.10: every current name,
    and the old gpu_cache_usage_perc and time_per_output_token_seconds beside their replacements."""
    def label_sets(n: Native) -> list[dict[str, str]]:
        engines = [{"model_name": VLLM_MODEL, "engine": e} for e in ("0", "1")]
        if "finished_reason" in n.labels:
            return [{**ls, "finished_reason": r} for ls in engines for r in ("stop", "length", "abort")]
        return engines
    return catalog_exposition(_families([n for natives in VLLM.signals.values() for n in natives], label_sets))


def vllm_v0_text() -> str:
    """vLLM V0 (0.6.x): model_name only; TTFT to 10.0, the old per-step time_per_output_token to 2.5, e2e from 1.0;
    the old KV-cache gauge; no per-request TPOT and no queue-time histogram."""
    natives = [n for n in _natives(VLLM, "time_to_first_token", "inter_token_latency", "e2e_request_latency",
                                   "requests_running", "requests_waiting", "kv_cache_usage", "preemptions",
                                   "prompt_tokens", "generation_tokens", "requests_finished")
               if n.name not in ("vllm:inter_token_latency_seconds", "vllm:kv_cache_usage_perc")]

    def label_sets(n: Native) -> list[dict[str, str]]:
        if "finished_reason" in n.labels:
            return [{"model_name": "mistral-7b", "finished_reason": r} for r in ("stop", "length")]
        return [{"model_name": "mistral-7b"}]
    families = _families(natives, label_sets, {"vllm:time_to_first_token_seconds": VLLM_OLD_TTFT_BUCKETS,
                                               "vllm:time_per_output_token_seconds": VLLM_OLD_ITL_BUCKETS,
                                               "vllm:e2e_request_latency_seconds": VLLM_V0_E2E_BUCKETS})
    families += [Family("vllm:num_requests_swapped", "gauge", [{"model_name": "mistral-7b"}]),
                 Family("vllm:cpu_cache_usage_perc", "gauge", [{"model_name": "mistral-7b"}])]
    return catalog_exposition(families)


SGLANG_MODEL = "Qwen/Qwen2.5-7B-Instruct"


def sglang_text() -> str:
    """SGLang 0.5.23: tokenizer series per is_streaming (where the native has it), scheduler series per dp_rank
    (DP attention); only the current names (a server has one queue-time name or the other)."""
    def label_sets(n: Native) -> list[dict[str, str]]:
        base = {"model_name": SGLANG_MODEL, "engine_type": "unified"}
        if "tp_rank" in n.labels:
            return [{**base, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", "dp_rank": d} for d in ("0", "1")]
        if "is_streaming" in n.labels:
            return [{**base, "is_streaming": s} for s in ("true", "false")]
        return [base]
    return catalog_exposition(_families([natives[0] for natives in SGLANG.signals.values()], label_sets))


def targets() -> list[Target]:
    vllm_a = Chooser("vllm-a", gauges={"vllm:kv_cache_usage_perc": 0.25, "vllm:gpu_cache_usage_perc": 0.75},
                     histograms={"vllm:time_to_first_token_seconds": _cumulative_share(1.0, 2.0, 0.5),
                                 "vllm:request_time_per_output_token_seconds": _cumulative_share(0.1, 2.0, 0.5)})
    vllm_b = Chooser("vllm-a", scale=2.0, gauges={"vllm:kv_cache_usage_perc": 0.5, "vllm:gpu_cache_usage_perc": 0.5},
                     histograms=vllm_a.histograms)
    tgi = Chooser("tgi", integer=True)
    return [
        _real("vllm-0.10.2", VLLM, {"namespace": "serving", "pod": "qwen3-0"}),
        _real("vllm-0.5.1", VLLM, {"workload": "hermes"}),
        _real("vllm-0.5.4", VLLM, {"workload": "qwenvl"}),
        _real("sglang-0.4.4", SGLANG, {"namespace": "serving", "pod": "llama3-0"}),
        _real("sglang-0.4.7", SGLANG, {"workload": "r1"}),
        # its request count includes its aborted ones (217 and 157 in the paste): the count grows faster
        _real("sglang-0.4.9", SGLANG, {"workload": "r1"},
              counters={"sglang:num_requests_total": 30.0, "sglang:num_aborted_requests_total": 20.0}),
        Target("vllm-0.11-a", VLLM, Exposition(vllm_011_text(), vllm_a),
               {"cluster": CLUSTER, "namespace": "llm", "pod": "vllm-0"}),
        Target("vllm-0.11-b", VLLM, Exposition(vllm_011_text(), vllm_b),
               {"cluster": CLUSTER, "namespace": "llm", "pod": "vllm-1"}),
        Target("vllm-v0", VLLM, Exposition(vllm_v0_text(), Chooser("vllm-v0")),
               {"cluster": CLUSTER, "workload": "v0-chat"}),
        Target("sglang-0.5", SGLANG, Exposition(sglang_text(), Chooser("sglang-0.5")),
               {"cluster": CLUSTER, "namespace": "serving", "pod": "sglang-0"}),
        Target("tgi", TGI, Exposition(tgi_exposition(TGI_DURATION_BUCKETS), tgi, rust=True),
               {"cluster": CLUSTER, "workload": "tgi-chat", "model": "bigscience/bloom-560m"}),
    ]


# --- the client path --------------------------------------------------------------------------------------------

CLIENT_WORKLOAD, CLIENT_MODEL = "chat-live", "llama-live"
PERIOD = 0.5  # seconds between batches


@dataclass(frozen=True)
class Request:
    ttft: float | None
    tpot: float | None
    e2e: float
    output: int
    prompt: int
    gaps: tuple[float, ...]
    queue: float | None
    reason: str


BATCH = (
    *[Request(0.25, 0.05, 1.5, 26, 300, (0.04, 0.06), 0.02, "stop")] * 3,  # both met
    Request(0.5, 0.2, 4.0, 18, 120, (0.2, 0.2), 0.1, "stop"),  # TTFT only
    Request(2.0, 0.075, 3.0, 14, 2000, (0.075,), 1.2, "length"),  # TPOT only
    Request(3.0, 0.3, 9.0, 20, 50, (0.3, 0.3), 2.0, "stop"),  # neither
    Request(0.75, None, 0.8, 1, 10, (), None, "length"),  # one token: TPOT not judged, both met
    Request(0.1, 0.04, 0.6, 8, 40, (0.04,), 0.01, "error"),  # failed after meeting both
    *[Request(None, None, 5.0, 0, 500, (), None, "abort")] * 2,  # gone before the first token: not judged
)
TTFT_OBJECTIVE, TPOT_OBJECTIVE = 1.0, 0.1  # the client's defaults


def _met(r: Request) -> tuple[bool, bool, bool]:
    ttft = r.ttft is not None and r.ttft <= TTFT_OBJECTIVE
    tpot = r.tpot is not None and r.tpot <= TPOT_OBJECTIVE
    return ttft, tpot, ttft and (tpot or r.tpot is None)


def client_per_batch() -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Each client-path record's series (daemon labels aside) -> its count per batch, from BATCH alone."""
    base = {"cluster": CLUSTER, "workload": CLIENT_WORKLOAD, "model": CLIENT_MODEL, "engine": "goodput"}
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = defaultdict(dict)

    def put(record: str, value: float, **labels: str) -> None:
        out[record][frozenset({**base, **labels}.items())] = value

    for level in ("server", "workload"):
        put(f"{level}:goodput_inference_prompt_tokens:rate{SHORT}", sum(r.prompt for r in BATCH))
        put(f"{level}:goodput_inference_generation_tokens:rate{SHORT}", sum(r.output for r in BATCH))
        for reason in ("stop", "length", "abort", "error"):
            put(f"{level}:goodput_inference_requests:rate{SHORT}", sum(r.reason == reason for r in BATCH),
                reason=reason)
    observed = {"time_to_first_token": (TTFT_BUCKETS, [r.ttft for r in BATCH if r.ttft is not None]),
                "time_per_output_token": (TPOT_BUCKETS, [r.tpot for r in BATCH if r.tpot is not None]),
                "inter_token_latency": (ITL_BUCKETS, [g for r in BATCH for g in r.gaps]),
                "e2e_request_latency": (E2E_BUCKETS, [r.e2e for r in BATCH]),
                "queue_time": (QUEUE_BUCKETS, [r.queue for r in BATCH if r.queue is not None])}
    for signal, (bounds, values) in observed.items():
        for bound in (*bounds, math.inf):
            put(f"workload:goodput_inference_{HISTOGRAMS[signal]}_bucket:rate{SHORT}",
                sum(v <= bound for v in values), le=python_float(bound))
    met = [_met(r) for r in BATCH]
    judged = {"ttft": sum(r.ttft is not None for r in BATCH), "tpot": sum(r.tpot is not None for r in BATCH),
              "both": sum(r.ttft is not None for r in BATCH)}
    for i, objective in enumerate(("ttft", "tpot", "both")):
        put(f"workload:goodput_inference_slo_requests:rate{SHORT}", judged[objective], objective=objective)
        put(f"workload:goodput_inference_slo_met_requests:rate{SHORT}", sum(m[i] for m in met), objective=objective)
    return out


def client_bounds() -> tuple[float, float]:
    """The joint attainment's bounds from the batch's counts: of the N requests judged on either objective, m_ttft
    and m_tpot missed each; those that missed either are at least max(m) and at most their sum."""
    met = [_met(r) for r in BATCH]
    judged_ttft, judged_tpot = sum(r.ttft is not None for r in BATCH), sum(r.tpot is not None for r in BATCH)
    misses = (judged_ttft - sum(m[0] for m in met), judged_tpot - sum(m[1] for m in met))
    n = max(judged_ttft, judged_tpot)
    return max(0.0, 1 - sum(misses) / n), 1 - max(misses) / n


def client_shares() -> dict[str, float]:
    met = [_met(r) for r in BATCH]
    judged_ttft = sum(r.ttft is not None for r in BATCH)
    return {"ttft": sum(m[0] for m in met) / judged_ttft,
            "tpot": sum(m[1] for m in met) / sum(r.tpot is not None for r in BATCH),
            "both": sum(m[2] for m in met) / judged_ttft,
            "met_both_of_all": sum(m[2] for m in met) / len(BATCH)}


def send_batches(telemetry: Telemetry, stop: threading.Event) -> None:
    """One batch every PERIOD seconds, each sent in one request (flush), so a scrape never sees part of one."""
    due = time.monotonic()
    while not stop.is_set():
        for r in BATCH:
            telemetry.record_request(CLIENT_MODEL, r.ttft, r.tpot, r.e2e, r.output, prompt_tokens=r.prompt,
                                     inter_token_seconds=r.gaps, queue_seconds=r.queue, finish_reason=r.reason)
        telemetry.flush()
        due += PERIOD
        stop.wait(max(0.0, due - time.monotonic()))


# --- what the rules should record, from the chosen slopes and values ---------------------------------------------

Key = frozenset[tuple[str, str]]
Expected = dict[str, dict[Key, float]]


def _pick(target: Target, natives: tuple[Native, ...], suffix: str) -> list[tuple[Native, Series]]:
    """The series of a signal, every name the engine has used, the current one first: an older name's series
    counts only where no newer name has one with the same labels (PromQL's `or`; a native with its own finish reason
    has labels of its own)."""
    seen: set[Key] = set()
    out = []
    for native in natives:
        for s in target.exposition.series:
            if s.name != native.name + suffix or (
                    native.match and not any(f'{k}="{v}"' == native.match for k, v in s.labels)):
                continue
            key = frozenset(s.labels) | ({("reason", native.reason)} if native.reason else set())
            if key not in seen:
                seen.add(key)
                out.append((native, s))
    return out


def _slope(target: Target, native: Native, s: Series) -> float:
    """A counter's rate: its slope, less that of the series `less` names with the same labels (SGLang's aborts)."""
    less = target.exposition.by_key.get((native.less, s.labels)) if native.less else None
    return s.slope - (less.slope if less else 0.0)


def _normalized(target: Target, native: Native, s: Series, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """A series' labels at the server level: the target's, the engine's own dropped (but those in `keep`), the
    model label as `model`, the finish reason as `reason` (normalized), and `engine` naming the engine."""
    engine, labels = target.engine, s.label_dict
    own = set(native.labels)
    out = {k: v for k, v in labels.items() if k not in own or k in keep}
    out.update(target.labels)
    out.update(job=target.name, instance=target.instance)
    if engine.model_label and labels.get(engine.model_label):
        out["model"] = labels[engine.model_label]
    if engine.reason_label and labels.get(engine.reason_label):
        reason = labels[engine.reason_label]
        out["reason"] = next((new for regex, new in engine.reasons if re.fullmatch(regex, reason)), reason)
    if native.reason and not out.get("reason"):
        out["reason"] = native.reason
    out["engine"] = engine.name
    return out


def _workload(labels: dict[str, str], *extra: str) -> dict[str, str]:
    return {k: labels[k] for k in (*KEYS, "engine", *extra) if k in labels}


def _key(labels: dict[str, str]) -> Key:
    return frozenset(labels.items())


def _met_buckets(target: Target, natives: tuple[Native, ...], threshold: float) -> list[tuple[Native, Series, float]]:
    """Per histogram series (its labels but `le`): the bucket the rules read for `threshold`, the largest bound at or
    below it among the candidates, and that bound in seconds; the current name first."""
    seen: set[Key] = set()
    out = []
    for native in natives:
        bounds = candidates(native, threshold)
        groups: dict[Key, list[Series]] = defaultdict(list)
        for s in target.exposition.series:
            if s.name == native.name + "_bucket" and s.label_dict["le"] != INF and any(
                    math.isclose(le_value(s.label_dict["le"]), b, rel_tol=1e-9) for b in bounds):
                groups[frozenset((k, v) for k, v in s.labels if k != "le")].append(s)
        for key, found in groups.items():
            if key not in seen:
                seen.add(key)
                top = max(found, key=lambda s: le_value(s.label_dict["le"]))
                out.append((native, top, le_value(top.label_dict["le"]) / native.le_per))
    return out


def engines_expected(all_targets: list[Target]) -> Expected:
    """Every series the inference rules should record from the engines' targets, with its value (the long windows'
    request rates are not here: they average the 20 s ones since the start)."""
    out: Expected = defaultdict(dict)
    gauges: dict[str, dict[Key, list[float]]] = defaultdict(lambda: defaultdict(list))
    sums: dict[str, dict[Key, float]] = defaultdict(lambda: defaultdict(float))
    bounds: dict[Key, list[float]] = defaultdict(list)

    def add(record: str, labels: dict[str, str], value: float) -> None:
        sums[record][_key(labels)] += value

    for t in all_targets:
        signals = t.engine.signals
        for signal, (name, fn) in GAUGES.items():
            for native, s in _pick(t, signals.get(signal, ()), ""):
                labels = _normalized(t, native, s)
                gauges[f"server:goodput_inference_{name}:{fn}"][_key(labels)].append(s.value)
        for signal, name in COUNTERS.items():
            for native, s in _pick(t, signals.get(signal, ()), ""):
                labels = _normalized(t, native, s)
                add(f"server:goodput_inference_{name}:rate{SHORT}", labels, _slope(t, native, s) / native.per)
                add(f"workload:goodput_inference_{name}:rate{SHORT}",
                    _workload(labels, *(("reason",) if name == "requests" else ())), _slope(t, native, s) / native.per)
        for signal, name in HISTOGRAMS.items():
            natives = tuple(n for n in signals.get(signal, ()) if n.le_per == 1)
            for native, s in _pick(t, natives, "_bucket"):
                labels = {**_workload(_normalized(t, native, s)), "le": s.label_dict["le"]}
                add(f"workload:goodput_inference_{name}_bucket:rate{SHORT}", labels, s.slope)
        for objective, threshold in THRESHOLDS[t.engine.name].items():
            natives = signals[SIGNALS[objective]]
            for native, s in _pick(t, natives, "_count"):
                add(f"workload:goodput_inference_slo_requests:rate{SHORT}",
                    {**_workload(_normalized(t, native, s)), "objective": objective}, s.slope)
            for native, s, bound in _met_buckets(t, natives, threshold):
                labels = {**_workload(_normalized(t, native, s)), "objective": objective}
                add(f"workload:goodput_inference_slo_met_requests:rate{SHORT}", labels, s.slope)
                bounds[_key(labels)].append(bound)
    for record, groups in gauges.items():  # each server's, then each served model's, by the same function
        fn = max if record.endswith(":max") else sum
        by_workload: dict[Key, list[float]] = defaultdict(list)
        for labels, values in groups.items():
            out[record][labels] = fn(values)
            by_workload[_key(_workload(dict(labels)))].append(fn(values))
        out[record.replace("server:", "workload:")].update({k: fn(v) for k, v in by_workload.items()})
    for record, groups in sums.items():
        out[record].update(groups)
    out["workload:goodput_inference_slo_judged_bound_seconds:min"] = {k: min(v) for k, v in bounds.items()}

    requests, met = out[f"workload:goodput_inference_slo_requests:rate{SHORT}"], \
        out[f"workload:goodput_inference_slo_met_requests:rate{SHORT}"]
    for key in requests:
        budget = 1 - OBJECTIVES[dict(key)["engine"]].target
        out["workload:goodput_inference_slo_error_budget:ratio"][_key(_workload(dict(key)))] = budget
    # the finished requests, aborted ones out; those of an objective nothing judges are unjudged
    finished: dict[Key, float] = defaultdict(float)
    for key, value in out[f"workload:goodput_inference_requests:rate{SHORT}"].items():
        labels = dict(key)
        if labels.pop("reason", "") != "abort":
            finished[_key(labels)] += value
    unknown: set[Key] = set()
    for group, value in finished.items():
        for objective in SIGNALS:
            if value > 0 and _key({**dict(group), "objective": objective}) not in requests:
                out[f"workload:goodput_inference_slo_unjudged_requests:rate{SHORT}"][
                    _key({**dict(group), "objective": objective})] = value
                unknown.add(group)
    attainment: dict[Key, dict[str, float]] = defaultdict(dict)
    counts: dict[Key, dict[str, tuple[float, float]]] = defaultdict(dict)  # objective -> (judged, met) per second
    for key, judged in requests.items():
        labels = dict(key)
        objective = labels.pop("objective")
        if key not in met:  # judged, with no bucket at or below the threshold: unmeasured
            unknown.add(_key(labels))
        elif judged > 0:
            attainment[_key(labels)][objective] = met[key] / judged
            counts[_key(labels)][objective] = (judged, met[key])
    for window in (SHORT, *LONG):
        for group, figures in attainment.items():
            labels = dict(group)
            for objective, a in figures.items():
                out[f"workload:goodput_inference_slo_attainment_ratio:rate{window}"][
                    _key({**labels, "objective": objective})] = a
            # the bounds from counts: N requests judged on either objective, m missing each; those that missed
            # either are at least max(m) and at most sum(m) (steady rates: every window's ratios are the same)
            judged_met = [v for objective, v in counts[group].items() if objective in ("ttft", "tpot")]
            n = max(j for j, _ in judged_met)
            misses = [j - m for j, m in judged_met]
            joint = f"workload:goodput_inference_slo_joint_attainment_ratio:rate{window}"
            lower, upper = max(0.0, 1 - sum(misses) / n), 1 - max(misses) / n
            # the upper bound counts only misses that happened, so it stands where an objective is unjudged and the
            # error ratio (the burn-rate pages) reads it
            out[joint][_key({**labels, "bound": "upper"})] = upper
            out[f"workload:goodput_inference_slo_error_ratio:rate{window}"][group] = 1 - upper
            if group in unknown:  # an objective nothing judges: no lower bound, so no goodput
                continue
            out[joint][_key({**labels, "bound": "lower"})] = lower
            # the judged requests (the larger count of the objectives') times the lower bound, never more than the
            # finished ones (aborted ones out)
            if window == SHORT and group in finished:
                out[f"workload:goodput_inference_slo_goodput:rate{SHORT}"][group] = min(n * lower, finished[group])
    return out


# --- the stack --------------------------------------------------------------------------------------------------

@dataclass
class Live:
    prometheus: httpx.Client
    targets: list[Target]
    expected: Expected
    daemon_labels: dict[str, str]

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = self.prometheus.get("/api/v1/query", params={"query": expr})
        response.raise_for_status()
        return response.json()["data"]["result"]

    def record(self, name: str, matchers: str = "") -> dict[Key, float]:
        """Every series of a recorded name: labels (no __name__) -> value."""
        out = {}
        for item in self.query(f'{{__name__="{name}"{"," + matchers if matchers else ""}}}'):
            labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
            out[_key(labels)] = float(item["value"][1])
        return out


def _prometheus_config(replay: ReplayServer, all_targets: list[Target], daemon_port: int, rules: Path) -> dict:
    jobs = [{"job_name": t.name, "metrics_path": f"/t/{t.name}",
             "static_configs": [{"targets": [f"127.0.0.1:{replay.port}"], "labels": t.labels}]} for t in all_targets]
    jobs.append({"job_name": "goodput-exporter",
                 "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"], "labels": {"cluster": CLUSTER}}]})
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules / "*.rules.yml")], "scrape_configs": jobs}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        pytest.fail("prometheus not found: `make test` installs Debian's prometheus package")
    work = tmp_path_factory.mktemp("inference-live")
    all_targets = targets()
    with ExitStack() as stack:
        replay = stack.enter_context(ReplayServer({t.name: t.exposition for t in all_targets}))
        for t in all_targets:
            t.instance = f"127.0.0.1:{replay.port}"
        ingest_port = free_port()
        daemon = stack.enter_context(live_server(quick_config(ingest={"listen_address": f"127.0.0.1:{ingest_port}"}),
                                                 backend=SimulatedGpus(1)))
        telemetry = Telemetry(CLIENT_WORKLOAD, 0, url=f"http://127.0.0.1:{ingest_port}", flush_interval=3600)
        stack.callback(telemetry.close)
        stop = threading.Event()
        sender = threading.Thread(target=send_batches, args=(telemetry, stop), daemon=True)
        sender.start()
        stack.callback(sender.join, 5)
        stack.callback(stop.set)

        rules = work / "rules"
        rules.mkdir()
        for name, text in rule_files(SETTINGS, source="tests/test_inference_live.py").items():
            (rules / name).write_text(text)
        daemon_port = int(daemon.url.rsplit(":", 1)[1])
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(replay, all_targets, daemon_port, rules)))
        port = free_port()
        log = (work / "prometheus.log").open("wb")
        stack.callback(log.close)
        proc = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
             # align scrape timestamps to the interval even 9 ms late (the default 2 ms; it must stay under 1% of it)
             f"--web.listen-address=127.0.0.1:{port}", "--scrape.timestamp-tolerance=9ms"],
            stdout=log, stderr=subprocess.STDOUT)

        def stop_prometheus() -> None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        stack.callback(stop_prometheus)
        client = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10))

        def ready() -> bool:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            try:
                return client.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False
        wait_for(ready, timeout=30, interval=0.2)
        result = Live(client, all_targets, engines_expected(all_targets),
                      {"job": "goodput-exporter", "instance": f"127.0.0.1:{daemon_port}"})
        jobs = len(all_targets) + 1

        # every target scraped all through the short window (21 samples in 21 s), then one more evaluation
        def filled() -> bool:
            counts = result.query("count_over_time(up[21s])")
            return len(counts) == jobs and min(float(c["value"][1]) for c in counts) >= 21
        wait_for(filled, timeout=60, interval=0.5)
        time.sleep(2.0)
        yield result


# --- checks -----------------------------------------------------------------------------------------------------

def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)


def _diff(expected: dict[Key, float], found: dict[Key, float], close: Callable[[float, float], bool] = _close
          ) -> list[str]:
    problems = []
    for key in sorted(set(expected) | set(found), key=lambda k: sorted(k)):
        labels = dict(sorted(key))
        if key not in found:
            problems.append(f"missing {labels} (expected {expected[key]})")
        elif key not in expected:
            problems.append(f"unexpected {labels} = {found[key]}")
        elif not close(expected[key], found[key]):
            problems.append(f"{labels}: expected {expected[key]!r}, got {found[key]!r}")
    return problems


def _eventually(check: Callable[[], list[str]], tries: int = 3) -> list[str]:
    """A check's problems, retried a few times a second apart (a late scrape keeps its own timestamp)."""
    problems = check()
    for _ in range(tries - 1):
        if not problems:
            break
        time.sleep(1.0)
        problems = check()
    return problems


def test_the_replay_keeps_every_line_and_moves_only_values() -> None:
    """No Prometheus: every line of each exposition comes back with only its value changed: counters and histogram
    parts linear from the file's value, buckets still cumulative, gauges as chosen; TGI's in its Rust spelling."""
    for t in targets():
        rendered = [t.exposition.render(x).splitlines() for x in (0.0, 7.0)]
        original = (ENGINES_DIR / REAL_FILES[t.name]).read_text().splitlines() if t.name in REAL_FILES \
            else rendered[0]
        series = iter(t.exposition.series)
        for line, now, later in zip(original, *rendered, strict=True):
            if not line or line.startswith("#"):
                assert now == later == line
                continue
            s = next(series)
            (prefix, written), (prefix0, v0), (prefix7, v7) = (x.rsplit(" ", 1) for x in (line, now, later))
            assert prefix == prefix0 == prefix7
            if s.kind == "gauge":
                assert float(v0) == float(v7) == s.value
            else:
                assert float(v0) == float(written) and math.isclose(float(v7), float(v0) + 7 * s.slope)
        histograms: dict[tuple[str, Key], list[tuple[float, float]]] = defaultdict(list)
        for s in t.exposition.series:
            if s.name.endswith("_bucket"):
                rest = frozenset((k, v) for k, v in s.labels if k != "le")
                histograms[(s.name[:-7], rest)].append((le_value(s.label_dict["le"]), s.at(7.0)))
        for (base, rest), buckets in histograms.items():
            values = [v for _, v in sorted(buckets)]
            assert values == sorted(values), base
            count = next((c for c in t.exposition.series if c.name == f"{base}_count" and frozenset(c.labels) == rest),
                         None)
            if count is not None and sorted(buckets)[-1][0] == math.inf:
                assert count.at(7.0) == values[-1], base
    tgi = next(t for t in targets() if t.name == "tgi").exposition.render(3.0)
    assert f'tgi_request_mean_time_per_token_duration_bucket{{le="{THRESHOLDS["tgi"]["tpot"]!r}"}}' in tgi
    assert 'tgi_request_input_length_bucket{le="256"} ' in tgi and 'le="256.0"' not in tgi
    assert re.search(r"^tgi_request_success \d+$", tgi, re.M) and "_total" not in tgi


def test_the_rules_record_exactly_these_names() -> None:
    from goodput_mixin.rules.inference import inference_groups

    recorded = {r["record"] for g in inference_groups(SETTINGS) for r in g["rules"] if "record" in r}
    assert recorded - {r for r in recorded if r.startswith("workload:goodput_inference_gpu")} == set(RECORDS)


KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("record", [
    pytest.param(r, marks=pytest.mark.xfail(reason=KNOWN[r], strict=True)) if r in KNOWN else r for r in RECORDS])
def test_every_engine_series_is_what_the_replayed_data_implies(live: Live, record: str) -> None:
    """Every series of `record` from the engines' targets, and no other, with its value (the long windows' request
    rates: within (0, the 20 s rate], as they average what was recorded since the start)."""
    expected = live.expected.get(record, {})
    window = record.rsplit(":rate", 1)[-1] if ":rate" in record else None
    long_rate = window in LONG and ("slo_requests" in record or "slo_met_requests" in record)
    if long_rate:
        expected = live.expected.get(record.replace(f":rate{window}", f":rate{SHORT}"), {})

    def close(want: float, got: float) -> bool:  # averaged since the start, so at most the current rate
        return 0 < got <= want * (1 + REL) if long_rate else _close(want, got)

    problems = _eventually(lambda: _diff(expected, live.record(record, 'engine!="goodput"'), close))
    assert not problems, f"{record}:\n  " + "\n  ".join(problems)


def test_what_an_engine_lacks_is_not_recorded(live: Live) -> None:
    """The main comparison covers this (exact label sets); here the cases by name."""
    tgi = 'engine="tgi"'
    # TGI cannot judge TTFT: its finished requests are unjudged on it, and it has no joint figure nor goodput
    ttft = live.query(f'{{__name__=~"(server|workload):goodput_inference_.*", {tgi}, objective="ttft"}}')
    assert [r["metric"]["__name__"] for r in ttft] == [f"workload:goodput_inference_slo_unjudged_requests:rate{SHORT}"]
    assert not live.record(f"workload:goodput_inference_slo_goodput:rate{SHORT}", tgi)
    for name in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket"):
        assert not live.record(f"workload:goodput_inference_{name}:rate{SHORT}", tgi)
    assert not live.record("server:goodput_inference_kv_cache_usage_ratio:max", tgi)
    assert not live.record(f"server:goodput_inference_preemptions:rate{SHORT}", tgi)
    assert live.record(f"workload:goodput_inference_slo_attainment_ratio:rate{SHORT}", f'{tgi}, objective="tpot"')

    # vLLM V0: TTFT is its only objective, its KV cache the old gauge, its inter-token latency the old histogram
    v0 = 'workload="v0-chat"'
    assert {dict(k)["objective"] for k in live.record(f"workload:goodput_inference_slo_requests:rate{SHORT}", v0)} \
        == {"ttft"}
    assert not live.record(f"workload:goodput_inference_time_per_output_token_seconds_bucket:rate{SHORT}", v0)
    (kv,) = live.record("workload:goodput_inference_kv_cache_usage_ratio:max", v0).values()
    v0_target = next(t for t in live.targets if t.name == "vllm-v0")
    assert kv == v0_target.exposition.by_key[("vllm:gpu_cache_usage_perc", (("model_name", "mistral-7b"),))].value
    # it cannot judge TPOT: no lower bound of the joint figure (it would count TPOT as met), only the upper one (the
    # TTFT misses), and its finished requests unjudged on TPOT
    assert {dict(k)["bound"] for k in live.record(f"workload:goodput_inference_slo_joint_attainment_ratio:rate{SHORT}",
                                                  v0)} == {"upper"}
    assert {dict(k)["objective"] for k in live.record(f"workload:goodput_inference_slo_unjudged_requests:rate{SHORT}",
                                                      v0)} == {"tpot"}

    # vLLM 0.11 shows both inter-token names on one engine: the new one's slopes, not both added
    pods = [t for t in live.targets if t.name.startswith("vllm-0.11")]
    new = sum(s.slope for t in pods for s in t.exposition.series
              if s.name == "vllm:inter_token_latency_seconds_bucket" and s.label_dict["le"] == INF)
    old = sum(s.slope for t in pods for s in t.exposition.series
              if s.name == "vllm:time_per_output_token_seconds_bucket" and s.label_dict["le"] == INF)
    assert new != old
    (rate,) = live.record(f"workload:goodput_inference_inter_token_latency_seconds_bucket:rate{SHORT}",
                          f'namespace="llm", le="{INF}"').values()
    assert _close(rate, new)

    # vLLM 0.5.1's excerpt stops at le="0.06": judged there, the nearest bound below 1.0 s, and that bound exposed
    (bound,) = live.record("workload:goodput_inference_slo_judged_bound_seconds:min", 'workload="hermes"').values()
    assert bound == 0.06

    # excerpts: a met count without a count (vLLM 0.10.2), a count without a bucket at or below the threshold
    # (SGLang 0.4.7)
    for selector in ('namespace="serving", model="/home/jovyan/qwen3-8b"', 'workload="r1"'):
        assert live.record(f"workload:goodput_inference_slo_requests:rate{SHORT}", selector) or \
            live.record(f"workload:goodput_inference_slo_met_requests:rate{SHORT}", selector)
        assert not live.record(f"workload:goodput_inference_slo_attainment_ratio:rate{SHORT}", selector)
        assert not live.record(f"workload:goodput_inference_slo_goodput:rate{SHORT}", selector)


# --- the client path --------------------------------------------------------------------------------------------

PER_BATCH = client_per_batch()


@pytest.mark.parametrize("record", sorted(PER_BATCH))
def test_client_path_series_are_whole_batches(live: Live, record: str) -> None:
    """Each series of `record` from the daemon is its count per batch times the batch rate (one for the record,
    read from its largest series; about 1/PERIOD)."""
    per_batch = {_key({**dict(k), **(live.daemon_labels if record.startswith("server:") else {})}): v
                 for k, v in PER_BATCH[record].items()}
    reference = max(per_batch, key=lambda k: per_batch[k])

    def check() -> list[str]:
        found = live.record(record, 'engine="goodput"')
        if reference not in found:
            return [f"missing {dict(reference)}", *(f"found {dict(k)}" for k in found)]
        rate = found[reference] / per_batch[reference]
        problems = [] if 0.8 <= rate * PERIOD <= 1.2 else [f"batch rate {rate}/s, sent {1 / PERIOD}/s"]
        return problems + _diff({k: v * rate for k, v in per_batch.items()}, found,
                                lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))

    problems = _eventually(check)
    assert not problems, f"{record}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("window", [SHORT, *LONG])
def test_client_path_attainment_is_the_share_sent(live: Live, window: str) -> None:
    """Attainment per objective is the share sent, exactly; the joint figure (objective both) is the exact one, and
    lies within the bounds the two histograms give."""
    shares = client_shares()
    labels = {"cluster": CLUSTER, "workload": CLIENT_WORKLOAD, "model": CLIENT_MODEL, "engine": "goodput"}
    lower, upper = client_bounds()
    expected: Expected = {
        f"workload:goodput_inference_slo_attainment_ratio:rate{window}": {
            _key({**labels, "objective": o}): shares[o] for o in ("ttft", "tpot", "both")},
        f"workload:goodput_inference_slo_joint_attainment_ratio:rate{window}": {
            _key({**labels, "bound": "lower"}): lower,
            _key({**labels, "bound": "upper"}): upper,
            _key({**labels, "bound": "exact"}): shares["both"]},
        f"workload:goodput_inference_slo_error_ratio:rate{window}": {_key(labels): 1 - shares["both"]},
    }
    if window == SHORT:
        expected["workload:goodput_inference_slo_error_budget:ratio"] = {
            _key(labels): 1 - resolve(SETTINGS, "goodput").target}
    assert lower < shares["both"] < upper  # the mix sent makes the bounds differ, and the exact figure within
    problems = _eventually(lambda: [p for record, want in expected.items()
                                    for p in _diff(want, live.record(record, 'engine="goodput"'))])
    assert not problems, "\n  ".join(problems)


def test_client_path_goodput_counts_the_requests_that_met_both(live: Live) -> None:
    """SLO goodput, where the client counted the requests that met both, is that count's rate."""
    def check() -> list[str]:
        goodput = live.record(f"workload:goodput_inference_slo_goodput:rate{SHORT}", 'engine="goodput"')
        met = live.record(f"workload:goodput_inference_slo_met_requests:rate{SHORT}",
                          'engine="goodput", objective="both"')
        return _diff({_key({k: v for k, v in key if k != "objective"}): v for key, v in met.items()}, goodput)

    problems = _eventually(check)
    assert not problems, "\n  ".join(problems)
