"""Rules equivalence: the shipped rules evaluated by Prometheus and by vmalert over the same backfilled hour, compared
series by series and sample by sample (issue 21). Used by tests/test_rules_equivalence.py; run alone,
`.venv/bin/python tests/rules_equivalence.py` prints every difference (`--measured`: the sizes the test holds).

The data (`fleet`) is a small cluster: three nodes of 8 GPUs under the daemon's metric names and labels (a training
workload of 8 ranks with the flight recorder's series, a second one that starts and ends inside the hour, DCGM
ratios with one MIG GPU, fabric ports and interfaces, host pressure, the client path's inference series) and vLLM,
SGLang, TGI, Triton (TensorRT-LLM, its first-response histogram in ms) and Ray Serve vLLM pods. Every target is
scraped every 30 s with jitter (no sample on the minute grid); node0's scraper is down for 6.5 minutes (no sample
and no staleness marker: the lookback decides), node1's daemon restarts (failed scrapes, `up` 0, its own counters
from 0), one GPU's memory grows toward its limit, and faults make every rule and alert return something. Staleness
markers are where a scraper writes them (a failed scrape; a series a scrape no longer has). The same samples go to
Prometheus (`promtool tsdb create-blocks-from openmetrics`, the blocks in its data dir before it starts) and to
VictoriaMetrics (`/api/v1/import/prometheus`, millisecond timestamps); the markers, which neither text format
carries, by remote write to both (Prometheus with an out-of-order window to take them).

The recording rules are evaluated from an hour before the compared hour (so the 1h windows over recorded series are
full), level by level in dependency order (a rule comes a level after every rule recording a name it reads), each
level's results written before the next level is evaluated, with the staleness markers a live ruler writes when one
of a rule's series disappears (neither backfill tool writes them):
- Prometheus: each rule's expression as a range query at the group's interval, its results with the rule's labels
  and name written back by remote write. That is what `promtool tsdb create-blocks-from rules` does, but promtool
  starts each group's range at an offset hashed from the group's name and file (sub-second, different per group),
  at which vmalert, asking for whole seconds, cannot evaluate; so the same queries run here at shared instants.
- vmalert: `vmalert -replay.timeFrom/-replay.timeTo` on the level's rules, writing through remote write, then
  /internal/force_flush. vmalert 1.79's replay asks range queries at step = -datasource.queryStep (5m by default)
  whatever the group's interval; its live instant queries carry the same step, which MetricsQL also takes as a bare
  selector's lookback. Five replays with timeFrom one interval apart together evaluate every interval with that 5m
  lookback. VictoriaMetrics runs with -search.disableCache (which also stops it rounding a range to the step). Each
  write to it is followed by a search counting exactly the samples and markers written, before anything reads them.
Both evaluate at the same instants, multiples of the interval (every group of the shipped rules runs at 1m).

Then every recorded series is read raw from both over the compared hour and compared sample by sample: the same
label sets, a sample at the same instants, values within REL_TOL (ABS_TOL near zero). The alert expressions are
compared the same way, as range queries at the evaluation interval on Prometheus and as a live vmalert evaluates
them on VictoriaMetrics, after every recorded series is in (the `for:` state is not compared).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml
from goodput_client.contract import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from goodput_mixin.rules.engines import ENGINES, Engine, Native

PIPE_BOUND = {(0, 5): "fp16", (0, 6): "fp32", (2, 3): "fp64"}  # GPUs whose busiest pipe is not the tensor one
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
CLUSTER = "east"
SCRAPE = 30  # s between scrapes of a target
INTERVAL = 60  # s: every group's evaluation interval (the shipped rules' default)
LOOKBACK = 300  # s: Prometheus's lookback delta; vmalert's default -datasource.queryStep
HOUR = 3600
EVAL_FROM = -HOUR  # s from the compared hour's start: the recording rules are evaluated from here
RAW_FROM = EVAL_FROM - 1800 - 2 * SCRAPE  # the longest raw window (predict_linear's 30m) before EVAL_FROM
# Prometheus 2's range selectors include a sample exactly at the window's start (MetricsQL's and Prometheus 3's do
# not): a 1h window over a series recorded at the very instants it is read at would hold 61 samples, vmalert's 60. A
# live Prometheus evaluates each group at an offset of its own, so its 1h windows over another group's results
# hold 60 too: the Prometheus side writes each result this many ms before the instant it was evaluated at.
WRITTEN_BEFORE = 1
REL_TOL = 0.01  # two values agree within 1% of the larger,
ABS_TOL = 1e-9  # or this far apart (values that are 0 on one side and a rounding error on the other)


# --- the data ---------------------------------------------------------------------------------------------------


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    times: list[int]  # ms
    values: list[float]
    stale: list[int] = field(default_factory=list)  # ms: Prometheus staleness markers


@dataclass
class Target:
    labels: dict[str, str]  # target labels (cluster, instance, job, ...)
    phase: float  # s after each 30 s tick the target is scraped
    failed: tuple[tuple[float, float], ...] = ()  # (from, to) s: its scrapes fail (up 0, every series marked stale)
    outages: tuple[tuple[float, float], ...] = ()  # (from, to) s: its scraper is down (nothing written at all)
    scrapes: list[tuple[float, bool]] = field(default_factory=list)  # (s from the hour's start, succeeded)

    @property
    def times(self) -> list[float]:
        return [t for t, ok in self.scrapes if ok]


def _scrapes(target: Target, rng: random.Random) -> None:
    t = RAW_FROM + target.phase
    while t <= HOUR:
        at = round(t + rng.uniform(-0.4, 0.4), 3)  # jitter: never on the grid
        if not any(a <= at < b for a, b in target.outages):
            target.scrapes.append((at, not any(a <= at < b for a, b in target.failed)))
        t += SCRAPE


def _le(engine: Engine, bound: float) -> str:
    """`le` as the engine's client library writes it (engines.py's module docstring)."""
    text = repr(float(bound))
    return text[:-2] if engine.le_format == "rust" and text.endswith(".0") else text


def _cdf(bound: float, median: float) -> float:
    """Share of observations at or under `bound`: a log-logistic distribution."""
    return 0.0 if bound <= 0 else 1 / (1 + (median / bound) ** 3)


def _wave(s: float, period: float, phase: float = 0.0) -> float:
    return math.sin(2 * math.pi * (s / period + phase))


# minutes from the hour's start (s = 60 * minutes)
CRASH, RESTARTED = 25 * 60, 25 * 60 + 20  # pretrain's ranks crash and are down 20 s
STRAGGLER = 30 * 60  # pretrain rank 3 slows down
HANG = 52 * 60  # pretrain rank 5 skips a collective: the others wait in it
FINETUNE = (10 * 60, 45 * 60)  # the second workload runs on node1's GPUs 0-3 only then
NODE0_GAP = (38 * 60, 38 * 60 + 390)  # node0's scraper is down for 6.5 minutes: no sample, no marker
NODE1_RESTART = (50 * 60, 50 * 60 + 100)  # node1's daemon restarts: failed scrapes, its own counters from 0
XID = 20 * 60  # node1 GPU 6 falls off the bus (XID 79)
OVERLOAD = (30 * 60, 40 * 60)  # the vLLM pod gets 2.4x its requests


class Fleet:
    """The series of the scenario in the module docstring, with the staleness markers a scraper writes: at a failed
    scrape for every series of its target, at a successful one for each series that the scrape no longer has."""

    def __init__(self, t0: int) -> None:
        self.t0 = t0
        self.rng = random.Random(21)
        self.series: list[Series] = []

    def target(self, phase: float, failed: tuple[tuple[float, float], ...] = (),
               outages: tuple[tuple[float, float], ...] = (), **labels: str) -> Target:
        target = Target({"cluster": CLUSTER, **labels}, phase, failed, outages)
        _scrapes(target, self.rng)
        values = {t: 1.0 if ok else 0.0 for t, ok in target.scrapes}
        self.add(target, "up", {}, values, every=True)
        return target

    def ms(self, t: float) -> int:
        return round((self.t0 + t) * 1000)

    def add(self, target: Target, name: str, labels: dict[str, str], values: dict[float, float],
            every: bool = False) -> None:
        """A series of `target` with `values` at some of its scrapes (all of them with `every`)."""
        if not values:
            return
        series = Series(name, {**target.labels, **labels}, [], [])
        present = False
        for t, ok in target.scrapes:
            if t in values and (ok or every):
                series.times.append(self.ms(t))
                series.values.append(values[t])
                present = True
            elif present:
                series.stale.append(self.ms(t))
                present = False
        self.series.append(series)

    def gauge(self, target: Target, name: str, labels: dict[str, str], f: Callable[[float], float | None]) -> None:
        self.add(target, name, labels, {t: v for t in target.times if (v := f(t)) is not None})

    def counter(self, target: Target, name: str, labels: dict[str, str], rate: Callable[[float], float | None],
                base: float = 0.0, integer: bool = False, resets: Iterable[float] = ()) -> None:
        """Integral of `rate` (per s) over the target's scrapes, from `base`; absent where `rate` is None (and from
        `base` again when it is back); from 0 again at the first scrape after each of `resets` (a restart)."""
        values: dict[float, float] = {}
        value, prev = base, None
        pending = sorted(resets)
        for t in target.times:
            r = rate(t)
            if r is None:
                prev, value = None, base
                continue
            if pending and t >= pending[0]:
                restart = pending.pop(0)
                value = r * (t - restart)
            elif prev is not None:
                mid = rate((prev + t) / 2)
                value += (r if mid is None else mid) * (t - prev)
            prev = t
            values[t] = math.floor(value) if integer else round(value, 6)
        self.add(target, name, labels, values)

    def events(self, target: Target, name: str, labels: dict[str, str], at: Iterable[float], base: int = 0,
               present: Callable[[float], bool] = lambda s: True) -> None:
        """A counter of events: `base` plus the events (s) at or before each scrape."""
        at = sorted(at)
        self.add(target, name, labels,
                 {t: float(base + sum(1 for e in at if e <= t)) for t in target.times if present(t)})


MEMORY = 80 * 2**30  # bytes on each GPU


def _memory_used(node: int, gpu: int, held: bool, s: float) -> float:
    if (node, gpu) == (0, 5):  # a leak from 10 minutes before the hour: 6 MiB/s toward the limit
        return float(round(45 * 2**30 + 6 * 2**20 * max(0.0, s + 600) + 2**28 * _wave(s, 120)))
    if (node, gpu) in ((2, 0), (2, 1)):  # vLLM takes 96% of the memory up front
        return 0.96 * MEMORY
    return float(round(60 * 2**30 + 2**29 * _wave(s, 600))) if held else float(2**28)


def _gpu(node: int, gpu: int) -> dict[str, str]:
    return {"gpu": str(gpu), "uuid": f"GPU-5e1f{node:02d}{gpu:02d}"}


def _pretrain(rank: int, s: float) -> dict[str, float] | None:
    """pretrain rank's seconds per second in each phase; None while its process is down."""
    if CRASH <= s < RESTARTED:
        return None
    if RESTARTED <= s < RESTARTED + 15:
        return {"startup": 0.5, "checkpoint_restore": 0.5}
    if s >= HANG:
        return {"data_wait": 1.0} if rank == 5 else {"comm_wait": 1.0}
    data = 0.08 + 0.02 * _wave(s, 900, rank / 8)
    if s >= STRAGGLER:  # rank 3's own time per step is 1.53 times the others': they wait for it
        if rank == 3:
            return {"compute": 0.82, "data_wait": data, "comm_wait": 0.02, "checkpoint_save": 0.04,
                    "untracked": 0.12 - data}
        return {"compute": 0.46, "data_wait": data, "comm_wait": 0.36, "checkpoint_save": 0.04,
                "untracked": 0.14 - data}
    return {"compute": 0.66, "data_wait": data, "comm_wait": 0.15, "checkpoint_save": 0.04, "untracked": 0.15 - data}


def _redo(s: float) -> bool:
    """pretrain's ranks redo the steps since their last checkpoint."""
    return RESTARTED + 15 <= s < RESTARTED + 215


def _pretrain_steps(s: float) -> float:
    if CRASH <= s < RESTARTED + 15 or s >= HANG:
        return 0.0
    return 1.6 if s >= STRAGGLER else 2.0 + 0.2 * _wave(s, 1200)


PHASES = ("compute", "data_wait", "comm_wait", "checkpoint_save", "checkpoint_restore", "compile", "startup", "eval",
          "other", "untracked")
LABEL_VALUES: dict[str, dict[str, float] | None] = {  # the engines' own labels: value -> share of the requests
    "engine": {"0": 1}, "engine_type": {"unified": 1}, "is_streaming": {"true": 0.7, "false": 0.3},
    "tp_rank": {"0": 1}, "pp_rank": {"0": 1}, "moe_ep_rank": {"0": 1}, "dp_rank": None, "priority": None,
    "finished_reason": {"stop": 0.8, "length": 0.15, "abort": 0.05},
    # Triton's (its per-kind gauges get the kind the native reads) and Ray's metrics agent's
    "version": {"1": 1}, "request_type": None, "kv_cache_block_type": None, "reason": None, "err": None,
    "WorkerId": {"a3c1f09e": 1}, "ReplicaId": None, "NodeAddress": {"10.2.0.15": 1}, "SessionName": {"session_1": 1},
    "Version": {"2.52.0": 1}, "Component": None}
# normalized latency signal -> (median s, observations per request)
LATENCY = {"time_to_first_token": (0.3, 1), "time_per_output_token": (0.035, 1), "inter_token_latency": (0.04, 50),
           "e2e_request_latency": (5.0, 1), "queue_time": (0.05, 1)}


def fleet(t0: int) -> list[Series]:
    """The scenario's series; `t0` is the compared hour's start (Unix s)."""
    f = Fleet(t0)
    job = "goodput-exporter"
    nodes = [f.target(7.3, outages=(NODE0_GAP,), instance="node0:9445", job=job),
             f.target(19.1, failed=(NODE1_RESTART,), instance="node1:9445", job=job),
             f.target(3.7, instance="node2:9445", job=job)]
    restart = (NODE1_RESTART[1],)

    def finetune(s: float) -> bool:
        return FINETUNE[0] <= s < FINETUNE[1]

    # GPU -> (workload, rank, namespace, pod, container) holding it, and when
    holders: dict[tuple[int, int], tuple[str, str, str, str, str, Callable[[float], bool]]] = {}
    for r in range(8):
        holders[0, r] = ("pretrain", str(r), "research", f"pretrain-worker-{r}", "trainer", lambda s: True)
    for r in range(4):
        holders[1, r] = ("finetune", str(r), "ml", f"finetune-{r}", "trainer", finetune)
    vllm_pod, sglang_pod, tgi_pod = "llama-vllm-6d4b9c7f5-x2kq8", "qwen-sglang-7c9d8b6f4-p4mzt", "mistral-tgi-0"
    holders[2, 0] = ("", "", "serve", vllm_pod, "vllm", lambda s: True)
    holders[2, 1] = ("", "", "serve", vllm_pod, "vllm", lambda s: True)
    holders[2, 2] = ("", "", "serve", sglang_pod, "sglang", lambda s: True)
    holders[2, 3] = ("", "", "serve", tgi_pod, "tgi", lambda s: True)
    holders[2, 4] = ("chat", "0", "apps", "chat-0", "server", lambda s: True)
    holders[2, 5] = ("", "", "serve", "phi-vllm-0", "vllm", lambda s: True)
    holders[2, 6] = ("", "", "serve", "gemma-triton-0", "triton", lambda s: True)
    holders[2, 7] = ("", "", "serve", "raycluster-llm-worker-gpu-8x2wq", "ray-worker", lambda s: True)

    def idle(node: int, gpu: int, s: float) -> float:
        holder = holders.get((node, gpu))
        if holder is None or not holder[5](s):
            return 1.0
        if node == 0:
            phases = _pretrain(gpu, s)
            if phases is None:
                return 1.0
            if s >= HANG:
                return 0.0  # NCCL spins in the collective
            return min(1.0, 0.03 + phases.get("comm_wait", 0) * 0.9 + phases.get("data_wait", 0)
                       + phases.get("startup", 0) + phases.get("checkpoint_restore", 0))
        if node == 1:
            return 0.35 + 0.05 * _wave(s, 300, gpu / 4)
        if (node, gpu) == (2, 2) and OVERLOAD[0] <= s < OVERLOAD[1]:
            return 0.62  # SGLang waits on its tokenizer while requests queue
        return 0.3 + 0.15 * _wave(s, 700, gpu / 5)

    for node, target in enumerate(nodes):
        for gpu in range(8):
            g = _gpu(node, gpu)
            lost = node == 1 and gpu == 6  # falls off the bus at XID; after the daemon's restart it is not seen
            seen: Callable[[float], bool] = (lambda s: s < NODE1_RESTART[0]) if lost else (lambda s: True)

            def present(v: Callable[[float], float], seen: Callable[[float], bool] = seen) -> Callable[
                    [float], float | None]:
                return lambda s: v(s) if seen(s) else None

            f.gauge(target, "goodput_gpu_up", g, present(lambda s, lost=lost: 0.0 if lost and s >= XID else 1.0))
            f.events(target, "goodput_gpu_lost_total", g, [XID] if lost else [], present=seen)
            f.counter(target, "goodput_gpu_idle_seconds_total", g,
                      present(lambda s, node=node, gpu=gpu: idle(node, gpu, s)),
                      resets=restart if node == 1 else ())
            f.counter(target, "goodput_gpu_sampled_seconds_total", g, present(lambda s: 1.0),
                      resets=restart if node == 1 else ())
            holder = holders.get((node, gpu))
            f.gauge(target, "goodput_gpu_allocated", g,
                    present(lambda s, h=holder: 1.0 if h is not None and h[5](s) else 0.0))
            f.gauge(target, "goodput_gpu_memory_used_bytes", g,
                    present(lambda s, n=node, i=gpu, h=holder: _memory_used(n, i, h is not None and h[5](s), s)))
            f.gauge(target, "goodput_gpu_memory_total_bytes", g, present(lambda s: float(MEMORY)))

            def power(s: float, node: int = node, gpu: int = gpu) -> float:
                return round(90 + 600 * (1 - idle(node, gpu, s)), 1)

            f.gauge(target, "goodput_gpu_power_watts", g, present(power))
            f.counter(target, "goodput_gpu_energy_joules_total", g, present(power), base=3.1e8 + 1e6 * gpu)
            for dtype, peak in (("fp64", 67e12), ("tf32", 494.5e12), ("fp16", 989.5e12), ("bf16", 989.5e12),
                                ("fp8", 1979e12)):
                f.gauge(target, "goodput_gpu_peak_flops", {**g, "dtype": dtype}, present(lambda s, p=peak: p))
            ecc = (node, gpu) == (1, 7)
            f.counter(target, "goodput_gpu_ecc_errors_total", {**g, "error_type": "corrected"},
                      present(lambda s: 0.002), base=17, integer=True)
            f.events(target, "goodput_gpu_ecc_errors_total", {**g, "error_type": "uncorrected"},
                     [15 * 60 + 5, 15 * 60 + 25] if ecc else [], present=seen)
            f.events(target, "goodput_gpu_remapped_rows_total", {**g, "error_type": "uncorrected"},
                     [15 * 60 + 25] if ecc else [], present=seen)
            f.counter(target, "goodput_gpu_remapped_rows_total", {**g, "error_type": "corrected"},
                      present(lambda s: 0.0), integer=True)
            f.gauge(target, "goodput_gpu_row_remap_pending", g,
                    present(lambda s, ecc=ecc: 1.0 if ecc and s >= 16 * 60 else 0.0))
            # node2's GPU 6 fails a row remap (no spare row) at 30m: the replace risk level
            f.gauge(target, "goodput_gpu_row_remap_failure", g,
                    present(lambda s, n=node, i=gpu: 1.0 if (n, i) == (2, 6) and s >= 30 * 60 else 0.0))
            for cause in ("single_bit", "double_bit"):
                f.counter(target, "goodput_gpu_retired_pages_total", {**g, "cause": cause},
                          present(lambda s, c=cause, n=node, i=gpu: 0.004 if (n, i, c) == (2, 5, "single_bit") and
                                  s >= 5 * 60 else 0.0), integer=True)
            f.gauge(target, "goodput_gpu_retired_pages_pending", g,
                    present(lambda s, n=node, i=gpu: 1.0 if (n, i) == (2, 5) and s >= 6 * 60 else 0.0))
            # node0's GPU 4: its driver asks for a GPU reset (NVML's recovery action 1) from 40m to 50m
            f.gauge(target, "goodput_gpu_recovery_action", g,
                    present(lambda s, n=node, i=gpu: 1.0 if (n, i) == (0, 4) and 40 * 60 <= s < 50 * 60 else 0.0))
            for reason in ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"):
                hot = (node, gpu, reason) == (2, 0, "power")
                warm = (node, gpu, reason) == (0, 5, "thermal")  # a second candidate of the leaking GPU's
                f.counter(target, "goodput_gpu_clock_throttle_seconds_total", {**g, "reason": reason},
                          present(lambda s, hot=hot, warm=warm: 0.32 if (hot and s >= 20 * 60) or (
                              warm and 45 * 60 <= s < 55 * 60) else 0.01))
            if lost:
                f.events(target, "goodput_gpu_xid_errors_total", {**g, "xid": "79"}, [XID],
                         present=lambda s: XID <= s < NODE1_RESTART[0])
                f.gauge(target, "goodput_gpu_last_xid_timestamp_seconds", g,
                        lambda s: float(t0 + XID) if XID <= s < NODE1_RESTART[0] else None)
            f.gauge(target, "goodput_gpu_pcie_link_max_width", g, present(lambda s: 16.0))
            f.gauge(target, "goodput_gpu_pcie_link_width", g,
                    present(lambda s, n=node, i=gpu: 8.0 if (n, i) == (1, 2) and s >= 5 * 60 else 16.0))
            f.gauge(target, "goodput_gpu_pcie_link_max_generation", g, present(lambda s: 5.0))
            f.gauge(target, "goodput_gpu_pcie_link_generation", g,
                    present(lambda s, n=node, i=gpu: 3.0 if (n, i) == (0, 1) else
                            (1.0 if idle(n, i, s) >= 0.99 else 5.0)))
            for error_type in ("crc_flit", "crc_data", "replay", "recovery"):  # the GPU's links together
                bad = (node, gpu) == (2, 1) and error_type in ("crc_flit", "replay")
                rate = (220.0 if error_type == "crc_flit" else 0.05) if bad else 0.0
                f.counter(target, "goodput_gpu_nvlink_errors_total", {**g, "error_type": error_type},
                          present(lambda s, rate=rate: rate if s >= 20 * 60 else 0.0), integer=True)
            if (node, gpu) == (0, 4):
                f.gauge(target, "goodput_gpu_numa_mismatch", {**g, "pid": "4242"}, lambda s: 1.0)
            # DCGM: per GPU, node2's GPU 7 in MIG mode with two GPU instances
            ratios = {"sm": 0.9, "dram": 0.45, "tensor": 0.55, "fp16": 0.08, "fp32": 0.2, "fp64": 0.0}
            if node == 1 and gpu < 4:  # finetune's kernels keep few SMs and tensor pipes busy
                ratios = {"sm": 0.6, "dram": 0.8, "tensor": 0.15, "fp16": 0.02, "fp32": 0.1, "fp64": 0.0}
            if (node, gpu) in PIPE_BOUND:  # kernels on one of the other math pipes (every pipe's class candidate)
                ratios = {**ratios, "tensor": 0.1, PIPE_BOUND[node, gpu]: 0.95}
            instances = [{"gpu_instance_id": "1"}, {"gpu_instance_id": "2"}] if (node, gpu) == (2, 7) else [{}]
            for name, share in ratios.items():
                for k, inst in enumerate(instances):
                    f.gauge(target, f"goodput_gpu_{name}_active_ratio", {**g, **inst},
                            present(lambda s, n=node, i=gpu, share=share, k=k: round(
                                share * (1 - idle(n, i, s)) * (1 - 0.2 * k) + 0.01 * _wave(s, 240), 4)))
            if holder is not None:
                workload, rank, namespace, pod, container, active = holder
                if workload:
                    f.gauge(target, "goodput_gpu_workload_info", {**g, "workload": workload, "rank": rank},
                            lambda s, a=active: 1.0 if a(s) else None)
                f.gauge(target, "goodput_gpu_pod_info",
                        {**g, "mig_uuid": "", "pod": pod, "namespace": namespace, "container": container},
                        lambda s, a=active: 1.0 if a(s) else None)
        for source in ("nvml", "dcgm", "fabric", "host", "ingest", "flight", "kubelet", "process"):
            bad = node == 1 and source == "dcgm"
            f.gauge(target, "goodput_exporter_source_up", {"source": source},
                    lambda s, bad=bad: 0.0 if bad and 20 * 60 <= s < 35 * 60 else 1.0)
        for resource in ("cpu", "io", "memory"):
            for kind in ("some", "full"):
                io = node == 0 and resource == "io" and kind == "some"
                cpu = node == 1 and resource == "cpu" and kind == "some"
                f.counter(target, "goodput_host_pressure_stalled_seconds_total", {"resource": resource, "kind": kind},
                          lambda s, io=io, cpu=cpu: 0.4 if (io and 30 * 60 <= s < 50 * 60) or (
                              cpu and 20 * 60 <= s < 30 * 60) else 0.01)
        _fabric(f, node, target, lambda s, node=node: (1 - idle(node, 0, s)) * (1.0 if node < 2 else 0.2))

    _training(f, nodes[0], nodes[1], finetune)
    _pipelines(f, nodes[2])
    _serving(f, nodes[2])
    return f.series


def _fabric(f: Fleet, node: int, target: Target, busy: Callable[[float], float]) -> None:
    ports = [("mlx5_0", "InfiniBand", ""), ("mlx5_1", "InfiniBand", ""), ("mlx5_2", "Ethernet", "eth2")]
    for i, (device, layer, netdev) in enumerate(ports):
        p = {"device": device, "port": "1"}
        f.gauge(target, "goodput_fabric_port_info", {**p, "link_layer": layer, "netdev": netdev}, lambda s: 1.0)
        flap = (node, device) == (1, "mlx5_0")
        downs = [15 * 60, 17 * 60, 19 * 60] if flap else []

        def state(s: float, downs: list[float] = downs) -> float:
            return 1.0 if any(d <= s < d + 30 for d in downs) else 4.0

        f.gauge(target, "goodput_fabric_port_state", p, state)
        f.gauge(target, "goodput_fabric_port_physical_state", p, lambda s, state=state: 5.0 if state(s) == 4 else 2.0)
        slow = (node, device) == (2, "mlx5_1")
        f.gauge(target, "goodput_fabric_port_rate_bytes_per_second", p, lambda s, slow=slow: 25e9 if slow else 50e9)
        for direction in ("transmit", "receive"):
            share = 0.3 + 0.05 * i
            f.counter(target, f"goodput_fabric_port_{direction}_bytes_total", p,
                      lambda s, share=share, state=state: 0.0 if state(s) != 4 else 50e9 * share * busy(s) + 1e5,
                      base=7.7e13 + i * 1e12)
            f.counter(target, f"goodput_fabric_port_{direction}_packets_total", p,
                      lambda s, share=share, state=state: 0.0 if state(s) != 4 else 50e9 * share * busy(s) / 4096 + 30,
                      base=1.9e10 + i * 1e9, integer=True)
        f.events(target, "goodput_fabric_port_link_downed_total", p, [d + 2 for d in downs], base=2)
        f.counter(target, "goodput_fabric_port_link_error_recovery_total", p, lambda s: 0.0, integer=True)
        for counter in ("symbol_error", "port_rcv_errors", "local_link_integrity_errors", "port_xmit_discards"):
            bad = (node, device, counter) == (0, "mlx5_1", "symbol_error")
            f.counter(target, "goodput_fabric_port_errors_total", {**p, "counter": counter},
                      lambda s, bad=bad: 0.5 + 0.3 * _wave(s, 300) if bad and s >= 12 * 60 else 0.0, integer=True)
        if layer == "Ethernet":
            for counter in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored"):
                hot = node == 0 and counter != "rp_cnp_ignored"
                f.counter(target, "goodput_fabric_port_congestion_packets_total", {**p, "counter": counter},
                          lambda s, hot=hot: 8000.0 * busy(s) if hot and STRAGGLER <= s < HANG else 0.5,
                          integer=True)
            for counter in ("out_of_sequence", "local_ack_timeout_err"):
                f.counter(target, "goodput_fabric_port_retransmission_events_total", {**p, "counter": counter},
                          lambda s: 0.2 * busy(s), integer=True)
    for interface in ("eth0", "eth2"):
        n = {"interface": interface}
        down = (node, interface) == (1, "eth0")
        f.gauge(target, "goodput_fabric_interface_up", n, lambda s, down=down: 0.0 if down and s >= 40 * 60 else 1.0)
        f.gauge(target, "goodput_fabric_interface_speed_bytes_per_second", n,
                lambda s, down=down, i=interface: None if down and s >= 40 * 60 else (12.5e9 if i == "eth0" else 50e9))
        f.events(target, "goodput_fabric_interface_carrier_changes_total", n, [40 * 60 + 2] if down else [], base=4)
        for direction in ("transmit", "receive"):
            f.counter(target, f"goodput_fabric_interface_{direction}_bytes_total", n,
                      lambda s, i=interface: (2e6 if i == "eth0" else 50e9 * 0.4 * busy(s) + 1e5), base=4.4e12)
            f.counter(target, f"goodput_fabric_interface_{direction}_packets_total", n,
                      lambda s: 3000.0, base=6.1e9, integer=True)
        for counter in ("rx_errors", "rx_crc_errors", "tx_errors", "rx_dropped"):
            bad = (node, interface) == (2, "eth0") and counter in ("rx_errors", "rx_crc_errors")
            f.counter(target, "goodput_fabric_interface_errors_total", {**n, "counter": counter},
                      lambda s, bad=bad: 0.2 if bad and s >= 5 * 60 else 0.0, integer=True)


def _training(f: Fleet, node0: Target, node1: Target, finetune: Callable[[float], bool]) -> None:
    for r in range(8):
        w = {"workload": "pretrain", "rank": str(r)}

        def phases(s: float, r: int = r) -> dict[str, float] | None:
            return _pretrain(r, s)

        for phase in PHASES:
            f.counter(node0, "goodput_phase_seconds_total", {**w, "phase": phase},
                      lambda s, phase=phase, phases=phases: (phases(s) or {}).get(phase, 0.0), base=5400 * 0.1)
        f.counter(node0, "goodput_elapsed_seconds_total", w,
                  lambda s, phases=phases: 0.0 if phases(s) is None else 1.0, base=5400)
        f.counter(node0, "goodput_downtime_seconds_total", w,
                  lambda s, phases=phases: 1.0 if phases(s) is None else 0.0, base=12)
        f.counter(node0, "goodput_wasted_seconds_total", w, lambda s: 1.0 if _redo(s) else 0.0, base=30)
        f.counter(node0, "goodput_wasted_compute_seconds_total", w, lambda s: 0.66 if _redo(s) else 0.0, base=20)
        f.counter(node0, "goodput_wasted_steps_total", w, lambda s: 2.0 if _redo(s) else 0.0, base=60, integer=True)
        f.counter(node0, "goodput_steps_total", w, _pretrain_steps, base=10800, integer=True)
        f.counter(node0, "goodput_tokens_total", w, lambda s: 8192 * _pretrain_steps(s), base=10800 * 8192)
        f.counter(node0, "goodput_model_flops_total", {**w, "dtype": "bf16"}, lambda s: 3.4e14 * _pretrain_steps(s),
                  base=3.6e18)
        # while it steps, each second is a second of steps
        f.counter(node0, "goodput_step_duration_seconds_sum", w, lambda s: 1.0 if _pretrain_steps(s) else 0.0,
                  base=5300)
        f.counter(node0, "goodput_step_duration_seconds_count", w, _pretrain_steps, base=10800, integer=True)
        # the forecast's inputs: the step number, a target 50,000 steps on and a deadline at 2h (both declared), the
        # change detector's baseline (rank 3's moves up a while after it straggles), the last event while the process
        # is up, the crash's restart
        f.counter(node0, "goodput_step_number", w, _pretrain_steps, base=10800, integer=True)
        f.gauge(node0, "goodput_target_step_number", w, lambda s: 60000.0)
        f.gauge(node0, "goodput_deadline_timestamp_seconds", w, lambda s: float(f.t0 + 2 * HOUR))
        f.gauge(node0, "goodput_step_time_baseline_seconds", w,
                lambda s, r=r: 0.78 if r == 3 and s >= STRAGGLER + 65 else 0.5)
        f.gauge(node0, "goodput_workload_last_event_timestamp_seconds", w,
                lambda s, phases=phases: None if phases(s) is None else float(f.t0 + math.floor(s)))
        f.events(node0, "goodput_workload_restarts_total", w, [RESTARTED])
        f.events(node0, "goodput_step_time_shifts_total", {**w, "direction": "up"}, [STRAGGLER + 65] if r == 3 else [])
        f.counter(node0, "goodput_step_time_shifts_total", {**w, "direction": "down"}, lambda s: 0.0, integer=True)
        # flight recorder: three collectives per step; each rank's dump shows it waiting in the next one, but rank 5's,
        # which shows it has not enqueued it yet (a lag of a few ms while it steps); rank 5 stops enqueueing at HANG,
        # the others wait in it
        for state, base in (("enqueued", 32399 if r == 5 else 32400), ("completed", 32399)):
            f.counter(node0, "goodput_collective_last_seq", {**w, "pg": "0", "state": state},
                      lambda s: 3 * _pretrain_steps(s), base=base, integer=True)
        f.gauge(node0, "goodput_collective_oldest_inflight_seconds", {**w, "pg": "0"},
                lambda s, r=r: round(s - HANG, 3) if s >= HANG and r != 5 else 0.004)
        f.gauge(node0, "goodput_flight_recorder_dump_timestamp_seconds", w,
                lambda s: float(f.t0 + math.floor(s / 20) * 20))
        if r == 5:
            f.gauge(node0, "goodput_collective_missing_rank", {**w, "pg": "0", "seq": "48001", "op": "all_reduce"},
                    lambda s: 1.0 if s >= HANG + 20 else None)
    # pretrain is named across its runs (GOODPUT_JOB): the crash's restart came as a second run, its lineage
    for run, since in (("pretrain-1", -5400.0), ("pretrain-2", float(RESTARTED))):
        f.gauge(node0, "goodput_workload_run_start_timestamp_seconds", {"workload": "pretrain", "run": run},
                lambda s, since=since: float(f.t0 + since) if s >= since else None)
    for r in range(4):
        w = {"workload": "finetune", "rank": str(r)}
        shares = {"compute": 0.52, "data_wait": 0.23, "comm_wait": 0.12, "untracked": 0.13}

        def alive(v: float) -> Callable[[float], float | None]:
            return lambda s: v if finetune(s) else None
        for phase in PHASES:
            f.counter(node1, "goodput_phase_seconds_total", {**w, "phase": phase}, alive(shares.get(phase, 0.0)))
        f.counter(node1, "goodput_elapsed_seconds_total", w, alive(1.0))
        f.counter(node1, "goodput_downtime_seconds_total", w, alive(0.0))
        f.counter(node1, "goodput_wasted_seconds_total", w, alive(0.0))
        f.counter(node1, "goodput_wasted_compute_seconds_total", w, alive(0.0))
        f.counter(node1, "goodput_steps_total", w, alive(1.0), integer=True)
        f.counter(node1, "goodput_tokens_total", w, alive(4096.0))
        f.counter(node1, "goodput_model_flops_total", {**w, "dtype": "bf16"}, alive(1.1e14))
        f.counter(node1, "goodput_step_duration_seconds_sum", w, alive(1.0))
        f.counter(node1, "goodput_step_duration_seconds_count", w, alive(1.0), integer=True)
        # a target and no baseline: the forecast reads the 1h median step time
        f.counter(node1, "goodput_step_number", w, alive(1.0), integer=True)
        f.gauge(node1, "goodput_target_step_number", w, alive(5000.0))
        f.gauge(node1, "goodput_step_time_seconds", {**w, "window": "1h"}, alive(1.0))
        f.gauge(node1, "goodput_workload_last_event_timestamp_seconds", w,
                lambda s: float(f.t0 + math.floor(s)) if finetune(s) else None)
        f.events(node1, "goodput_workload_restarts_total", w, [], present=finetune)
        # every rank slows down at once: a regression of the job, not a straggler
        f.events(node1, "goodput_step_time_shifts_total", {**w, "direction": "up"}, [30 * 60 + 5 * r],
                 present=finetune)
        f.events(node1, "goodput_step_time_shifts_total", {**w, "direction": "down"}, [], present=finetune)


def _pipelines(f: Fleet, node: Target) -> None:
    """Two more jobs a step a second, all hour: `pipeline`, two stages of two replicas (their roles), the last stage
    computing twice as long by construction (the stage-imbalance ticket), its bubbles untracked, its collectives timed
    on the GPU (NCCL's durations: the GPU-side wait); and `shuffled`, four ranks each waiting half of every step for
    another in turn (the random-kind ticket: their own times differ a little on average, 0.5 to 0.8 s, and much from
    step to step, their goodput_step_own_variation_ratio 0.15; the pipeline's work is steady, 0.01)."""
    for name, ranks in (("pipeline", 4), ("shuffled", 4)):
        for r in range(ranks):
            w = {"workload": name, "rank": str(r)}
            stage = r % 2
            shares = ({"compute": 0.25 * (1 + stage), "comm_wait": 0.5 - 0.25 * stage, "untracked": 0.25}
                      if name == "pipeline" else {"compute": 0.8 - 0.1 * r, "comm_wait": 0.2 + 0.1 * r})
            f.gauge(node, "goodput_step_own_variation_ratio", w,
                    lambda s, v=0.01 if name == "pipeline" else 0.15: v)
            for phase in PHASES:
                share = shares.get(phase, 0.0)
                f.counter(node, "goodput_phase_seconds_total", {**w, "phase": phase}, lambda s, v=share: v)
            for metric in ("goodput_elapsed_seconds_total", "goodput_step_duration_seconds_sum"):
                f.counter(node, metric, w, lambda s: 1.0)
            for metric in ("goodput_steps_total", "goodput_step_duration_seconds_count"):
                f.counter(node, metric, w, lambda s: 1.0, integer=True)
            if name == "pipeline":
                f.gauge(node, "goodput_rank_role_info",
                        {**w, "pipeline_stage": str(stage), "data_parallel_rank": str(r // 2)}, lambda s: 1.0)
                f.counter(node, "goodput_collective_duration_seconds_sum", {**w, "pg": "0", "op": "all_reduce"},
                          lambda s, stage=stage: 0.2 - 0.1 * stage)


def _label_sets(engine: Engine, native: Native, model: str) -> list[tuple[dict[str, str], float]]:
    """The engine's own label sets on `native`, each with its share of the requests."""
    sets: list[tuple[dict[str, str], float]] = [({}, 1.0)]
    if native.match:  # one kind of a per-kind gauge family: request_type="active"
        label, value = native.match.split("=", 1)
        sets = [({label: value.strip('"')}, 1.0)]
    for label in native.labels:
        values = {model: 1.0} if label == engine.model_label else LABEL_VALUES[label]
        if values is not None:
            sets = [({**labels, label: value}, share * part)
                    for labels, share in sets for value, part in values.items()]
    return sets


def _custom_ttft(engine: Engine) -> Engine:
    natives = engine.signals["time_to_first_token"]
    custom = dataclasses.replace(natives[0], buckets=tuple(b for b in natives[0].buckets if b != 1.0))
    return dataclasses.replace(engine, signals={**engine.signals, "time_to_first_token": (custom, *natives[1:])})


def _triton(engine: Engine) -> Engine:
    """Triton with a first-response histogram (its buckets are set per model): milliseconds, no bound at 1000."""
    natives = engine.signals["time_to_first_token"]
    ms = dataclasses.replace(natives[0], buckets=(100.0, 250.0, 500.0, 2500.0, 5000.0))
    return dataclasses.replace(engine, signals={**engine.signals, "time_to_first_token": (ms, *natives[1:])})


def _serving_gauge(signal: str, rate: float, hot: bool, s: float) -> float:
    overloaded = hot and OVERLOAD[0] <= s < OVERLOAD[1]
    if signal == "requests_running":
        return float(round(3 * rate))
    if signal == "requests_waiting":
        if overloaded:
            return float(round(12 + 6 * _wave(s, 120)))
        return 0.0 if s < OVERLOAD[0] or s >= 45 * 60 else 1.0
    return 0.97 if overloaded else round(0.45 + 0.1 * _wave(s, 360), 3)  # KV cache usage


def _per_request(signal: str, hot: bool, s: float) -> float:
    if signal == "preemptions":
        return 0.2 if hot and OVERLOAD[0] <= s < OVERLOAD[1] else 0.0
    return {"prompt_tokens": 900.0, "generation_tokens": 180.0}.get(signal, 1.0)


def _serving(f: Fleet, node2: Target) -> None:
    def load(base: float, hot: bool) -> Callable[[float], float]:
        return lambda s: base * (2.4 if hot and OVERLOAD[0] <= s < OVERLOAD[1] else 1.0 + 0.2 * _wave(s, 500))

    def slow(hot: bool) -> Callable[[float], float]:
        return lambda s: 4.0 if hot and OVERLOAD[0] <= s < OVERLOAD[1] else 1.0

    pods = [
        (ENGINES["vllm"], f.target(11.9, instance="10.2.0.11:8000", job="vllm", namespace="serve",
                                   pod="llama-vllm-6d4b9c7f5-x2kq8", container="vllm"),
         "meta-llama/Llama-3.1-8B-Instruct", 5.0, True),
        (ENGINES["sglang"], f.target(23.3, instance="10.2.0.12:30000", job="sglang", namespace="serve",
                                     pod="qwen-sglang-7c9d8b6f4-p4mzt"), "Qwen/Qwen2.5-7B-Instruct", 2.0, False),
        (ENGINES["tgi"], f.target(1.1, instance="10.2.0.13:80", job="tgi", namespace="serve", pod="mistral-tgi-0",
                                  model="mistralai/Mistral-7B-Instruct-v0.3"), "", 1.0, False),
        # custom TTFT buckets without the objective's bound: its TTFT attainment cannot be judged
        (_custom_ttft(ENGINES["vllm"]), f.target(15.5, instance="10.2.0.14:8000", job="vllm", namespace="serve",
                                                 pod="phi-vllm-0", container="vllm"),
         "microsoft/Phi-3-mini-4k-instruct", 0.5, False),
        # Triton with TensorRT-LLM (its TTFT in milliseconds, no per-request TPOT), vLLM under Ray Serve
        (_triton(ENGINES["triton"]), f.target(8.7, instance="10.2.0.16:8002", job="triton", namespace="serve",
                                              pod="gemma-triton-0", container="triton"), "ensemble", 1.5, False),
        (ENGINES["ray_vllm"], f.target(27.1, instance="10.2.0.15:8080", job="ray", namespace="serve",
                                       pod="raycluster-llm-worker-gpu-8x2wq", container="ray-worker"),
         "qwen3-8b", 2.5, False),
    ]
    for engine, target, model, base, hot in pods:
        rate, factor = load(base, hot), slow(hot)
        for signal, natives in engine.signals.items():
            native = natives[0]
            for own, share in _label_sets(engine, native, model):
                if native.kind == "gauge":
                    f.gauge(target, native.name, own,
                            lambda s, g=signal, r=rate, h=hot: _serving_gauge(g, r(s), h, s))
                elif native.kind == "counter":
                    f.counter(target, native.name, own,
                              lambda s, g=signal, r=rate, h=hot, sh=share: r(s) * sh * _per_request(g, h, s),
                              base=1e5 * share, integer=True)
                else:  # a histogram in milliseconds (Triton's) observes the latencies x 1000
                    _histogram(f, target, engine, native, own, signal, lambda s, r=rate, sh=share: r(s) * sh,
                               lambda s, fa=factor, u=native.le_per: u * fa(s))
    # the client path: the serving process's own request events, on node2's daemon
    client = {"workload": "chat", "model": "m-chat"}
    rate = load(3.0, False)
    buckets = {"time_to_first_token": TTFT_BUCKETS, "time_per_output_token": TPOT_BUCKETS,
               "inter_token_latency": ITL_BUCKETS, "e2e_request_latency": E2E_BUCKETS, "queue_time": QUEUE_BUCKETS}
    for signal, bounds in buckets.items():
        native = Native(f"goodput_inference_{signal}_seconds", "histogram", (), bounds)
        _histogram(f, node2, ENGINES["vllm"], native, client, signal, rate, lambda s: 1.0)
    f.counter(node2, "goodput_inference_prompt_tokens_total", client, lambda s: 700 * rate(s), integer=True)
    f.counter(node2, "goodput_inference_generation_tokens_total", client, lambda s: 150 * rate(s), integer=True)
    for reason, part in (("stop", 0.9), ("length", 0.1)):
        f.counter(node2, "goodput_inference_requests_total", {**client, "reason": reason},
                  lambda s, p=part: p * rate(s), integer=True)
    ttft, tpot = _cdf(1.0, LATENCY["time_to_first_token"][0]), _cdf(0.1, LATENCY["time_per_output_token"][0])
    for objective, part in (("ttft", ttft), ("tpot", tpot), ("both", ttft * tpot)):
        f.counter(node2, "goodput_inference_slo_met_requests_total", {**client, "objective": objective},
                  lambda s, p=part: p * rate(s), integer=True)


def _histogram(f: Fleet, target: Target, engine: Engine, native: Native, labels: dict[str, str], signal: str,
               rate: Callable[[float], float], factor: Callable[[float], float]) -> None:
    median, per_request = LATENCY[signal]
    for bound in (*native.buckets, math.inf):
        le = "+Inf" if bound == math.inf else _le(engine, bound)
        f.counter(target, f"{native.name}_bucket", {**labels, "le": le},
                  lambda s, b=bound: per_request * rate(s) * (1.0 if b == math.inf else _cdf(b, median * factor(s))),
                  base=5000.0, integer=True)
    f.counter(target, f"{native.name}_count", labels, lambda s: per_request * rate(s), base=5000.0, integer=True)
    f.counter(target, f"{native.name}_sum", labels, lambda s: per_request * rate(s) * median * factor(s) * 1.2,
              base=5000.0 * median)


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v != "")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def write_openmetrics(series: list[Series], path: Path) -> None:
    """OpenMetrics text for promtool: each name's series together, timestamps in seconds."""
    with path.open("w") as out:
        for name in sorted({s.name for s in series}):
            out.write(f"# TYPE {name} unknown\n")
            for s in series:
                if s.name == name:
                    head = f"{name}{{{_label_text(s.labels)}}} "
                    out.writelines(f"{head}{_number(v)} {t / 1000:.3f}\n" for t, v in zip(s.times, s.values,
                                                                                           strict=True))
        out.write("# EOF\n")


def prometheus_text(series: list[Series]) -> bytes:
    """Prometheus text format with millisecond timestamps, for VictoriaMetrics' /api/v1/import/prometheus."""
    lines = []
    for s in series:
        head = f"{s.name}{{{_label_text(s.labels)}}} "
        lines += [f"{head}{_number(v)} {t}\n" for t, v in zip(s.times, s.values, strict=True)]
    return "".join(lines).encode()


# --- the rules ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    group: str
    record: str  # or the alert's name
    expr: str
    labels: tuple[tuple[str, str], ...]
    alert: bool = False

    @property
    def id(self) -> str:
        """The record (or alert) name with the rule's own labels: unique among the shipped rules."""
        return self.record + ("{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}" if self.labels else "")


def load_rules(files: Iterable[Path]) -> list[Rule]:
    rules = []
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            interval = group.get("interval", "1m")
            assert interval == "1m", f"group {group['name']}: the harness evaluates every group at 1m, not {interval}"
            for rule in group["rules"]:
                rules.append(Rule(group["name"], rule.get("record") or rule["alert"], rule["expr"],
                                  tuple(sorted((rule.get("labels") or {}).items())), "alert" in rule))
    return rules


def levels(rules: list[Rule]) -> list[list[Rule]]:
    """Recording rules by dependency level: a rule comes after every rule recording a name its expression reads."""
    recorded = {r.record for r in rules}
    reads = {r: {t for t in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r.expr) if t in recorded} for r in rules}
    level: dict[str, int] = {}
    for _ in range(len(rules) + 1):
        changed = False
        for r in rules:
            mine = 1 + max((level.get(name, 0) for name in reads[r]), default=0)
            if level.get(r.record, 0) < mine:
                level[r.record], changed = mine, True
        if not changed:
            break
    else:
        raise ValueError("the recording rules read each other in a cycle")
    out: list[list[Rule]] = [[] for _ in range(max(level.values()))]
    for r in rules:
        out[level[r.record] - 1].append(r)
    return out


def rule_file(rules: list[Rule]) -> str:
    groups: dict[str, list[dict[str, object]]] = {}
    for r in rules:
        entry: dict[str, object] = {"record": r.record, "expr": r.expr}
        if r.labels:
            entry["labels"] = dict(r.labels)
        groups.setdefault(r.group, []).append(entry)
    return yaml.safe_dump({"groups": [{"name": name, "interval": "1m", "rules": rs} for name, rs in groups.items()]},
                          sort_keys=False, width=1000)


# --- the engines -------------------------------------------------------------------------------------------------


class EngineError(RuntimeError):
    pass


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        package = "prometheus" if name in ("prometheus", "promtool") else "victoria-metrics"
        raise EngineError(f"{name} is not installed (Debian: apt-get install {package}; `make deps` does it)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, data: bytes | None = None, timeout: float = 60, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as e:
        raise EngineError(f"{url[:300]}: {e.code} {e.read()[:500]!r}") from e


STALE = struct.pack("<Q", 0x7FF0000000000002)  # Prometheus's staleness marker: a NaN with this bit pattern


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _snappy(data: bytes) -> bytes:
    """Snappy's block format with literals only: valid input for any decoder, no compression needed here."""
    out = bytearray(_varint(len(data)))
    for i in range(0, len(data), 65536):
        chunk = data[i:i + 65536]
        n = len(chunk) - 1
        out += bytes([n << 2]) if n < 60 else bytes([61 << 2]) + n.to_bytes(2, "little")
        out += chunk
    return bytes(out)


Points = list[tuple[int, bytes]]  # (ms, the value's 8 bytes, little-endian)


def points(times: list[int], values: list[float], stale: Iterable[int] = ()) -> Points:
    merged = [(t, struct.pack("<d", v)) for t, v in zip(times, values, strict=True)] + [(t, STALE) for t in stale]
    return sorted(merged)


def remote_write(url: str, series: list[tuple[dict[str, str], Points]]) -> None:
    """Prometheus remote write (protobuf WriteRequest, snappy) of `series` (labels with __name__), in batches."""
    batch: list[bytes] = []
    size = 0

    def send() -> None:
        _http(url, _snappy(b"".join(batch)), headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0"})

    for labels, pts in series:
        if not pts:
            continue
        body = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode()))
                        for k, v in sorted(labels.items()) if v != "")
        body += b"".join(_field(2, b"\x09" + value + b"\x10" + _varint(t)) for t, value in pts)
        batch.append(_field(1, body))
        size += len(pts)
        if size >= 20000:
            send()
            batch, size = [], 0
    if batch:
        send()


def markers(times: Iterable[int], grid: list[int]) -> list[int]:
    """Where a ruler writes staleness markers for a recorded series present at `times` of its evaluations `grid`:
    at each evaluation that no longer has it."""
    present = set(times)
    return [t for prev, t in itertools.pairwise(grid) if prev in present and t not in present]


class Server:
    """A server process on 127.0.0.1 with its log in the work dir; stop() in a finally."""

    def __init__(self, name: str, work: Path, ready_path: str) -> None:
        self.name, self.work, self.ready_path = name, work, ready_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        raise NotImplementedError

    def owned(self) -> bool:
        """Whether the server answering on the port is this one (another process may have taken the free port)."""
        raise NotImplementedError

    def start(self, attempts: int = 3) -> None:
        with (self.work / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if attempts > 1 and "address already in use" in self.log_tail():  # the free port was taken
                    self.port = free_port()
                    return self.start(attempts - 1)
                raise EngineError(f"{self.name} exited: {self.log_tail()}")
            try:
                if _http(self.url + self.ready_path, timeout=2) is not None and self.owned():
                    return
            except (OSError, EngineError):
                pass
            time.sleep(0.1)
        raise EngineError(f"{self.name} not ready in 60 s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log_tail(self) -> str:
        path = self.work / f"{self.name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def query_range(self, expr: str, start: int, end: int, step: int, **extra: str) -> list[dict]:  # type: ignore[type-arg]
        body = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step, **extra}).encode()
        answer = json.loads(_http(self.url + "/api/v1/query_range", body))
        return list(answer["data"]["result"])

    def query(self, expr: str, at: int) -> list[dict]:  # type: ignore[type-arg]
        body = urllib.parse.urlencode({"query": expr, "time": at}).encode()
        return list(json.loads(_http(self.url + "/api/v1/query", body))["data"]["result"])


class Prometheus(Server):
    def __init__(self, work: Path) -> None:
        super().__init__("prometheus", work, "/-/ready")
        self.data = work / "prometheus-data"
        self.data.mkdir(parents=True, exist_ok=True)
        # recorded series and staleness markers come by remote write, older than the blocks: out of order
        (work / "prometheus.yml").write_text("storage:\n  tsdb:\n    out_of_order_time_window: 30d\n")

    def args(self) -> list[str]:
        return [binary("prometheus"), f"--config.file={self.work / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.data}", f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=10y", "--web.enable-remote-write-receiver", "--log.level=warn"]

    def owned(self) -> bool:
        flags = json.loads(_http(self.url + "/api/v1/status/flags", timeout=2))["data"]
        return bool(flags.get("storage.tsdb.path") == str(self.data))

    def load(self, series: list[Series]) -> None:
        """Blocks of `series` in the data dir, Prometheus started on them, then their staleness markers written."""
        path = self.work / "history.om"
        write_openmetrics(series, path)
        done = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(path),
                               str(self.data)], capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise EngineError(f"promtool tsdb create-blocks-from openmetrics: {done.stderr[-2000:]}")
        path.unlink()
        self.start()
        self.write([({**s.labels, "__name__": s.name}, points([], [], s.stale)) for s in series])

    def write(self, series: list[tuple[dict[str, str], Points]]) -> None:
        remote_write(self.url + "/api/v1/write", series)


class Victoria(Server):
    def __init__(self, work: Path) -> None:
        super().__init__("victoria-metrics", work, "/health")
        self.data = work / "vm-data"
        self.lagged: list[str] = []  # what a search missed right after a write and a flush

    def args(self) -> list[str]:
        return [binary("victoria-metrics"), f"-storageDataPath={self.data}", f"-httpListenAddr=127.0.0.1:{self.port}",
                "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s", "-loggerLevel=WARN"]

    def owned(self) -> bool:
        return f'-storageDataPath="{self.data}"' in _http(self.url + "/flags", timeout=2).decode()

    def load(self, series: list[Series]) -> None:
        """`series` through /api/v1/import/prometheus, their staleness markers by remote write."""
        _http(self.url + "/api/v1/import/prometheus", prometheus_text(series), timeout=300)
        self.write([({**s.labels, "__name__": s.name}, points([], [], s.stale)) for s in series])
        first, last = min(s.times[0] for s in series) // 1000, max(s.times[-1] for s in series) // 1000 + 1
        self.wait_visible('{__name__=~".+"}', first, last, sum(len(s.times) for s in series),
                          sum(len(s.stale) for s in series))

    def wait_visible(self, match: str, start: int, end: int, samples: int, stale: int) -> None:
        """Flush until queries see exactly `samples` samples and `stale` staleness markers of `match`: a series
        just written is sometimes missing from a search right after /internal/force_flush."""
        deadline = time.monotonic() + 30
        while True:
            self.flush()
            values = [v for s in self.export(match, start, end) for v in s["values"]]
            seen = (sum(v is not None for v in values), sum(v is None for v in values))
            if seen == (samples, stale):
                return
            self.lagged.append(f"{match[:60]}: {seen} of {(samples, stale)} (samples, staleness markers)")
            if time.monotonic() > deadline:
                raise EngineError(f"VictoriaMetrics shows {seen} (samples, staleness markers) of {match}, "
                                  f"not the {(samples, stale)} written")
            time.sleep(0.2)

    def write(self, series: list[tuple[dict[str, str], Points]]) -> None:
        remote_write(self.url + "/api/v1/write", series)

    def flush(self) -> None:
        _http(self.url + "/internal/force_flush")

    def replay(self, rules_path: Path, start: int, end: int) -> int:
        """vmalert's replay of the rule file, in LOOKBACK // INTERVAL runs one interval apart (see the docstring);
        returns the samples vmalert wrote."""
        imported = 0
        for k in range(LOOKBACK // INTERVAL):
            frm = datetime.fromtimestamp(start + k * INTERVAL, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            to = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            done = subprocess.run([binary("vmalert"), f"-rule={rules_path}", f"-datasource.url={self.url}",
                                   f"-remoteWrite.url={self.url}", f"-replay.timeFrom={frm}", f"-replay.timeTo={to}",
                                   f"-datasource.queryStep={LOOKBACK}s", "-replay.rulesDelay=0s",
                                   "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0"],
                                  capture_output=True, text=True, timeout=300)
            with (self.work / "vmalert.log").open("a") as log:
                log.write(f"--- {rules_path.name} from {frm}\n{done.stdout}{done.stderr}")
            total = re.search(r"replay finished! Imported (\d+) samples", done.stderr)
            # vmalert drops what it could not send after its retries, and still exits 0
            if done.returncode or total is None or re.search(r"\t(warn|error|fatal)\t", done.stderr):
                raise EngineError(f"vmalert replay of {rules_path.name} from {frm}: {done.stderr[-3000:]}")
            imported += int(total.group(1))
        return imported

    def export(self, match: str, start: int, end: int) -> list[dict]:  # type: ignore[type-arg]
        body = urllib.parse.urlencode({"match[]": match, "start": start, "end": end}).encode()
        return [json.loads(line) for line in _http(self.url + "/api/v1/export", body).splitlines() if line]

    def query_range_live(self, expr: str, start: int, end: int) -> list[dict]:  # type: ignore[type-arg]
        """A live vmalert's answers at every interval: range queries at its 5m step, one interval apart, merged."""
        merged: dict[str, dict] = {}  # type: ignore[type-arg]
        for k in range(LOOKBACK // INTERVAL):
            for s in self.query_range(expr, start + k * INTERVAL, end, LOOKBACK, nocache="1"):
                key = json.dumps(s["metric"], sort_keys=True)
                merged.setdefault(key, {"metric": s["metric"], "values": []})["values"] += s["values"]
        for s in merged.values():
            s["values"].sort(key=lambda v: float(v[0]))
        return list(merged.values())


# --- evaluation and comparison -----------------------------------------------------------------------------------

Key = tuple[tuple[str, str], ...]  # a series' labels, __name__ included, sorted


def _key(metric: dict[str, str]) -> Key:
    return tuple(sorted((k, v) for k, v in metric.items() if v != ""))


def evaluate_prometheus(prom: Prometheus, rule_levels: list[list[Rule]], start: int, end: int,
                        since: int) -> tuple[list[str], dict[str, int]]:
    """Each level's range queries on Prometheus, written back with their staleness markers before the next level;
    returns errors, and each rule's series with a sample from `since` on."""
    errors: list[str] = []
    produced: dict[str, int] = {}
    grid = list(range(start * 1000, end * 1000 + 1, INTERVAL * 1000))
    for rules in rule_levels:
        out: list[tuple[dict[str, str], Points]] = []
        for rule in rules:
            seen: set[Key] = set()
            try:
                result = prom.query_range(rule.expr, start, end, INTERVAL)
            except EngineError as e:
                errors.append(f"{rule.record} ({rule.group}): {e}")
                continue
            produced[rule.id] = sum(1 for s in result if float(s["values"][-1][0]) >= since)
            for s in result:
                labels = {**s["metric"], **dict(rule.labels), "__name__": rule.record}
                key = _key(labels)
                if key in seen:
                    errors.append(f"{rule.record}: two results with the labels {dict(key)}")
                    continue
                seen.add(key)
                times = [round(float(t) * 1000) for t, _ in s["values"]]
                stale = markers(times, grid)
                out.append((labels, points([t - WRITTEN_BEFORE for t in times], [float(v) for _, v in s["values"]],
                                           [t - WRITTEN_BEFORE for t in stale])))
        prom.write(out)
    return errors, produced


def evaluate_vmalert(vm: Victoria, rule_levels: list[list[Rule]], start: int, end: int, work: Path) -> None:
    """Each level replayed by vmalert, then the staleness markers a live vmalert writes added, before the next."""
    grid = list(range(start * 1000, end * 1000 + 1, INTERVAL * 1000))
    for n, rules in enumerate(rule_levels, 1):
        path = work / f"level{n}.rules.yml"
        path.write_text(rule_file(rules))
        imported = vm.replay(path, start, end)
        names = json.dumps("|".join(sorted({re.escape(r.record) for r in rules})))
        match = f"{{__name__=~{names}}}"
        vm.wait_visible(match, start, end, imported, 0)
        stale = []
        for s in vm.export(match, start, end):
            times = [t for t, v in zip(s["timestamps"], s["values"], strict=True) if v is not None]
            stale.append((s["metric"], points([], [], markers(times, grid))))
        vm.write(stale)
        vm.wait_visible(match, start, end, imported, sum(len(pts) for _, pts in stale))


Samples = dict[Key, dict[int, float]]  # series -> {ms: value}


def prometheus_samples(prom: Prometheus, names: list[str], start: int, end: int) -> Samples:
    """Prometheus's recorded series, at the instants they were evaluated at (see WRITTEN_BEFORE)."""
    out: Samples = {}
    for name in names:
        for s in prom.query(f"{{__name__={json.dumps(name)}}}[{end - start + 1}s]", end):
            points = {round(float(t) * 1000) + WRITTEN_BEFORE: float(v) for t, v in s["values"]}
            out[_key(s["metric"])] = {t: v for t, v in points.items() if t >= start * 1000}
    return out


def victoria_samples(vm: Victoria, names: list[str], start: int, end: int) -> Samples:
    out: Samples = {}
    for name in names:
        for s in vm.export(f"{{__name__={json.dumps(name)}}}", start, end):
            values = dict(zip(s["timestamps"], s["values"], strict=True))
            out[_key(s["metric"])] = {int(t): float(v) for t, v in values.items()
                                      if start * 1000 <= t <= end * 1000 and v is not None and not math.isnan(v)}
    return out


def range_samples(result: list[dict]) -> Samples:  # type: ignore[type-arg]
    """An alert expression's results by their labels (an alert's labels leave out __name__)."""
    out: Samples = {}
    for s in result:
        key = _key({k: v for k, v in s["metric"].items() if k != "__name__"})
        out.setdefault(key, {}).update({round(float(t) * 1000): float(v) for t, v in s["values"]})
    return out


@dataclass
class Difference:
    """How one rule's (or alert expression's) results differ between the engines."""

    name: str
    series_prometheus: int = 0
    series_victoria: int = 0
    samples_prometheus: int = 0
    samples_victoria: int = 0
    compared: int = 0  # samples present on both
    differing: int = 0  # ... of which apart by more than the tolerance
    max_relative: float = 0.0  # the largest |a - b| / max(|a|, |b|) among them
    only_prometheus: int = 0  # samples (of series on both sides, or not) on one side only
    only_victoria: int = 0
    worst: str = ""  # where the largest difference is, for the report
    examples: list[str] = field(default_factory=list)
    relative: list[float] = field(default_factory=list, repr=False)  # |a - b| / max(|a|, |b|) of each sample

    @property
    def agrees(self) -> bool:
        return not (self.differing or self.only_prometheus or self.only_victoria)


def _agree(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(REL_TOL * max(abs(a), abs(b)), ABS_TOL) or a == b


def compare(name: str, prom: Samples, vm: Samples, t0: int) -> Difference:
    d = Difference(name, len(prom), len(vm), sum(map(len, prom.values())), sum(map(len, vm.values())))
    for key in sorted(set(prom) | set(vm)):
        p, v = prom.get(key, {}), vm.get(key, {})
        labels = ",".join(f"{k}={v}" for k, v in key if k != "__name__")
        for t in sorted(set(p) | set(v)):
            at = f"{{{labels}}} at +{(t / 1000 - t0) / 60:.1f}m"
            if t not in v:
                d.only_prometheus += 1
                if len(d.examples) < 6:
                    d.examples.append(f"Prometheus only: {p[t]:.6g} {at}")
                continue
            if t not in p:
                d.only_victoria += 1
                if len(d.examples) < 6:
                    d.examples.append(f"vmalert only: {v[t]:.6g} {at}")
                continue
            d.compared += 1
            a, b = p[t], v[t]
            d.relative.append(0.0 if a == b else 1.0 if math.isnan(a) or math.isnan(b)
                              else abs(a - b) / max(abs(a), abs(b)))
            if not _agree(a, b):
                d.differing += 1
                rel = 1.0 if math.isnan(a) or math.isnan(b) else abs(a - b) / max(abs(a), abs(b))
                if rel > d.max_relative:
                    d.max_relative, d.worst = rel, f"Prometheus {a:.6g} vs vmalert {b:.6g} {at}"
                if len(d.examples) < 6:
                    d.examples.append(f"Prometheus {a:.6g} vs vmalert {b:.6g} {at}")
    return d


@dataclass
class Report:
    t0: int
    rules: list[Rule]
    levels: int
    recorded: dict[str, Difference]  # record name -> its series compared (vmalert's replay against Prometheus)
    alerts: dict[str, Difference]  # alert name -> its expression compared
    instant: dict[str, Difference]  # record name -> vmalert's live (instant) evaluation against Prometheus's
    produced: dict[str, tuple[int, int]]  # rule id -> series in the compared hour on (Prometheus, vmalert)
    errors: list[str]
    seconds: dict[str, float]  # phase -> wall time
    lagged: list[str]  # VictoriaMetrics searches that missed data right after it was written and flushed

    def table(self) -> str:
        lines = []
        for kind, diffs in (("record", self.recorded), ("alert", self.alerts), ("instant", self.instant)):
            for name, d in sorted(diffs.items()):
                state = "ok" if d.agrees else (f"{d.differing}/{d.compared} differ (max {d.max_relative:.2%}), "
                                                f"{d.only_prometheus} Prometheus only, {d.only_victoria} vmalert only")
                lines.append(f"{kind} {name}: series {d.series_prometheus}/{d.series_victoria}, samples "
                             f"{d.samples_prometheus}/{d.samples_victoria}: {state}")
                if not d.agrees:
                    lines += [f"    worst: {d.worst}"] + [f"    {e}" for e in d.examples]
        lines += [f"no result: {rule} (Prometheus {p}, vmalert {v} series)"
                  for rule, (p, v) in sorted(self.produced.items()) if not (p and v)]
        return "\n".join(lines)


def instant_samples(vm: Victoria, rules: list[Rule], start: int, end: int) -> Samples:
    """The rules' expressions as a live vmalert evaluates them: an instant query at each interval, step 5m."""
    out: Samples = {}
    for rule in rules:
        for at in range(start, end + 1, INTERVAL):
            body = urllib.parse.urlencode({"query": rule.expr, "time": at, "step": f"{LOOKBACK}s", "nocache": "1"})
            for s in json.loads(_http(vm.url + "/api/v1/query", body.encode()))["data"]["result"]:
                key = _key({**s["metric"], **dict(rule.labels), "__name__": rule.record})
                out.setdefault(key, {})[at * 1000] = float(s["value"][1])
    return out


def run(work: Path, rules_dir: Path = RULES, now: float | None = None, instant: Iterable[str] = ()) -> Report:
    """The whole comparison in `work` (a fresh directory); every process is stopped before it returns. The
    recording rules named in `instant` are also evaluated as a live vmalert does, by instant queries on
    VictoriaMetrics (reading vmalert's replayed inputs), and compared with Prometheus's."""
    clock = time.monotonic()
    seconds: dict[str, float] = {}
    now = time.time() if now is None else now
    t0 = int(now - 2 * HOUR) // HOUR * HOUR  # the compared hour ends at least an hour before now
    rules = load_rules(sorted(rules_dir.glob("*.rules.yml")))
    assert len({r.id for r in rules}) == len(rules), "two rules with the same name and labels"
    recording = [r for r in rules if not r.alert]
    rule_levels = levels(recording)
    series = fleet(t0)
    seconds["data"] = time.monotonic() - clock
    prom, vm = Prometheus(work), Victoria(work)
    start, end = t0 + EVAL_FROM, t0 + HOUR
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            def prometheus_side() -> tuple[list[str], dict[str, int]]:
                began = time.monotonic()
                prom.load(series)
                seconds["prometheus load"] = time.monotonic() - began
                result = evaluate_prometheus(prom, rule_levels, start, end, t0)
                seconds["prometheus rules"] = time.monotonic() - began - seconds["prometheus load"]
                return result

            def victoria_side() -> None:
                began = time.monotonic()
                vm.start()
                vm.load(series)
                seconds["victoria load"] = time.monotonic() - began
                evaluate_vmalert(vm, rule_levels, start, end, work)
                seconds["vmalert rules"] = time.monotonic() - began - seconds["victoria load"]

            prom_future, vm_future = pool.submit(prometheus_side), pool.submit(victoria_side)
            errors, prom_produced = prom_future.result()
            vm_future.result()
        began = time.monotonic()
        names = sorted({r.record for r in recording})
        p, v = prometheus_samples(prom, names, t0, end), victoria_samples(vm, names, t0, end)

        def named(samples: Samples, name: str) -> Samples:
            return {k: s for k, s in samples.items() if dict(k)["__name__"] == name}

        recorded = {name: compare(name, named(p, name), named(v, name), t0) for name in names}
        alerts, produced = {}, {}
        for rule in rules:
            if rule.alert:
                prom_result = range_samples(prom.query_range(rule.expr, t0, end, INTERVAL))
                vm_result = range_samples(vm.query_range_live(rule.expr, t0, end))
                alerts[rule.record] = compare(rule.record, prom_result, vm_result, t0)
                produced[rule.id] = (len(prom_result), len(vm_result))
            else:
                produced[rule.id] = (prom_produced.get(rule.id, 0), len(vm.query_range_live(rule.expr, t0, end)))
        live = {name: compare(name, named(p, name), instant_samples(vm, [r for r in recording if r.record == name],
                                                                    t0, end), t0) for name in instant}
        seconds["compare"] = time.monotonic() - began
    finally:
        prom.stop()
        vm.stop()
    seconds["total"] = time.monotonic() - clock
    return Report(t0, rules, len(rule_levels), recorded, alerts, live, produced, errors, seconds, vm.lagged)


def measured(report: Report) -> dict[str, tuple[float, int, int, int]]:
    """Every comparison that does not agree: name (alerts as alert:Name) -> (largest relative difference, rounded
    up to 0.1%; samples apart by more than REL_TOL; samples on Prometheus's side only; on vmalert's only)."""
    out = {}
    for prefix, diffs in (("", report.recorded), ("alert:", report.alerts)):
        for name, d in sorted(diffs.items()):
            if not d.agrees:
                out[prefix + name] = (math.ceil(d.max_relative * 1000) / 1000, d.differing, d.only_prometheus,
                                      d.only_victoria)
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = run(Path(tmp))
    if sys.argv[1:] == ["--measured"]:  # test_rules_equivalence's KNOWN and KNOWN_ALERTS, causes "?" where new
        from test_rules_equivalence import KNOWN, KNOWN_ALERTS

        for name, numbers in measured(report).items():
            known = KNOWN_ALERTS.get(name.removeprefix("alert:")) if name.startswith("alert:") else KNOWN.get(name)
            causes = ", ".join(f'"{cause}"' for cause in (known.causes if known else ("?",)))
            causes += "," if causes.count('"') == 2 else ""
            print(f'    "{name.removeprefix("alert:")}": Known(({causes}), {", ".join(map(str, numbers))}),')
    else:
        print(report.table())
    print(f"levels: {report.levels}; errors: {report.errors}", file=sys.stderr)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items()), file=sys.stderr)
