"""Rules at cluster scale: the evaluation time of our rule groups over a synthetic history of 10,000 GPUs (1,250
nodes), 100 workloads x 64 ranks and 2,000 serving pods, on Prometheus and on VictoriaMetrics with vmalert, one
after the other in one run; and the series count per GPU of one daemon.

The history is OpenMetrics written here, turned into TSDB blocks by `promtool tsdb create-blocks-from
openmetrics`, and served by Debian's Prometheus with the rule files of rules/ as shipped, at a 30 s
evaluation interval (kube-prometheus-stack's default; the slow groups at their own 1m). It spans 62
minutes before the start and AHEAD after, one sample a minute but for the last 10 minutes, which are at a 15 s
scrape so that the 5m windows read as many samples as they would; that keeps it to about 80 million samples on a
2-core machine. It ends about when Prometheus starts on it (a block reaching into the future would make Prometheus
discard every rule result as out of bounds), and the groups are measured in the next few minutes. Each group's
`evaluationTime` is read from /api/v1/rules: of the groups evaluated every 30 s, the first of 8
evaluations (the data read for the first time) apart, then the median and worst of the last 6; of the slow
groups, the first of 3 apart, then the last 2.

Then Prometheus stops, and a fresh single-node VictoriaMetrics gets the same history moved later by whole minutes,
so that it too ends as its ruler starts: the same text, in milliseconds, streamed from the same writer into its
Prometheus text import, then flushed and merged (VictoriaMetrics takes samples up to two days ahead, so the import
can run before the history's end). vmalert then runs the same rule files against it, writing back to it, measured
the same way (`_victoria` says how a group's and a rule's time are read from vmalert 1.79). The two engines never
run at once: they would share the 2 cores. Run alone with `python bench/rules_scale.py`: it takes about 22
minutes (writing 2, converting 4 to 8, Prometheus waiting for the history's end and measuring 9, loading
VictoriaMetrics 3 and measuring 5).

Every series carries a `cluster` target label (one cluster, as a multi-cluster setup labels its targets), so
the joins `on (cluster, ...)` join what they would. Every GPU also reports DCGM's activity ratios (the dcgm
source on) and its power draw, and the ranks' GPUs carry the attribution info series (workload and pod), so the
groups reading them cost what they would.

The serving pods (`SERVING`: vLLM V1, SGLang, TGI, Triton with TensorRT-LLM, vLLM under Ray Serve) serve `MODELS`
models, each model one engine in one of the workloads' namespaces with 20 pods of 1, 2, 4 or 8 GPUs. Each pod
exposes the series that mixin/goodput_mixin/rules/engines.py gives for its engine under their current names (a
current release exposes no other), with the engine's own labels (those on by default: vLLM's model_name and
engine="0"; SGLang's model_name, engine_type="unified", is_streaming on the tokenizer's series, and tp_rank,
pp_rank, moe_ep_rank on the schedulers', two pipeline stages reporting on pods of 4 or more GPUs; TGI none;
Triton's model and version, with request_type and kv_cache_block_type on the TensorRT-LLM backend's gauges; Ray's
WorkerId, SessionName and Version beside vLLM's) and every default bucket (Triton's first-response histogram, which
has none, in milliseconds), `le` written as the engine's client library writes it (Python's repr; TGI's Rust
shortest form, which Prometheus 2 stores as written). The target labels are those of Kubernetes service discovery:
instance (pod IP:port), job, namespace, pod, and TGI's `model` added by the scrape, as TGI has no model label; each
target has its `up`. Counters and histograms grow at each pod's request rate (histogram buckets from a latency
distribution per model), gauges vary by scrape. The engines' other series (process, Python, the histograms no rule
reads) are left out: no rule reads them. The pods' GPUs are the fleet's GPUs held by no rank (nodes 800 on; 3,560
of the 3,600), each pod's GPUs on one node, given to it by goodput_gpu_pod_info (namespace, pod), so no GPU is held
twice.

The long-window groups average what the short-window (5m) rules recorded, so the history also holds those
recorded series for the longest window each is read over (1h; the inference SLO series 6h, for the 30m, 1h
and 6h groups), as a Prometheus that has run the rules that long would: the names and windows are read from the
long groups' expressions and the label sets follow the fleet; their values are constants (the cost of a range
read does not depend on them), written every 30 s as the rules would record them, and a check at the end
proves every series the short groups record had every window it is read over full behind it. The history is
written as one file per 2h block, converted one after the other, as promtool reads its whole input once per block
the input touches (and once more to find them); and Prometheus runs with compaction off (min = max block duration,
2h), so that no compaction runs while the groups are measured.
"""

from __future__ import annotations

import calendar
import dataclasses
import functools
import http.client
import http.server
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml
from goodput_mixin.rules.engines import ENGINES, Engine, Native
from goodput_mixin.rules.objectives import OBJECTIVES
from serving import free_port, metrics, settle_victoria, stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "rules-scale"
NODES = 1250
GPUS_PER_NODE = 8
WORKLOADS = 100
RANKS = 64
STEP = 60  # seconds between samples, but for the last RECENT seconds:
RECENT, SCRAPE = 600, 15  # ... which are at a 15 s scrape, so the 5m windows read what they would
HISTORY = 62 * 60
AHEAD = 600  # the history ends this long after it is started: writing and converting it takes about 5 minutes
EVALUATIONS = 8  # of each group evaluated at every evaluation (30 s); the first few read cold blocks
COLD = 2  # ... so the first is reported apart and the median and worst taken over the last 6
SLOW_EVALUATIONS = 3  # of each group with its own, longer interval (1m): the first apart, then the last 2
EVAL_INTERVAL = 30  # kube-prometheus-stack's default; Prometheus's own is 1m
# VictoriaMetrics as docs/scale-out.md deploys it (retention, deduplication of HA agent pairs), less the 30 s it hides
# by default (the history ends as the ruler starts: see the docs' -search.latencyOffset) and its caches (each
# evaluation should cost what it would on a store whose data keeps changing)
VM_RAISED: tuple[str, ...] = ()  # search limits the rules needed raised (none at 1.79's defaults)
VM_FLAGS = ("-retentionPeriod=90d", "-dedup.minScrapeInterval=15s", "-search.latencyOffset=0s", "-search.disableCache",
            *VM_RAISED)
SEEDED = 600  # s of the chained series in VictoriaMetrics' copy of the history (see _victoria)
VM_ALLOWANCE = 1.8  # x the seconds writing the history took: VictoriaMetrics' import, flush and merge of it
BLOCK = 2 * 3600  # promtool's block range: it reads its whole input once per block the history touches
NAMESPACES = 20  # the workloads' pods, and the serving pods, are spread over this many namespaces
# each rank's seconds per second in each phase (adding to 1 with untracked), and its accounting counters per second
PHASE_SHARES = {"compute": 0.65, "data_wait": 0.1, "comm_wait": 0.15, "checkpoint_save": 0.04, "checkpoint_restore": 0,
                "compile": 0, "startup": 0, "other": 0, "untracked": 0.06}
ACCOUNTING = {"goodput_elapsed_seconds": 1.0, "goodput_downtime_seconds": 0.01, "goodput_wasted_seconds": 0.02,
              "goodput_wasted_compute_seconds": 0.015}
STEPS_PER_SECOND = 2  # each rank's steps a second, and the seconds of its step durations' sum a second
STEP_SUM_PER_SECOND = 1
# each rank's GPU-side seconds in collectives a second (NCCL's timed durations): the least, and the more of rank r
COLLECTIVE_BASE, COLLECTIVE_SPREAD = 0.25, 0.01
# the nvml source's health gauges on every GPU: (healthy value, degraded value); one GPU in 997 degraded
HEALTH_GAUGES = {"up": (1, 0), "pcie_link_generation": (5, 5), "pcie_link_max_generation": (5, 5),
                 "pcie_link_width": (16, 8), "pcie_link_max_width": (16, 16), "row_remap_failure": (0, 0),
                 "row_remap_pending": (0, 1), "recovery_action": (0, 1)}
WASTEFUL = 5  # workloads redoing enough steps after restarts that GoodputWastedProgress pages (_long_value)
# workloads hung on a missing rank: their rank 0 never enqueued collective 1001, which the other 63 have waited in
# for 45 s (past rank_missing_seconds); the other workloads' ranks have an op in flight for 10 ms
HUNG = 5
DCGM_RATIOS = {"sm": 0.9, "dram": 0.4, "tensor": 0.6, "fp16": 0.1, "fp32": 0.2, "fp64": 0.0}  # x busy
CLUSTER = 'cluster="gpu-east-1"'  # every target's cluster label
SERVING = {"vllm": 1200, "sglang": 300, "tgi": 200, "triton": 200, "ray_vllm": 100}  # serving pods per engine
TITLES = {"vllm": "vLLM (V1)", "sglang": "SGLang", "tgi": "TGI", "triton": "Triton (TensorRT-LLM)",
          "ray_vllm": "vLLM under Ray Serve"}
MODELS = 100  # served models; model m's engine is MODEL_ENGINES[m % 20], its pods' GPUs MODEL_GPUS[m * 37 % 50]
MODEL_ENGINES = ("vllm",) * 12 + ("sglang",) * 3 + ("tgi",) * 2 + ("triton",) * 2 + ("ray_vllm",)
MODEL_GPUS = (8,) * 2 + (4,) * 5 + (2,) * 10 + (1,) * 33
PORTS = {"vllm": 8000, "sglang": 30000, "tgi": 80, "triton": 8002, "ray_vllm": 8080}
# Triton's first-response histogram has no default buckets (set per model): milliseconds, a bound at the 1 s objective
TRITON_FIRST_RESPONSE_MS = (50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)
PROMPT, GENERATED = 1000, 200  # tokens per request
# the engines' own labels: value -> share of the requests; None: off by default (DP attention, priority scheduling)
LABEL_VALUES: dict[str, dict[str, float] | None] = {
    "engine": {"0": 1}, "engine_type": {"unified": 1}, "is_streaming": {"true": 0.7, "false": 0.3},
    "tp_rank": {"0": 1}, "moe_ep_rank": {"0": 1}, "dp_rank": None, "priority": None,
    "finished_reason": {"stop": 0.8, "length": 0.15, "abort": 0.04, "error": 0.007, "repetition": 0.003},
    # Triton's (a per-kind gauge gets the kind its native reads; failures carry Triton's reason) and Ray's agent's
    "version": {"1": 1}, "request_type": None, "kv_cache_block_type": None, "reason": {"BACKEND": 1}, "err": None,
    "WorkerId": {"5f0c9a31": 1}, "ReplicaId": None, "NodeAddress": None, "SessionName": {"session_2026": 1},
    "Version": {"2.52.0": 1}, "Component": None}
# normalized latency signal -> (median seconds, before the model's own factor; observations per request)
LATENCY = {"time_to_first_token": (0.25, 1), "time_per_output_token": (0.03, 1),
           "inter_token_latency": (0.03, GENERATED), "e2e_request_latency": (6.0, 1), "queue_time": (0.02, 1)}


@dataclass
class Measured:
    """One engine's evaluation times."""

    groups: dict[str, tuple[float, float, float]]  # name -> (first s, steady median s, steady worst s)
    rules: dict[str, list[float]]  # group -> steady median evaluation time (s) of each of its rules, in order
    members: dict[str, list[str]]  # group -> its rules' names, in order
    load_s: float = 0.0  # loading the history: promtool's conversion; VictoriaMetrics' import, flush and merge
    peak_rss_mb: float = 0.0  # the store's (Prometheus; VictoriaMetrics, not vmalert), loading included
    busy_cores: float = 0.0  # while measured: the machine's CPUs busy, on average (steal apart)
    steal_cores: float = 0.0  # ... taken by the hypervisor for others
    engine_cores: float = 0.0  # ... of them the engine's (Prometheus; VictoriaMetrics and vmalert)

    def slowest(self, group: str) -> tuple[str, float]:
        """The group's rule with the largest steady median evaluation time."""
        names = self.members.get(group, [])
        if not names:
            return "", float("nan")
        i = max(range(len(names)), key=lambda i: self.rules[group][i])
        return names[i], self.rules[group][i]


@dataclass
class Result:
    series: int
    samples: int
    slow: set[str]  # groups evaluated at their own, longer interval
    engines: dict[str, Measured]  # "Prometheus", "VictoriaMetrics"
    written_s: float  # writing the history for promtool
    moved: int  # how much later VictoriaMetrics' copy of the history ends than Prometheus', s
    chained: int  # series a rule records and a later rule of its group reads (see _victoria)
    chain_depth: int  # the most rules in one such chain
    per_gpu_series: float  # series with a gpu label, per GPU, of one daemon at default settings
    per_gpu_total: float  # all series of that daemon, per GPU
    serving_gpus: int  # the fleet's GPUs held by serving pods


@dataclass(frozen=True)
class Model:
    name: str
    engine: str
    namespace: str
    gpus: int  # per pod
    slow: float  # latency factor


@dataclass(frozen=True)
class Pod:
    index: int
    model: Model
    name: str
    target: str  # its target labels, as Kubernetes service discovery gives them
    node: int
    gpus: tuple[int, ...]
    rate: float  # requests per second
    uptime: int  # seconds before the history starts

    @property
    def stages(self) -> int:
        """SGLang's reporting schedulers: one per pipeline stage (two on 4 GPUs or more)."""
        return 2 if self.model.engine == "sglang" and len(self.gpus) >= 4 else 1


def _allocated(node: int, gpu: int) -> bool:
    """Four GPUs in five are held by a job."""
    return bool((node + gpu) % 5)


@functools.cache
def _models() -> tuple[Model, ...]:
    return tuple(Model(f"org{m % 8}/model-{m:03d}-instruct", MODEL_ENGINES[m % len(MODEL_ENGINES)],
                       f"team{m % NAMESPACES}", MODEL_GPUS[m * 37 % len(MODEL_GPUS)], 0.6 + 0.25 * (m % 7))
                 for m in range(MODELS))


def _deployment(model: Model) -> str:
    """The Deployment serving `model`: its pods' owner."""
    return f"{model.name.split('/')[1]}-{model.engine}"


@functools.cache
def _serving() -> tuple[Pod, ...]:
    """The serving pods, each engine's spread over its models, packed on the GPUs no rank holds."""
    placed: list[Model] = []  # each pod's model
    for engine, count in SERVING.items():
        models = [m for m in _models() if m.engine == engine]
        assert models, f"no model is served by {engine}"
        placed += [models[i % len(models)] for i in range(count)]
    # largest first: sizes are powers of two dividing GPUS_PER_NODE, so a cursor packs them without a gap
    placed.sort(key=lambda model: -model.gpus)
    slot = -(-WORKLOADS * RANKS // GPUS_PER_NODE) * GPUS_PER_NODE  # the first GPU of the first node no rank uses
    chars = "bcdfghjklmnpqrstvwxz2456789"
    pods = []
    for index, model in enumerate(placed):
        node, first = divmod(slot, GPUS_PER_NODE)
        assert first + model.gpus <= GPUS_PER_NODE and node < NODES, "the serving pods do not fit the fleet"
        slot += model.gpus
        m = _models().index(model)
        deployment = _deployment(model)
        # the ReplicaSet's hash and the pod's suffix, in Kubernetes' alphabet (so the pod's owner is found from them)
        replica_set = "".join(chars[((m + 1) * 2654435761 // len(chars) ** k) % len(chars)] for k in range(10))
        pod = (f"{deployment}-{replica_set}-"
               + "".join(chars[((index + 1) * 7919 // len(chars) ** k) % len(chars)] for k in range(5)))
        target = (f'{CLUSTER},instance="10.{64 + index // 62500}.{index // 250 % 250}.{index % 250 + 2}:'
                  f'{PORTS[model.engine]}",job="{model.engine}",namespace="{model.namespace}",pod="{pod}"')
        if ENGINES[model.engine].model_label is None:  # TGI: the scrape adds the model
            target += f',model="{model.name}"'
        pods.append(Pod(index, model, pod, target, node, tuple(range(first, first + model.gpus)),
                        0.5 + 0.5 * (index % 7), 3600 * (index % 5)))
    return tuple(pods)


def _seconds(window: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in re.findall(r"(\d+)([smhd])", window))


def _long_inputs(files: dict[str, str]) -> dict[str, list[int]]:
    """The recorded series the long-window groups read over their window: name -> every window (s) it is read over."""
    names: dict[str, set[int]] = {}
    for text in files.values():
        for group in yaml.safe_load(text)["groups"]:
            if "interval" in group:
                for rule in group["rules"]:
                    for name, window in re.findall(r"(?:avg_over_time|deriv)\(([a-z_]+:\w+:\w+)\[(\w+)\]",
                                                   rule["expr"]):
                        names.setdefault(name, set()).add(_seconds(window))
    return {name: sorted(windows) for name, windows in sorted(names.items())}


def _chain_depth(files: dict[str, str]) -> int:
    """The most rules of one group in a chain, each reading what the one before it recorded."""
    deepest = 1
    for text in files.values():
        for group in yaml.safe_load(text)["groups"]:
            depth: dict[str, int] = {}
            for rule in group["rules"]:
                names = set(re.findall(r"\b([a-z_]+:\w+:\w+)\b", rule["expr"]))
                level = 1 + max((depth[name] for name in names if name in depth), default=0)
                deepest = max(deepest, level)
                if "record" in rule:
                    depth[rule["record"]] = max(depth.get(rule["record"], 0), level)
    return deepest


def _chained(files: dict[str, str], long_inputs: dict[str, list[int]]) -> dict[str, int]:
    """The series a rule records and a later rule of the same group reads: name -> the group's interval (s). Not
    those of `long_inputs`, which the history holds already."""
    names: dict[str, int] = {}
    for text in files.values():
        for group in yaml.safe_load(text)["groups"]:
            recorded: set[str] = set()
            for rule in group["rules"]:
                for name in set(re.findall(r"\b([a-z_]+:\w+:\w+)\b", rule["expr"])) & recorded:
                    if name not in long_inputs:
                        names[name] = _seconds(group.get("interval", f"{EVAL_INTERVAL}s"))
                if "record" in rule:
                    recorded.add(rule["record"])
    return dict(sorted(names.items()))


def _recorded_labels(name: str) -> list[str]:
    """Label sets of a short-window recorded series over the synthetic fleet."""
    level, metric = name.split(":")[:2]
    job = 'job="goodput-exporter"'
    if level == "gpu":
        sets = []
        for node in range(NODES):
            for gpu in range(GPUS_PER_NODE):
                allocated = _allocated(node, gpu)
                if ("while_allocated" in metric and not allocated) or ("unallocated" in metric and allocated):
                    continue
                sets.append(f'{CLUSTER},instance="node{node}:9445",{job},gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}"')
        return sets
    if level == "node":
        return [f'{CLUSTER},instance="node{node}:9445"' for node in range(NODES)]
    if level == "cluster":
        return [CLUSTER]
    if level == "namespace":
        return [f'{CLUSTER},namespace="team{n}"' for n in range(NAMESPACES)]
    if level == "workload" and metric in ("goodput_inference_slo_requests", "goodput_inference_slo_met_requests"):
        # per served model and objective: those whose histogram its engine has (no workload label: Kubernetes
        # discovery gives none; an engine whose model names every deployment shares, Triton, gets its pods' owner)
        return [f'{CLUSTER},namespace="{m.namespace}",model="{m.name}",engine="{m.engine}",objective="{objective}"'
                + (f',workload="{_deployment(m)}"' if ENGINES[m.engine].generic_models else "")
                for m in _models() for objective, (_, signal) in OBJECTIVES.items()
                if signal in ENGINES[m.engine].signals]
    if level == "workload" and metric == "goodput_phase_seconds":
        return [f'{CLUSTER},workload="job{w}",phase="{p}"' for w in range(WORKLOADS)
                for p in PHASE_SHARES]
    if level == "workload" and not metric.startswith("goodput_inference"):
        return [f'{CLUSTER},workload="job{w}"' for w in range(WORKLOADS)]
    if level == "workload_rank":  # with the node each rank runs on (the records keep it, for the alerts)
        return [f'{CLUSTER},instance="node{(w * RANKS + r) // GPUS_PER_NODE % NODES}:9445",workload="job{w}",rank="{r}"'
                for w in range(WORKLOADS) for r in range(RANKS)]
    raise ValueError(f"{name}: the bench does not know this level's labels; teach _recorded_labels")


def _long_value(name: str, label_set: str) -> float:
    """A long-window input's value over the history: 0.25, but for the seconds redone after restarts, which are the
    short window's own (ACCOUNTING: a job of 64 ranks redoing 2% of its time, under GoodputWastedProgress's 5%) but
    on WASTEFUL workloads, which redo 10% and page (at 0.25 everywhere, every workload paged at every evaluation),
    and for the ranks' step time and own time per step, which the straggler records also read at once (the 5m
    records, through the stage join): what their rules compute from the history (0.5 s, 0.395 s), checked against
    what Prometheus first records (_check_long_values). At 0.25, each rank read as a straggler on vmalert until its
    own records replaced the history's: all 6,400 pending, each running GoodputStraggler's annotation queries."""
    if name.startswith("workload:goodput_wasted_seconds:"):
        wasteful = any(f'workload="job{w}"' in label_set for w in range(WASTEFUL))
        return 0.1 if wasteful else ACCOUNTING["goodput_wasted_seconds"]
    if name in RANK_STEP_VALUES:
        rank = int(re.search(r'rank="(\d+)"', label_set).group(1))  # type: ignore[union-attr]
        return RANK_STEP_VALUES[name](rank)
    return 0.25


def _own_per_step(rank: int) -> float:
    """workload_rank:goodput_step_own_seconds:mean5m of the history: its time not untracked per step, less its wait
    (the larger of its comm_wait and its GPU-side wait, beyond the least rank's)."""
    tracked = ACCOUNTING["goodput_elapsed_seconds"] - PHASE_SHARES["untracked"]
    wait = max(PHASE_SHARES["comm_wait"], COLLECTIVE_SPREAD * (rank % 4))
    return (tracked - wait) / STEPS_PER_SECOND


RANK_STEP_VALUES: dict[str, Callable[[int], float]] = {
    "workload_rank:goodput_step_duration_seconds:mean5m": lambda rank: STEP_SUM_PER_SECOND / STEPS_PER_SECOND,
    "workload_rank:goodput_step_own_seconds:mean5m": _own_per_step,
}


def _le(engine: Engine, bound: float) -> str:
    """`le` as the engine's client library writes it (engines.py's module docstring)."""
    text = repr(float(bound))
    assert "e" not in text, bound  # no default bound of the latency histograms reaches an exponent form
    return text[:-2] if engine.le_format == "rust" and text.endswith(".0") else text


def _label_sets(engine: Engine, native: Native, pod: Pod) -> list[tuple[str, float]]:
    """The engine's own label sets on one pod's `native`, each with its share of the pod's requests."""
    sets: list[tuple[str, float]] = [(native.match, 1.0)] if native.match else [("", 1.0)]
    for label in native.labels:
        if native.match.startswith(f"{label}="):
            continue
        if label == engine.model_label:
            values: dict[str, float] | None = {pod.model.name: 1}
        elif label == "pp_rank":  # each stage's scheduler reports the same requests
            values = {str(stage): 1 for stage in range(pod.stages)}
        else:
            values = LABEL_VALUES[label]
        if values is not None:
            sets = [(f'{labels},{label}="{value}"'.lstrip(","), share * part)
                    for labels, share in sets for value, part in values.items()]
    return sets


def _cdf(bound: float, median: float) -> float:
    """The share of observations at or under `bound`: a log-logistic distribution."""
    return 0.0 if bound <= 0 else 1 / (1 + (median / bound) ** 3)


def _write_serving(declare: Callable[[str, str], None], counter: Callable[..., None],
                   varying: Callable[[str, str, Callable[[int], float]], None]) -> None:
    """Every serving pod's engine series."""
    pods = _serving()
    for engine in (ENGINES[name] for name in SERVING):
        mine = [pod for pod in pods if pod.model.engine == engine.name]
        declared = ""
        for signal, natives in engine.signals.items():
            native = natives[0]  # the current name: a current release exposes no other
            if native.le_per != 1:  # Triton's first-response histogram, in milliseconds
                native = dataclasses.replace(native, buckets=TRITON_FIRST_RESPONSE_MS)
            family = native.name[:-6] if native.kind == "counter" and native.name.endswith("_total") else native.name
            if family != declared:  # Triton's per-kind gauges: one family for running and waiting
                declare(family, native.kind)
                declared = family
            for pod in mine:
                i = pod.index
                for own, share in _label_sets(engine, native, pod):
                    labels = f"{pod.target},{own}" if own else pod.target
                    if native.kind == "gauge":
                        if signal == "requests_running":
                            base = max(1, round(pod.rate * 3))
                            varying(native.name, labels, lambda t, base=base, i=i: base + (t // SCRAPE + i) % 4)
                        elif signal == "requests_waiting":
                            varying(native.name, labels, lambda t, i=i: (t // SCRAPE + i) % 3)
                        else:  # kv_cache_usage
                            varying(native.name, labels, lambda t, i=i: round(0.3 + 0.06 * ((t // SCRAPE + i) % 10), 2))
                    elif native.kind == "counter":
                        per_request = {"preemptions": 0.01, "prompt_tokens": PROMPT, "generation_tokens": GENERATED,
                                       "queue_seconds": 0.05, "compute_seconds": 2.0}.get(signal, 1)
                        counter(native.name, labels, pod.rate * per_request * share * native.per, pod.uptime)
                    else:
                        median, per_request = LATENCY[signal]
                        median *= pod.model.slow * native.le_per
                        rate = pod.rate * per_request * share
                        for bound in native.buckets:
                            counter(f"{native.name}_bucket", f'{labels},le="{_le(engine, bound)}"',
                                    rate * _cdf(bound, median), pod.uptime, True)
                        counter(f"{native.name}_bucket", f'{labels},le="+Inf"', rate, pod.uptime, True)
                        counter(f"{native.name}_sum", labels, rate * median * 1.2, pod.uptime)
                        counter(f"{native.name}_count", labels, rate, pod.uptime, True)


def _write_history(sink: Callable[[int], TextIO], end: int, long_inputs: dict[str, list[int]],
                   ms: bool = False) -> tuple[int, int]:
    """Text of the whole fleet ending at `end`, and the recorded series the long groups read; returns (series,
    samples). Each sample goes to `sink(block)`, the stream of the 2h block (BLOCK) it falls in: a file per block
    for promtool, which reads a file once per block it touches, one stream for all for VictoriaMetrics. Seconds
    timestamps and OpenMetrics' `# EOF` for promtool; with `ms`, milliseconds, as VictoriaMetrics' Prometheus text
    import reads them (it skips the `#` lines). The history is the same for every `end` but for its place in time
    (`end` a multiple of STEP apart: the same samples moved)."""
    now = end - AHEAD
    start = now - HISTORY
    times = list(range(start - start % STEP, end - RECENT, STEP)) + list(range(end - RECENT, end, SCRAPE))
    series = samples = 0
    serving_gpus = {(pod.node, gpu): pod for pod in _serving() for gpu in pod.gpus}
    unit = "000" if ms else ""
    opened: dict[int, TextIO] = {}  # each block's stream, in the order first written

    def runs(at: list[int]) -> list[tuple[TextIO, list[int]]]:
        """`at` (ascending) cut where it crosses into another block: each part with its block's stream."""
        parts: list[tuple[int, list[int]]] = []
        for t in at:
            block = t - t % BLOCK
            if not parts or parts[-1][0] != block:
                parts.append((block, []))
            parts[-1][1].append(t)
        for block, _ in parts:
            if block not in opened:
                opened[block] = sink(block)
        return [(opened[block], part) for block, part in parts]

    fleet = runs(times)

    def declare(family: str, kind: str, at: list[tuple[TextIO, list[int]]] = fleet) -> None:
        for stream in {id(stream): stream for stream, _ in at}.values():
            stream.write(f"# TYPE {family} {kind}\n")

    def counter(name: str, labels: str, per_second: float, base: float = 0, integer: bool = False) -> None:
        nonlocal series, samples
        series, samples = series + 1, samples + len(times)
        first = times[0]
        for out, part in fleet:
            if integer:
                out.writelines(f"{name}{{{labels}}} {int((t - first + base) * per_second)} {t}{unit}\n" for t in part)
            else:
                out.writelines(f"{name}{{{labels}}} {round((t - first + base) * per_second, 3)} {t}{unit}\n"
                               for t in part)

    def gauge(name: str, labels: str, value: float, at: list[tuple[TextIO, list[int]]] = fleet) -> None:
        nonlocal series, samples
        series, samples = series + 1, samples + sum(len(part) for _, part in at)
        head = f"{name}{{{labels}}} {value} " if labels else f"{name} {value} "
        for out, part in at:
            out.writelines(f"{head}{t}{unit}\n" for t in part)

    def varying(name: str, labels: str, value: Callable[[int], float]) -> None:
        nonlocal series, samples
        series, samples = series + 1, samples + len(times)
        for out, part in fleet:
            out.writelines(f"{name}{{{labels}}} {value(t)} {t}{unit}\n" for t in part)

    for family, kind in (("goodput_gpu_idle_seconds", "counter"), ("goodput_gpu_sampled_seconds", "counter"),
                         ("goodput_gpu_allocated", "gauge"), ("goodput_gpu_memory_used_bytes", "gauge"),
                         ("goodput_gpu_memory_total_bytes", "gauge"), ("goodput_gpu_power_watts", "gauge"),
                         ("goodput_gpu_ecc_errors", "counter"),
                         ("goodput_gpu_clock_throttle_seconds", "counter"), ("goodput_gpu_xid_errors", "counter"),
                         ("up", "gauge"), ("goodput_exporter_source_up", "gauge"),
                         ("goodput_phase_seconds", "counter"), ("goodput_steps", "counter"),
                         ("goodput_tokens", "counter"), ("goodput_step_duration_seconds_sum", "gauge"),
                         ("goodput_step_duration_seconds_count", "gauge"),
                         ("goodput_collective_last_seq", "gauge"), ("goodput_collective_duration_seconds_sum", "gauge"),
                         ("goodput_rank_role_info", "gauge"), ("goodput_step_own_variation_ratio", "gauge"),
                         ("goodput_collective_oldest_inflight_seconds", "gauge"),
                         ("goodput_flight_recorder_dump_timestamp_seconds", "gauge"),
                         *((f"goodput_gpu_{name}_active_ratio", "gauge") for name in DCGM_RATIOS),
                         ("goodput_gpu_workload_info", "gauge"), ("goodput_gpu_pod_info", "gauge"),
                         ("goodput_gpu_energy_joules", "counter"), ("goodput_gpu_peak_flops", "gauge"),
                         *((f"goodput_gpu_{name}", "gauge") for name in HEALTH_GAUGES),
                         ("goodput_gpu_remapped_rows", "counter"), ("goodput_gpu_nvlink_errors", "counter"),
                         ("goodput_gpu_pcie_replays", "counter"), ("goodput_gpu_lost", "counter"),
                         ("goodput_gpu_numa_mismatch", "gauge"), ("goodput_gpu_last_xid_timestamp_seconds", "gauge"),
                         ("goodput_host_pressure_stalled_seconds", "counter"),
                         # the forecast's inputs: every workload declared its target and steps, one run of it
                         ("goodput_step_number", "gauge"), ("goodput_target_step_number", "gauge"),
                         ("goodput_step_time_baseline_seconds", "gauge"), ("goodput_workload_restarts", "counter"),
                         ("goodput_workload_last_event_timestamp_seconds", "gauge"),
                         ("goodput_workload_run_start_timestamp_seconds", "gauge"),
                         *((name, "counter") for name in ACCOUNTING), ("goodput_model_flops", "counter")):
        declare(family, kind)
        for node in range(NODES):
            inst = f'{CLUSTER},instance="node{node}:9445",job="goodput-exporter"'
            if family == "up":
                gauge("up", inst, 1)
            elif family == "goodput_host_pressure_stalled_seconds":
                for resource in ("cpu", "io", "memory"):
                    for kind in ("some", "full"):
                        counter(f"{family}_total", f'{inst},resource="{resource}",kind="{kind}"', 0.001)
            elif family == "goodput_exporter_source_up":
                for source in ("nvml", "host", "ingest", "flight"):
                    gauge(family, f'{inst},source="{source}"', 1)
            elif family.startswith("goodput_gpu_"):
                for gpu in range(GPUS_PER_NODE):
                    labels = f'{inst},gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}"'
                    busy = 0.5 + 0.4 * ((node * 8 + gpu) % 10) / 10
                    if family == "goodput_gpu_idle_seconds":
                        counter(f"{family}_total", labels, 1 - busy)
                    elif family == "goodput_gpu_sampled_seconds":
                        counter(f"{family}_total", labels, 1)
                    elif family == "goodput_gpu_allocated":
                        gauge(family, labels, int(_allocated(node, gpu)))
                    elif family == "goodput_gpu_memory_used_bytes":
                        gauge(family, labels, 40 * 2**30)
                    elif family == "goodput_gpu_memory_total_bytes":
                        gauge(family, labels, 80 * 2**30)
                    elif family == "goodput_gpu_power_watts":
                        gauge(family, labels, round(100 + 500 * busy))
                    elif family == "goodput_gpu_energy_joules":
                        counter(f"{family}_total", labels, round(100 + 500 * busy))
                    elif family == "goodput_gpu_peak_flops":  # an H100 SXM's datasheet figures
                        for dtype, peak in (("fp64", 67e12), ("tf32", 494.5e12), ("fp16", 989.5e12),
                                            ("bf16", 989.5e12), ("fp8", 1979e12)):
                            gauge(family, f'{labels},dtype="{dtype}"', peak)
                    elif family == "goodput_gpu_ecc_errors":
                        for kind in ("corrected", "uncorrected"):
                            counter(f"{family}_total", f'{labels},error_type="{kind}"', 0)
                    elif family == "goodput_gpu_clock_throttle_seconds":
                        for reason in ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
                                       "reliability"):
                            counter(f"{family}_total", f'{labels},reason="{reason}"', 0.01)
                    elif family == "goodput_gpu_xid_errors" and gpu == 0 and node % 100 == 0:
                        counter(f"{family}_total", f'{labels},xid="79"', 0)
                    elif family == "goodput_gpu_last_xid_timestamp_seconds" and gpu == 0 and node % 100 == 0:
                        gauge(family, labels, now - HISTORY)
                    elif family[len("goodput_gpu_"):] in HEALTH_GAUGES:  # a few GPUs degraded, as in a real fleet
                        name = family[len("goodput_gpu_"):]
                        degraded = (node * GPUS_PER_NODE + gpu) % 997 == 0
                        gauge(family, labels, HEALTH_GAUGES[name][degraded])
                    elif family == "goodput_gpu_remapped_rows":
                        for kind in ("corrected", "uncorrected"):
                            counter(f"{family}_total", f'{labels},error_type="{kind}"', 0)
                    elif family == "goodput_gpu_nvlink_errors":  # the GPU's links together (an H100 has 18)
                        for kind in ("replay", "recovery", "crc_flit", "crc_data"):
                            noisy = kind == "crc_flit" and (node * GPUS_PER_NODE + gpu) % 1009 == 0
                            counter(f"{family}_total", f'{labels},error_type="{kind}"', 150 if noisy else 0,
                                    integer=True)
                    elif family in ("goodput_gpu_pcie_replays", "goodput_gpu_lost"):  # on every GPU, 0 on most
                        noisy = family == "goodput_gpu_pcie_replays" and (node * GPUS_PER_NODE + gpu) % 1013 == 0
                        counter(f"{family}_total", labels, 0.05 if noisy else 0, integer=True)
                    elif family == "goodput_gpu_numa_mismatch" and node * GPUS_PER_NODE + gpu < WORKLOADS * RANKS:
                        rank = (node * GPUS_PER_NODE + gpu) % RANKS  # the rank's process on the GPU
                        gauge(family, f'{labels},pid="{1000 + rank}"', 0)
                    elif family.endswith("_active_ratio"):  # the dcgm source, on every GPU
                        gauge(family, labels, round(busy * DCGM_RATIOS[family[len("goodput_gpu_"):-13]], 3))
                    elif family.endswith("_info") and node * GPUS_PER_NODE + gpu < WORKLOADS * RANKS:
                        workload, rank = divmod(node * GPUS_PER_NODE + gpu, RANKS)  # the ranks' GPUs
                        if family == "goodput_gpu_workload_info":
                            gauge(family, f'{labels},workload="job{workload}",rank="{rank}"', 1)
                        else:
                            gauge(family, f'{labels},mig_uuid="",pod="job{workload}-{rank}",'
                                  f'namespace="team{workload % NAMESPACES}",container="train"', 1)
                    elif family == "goodput_gpu_pod_info" and (node, gpu) in serving_gpus:  # the serving pods'
                        pod = serving_gpus[node, gpu]
                        gauge(family, f'{labels},mig_uuid="",pod="{pod.name}",namespace="{pod.model.namespace}",'
                              f'container="{pod.model.engine}"', 1)
        if family == "up":  # the serving pods' targets
            for pod in _serving():
                gauge("up", pod.target, 1)
        if not family.startswith(("goodput_phase", "goodput_steps", "goodput_tokens", "goodput_step_",
                                  "goodput_collective", "goodput_flight", "goodput_model_flops", "goodput_rank_role",
                                  *ACCOUNTING)):
            continue
        for workload in range(WORKLOADS):
            for rank in range(RANKS):
                node = (workload * RANKS + rank) // GPUS_PER_NODE % NODES
                labels = (f'{CLUSTER},instance="node{node}:9445",job="goodput-exporter",workload="job{workload}",'
                          f'rank="{rank}"')
                if family == "goodput_phase_seconds":
                    for phase, share in PHASE_SHARES.items():
                        counter(f"{family}_total", f'{labels},phase="{phase}"', share)
                elif family in ACCOUNTING:
                    counter(f"{family}_total", labels, ACCOUNTING[family])
                elif family == "goodput_model_flops":
                    counter(f"{family}_total", f'{labels},dtype="bf16"', 4e14)
                elif family == "goodput_steps":
                    counter(f"{family}_total", labels, STEPS_PER_SECOND)
                elif family == "goodput_tokens":
                    counter(f"{family}_total", labels, 8192)
                elif family == "goodput_step_duration_seconds_sum":
                    counter(family, labels, STEP_SUM_PER_SECOND)
                elif family == "goodput_step_duration_seconds_count":
                    counter(family, labels, STEPS_PER_SECOND)
                elif family == "goodput_collective_last_seq":
                    waits = workload < HUNG and rank > 0
                    gauge(family, f'{labels},pg="0",state="enqueued"', 1001 if waits else 1000)
                    gauge(family, f'{labels},pg="0",state="completed"', 1000)
                elif family == "goodput_collective_duration_seconds_sum":  # NCCL's timed durations
                    counter(family, f'{labels},pg="0",op="allreduce"',
                            COLLECTIVE_BASE + COLLECTIVE_SPREAD * (rank % 4))
                elif family == "goodput_rank_role_info":  # four pipeline stages of RANKS // 4 replicas
                    gauge(family, f'{labels},pipeline_stage="{rank * 4 // RANKS}",'
                                  f'data_parallel_rank="{rank % (RANKS // 4)}"', 1)
                elif family == "goodput_step_own_variation_ratio":
                    gauge(family, labels, 0.01)
                elif family == "goodput_step_number":
                    counter(family, labels, 2, base=50_000, integer=True)
                elif family == "goodput_target_step_number":
                    gauge(family, labels, 1_000_000)
                elif family == "goodput_step_time_baseline_seconds":
                    gauge(family, labels, 0.5)
                elif family == "goodput_workload_restarts":
                    counter(f"{family}_total", labels, 0.0005, integer=True)
                elif family == "goodput_workload_last_event_timestamp_seconds":
                    varying(family, labels, lambda t: t - 1)
                elif family == "goodput_workload_run_start_timestamp_seconds":
                    if rank % GPUS_PER_NODE == 0:  # one series per workload and node
                        gauge(family, f'{labels.rsplit(",rank=", 1)[0]},run="job{workload}-1"', now - HISTORY)
                elif family == "goodput_collective_oldest_inflight_seconds":
                    gauge(family, f'{labels},pg="0"', 45 if workload < HUNG and rank > 0 else 0.01)
                elif family == "goodput_flight_recorder_dump_timestamp_seconds":
                    varying(family, labels, lambda t: t - 1)  # dumped a second before each scrape
                else:
                    gauge(family, labels, now)
    _write_serving(declare, counter, varying)
    for name, windows in long_inputs.items():
        # at the interval their rules are evaluated at, as the long windows read them: from the longest window
        # (and 2 minutes) before the history starts
        first = now - max(windows) - (HISTORY - 3600)
        recorded = runs(list(range(first - first % EVAL_INTERVAL, end, EVAL_INTERVAL)))
        declare(name, "gauge", recorded)
        for label_set in _recorded_labels(name):
            gauge(name, label_set, _long_value(name, label_set), recorded)
    if not ms:
        for stream in {id(stream): stream for stream in opened.values()}.values():
            stream.write("# EOF\n")
    return series, samples


def _get(port: int, path: str) -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def _query(port: int, expr: str, at: float | None = None) -> list[dict]:  # type: ignore[type-arg]
    params = {"query": expr, **({"time": str(at)} if at is not None else {})}
    return _get(port, "/api/v1/query?" + urllib.parse.urlencode(params))["data"]["result"]


def _per_gpu_series() -> tuple[float, float]:
    """Series of one daemon with 8 simulated GPUs at default settings."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--simulate", "8",
                             "--web.listen-address", f"127.0.0.1:{port}", "--ingest.enabled", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/readyz")
        time.sleep(2)
        series = list(metrics(port))
    finally:
        proc.terminate()
        proc.wait(10)
    return sum('gpu="' in name for name in series) / 8, len(series) / 8


def _checks() -> list[tuple[str, int]]:
    """Queries proving that the rules found the fleet (each expression's count)."""
    pods = _serving()
    gpus = sum(len(pod.gpus) for pod in pods)
    served = len({pod.model for pod in pods})
    # the models whose engine judges both objectives (TGI cannot judge time to first token, Triton time per output
    # token: theirs are unmeasured, with no SLO goodput nor error ratio)
    judged = len({pod.model for pod in pods
                  if all(signal in ENGINES[pod.model.engine].signals for _, signal in OBJECTIVES.values())})
    return [("count(gpu:goodput_gpu_idle_ratio:rate1h)", NODES * GPUS_PER_NODE),
            ("count(node:goodput_gpu_idle_ratio:rate5m)", NODES),
            ("count(workload_rank:goodput_straggler_ratio:rate5m)", WORKLOADS * RANKS),
            # the hung workloads' waits, across nodes, and the rank each misses
            ("count(workload_pg:goodput_collective_wait_started:min)", HUNG),
            ("count(workload_pg_rank:goodput_collective_rank_missing:info)", HUNG),
            ("count(gpu:goodput_gpu_activity_class:avg5m)", NODES * GPUS_PER_NODE),
            ("count(workload:goodput_gpu_idle_ratio:rate5m)", WORKLOADS),
            ("count(namespace:goodput_ratio:rate5m)", NAMESPACES),
            # every serving pod normalized, its GPUs found under its model, and the long SLO windows recorded
            ("count(count by (cluster, namespace, pod) (server:goodput_inference_requests:rate5m))", len(pods)),
            ("count(count by (cluster, namespace, pod) (server:goodput_inference_kv_cache_usage_ratio:max))",
             len(pods) - SERVING.get("tgi", 0)),
            ("count(workload:goodput_inference_gpu:info)", gpus),
            ("count(workload:goodput_inference_gpu_idle_ratio:rate5m)", served),
            ("count(workload:goodput_inference_gpu_power_watts:sum)", served),
            ("count(workload:goodput_inference_slo_goodput:rate5m)", judged),
            ("count(workload:goodput_inference_slo_unjudged_requests:rate5m)", served - judged),
            # every served model: one with an objective nothing judges keeps its error ratio (9095629)
            *((f"count(workload:goodput_inference_slo_error_ratio:rate{window})", served)
              for window in ("30m", "1h", "6h"))]


def _rule_errors(groups: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """The rules of a /api/v1/rules answer whose last evaluation failed: a failing rule's time means nothing."""
    return [f"{group['name']}: {rule['name']}: {rule['lastError']}" for group in groups for rule in group["rules"]
            if rule.get("lastError")]


def _cpu(pids: list[int]) -> tuple[float, float, float, float]:
    """Seconds since boot of the machine's CPUs busy (steal apart), stolen, in all, and of `pids` (user + system)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle, steal = fields[3] + fields[4], fields[7]
    total = sum(fields[:8])
    ours = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ours += int(stat[11]) + int(stat[12])
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle - steal) / tick, steal / tick, total / tick, ours / tick


def _measure(poll: Callable[[], tuple[dict[str, tuple[object, float]], dict[tuple[str, int], tuple[object, float]],
                                      dict[str, list[str]]]], slow: set[str], engine: list[int]) -> Measured:
    """Polls a ruler every 2 s until each group has had its evaluations. `poll` answers each evaluated group's last
    evaluation (a stamp that changes with each, and its seconds), the same for each rule (by group and position),
    and each group's rules' names. Meanwhile the CPU of the machine and of the `engine`'s processes is counted."""
    cpu_before, began = _cpu(engine), time.monotonic()
    durations: dict[str, list[float]] = {}
    rule_times: dict[tuple[str, int], list[float]] = {}
    members: dict[str, list[str]] = {}
    seen: dict[object, object] = {}

    def measured() -> bool:
        return bool(durations) and all(len(v) >= (SLOW_EVALUATIONS if name in slow else EVALUATIONS)
                                       for name, v in durations.items())

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not measured():
        time.sleep(2)
        try:
            groups, rules, names = poll()
        except (OSError, KeyError, ValueError):
            continue
        members.update(names)
        for name, (stamp, seconds) in groups.items():
            if seen.get(name) != stamp:
                seen[name] = stamp
                durations.setdefault(name, []).append(seconds)
        for key, (stamp, seconds) in rules.items():
            if seen.get(key) != stamp:
                seen[key] = stamp
                rule_times.setdefault(key, []).append(seconds)
    cpu_after, elapsed = _cpu(engine), time.monotonic() - began
    busy, steal, _, ours = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
    if not measured():
        raise RuntimeError("the groups were not all evaluated often enough in 10 minutes: "
                           + ", ".join(f"{name} {len(v)}" for name, v in sorted(durations.items())))

    def steady(name: str, values: list[float]) -> list[float]:
        return values[1:] if name in slow else values[COLD:]

    groups_out = {name: (v[0], statistics.median(steady(name, v)), max(steady(name, v)))
                  for name, v in sorted(durations.items())}
    rules_out = {name: [statistics.median(steady(name, rule_times[name, i]) or [0.0])
                        if rule_times.get((name, i)) else 0.0 for i in range(len(rules))]
                 for name, rules in members.items()}
    return Measured(groups_out, rules_out, members, busy_cores=busy / elapsed, steal_cores=steal / elapsed,
                    engine_cores=ours / elapsed)


def _verify(port: int, long_inputs: dict[str, list[int]]) -> None:
    """The rules found the fleet, and every series a short group records had each window full behind it."""
    for expr, expected in _checks():
        check = _query(port, expr)
        assert check and float(check[0]["value"][1]) == expected, (expr, expected, check)
    for name, windows in long_inputs.items():
        total = _query(port, f"count({name})")
        for window in windows:
            full = _query(port, f"count(count_over_time({name}[{window}s]) >= {window // EVAL_INTERVAL - 5})")
            assert total and full and total[0]["value"][1] == full[0]["value"][1], (name, window, total, full)


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _seeds(port: int, chained: dict[str, int], end: int) -> dict[str, tuple[int, list[str]]]:
    """The chained series as a ruler has them: name -> (interval, each series' text up to its timestamp). Each is
    taken as Prometheus first recorded it after the history's `end`, while its windows were still full: read at the
    end of the measurement, with the last 5m windows four minutes emptier, the steps rate read a fifth of the
    history's, and vmalert's first evaluations, from full windows, disagreed with it down the chains (every rank a
    straggler for a minute, each new alert running its annotations' queries: 24 s for goodput.alerts.collective)."""
    seeds = {}
    for name, interval in chained.items():
        heads: list[str] = []
        for metric, value in _first_recorded(port, name, end):
            labels = ",".join(f'{key}="{_escape(text)}"' for key, text in sorted(metric.items()) if key != "__name__")
            heads.append(f"{name}{{{labels}}} {value}")
        seeds[name] = (interval, heads)
    return seeds


def _first_recorded(port: int, name: str, end: int) -> list[tuple[dict[str, str], str]]:
    """Each series of `name` as Prometheus first recorded it after the history's `end` (within ten evaluations): its
    labels and its value as Prometheus wrote it. A series held by the history too has its samples up to `end` left
    out."""
    found = []
    for item in _query(port, f"{name}[{10 * EVAL_INTERVAL}s]", end + 10 * EVAL_INTERVAL):
        after = [value for at, value in item["values"] if float(at) > end]
        if after:
            found.append((item["metric"], after[0]))
    return found


def _check_long_values(port: int, end: int) -> None:
    """Each of RANK_STEP_VALUES, as Prometheus first recorded it after the history's end, is what the history holds
    (_long_value): else the straggler records would mix the two and call ranks stragglers that are not."""
    for name, expected in RANK_STEP_VALUES.items():
        wrong = []
        recorded = _first_recorded(port, name, end)
        for metric, value in recorded:
            want = expected(int(metric["rank"]))
            if abs(float(value) - want) > 1e-6 * want:
                wrong.append(f"{metric}: {value} recorded, {want} in the history")
        if not recorded or wrong:
            raise RuntimeError(f"{name}: the history's value is not what the rule records ({len(recorded)} series "
                               f"checked):\n" + "\n".join(wrong[:5]))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _prometheus(rules: list[str], slow: set[str], long_inputs: dict[str, list[int]], chained: dict[str, int],
                end: int) -> tuple[Measured, dict[str, tuple[int, list[str]]]]:
    """Prometheus on the blocks in WORK/data, which end at `end`: started just after it. Returns its measurement and
    what it last recorded of the `chained` series (see _victoria)."""
    if time.time() > end + 30:  # the 5m windows must not start emptying before the groups are measured
        raise RuntimeError(f"the history ended {time.time() - end:.0f} s before Prometheus could start: raise AHEAD")
    if time.time() < end + 2:  # rule results must land after the last block
        time.sleep(end + 2 - time.time())
    port = free_port()
    (WORK / "prometheus.yml").write_text(
        f"global: {{evaluation_interval: {EVAL_INTERVAL}s}}\nrule_files: {json.dumps(rules)}\n")
    # compaction off (one block range): the blocks would otherwise be merged while the groups are measured
    proc = subprocess.Popen(["prometheus", f"--config.file={WORK / 'prometheus.yml'}",
                             f"--storage.tsdb.path={WORK / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d", f"--storage.tsdb.min-block-duration={BLOCK}s",
                             f"--storage.tsdb.max-block-duration={BLOCK}s"],
                            stdout=(WORK / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)

    def poll() -> tuple[dict[str, tuple[object, float]], dict[tuple[str, int], tuple[object, float]],
                        dict[str, list[str]]]:
        groups, rules, names = {}, {}, {}
        for group in _get(port, "/api/v1/rules")["data"]["groups"]:
            name = group["name"]
            names[name] = [rule["name"] for rule in group["rules"]]
            last = group.get("lastEvaluation", "")
            if last and not last.startswith("0001"):
                groups[name] = (last, group["evaluationTime"])
            for i, rule in enumerate(group["rules"]):
                last = rule.get("lastEvaluation", "")
                if last and not last.startswith("0001"):
                    rules[name, i] = (last, rule["evaluationTime"])
        return groups, rules, names

    try:
        measured = _measure(poll, slow, [proc.pid])
        measured.peak_rss_mb = _peak_rss_mb(proc.pid)
        errors = _rule_errors(_get(port, "/api/v1/rules")["data"]["groups"])
        if errors:
            raise RuntimeError("Prometheus: rules failed:\n" + "\n".join(errors))
        _verify(port, long_inputs)
        if "out of bounds" in (WORK / "prometheus.log").read_text():
            raise RuntimeError("Prometheus discarded rule results as out of bounds")
        seeds = _seeds(port, chained, end)
        _check_long_values(port, end)
    finally:
        stop(proc, 60)
    return measured, seeds


class _Notifier(http.server.BaseHTTPRequestHandler):
    """Alertmanager's place for vmalert (1.79 has no blackhole notifier): takes the alerts and answers 200."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _import(port: int, end: int, long_inputs: dict[str, list[int]], seeds: dict[str, tuple[int, list[str]]]) -> None:
    """The history ending at `end`, and the `seeds` every interval over the SEEDED seconds before it, written
    straight into VictoriaMetrics' Prometheus text import (streamed through a pipe: it is about 16 GB of text)."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with open(write_fd, "w", buffering=1 << 20) as out:
                _write_history(lambda block: out, end, long_inputs, ms=True)
                for interval, heads in seeds.values():
                    first = end - SEEDED
                    stamps = [f" {t}000\n" for t in range(first - first % interval, end, interval)]
                    for head in heads:
                        out.writelines(head + stamp for stamp in stamps)
        except BaseException as error:  # a broken pipe after a failed request, or a bug: reported below
            failed.append(error)

    producer = threading.Thread(target=produce, name="vm-import", daemon=True)
    producer.start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900, blocksize=1 << 20)
    with open(read_fd, "rb") as body:
        conn.request("POST", "/api/v1/import/prometheus", body=body, encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        answer = response.read()
    producer.join()
    if response.status != 204 or failed:
        raise RuntimeError(f"VictoriaMetrics import: {response.status} {answer[:500]!r} {failed}")


def _stamp(text: str) -> float:
    """An RFC 3339 UTC time with up to nanoseconds, as Go writes it, in seconds since the epoch."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def _own_times(group: dict) -> list[float]:  # type: ignore[type-arg]
    """Each rule's own seconds in a vmalert 1.79 group's last evaluation. Its /api/v1/rules gives an alerting rule's
    query time, but a recording rule's `evaluationTime` is the time since the evaluation's timestamp (its
    `lastEvaluation`), which the group's evaluation starts after (the group's `lastEvaluation`) and the rules
    before it add to: a recording rule's own time is its end less the end of the rule before it."""
    rules = group["rules"]
    stamps = [_stamp(rule["lastEvaluation"]) for rule in rules if rule["type"] == "recording"]
    at = stamps[0] if stamps else None  # the evaluation's timestamp
    previous = _stamp(group["lastEvaluation"]) - at if at is not None else 0.0  # when the first rule started
    own = []
    for rule in rules:
        if rule["type"] == "recording":
            own.append(max(0.0, rule["evaluationTime"] - previous))
            previous = rule["evaluationTime"]
        else:
            own.append(rule["evaluationTime"])
            previous = (_stamp(rule["lastEvaluation"]) - at if at is not None else previous) + rule["evaluationTime"]
    return own


def _victoria(rules: list[str], slow: set[str], long_inputs: dict[str, list[int]],
              seeds: dict[str, tuple[int, list[str]]], end: int, allowance: float) -> tuple[Measured, int]:
    """A fresh single-node VictoriaMetrics loaded with the history moved in time (by whole minutes) so that it ends
    when vmalert starts, `allowance` seconds from now, as the blocks end when Prometheus starts; then vmalert with
    the same rule files. vmalert writes what it records back through the store, so a rule sees what an earlier rule
    of its group recorded only from the group's previous evaluation on: `seeds`, what Prometheus recorded of those
    series, are in the copy over the minutes before its end, as a vmalert that had been running would have left
    them. Returns the measurement and how far the history was moved (s)."""
    data = WORK / "victoria"
    port = free_port()
    log = (WORK / "victoria-metrics.log").open("wb")
    proc = subprocess.Popen(["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                             *VM_FLAGS], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, "/health")
        began = time.time()
        moved = -(-int(began + allowance - end) // STEP) * STEP
        _import(port, end + moved, long_inputs, seeds)
        # one part per month instead of the import's many small ones, so that no merge runs while the groups are
        # measured
        start = end + moved - AHEAD - HISTORY - max((w for ws in long_inputs.values() for w in ws), default=0)
        settle_victoria(port, start, end + moved)
        loaded = time.time()
        print(f"rules scale: VictoriaMetrics loaded (import, flush, merge) in {loaded - began:.0f} s", flush=True)
        if loaded > end + moved + 30:
            raise RuntimeError(f"the VictoriaMetrics import ended {loaded - end - moved:.0f} s after its history: "
                               "raise VM_ALLOWANCE")
        if loaded < end + moved + 2:
            time.sleep(end + moved + 2 - loaded)
        notifier = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Notifier)
        threading.Thread(target=notifier.serve_forever, name="notifier", daemon=True).start()
        ruler_port = free_port()
        ruler = subprocess.Popen(["vmalert", *(f"-rule={path}" for path in rules),
                                  f"-datasource.url=http://127.0.0.1:{port}",
                                  f"-remoteWrite.url=http://127.0.0.1:{port}",
                                  f"-notifier.url=http://127.0.0.1:{notifier.server_address[1]}",
                                  f"-evaluationInterval={EVAL_INTERVAL}s", f"-httpListenAddr=127.0.0.1:{ruler_port}"],
                                 stdout=(WORK / "vmalert.log").open("wb"), stderr=subprocess.STDOUT)
        iterations: dict[str, tuple[float, float]] = {}  # group -> (count, sum) of its iteration durations
        evaluated: dict[str, str] = {}  # group -> its last evaluation seen in /api/v1/rules

        def poll() -> tuple[dict[str, tuple[object, float]], dict[tuple[str, int], tuple[object, float]],
                            dict[str, list[str]]]:
            rules: dict[tuple[str, int], tuple[object, float]] = {}
            names, last = {}, {}
            for group in _get(ruler_port, "/api/v1/rules")["data"]["groups"]:
                name, stamp = group["name"], group.get("lastEvaluation", "")
                names[name] = [rule["name"] for rule in group["rules"]]
                if stamp and not stamp.startswith("0001") and evaluated.get(name) != stamp:
                    last[name] = stamp  # set when the group's evaluation has ended: its rules are all of it
                    for i, seconds in enumerate(_own_times(group)):
                        rules[name, i] = (stamp, seconds)
            # a group's time: vmalert_iteration_duration_seconds' sum grows by each evaluation's duration
            sums: dict[str, dict[str, float]] = {}
            for key, value in metrics(ruler_port).items():
                match = re.match(r'vmalert_iteration_duration_seconds_(sum|count)\{group="([^"]*)"', key)
                if match:
                    sums.setdefault(match[2], {})[match[1]] = value
            groups: dict[str, tuple[object, float]] = {}
            for name, values in sums.items():
                count, total = values["count"], values["sum"]
                before = iterations.get(name, (0.0, 0.0))
                if count > before[0]:
                    iterations[name] = (count, total)
                    groups[name] = (count, (total - before[1]) / (count - before[0]))
            evaluated.update(last)
            return groups, rules, names

        try:
            wait_ready(ruler_port, "/health")
            measured = _measure(poll, slow, [proc.pid, ruler.pid])
            measured.peak_rss_mb = _peak_rss_mb(proc.pid)
            errors = _rule_errors(_get(ruler_port, "/api/v1/rules")["data"]["groups"])
            if errors:
                raise RuntimeError("vmalert: rules failed:\n" + "\n".join(errors))
            _verify(port, long_inputs)
        finally:
            stop(ruler, 60)
            notifier.shutdown()
        measured.load_s = loaded - began
    finally:
        stop(proc, 60)
        log.close()
    return measured, moved


def run() -> Result:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    files = {path.name: path.read_text() for path in sorted((ROOT / "rules").glob("*.rules.yml"))}
    slow = {group["name"] for text in files.values() for group in yaml.safe_load(text)["groups"] if "interval" in group}
    long_inputs = _long_inputs(files)
    rules = sorted(str(ROOT / "rules" / name) for name in files)
    now = int(time.time())
    end = now + AHEAD
    blocks: dict[int, TextIO] = {}

    def block_file(block: int) -> TextIO:
        blocks[block] = (WORK / f"history-{block}.om").open("w")
        return blocks[block]

    try:
        series, samples = _write_history(block_file, end, long_inputs)
    finally:
        for stream in blocks.values():
            stream.close()
    written = time.time() - now
    print(f"rules scale: {series:,} series, {samples:,} samples written in {written:.0f} s", flush=True)
    for block in sorted(blocks):
        path = WORK / f"history-{block}.om"
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(WORK / "data")],
                       check=True, stdout=subprocess.DEVNULL)
        path.unlink()
    converted = time.time() - now - written
    print(f"rules scale: blocks written {time.time() - now:.0f} s after the start", flush=True)
    chained = _chained(files, long_inputs)
    prometheus, seeds = _prometheus(rules, slow, long_inputs, chained, end)
    prometheus.load_s = converted
    print("rules scale: Prometheus measured; VictoriaMetrics next", flush=True)
    victoria, moved = _victoria(rules, slow, long_inputs, seeds, end, VM_ALLOWANCE * written)
    per_gpu, per_gpu_total = _per_gpu_series()
    return Result(series, samples, slow, {"Prometheus": prometheus, "VictoriaMetrics": victoria}, written, moved,
                  len(chained), _chain_depth(files), per_gpu, per_gpu_total, sum(len(pod.gpus) for pod in _serving()))


def markdown(result: Result) -> list[str]:
    """The "Rules at cluster scale" section of bench/results.md."""
    prometheus, victoria = result.engines["Prometheus"], result.engines["VictoriaMetrics"]
    lines = [
        "## Rules at cluster scale",
        "",
        f"Synthetic history of {NODES * GPUS_PER_NODE:,} GPUs ({NODES:,} nodes, DCGM ratios and the nvml source's "
        "health series on every GPU: up, losses, PCIe link and replays, row remapping, the driver's recovery "
        "action, NVLink error totals, one GPU in 997 degraded; no RDMA NICs), "
        f"{WORKLOADS} workloads x {RANKS} ranks (with their attribution info series, their roles in four pipeline "
        "stages, NCCL's collective durations, their own time's step-to-step variation, and the forecast's inputs: "
        "step numbers, a target, a step-time baseline, restarts and one run each; "
        f"{WASTEFUL} of them redoing enough steps after restarts that GoodputWastedProgress pages) and "
        f"{sum(SERVING.values()):,} serving pods ("
        + ", ".join(f"{count:,} {TITLES[name]}" for name, count in SERVING.items())
        + f"; {MODELS} models; {result.serving_gpus:,} of the GPUs, by their pod info series): "
        f"{result.series:,} series, {result.samples:,} samples over {(HISTORY + AHEAD) // 60} minutes, "
        f"one a minute but for the last {RECENT // 60} at a {SCRAPE} s scrape, plus the short-window series the long "
        "rules average, over the longest window each is read over (1h; the inference SLO series 6h; every "
        f"{EVAL_INTERVAL} s, as recorded) (details in `bench/rules_scale.py`). Measured by `python "
        "bench/rules_scale.py`, rules/ as shipped, on each engine alone, one after the other:",
        "",
        "- **Prometheus** 2.42 on the history converted by `promtool tsdb create-blocks-from openmetrics` (one file "
        f"per 2h block; {prometheus.load_s:.0f} s), started as the history ends; a group's time is its "
        "`evaluationTime` in /api/v1/rules.",
        f"- **VictoriaMetrics** 1.79 single-node with `{' '.join(VM_FLAGS)}` ("
        + (f"search limits raised: `{' '.join(VM_RAISED)}`" if VM_RAISED else "no search limit needed raising")
        + "), the "
        f"same history moved {result.moved // 60} minutes later (the same samples, so that it too ends as vmalert "
        "starts), streamed into `/api/v1/import/prometheus`, then `/internal/force_flush` and "
        f"`/internal/force_merge` ({victoria.load_s:.0f} s in all); then **vmalert** 1.79 with the same rule files, "
        f"`-evaluationInterval={EVAL_INTERVAL}s`, `-datasource.queryStep` at its default 5m, writing back to "
        "VictoriaMetrics and notifying a stub that answers 200. A group's time is the growth of "
        "`vmalert_iteration_duration_seconds_sum{group=...}` over one evaluation: the wall time of its whole "
        "evaluation, as Prometheus's `evaluationTime` is (vmalert 1.79's /api/v1/rules has no group time, and a "
        "recording rule's `evaluationTime` there runs from the evaluation's timestamp, so a rule's own time is its "
        "end less the previous rule's end).",
        "- vmalert writes what it records back through the store, so a rule that reads what an earlier rule of its "
        "group recorded sees it as of the group's previous evaluation, where Prometheus gives it this evaluation's "
        f"(vmalert's documented limit on chaining; {result.chained} such series in rules/, in chains up to "
        f"{result.chain_depth} rules deep). VictoriaMetrics' copy of the history holds them over its last "
        f"{SEEDED // 60} minutes, as Prometheus first recorded them after the history ended (its windows still "
        "full), as a vmalert that had been running would have left them; without them the chains' last rules "
        "would find nothing for as many evaluations as the chain is "
        "deep.",
        "",
        f"Both every {EVAL_INTERVAL} s (the slow groups every 1m): the first evaluation (the data read for the first "
        f"time) apart; then the median and worst of the last {EVALUATIONS - COLD} (of the slow groups, the last "
        f"{SLOW_EVALUATIONS - 1}). Target: < 1 s per evaluation on both. Each engine's groups share the machine's "
        f"{os.cpu_count()} cores with each other and with the engine's own work (vmalert's queries are answered by "
        "VictoriaMetrics, a second process).",
        "",
        "| group | every | rules | Prometheus first | median | worst | VictoriaMetrics first | median | worst "
        "| slowest rule, Prometheus (median) | slowest rule, vmalert (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(set(prometheus.groups) | set(victoria.groups)):
        every = "1m" if name in result.slow else f"{EVAL_INTERVAL} s"
        cells = []
        for engine in (prometheus, victoria):
            first, median, worst = engine.groups.get(name, (float("nan"),) * 3)
            cells += [f"{first * 1000:.0f} ms", f"{median * 1000:.0f} ms", f"{worst * 1000:.0f} ms"]
        slowest = []
        for engine in (prometheus, victoria):
            rule, seconds = engine.slowest(name)
            slowest.append(f"`{rule}` ({seconds * 1000:.0f} ms)" if len(engine.members.get(name, [])) > 1 else
                           f"its only rule ({seconds * 1000:.0f} ms)")
        count = len(prometheus.members.get(name) or victoria.members.get(name, []))
        lines.append(f"| `{name}` | {every} | {count} | " + " | ".join(cells) + " | " + " | ".join(slowest) + " |")
    lines.append("")
    for title, engine in result.engines.items():
        busy = sum(median * (1 if name in result.slow else 60 / EVAL_INTERVAL)
                   for name, (_, median, _) in engine.groups.items())
        worst_name, (_, _, worst) = max(engine.groups.items(), key=lambda item: item[1][2])
        lines.append(f"- {title}: slowest group `{worst_name}` (worst {worst * 1000:.0f} ms); rule evaluation in "
                     f"all, from the medians, {busy:.1f} s a minute of group time ({os.cpu_count() * 60} core-seconds "
                     f"a minute on this machine). While measured, the machine's {os.cpu_count()} cores were busy "
                     f"{engine.busy_cores:.2f} cores on average, {engine.engine_cores:.2f} of them the engine's "
                     f"({'Prometheus' if title == 'Prometheus' else 'VictoriaMetrics and vmalert'}), the rest this "
                     f"bench's polling and anything else on the machine; {engine.steal_cores:.2f} cores stolen by the "
                     f"hypervisor. The store's peak RSS, loading included: {engine.peak_rss_mb:,.0f} MB.")
    lines += [
        "",
        f"Series per GPU of one daemon with 8 simulated GPUs at default settings: {result.per_gpu_series:.1f} "
        f"with a `gpu` label (target <= 60), {result.per_gpu_total:.1f} counting every series of the daemon "
        "(self-metrics, process and host series included); what they cost at a store is under *Backend cost per GPU*.",
        "",
    ]
    return lines



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    r = run()
    for title, engine in r.engines.items():
        print(f"{title}:")
        for name, (first, median, worst) in engine.groups.items():
            print(f"  {name}: first {first * 1000:.0f} ms, then median {median * 1000:.0f} ms, "
                  f"worst {worst * 1000:.0f} ms")
        ranked = sorted(((seconds, f"{group}: {engine.members[group][i]}") for group, times in engine.rules.items()
                         for i, seconds in enumerate(times)), reverse=True)
        for seconds, name in ranked[:15]:
            print(f"  {seconds * 1000:7.0f} ms  {name}")
    print(f"series per GPU: {r.per_gpu_series:.1f} with a gpu label, {r.per_gpu_total:.1f} in all")
    print("\n".join(markdown(r)))
