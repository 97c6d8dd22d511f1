"""Rules at cluster scale: Prometheus's own evaluation time of our rule groups over a synthetic history
of 10,000 GPUs (1,250 nodes), 100 workloads x 64 ranks and 2,000 serving pods, and the series count per GPU
of one daemon.

The history is OpenMetrics written here, turned into TSDB blocks by `promtool tsdb create-blocks-from
openmetrics`, and served by Debian's Prometheus with the rule files of rules/ as shipped, at a 30 s
evaluation interval (kube-prometheus-stack's default; the slow groups at their own 1m). It spans 62
minutes, one sample a minute but for the last 10 minutes, which are at a 15 s scrape so that the 5m
windows read as many samples as they would; that keeps it to about 70 million samples on a 2-core
machine. It ends about when
Prometheus starts on it (a block reaching into the future would make Prometheus discard every rule
result as out of bounds), and the groups are measured in the next few minutes. Each group's
`evaluationTime` is read from /api/v1/rules: of the groups evaluated every 30 s, the first of 8
evaluations (cold blocks read from disk) apart, then the median and worst of the last 6; of the slow
groups, the first of 3 apart, then the last 2. Run alone with `python bench/rules_scale.py`.

Every series carries a `cluster` target label (one cluster, as a multi-cluster setup labels its targets), so
the joins `on (cluster, ...)` join what they would. Every GPU also reports DCGM's activity ratios (the dcgm
source on) and its power draw, and the ranks' GPUs carry the attribution info series (workload and pod), so the
groups reading them cost what they would.

The serving pods (`SERVING`: vLLM V1, SGLang and TGI) serve `MODELS` models, each model one engine in one of the
workloads' namespaces with 20 pods of 1, 2, 4 or 8 GPUs. Each pod exposes the series that
mixin/goodput_mixin/rules/engines.py gives for its engine under their current names (a current release exposes no
other), with the engine's own labels (those on by default: vLLM's model_name and engine="0"; SGLang's model_name,
engine_type="unified", is_streaming on the tokenizer's series, and tp_rank, pp_rank, moe_ep_rank on the
schedulers', two pipeline stages reporting on pods of 4 or more GPUs; TGI none) and every default bucket, `le`
written as the engine's client library writes it (Python's repr; TGI's Rust shortest form, which Prometheus 2
stores as written). The target labels are those of Kubernetes service discovery: instance (pod IP:port), job,
namespace, pod, and TGI's `model` added by the scrape, as TGI has no model label; each target has its `up`.
Counters and histograms grow at each pod's request rate (histogram buckets from a latency distribution per model),
gauges vary by scrape. The engines' other series (process, Python, the histograms no rule reads) are left out: no
rule reads them. The pods' GPUs are the fleet's GPUs held by no rank (nodes 800 on; 3,560 of the 3,600), each
pod's GPUs on one node, given to it by goodput_gpu_pod_info (namespace, pod), so no GPU is held twice.

The long-window groups average what the short-window (5m) rules recorded, so the history also holds those
recorded series for the longest window each is read over (1h; the inference SLO series 6h, for the 30m, 1h
and 6h groups), as a Prometheus that has run the rules that long would: the names and windows are read from the
long groups' expressions and the label sets follow the fleet; their values are constants (the cost of a range
read does not depend on them), written every 30 s as the rules would record them, and a check at the end
proves every series the short groups record had every window it is read over full behind it. The part of
them older than the 2h block the fleet starts in is a second, small file, converted apart, so that promtool
(which reads its whole input once per 2h block) still reads the large file once or twice; and Prometheus runs
with compaction off (min = max block duration, 2h), so that no compaction runs while the groups are measured.
"""

from __future__ import annotations

import functools
import http.client
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml
from goodput_mixin.rules.engines import ENGINES, Engine, Native
from goodput_mixin.rules.objectives import OBJECTIVES
from serving import free_port, wait_ready

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
BLOCK = 2 * 3600  # promtool's block range: it reads its whole input once per block the history touches
NAMESPACES = 20  # the workloads' pods, and the serving pods, are spread over this many namespaces
# each rank's seconds per second in each phase (adding to 1 with untracked), and its accounting counters per second
PHASE_SHARES = {"compute": 0.65, "data_wait": 0.1, "comm_wait": 0.15, "checkpoint_save": 0.04, "checkpoint_restore": 0,
                "compile": 0, "startup": 0, "other": 0, "untracked": 0.06}
ACCOUNTING = {"goodput_elapsed_seconds": 1.0, "goodput_downtime_seconds": 0.01, "goodput_wasted_seconds": 0.02,
              "goodput_wasted_compute_seconds": 0.015}
DCGM_RATIOS = {"sm": 0.9, "dram": 0.4, "tensor": 0.6, "fp16": 0.1, "fp32": 0.2, "fp64": 0.0}  # x busy
CLUSTER = 'cluster="gpu-east-1"'  # every target's cluster label
SERVING = {"vllm": 1400, "sglang": 400, "tgi": 200}  # serving pods per engine
TITLES = {"vllm": "vLLM (V1)", "sglang": "SGLang", "tgi": "TGI"}
MODELS = 100  # served models; model m's engine is MODEL_ENGINES[m % 10], its pods' GPUs MODEL_GPUS[m * 37 % 50]
MODEL_ENGINES = ("vllm",) * 7 + ("sglang",) * 2 + ("tgi",)
MODEL_GPUS = (8,) * 2 + (4,) * 5 + (2,) * 10 + (1,) * 33
PORTS = {"vllm": 8000, "sglang": 30000, "tgi": 80}
PROMPT, GENERATED = 1000, 200  # tokens per request
# the engines' own labels: value -> share of the requests; None: off by default (DP attention, priority scheduling)
LABEL_VALUES: dict[str, dict[str, float] | None] = {
    "engine": {"0": 1}, "engine_type": {"unified": 1}, "is_streaming": {"true": 0.7, "false": 0.3},
    "tp_rank": {"0": 1}, "moe_ep_rank": {"0": 1}, "dp_rank": None, "priority": None,
    "finished_reason": {"stop": 0.8, "length": 0.15, "abort": 0.04, "error": 0.007, "repetition": 0.003}}
# normalized latency signal -> (median seconds, before the model's own factor; observations per request)
LATENCY = {"time_to_first_token": (0.25, 1), "time_per_output_token": (0.03, 1),
           "inter_token_latency": (0.03, GENERATED), "e2e_request_latency": (6.0, 1), "queue_time": (0.02, 1)}


@dataclass
class Result:
    series: int
    samples: int
    groups: dict[str, tuple[float, float, float, int]]  # name -> (first s, steady median s, steady worst s, rules)
    rules: dict[str, float]  # rule name -> steady median evaluation time, s
    members: dict[str, list[str]]  # group -> its rules' names
    slow: set[str]  # groups evaluated at their own, longer interval
    per_gpu_series: float  # series with a gpu label, per GPU, of one daemon at default settings
    per_gpu_total: float  # all series of that daemon, per GPU
    serving_gpus: int  # the fleet's GPUs held by serving pods

    def slowest(self, group: str) -> tuple[str, float]:
        """The group's rule with the largest steady median evaluation time."""
        return max(((name, self.rules.get(name, 0.0)) for name in self.members[group]), key=lambda item: item[1])


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
        deployment = f"{model.name.split('/')[1]}-{model.engine}"
        pod = (f"{deployment}-{(m + 1) * 2654435761 % 16**10:010x}-"
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
        # discovery gives none)
        return [f'{CLUSTER},namespace="{m.namespace}",model="{m.name}",engine="{m.engine}",objective="{objective}"'
                for m in _models() for objective, (_, signal) in OBJECTIVES.items()
                if signal in ENGINES[m.engine].signals]
    if level == "workload" and metric == "goodput_phase_seconds":
        return [f'{CLUSTER},workload="job{w}",phase="{p}"' for w in range(WORKLOADS)
                for p in PHASE_SHARES]
    if level == "workload" and not metric.startswith("goodput_inference"):
        return [f'{CLUSTER},workload="job{w}"' for w in range(WORKLOADS)]
    if level == "workload_rank":
        return [f'{CLUSTER},workload="job{w}",rank="{r}"' for w in range(WORKLOADS) for r in range(RANKS)]
    raise ValueError(f"{name}: the bench does not know this level's labels; teach _recorded_labels")


def _le(engine: Engine, bound: float) -> str:
    """`le` as the engine's client library writes it (engines.py's module docstring)."""
    text = repr(float(bound))
    assert "e" not in text, bound  # no default bound of the latency histograms reaches an exponent form
    return text[:-2] if engine.le_format == "rust" and text.endswith(".0") else text


def _label_sets(engine: Engine, native: Native, pod: Pod) -> list[tuple[str, float]]:
    """The engine's own label sets on one pod's `native`, each with its share of the pod's requests."""
    sets: list[tuple[str, float]] = [("", 1.0)]
    for label in native.labels:
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


def _write_serving(out: TextIO, counter: Callable[..., None],
                   varying: Callable[[str, str, Callable[[int], float]], None]) -> None:
    """Every serving pod's engine series."""
    pods = _serving()
    for engine in (ENGINES[name] for name in SERVING):
        mine = [pod for pod in pods if pod.model.engine == engine.name]
        for signal, natives in engine.signals.items():
            native = natives[0]  # the current name: a current release exposes no other
            family = native.name[:-6] if native.kind == "counter" and native.name.endswith("_total") else native.name
            out.write(f"# TYPE {family} {native.kind}\n")
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
                        per_request = {"preemptions": 0.01, "prompt_tokens": PROMPT,
                                       "generation_tokens": GENERATED}.get(signal, 1)
                        counter(native.name, labels, pod.rate * per_request * share, pod.uptime)
                    else:
                        median, per_request = LATENCY[signal]
                        median *= pod.model.slow
                        rate = pod.rate * per_request * share
                        for bound in native.buckets:
                            counter(f"{native.name}_bucket", f'{labels},le="{_le(engine, bound)}"',
                                    rate * _cdf(bound, median), pod.uptime, True)
                        counter(f"{native.name}_bucket", f'{labels},le="+Inf"', rate, pod.uptime, True)
                        counter(f"{native.name}_sum", labels, rate * median * 1.2, pod.uptime)
                        counter(f"{native.name}_count", labels, rate, pod.uptime, True)


def _write_history(path: Path, early: Path, now: int, long_inputs: dict[str, list[int]]) -> tuple[int, int]:
    """OpenMetrics text of the whole fleet, and in `early` the recorded series' samples before the 2h block the
    fleet starts in; returns (series, samples)."""
    start = now - HISTORY
    end = now + AHEAD
    split = start - start % BLOCK
    times = list(range(start - start % STEP, end - RECENT, STEP)) + list(range(end - RECENT, end, SCRAPE))
    series = samples = 0
    serving_gpus = {(pod.node, gpu): pod for pod in _serving() for gpu in pod.gpus}
    with path.open("w") as out, early.open("w") as before:
        def counter(name: str, labels: str, per_second: float, base: float = 0, integer: bool = False) -> None:
            nonlocal series, samples
            series, samples = series + 1, samples + len(times)
            if integer:
                out.writelines(f"{name}{{{labels}}} {int((t - times[0] + base) * per_second)} {t}\n" for t in times)
            else:
                out.writelines(f"{name}{{{labels}}} {round((t - times[0] + base) * per_second, 3)} {t}\n"
                               for t in times)

        def gauge(name: str, labels: str, value: float, at: list[int] = times) -> None:
            nonlocal series, samples
            series, samples = series + 1, samples + len(at)
            head = f"{name}{{{labels}}} {value} " if labels else f"{name} {value} "
            out.writelines(f"{head}{t}\n" for t in at)

        def varying(name: str, labels: str, value: Callable[[int], float]) -> None:
            nonlocal series, samples
            series, samples = series + 1, samples + len(times)
            out.writelines(f"{name}{{{labels}}} {value(t)} {t}\n" for t in times)

        for family, kind in (("goodput_gpu_idle_seconds", "counter"), ("goodput_gpu_sampled_seconds", "counter"),
                             ("goodput_gpu_allocated", "gauge"), ("goodput_gpu_memory_used_bytes", "gauge"),
                             ("goodput_gpu_memory_total_bytes", "gauge"), ("goodput_gpu_power_watts", "gauge"),
                             ("goodput_gpu_ecc_errors", "counter"),
                             ("goodput_gpu_clock_throttle_seconds", "counter"), ("goodput_gpu_xid_errors", "counter"),
                             ("up", "gauge"), ("goodput_exporter_source_up", "gauge"),
                             ("goodput_phase_seconds", "counter"), ("goodput_steps", "counter"),
                             ("goodput_tokens", "counter"), ("goodput_step_duration_seconds_sum", "gauge"),
                             ("goodput_step_duration_seconds_count", "gauge"),
                             ("goodput_collective_last_seq", "gauge"),
                             ("goodput_collective_oldest_inflight_seconds", "gauge"),
                             ("goodput_flight_recorder_dump_timestamp_seconds", "gauge"),
                             *((f"goodput_gpu_{name}_active_ratio", "gauge") for name in DCGM_RATIOS),
                             ("goodput_gpu_workload_info", "gauge"), ("goodput_gpu_pod_info", "gauge"),
                             ("goodput_gpu_energy_joules", "counter"), ("goodput_gpu_peak_flops", "gauge"),
                             *((name, "counter") for name in ACCOUNTING), ("goodput_model_flops", "counter")):
            out.write(f"# TYPE {family} {kind}\n")
            for node in range(NODES):
                inst = f'{CLUSTER},instance="node{node}:9445",job="goodput-exporter"'
                if family == "up":
                    gauge("up", inst, 1)
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
                                      "goodput_collective", "goodput_flight", "goodput_model_flops",
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
                        counter(f"{family}_total", labels, 2)
                    elif family == "goodput_tokens":
                        counter(f"{family}_total", labels, 8192)
                    elif family == "goodput_step_duration_seconds_sum":
                        counter(family, labels, 1)
                    elif family == "goodput_step_duration_seconds_count":
                        counter(family, labels, 2)
                    elif family == "goodput_collective_last_seq":
                        for state in ("enqueued", "completed"):
                            gauge(family, f'{labels},pg="0",state="{state}"', 1000)
                    elif family == "goodput_collective_oldest_inflight_seconds":
                        gauge(family, f'{labels},pg="0"', 0.01)
                    else:
                        gauge(family, labels, now)
        _write_serving(out, counter, varying)
        early_names = 0
        for name, windows in long_inputs.items():
            # at the interval their rules are evaluated at, as the long windows read them: from the longest window
            # (and 2 minutes) before the history starts; the part before the fleet's first block apart
            first = now - max(windows) - (HISTORY - 3600)
            recorded = list(range(first - first % EVAL_INTERVAL, end, EVAL_INTERVAL))
            late = [t for t in recorded if t >= split]
            out.write(f"# TYPE {name} gauge\n")
            labels = _recorded_labels(name)
            for label_set in labels:
                gauge(name, label_set, 0.25, late)
            if len(late) < len(recorded):
                early_names += 1
                before.write(f"# TYPE {name} gauge\n")
                for label_set in labels:
                    head = f"{name}{{{label_set}}} 0.25 "
                    before.writelines(f"{head}{t}\n" for t in recorded[:len(recorded) - len(late)])
                samples += len(labels) * (len(recorded) - len(late))
        out.write("# EOF\n")
        before.write("# EOF\n")
    if not early_names:
        early.unlink()
    return series, samples


def _get(port: int, path: str) -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def _query(port: int, expr: str) -> list[dict]:  # type: ignore[type-arg]
    return _get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]


def _per_gpu_series() -> tuple[float, float]:
    """Series of one daemon with 8 simulated GPUs at default settings."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--simulate", "8",
                             "--web.listen-address", f"127.0.0.1:{port}", "--ingest.enabled", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/readyz")
        time.sleep(2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        lines = [line for line in conn.getresponse().read().decode().splitlines() if line and line[0] != "#"]
    finally:
        proc.terminate()
        proc.wait(10)
    return sum('gpu="' in line for line in lines) / 8, len(lines) / 8


def _checks() -> list[tuple[str, int]]:
    """Queries proving that the rules found the fleet (each expression's count)."""
    pods = _serving()
    gpus = sum(len(pod.gpus) for pod in pods)
    served = len({pod.model for pod in pods})
    return [("count(gpu:goodput_gpu_idle_ratio:rate1h)", NODES * GPUS_PER_NODE),
            ("count(node:goodput_gpu_idle_ratio:rate5m)", NODES),
            ("count(workload_rank:goodput_straggler_ratio:rate5m)", WORKLOADS * RANKS),
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
            ("count(workload:goodput_inference_slo_goodput:rate5m)", served),
            *((f"count(workload:goodput_inference_slo_error_ratio:rate{window})", served)
              for window in ("30m", "1h", "6h"))]


def run() -> Result:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    files = {path.name: path.read_text() for path in sorted((ROOT / "rules").glob("*.rules.yml"))}
    slow = {group["name"] for text in files.values() for group in yaml.safe_load(text)["groups"] if "interval" in group}
    long_inputs = _long_inputs(files)
    now = int(time.time())
    series, samples = _write_history(WORK / "history.om", WORK / "early.om", now, long_inputs)
    print(f"rules scale: {series:,} series, {samples:,} samples written in {time.time() - now:.0f} s", flush=True)
    for name in ("history.om", "early.om"):
        if (WORK / name).exists():
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(WORK / name),
                            str(WORK / "data")], check=True, stdout=subprocess.DEVNULL)
            (WORK / name).unlink()
    print(f"rules scale: blocks written {time.time() - now:.0f} s after the start", flush=True)
    end = now + AHEAD
    if time.time() > end + 30:  # a 5m window holds 5 samples: it must not start emptying while measured
        raise RuntimeError(f"writing the history took {time.time() - now:.0f} s, past its end: raise AHEAD")
    if time.time() < end + 2:  # rule results must land after the last block
        time.sleep(end + 2 - time.time())
    port = free_port()
    rules = sorted(str(ROOT / "rules" / name) for name in files)
    (WORK / "prometheus.yml").write_text(
        f"global: {{evaluation_interval: {EVAL_INTERVAL}s}}\nrule_files: {json.dumps(rules)}\n")
    # compaction off (one block range): the blocks would otherwise be merged while the groups are measured
    proc = subprocess.Popen(["prometheus", f"--config.file={WORK / 'prometheus.yml'}",
                             f"--storage.tsdb.path={WORK / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d", f"--storage.tsdb.min-block-duration={BLOCK}s",
                             f"--storage.tsdb.max-block-duration={BLOCK}s"],
                            stdout=(WORK / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
    durations: dict[str, list[float]] = {}
    rule_times: dict[str, list[float]] = {}
    members: dict[str, list[str]] = {}
    try:
        deadline = time.monotonic() + 600
        seen: dict[str, str] = {}
        def measured() -> bool:
            return bool(durations) and all(len(v) >= (SLOW_EVALUATIONS if name in slow else EVALUATIONS)
                                           for name, v in durations.items())

        while time.monotonic() < deadline and not measured():
            time.sleep(2)
            try:
                groups = _get(port, "/api/v1/rules")["data"]["groups"]
            except (OSError, KeyError, ValueError):
                continue
            for group in groups:
                name, last = group["name"], group.get("lastEvaluation", "")
                if last and not last.startswith("0001") and seen.get(name) != last:
                    seen[name] = last
                    durations.setdefault(name, []).append(group["evaluationTime"])
                    members[name] = [rule["name"] for rule in group["rules"]]
                    if len(durations[name]) > (1 if name in slow else COLD):
                        for rule in group["rules"]:
                            rule_times.setdefault(rule["name"], []).append(rule["evaluationTime"])
        for expr, expected in _checks():
            check = _query(port, expr)
            assert check and float(check[0]["value"][1]) == expected, (expr, expected, check)
        for name, windows in long_inputs.items():  # every series a short group records had each window full behind it
            total = _query(port, f"count({name})")
            for window in windows:
                full = _query(port, f"count(count_over_time({name}[{window}s]) >= {window // EVAL_INTERVAL - 5})")
                assert total and full and total[0]["value"][1] == full[0]["value"][1], (name, window, total, full)
        if "out of bounds" in (WORK / "prometheus.log").read_text():
            raise RuntimeError("Prometheus discarded rule results as out of bounds")
    finally:
        proc.terminate()
        proc.wait(30)
    per_gpu, per_gpu_total = _per_gpu_series()
    steady = {name: v[1:] if name in slow else v[COLD:] for name, v in durations.items()}
    return Result(series, samples, {name: (v[0], statistics.median(steady[name]), max(steady[name]), len(members[name]))
                                    for name, v in sorted(durations.items())},
                  {name: statistics.median(v) for name, v in rule_times.items()}, members, slow, per_gpu,
                  per_gpu_total, sum(len(pod.gpus) for pod in _serving()))


if __name__ == "__main__":
    r = run()
    for name, (first, median, worst, count) in r.groups.items():
        print(f"{name}: {count} rules, first {first * 1000:.0f} ms, then median {median * 1000:.0f} ms, "
              f"worst {worst * 1000:.0f} ms")
    for name, median in sorted(r.rules.items(), key=lambda item: -item[1])[:15]:
        print(f"  {median * 1000:7.0f} ms  {name}")
    print(f"series per GPU: {r.per_gpu_series:.1f} with a gpu label, {r.per_gpu_total:.1f} in all")
