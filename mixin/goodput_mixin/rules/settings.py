"""The one place thresholds, windows and label names of the rules live; rules/ is generated from it.

Defaults are what `rules/` ships; `goodput-exporter rules --settings FILE` renders the same rules with
a YAML file's overrides (unknown keys are errors, as in the daemon's config).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from exporter.core.settings import ConfigError
from exporter.health.risk import DRAIN, xids_at

_RANGE = re.compile(r"^\d+[smhd]$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _range(value: str) -> str:
    if not _RANGE.match(value):
        raise ValueError(f"{value!r} is not a PromQL range like 5m or 1h")
    return value


def seconds(range_: str) -> int:
    return int(range_[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[range_[-1]]


# the latency objectives by name (objectives.OBJECTIVES)
Objective = Literal["ttft", "tpot"]


class Objectives(BaseModel):
    """Latency objectives of served requests, and the share of requests that must meet them."""

    model_config = ConfigDict(extra="forbid")

    ttft_seconds: float = Field(1.0, gt=0, description="Time to first token, at most.")
    tpot_seconds: float = Field(0.1, gt=0, description="Time per output token after the first (a request's mean), "
                                "at most.")
    target: float = Field(0.99, gt=0, lt=1, description="Share of requests that must meet both.")
    unjudged: list[Objective] = Field(
        default_factory=list, description="Objectives the engine is known not to judge (TGI: ttft; Triton: tpot): "
        "GoodputInferenceSLOUnmeasured does not fire for them. Nothing else changes: a model's SLO goodput stays "
        "absent where an objective is not judged, and one the engine does judge after all is still judged.")


class ObjectivesPart(BaseModel):
    """Some of the objectives, over others."""

    model_config = ConfigDict(extra="forbid")

    ttft_seconds: float | None = Field(None, gt=0)
    tpot_seconds: float | None = Field(None, gt=0)
    target: float | None = Field(None, gt=0, lt=1)
    unjudged: list[Objective] | None = Field(None)


class ObjectivesOverride(ObjectivesPart):
    model: str | None = Field(None, min_length=1, description="The served model (the engine's model label); "
                              "absent: every model.")
    engine: str | None = Field(None, description="The engine; absent: every engine of inference_engines.")


def _tgi_bound(near: float) -> float:
    """The bound of TGI's duration buckets nearest `near` (router/src/server.rs: 0.0001 times 1.5, again and again)."""
    from .engines import ENGINES

    bounds = ENGINES["tgi"].signals["time_per_output_token"][0].buckets
    return min(bounds, key=lambda b: abs(b - near))


TGI_TPOT_OBJECTIVE = _tgi_bound(0.1)


class RulesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    windows: list[str] = Field(
        ["5m", "1h"], description="Rate windows of the recording rules, shortest first; the last is the "
        "baseline the short window is compared with.")
    slow_groups_interval: str = Field(
        "1m", description="How often the groups that change slowly are evaluated: the longer windows (averages of "
        "what the short-window rules recorded) and the DCGM activity classes.")
    node_label: str = Field(
        "instance", description="Label that names a node on the exporter's series (instance unless "
        "relabeling adds e.g. node).")
    cluster_label: str = Field(
        "cluster", description="Label that names a cluster (an external label); absent is fine.")
    global_view: bool = Field(
        False, description="Rules for a ruler that reads many clusters' series from one store (VictoriaMetrics with "
        "vmalert, Thanos, Mimir: docs/scale-out.md): alert descriptions name the cluster, and "
        "GoodputClusterNotReporting pages when a cluster that reported within cluster_not_reporting_window sends "
        "nothing (its agent or its remote write is down). Off for a Prometheus per cluster, which cannot page on "
        "its own silence; every aggregation and join carries the cluster label either way.")
    memory_predict_window: str = Field("30m", description="History predict_linear() fits GPU memory on.")
    memory_predict_horizon: str = Field("1h", description="How far ahead GPU memory use is predicted.")
    goodput_trend_window: str = Field("1h", description="Window of deriv() over the short-window goodput.")
    underused_sm_active_ratio: float = Field(
        0.5, gt=0, le=1, description="Activity class: a GPU whose SMs were active less than this share of "
        "the short window is underused (DCGM's guidance: below 0.5 the GPU is used ineffectively).")
    compute_bound_pipe_ratio: float = Field(
        0.5, gt=0, le=1, description="Activity class: a busier GPU whose tensor or FP16/32/64 pipes were active "
        "at least this share is compute-bound.")
    memory_bound_dram_ratio: float = Field(
        0.5, gt=0, le=1, description="Activity class: a busier GPU, not compute-bound, whose memory interface "
        "was active at least this share is memory-bound.")
    fabric_error_counters: list[str] = Field(
        ["symbol_error", "port_rcv_errors", "local_link_integrity_errors", "port_rcv_remote_physical_errors",
         "excessive_buffer_overrun_errors"],
        description="Link errors of an RDMA port (the `counter` values of goodput_fabric_port_errors_total) summed "
        "into link:goodput_fabric_link_errors:rate5m, which GoodputFabricErrors judges: errors of the wire and its "
        "ends. Discards, VL15 drops and constraint (partition) errors are left out: they count drops and "
        "configuration, not a bad link. An interface's are its receive errors (rx_errors, CRC errors among them).")
    # --- alerts -----------------------------------------------------------------------------------
    runbook_base_url: str = Field(
        "https://github.com/goodput-exporter/goodput-exporter/blob/main/docs/runbooks",
        description="Where the runbooks (docs/runbooks/ of this repository) are served; point it at your copy.")
    exporter_job: str = Field("goodput-exporter", description="The Prometheus job scraping the exporter.")
    goodput_drop_ratio: float = Field(
        0.3, gt=0, lt=1, description="GoodputDrop: tokens/s or goodput this much below the workload's baseline.")
    goodput_drop_for: str = Field("15m", description="GoodputDrop: for how long.")
    wasted_progress_window: str = Field(
        "1h", description="GoodputWastedProgress: the window the seconds of steps redone after restarts are counted "
        "over (workload:goodput_wasted_seconds:increase1h, the average of the short-window rate over it); at least "
        "the short window.")
    wasted_progress_ratio: float = Field(
        0.05, gt=0, lt=1, description="GoodputWastedProgress: share of the window spent redoing steps lost to "
        "restarts (the progress since the last checkpoint, each time).")
    forecast_stale_window: str = Field(
        "10m", description="Forecast: a workload whose step number did not change within this window has no "
        "forecast of its finish (a job that stopped stepping, hung or done, is not forecast to finish in years).")
    forecast_interruptions_per_gpu_hour: float = Field(
        2e-5, gt=0, description="Forecast: the interruptions per GPU-hour assumed before the cluster has observed "
        "any (the prior of every estimate, worth one interruption). Llama 3's pre-training saw 419 unexpected "
        "interruptions in 54 days on 16,384 H100 GPUs: 419 / (54 x 24 x 16,384) = 2.0e-5 (Dubey et al., The Llama 3 "
        "Herd of Models, 2024, section 3.3.4).")
    forecast_interruption_cost: str = Field(
        "15m", description="Forecast: the downtime and lost progress assumed for one interruption before the cluster "
        "has seen any (the prior of the cluster's mean cost, worth one interruption, which is in turn the prior of "
        "each workload's own mean): detecting the failure, rescheduling, and redoing the steps since the last "
        "checkpoint.")
    forecast_best_memory: str = Field(
        "6h", description="Forecast: the window of a workload's best sustained goodput (workload:goodput_ratio:best1h, "
        "the maximum of its 1h goodput over this window), which keeps it through a gap shorter than the window, e.g. "
        "a Prometheus restart.")
    deadline_at_risk_for: str = Field(
        "30m", description="GoodputDeadlineAtRisk: for how long the P50 forecast of a workload's finish must pass its "
        "declared deadline.")
    mfu_drop_ratio: float = Field(
        0.2, gt=0, lt=1, description="GoodputMFUDrop: model FLOPs utilization this much below the workload's "
        "baseline.")
    mfu_drop_for: str = Field("15m", description="GoodputMFUDrop: for how long.")
    idle_while_allocated_ratio: float = Field(
        0.5, gt=0, le=1, description="GoodputGPUIdleWhileAllocated: idle share of an allocated GPU.")
    idle_while_allocated_for: str = Field("30m", description="GoodputGPUIdleWhileAllocated: for how long.")
    straggler_ratio: float = Field(
        1.5, gt=1, description="GoodputStraggler: a rank's own time per step over the median rank's.")
    straggler_for: str = Field("10m", description="GoodputStraggler: for how long.")
    stage_imbalance_ratio: float = Field(
        1.2, gt=1, description="GoodputStageImbalance: the slowest pipeline stage's typical own time per step (the "
        "median of its ranks') over the mean of every stage's (workloads that report their ranks' roles, "
        "goodput_rank_role_info, with two stages or more), while the ranks' work per step is steady (their median "
        "goodput_step_own_variation_ratio at most straggler_random_variation).")
    stage_imbalance_for: str = Field("30m", description="GoodputStageImbalance: for how long.")
    straggler_random_variation: float = Field(
        0.05, gt=0, description="GoodputStragglerRandom: the median rank's goodput_step_own_variation_ratio (how much "
        "its own time varies from step to step) above which the slowest rank changes from step to step. On ByteDance's "
        "published straggler traces: 0.006 and 0.007 for a slow worker and a slow stage, 0.117 for the random kind.")
    straggler_random_slowdown: float = Field(
        1.1, gt=1, description="GoodputStragglerRandom: the workload's slowdown from stragglers "
        "(workload:goodput_straggler_slowdown_ratio) above which uneven work is ticketed, with no rank slower "
        "than straggler_ratio times its stage's median (or the wait share of straggler_random_wait_ratio).")
    straggler_random_wait_ratio: float = Field(
        0.3, gt=0, lt=1, description="GoodputStragglerRandom: share of the step that even the rank that waits least "
        "spends waiting in collectives (the larger of its comm_wait and its GPU-side wait) above which uneven work is "
        "ticketed (or the slowdown of straggler_random_slowdown): when every rank waits alike on average, as under "
        "random imbalance in plain data parallelism, the slowdown's balanced what-if reads near 1.")
    straggler_random_for: str = Field("30m", description="GoodputStragglerRandom: for how long.")
    step_shift_window: str = Field(
        "15m", description="workload:goodput_step_time_shift:info: how long a lasting shift up of a rank's step time "
        "(goodput_step_time_shifts_total, the daemon's change detector) counts. Within it, shifts on more than half "
        "of the workload's ranks are a job-wide regression; on half or fewer, a straggler.")
    collective_hang_seconds: float = Field(
        300, gt=0, description="GoodputCollectiveHang: oldest in-flight collective waiting this long.")
    dump_stale_seconds: float = Field(
        900, gt=0, description="A flight-recorder dump older than this no longer proves a hang.")
    rank_missing_for: str = Field("1m", description="GoodputCollectiveRankMissing: for how long.")
    rank_missing_seconds: float = Field(
        30, gt=0, description="GoodputCollectiveRankMissing, across nodes: a rank is missing from a collective when "
        "its own flight-recorder dump, written at least this long after another rank of the process group began "
        "waiting in it, shows it has not enqueued it (dump times are compared, so the time between dumps does not "
        "matter). Ranks whose dumps are on the same node are also checked by the daemon (flight.rank_missing_after).")
    critical_xids: list[int] = Field(
        default_factory=lambda: xids_at(DRAIN),
        description="GoodputGPUXidCritical: XID codes that page. By default those whose immediate action in NVIDIA's "
        "XID catalogue is a GPU reset or a node reboot (the failure-risk level drain's XIDs, docs/health.md): "
        "application faults (13, 31, 43, 45: most often the job's own bug) and the XIDs whose action is to restart "
        "the application or watch (63, 92, 94) page nobody; the risk level shows those that repeat.")
    throttle_ratio: float = Field(
        0.2, gt=0, le=1, description="GoodputGPUThrottled: share of time clocks were held down by power, "
        "thermal, board or reliability limits.")
    throttle_for: str = Field("15m", description="GoodputGPUThrottled: for how long.")
    reset_required_for: str = Field(
        "0m", description="GoodputGPUResetRequired: for how long a row remap or page retirement has waited for a "
        "reset (or a row remap has failed); the state holds until the GPU is reset, so there is no noise to wait out.")
    risk_watch_for: str = Field(
        "30m", description="GoodputGPURiskWatch: for how long a GPU has been at risk level watch (info: notifies "
        "nobody; a trend that holds half an hour is worth seeing in Alertmanager).")
    risk_drain_for: str = Field(
        "5m", description="GoodputGPURiskDrain: for how long a GPU has been at risk level drain (a GPU that went "
        "dark for one sample is not a ticket).")
    risk_replace_for: str = Field(
        "0m", description="GoodputGPURiskReplace: for how long a GPU has been at risk level replace; its reasons "
        "hold until the GPU is replaced (a failed remap, retired pages) or for a day (XID 79 again), so there is no "
        "noise to wait out.")
    pcie_degraded_busy_ratio: float = Field(
        0.5, gt=0, le=1, description="GoodputGPUPCIeLinkDegraded: the PCIe generation is compared with its maximum "
        "only on GPUs busy at least this share of the short window; idle GPUs drop their link generation to save "
        "power. The link width is compared always.")
    pcie_degraded_for: str = Field("10m", description="GoodputGPUPCIeLinkDegraded: for how long.")
    nvlink_crc_error_rate: float = Field(
        100, gt=0, description="GoodputGPUNVLinkErrors: CRC errors (flit or data) per second on a GPU's links "
        "together (per link before the counters were summed per GPU); 100 is DCGM's health limit, the rate from which "
        "the driver team says they matter (each is corrected by a replay).")
    nvlink_replay_error_rate: float = Field(
        0.01, gt=0, description="GoodputGPUNVLinkErrors: replays or recoveries (a link retrained) per second on a "
        "GPU's links together; a healthy link has none, DCGM's health check flags any.")
    nvlink_errors_for: str = Field("10m", description="GoodputGPUNVLinkErrors: for how long.")
    memory_used_ratio: float = Field(
        0.8, gt=0, le=1, description="GoodputGPUMemoryExhaustionSoon: only past this much memory in use.")
    memory_exhaustion_for: str = Field("10m", description="GoodputGPUMemoryExhaustionSoon: for how long.")
    fabric_link_down_for: str = Field("5m", description="GoodputFabricLinkDown: for how long.")
    fabric_link_down_allocated_only: bool = Field(
        True, description="GoodputFabricLinkDown: only on nodes whose GPUs were in use (held by a process, or "
        "assigned to a pod) within fabric_link_down_allocated_window, so that a node drained for repair does not "
        "page. Off: on every node.")
    fabric_link_down_allocated_window: str = Field(
        "1h", description="GoodputFabricLinkDown: how far back a node's GPU use counts: a link failure that kills "
        "the job frees its GPUs, and the alert keeps firing this long after.")
    fabric_link_down_ignore: str = Field(
        "", description="GoodputFabricLinkDown: a regular expression of RDMA devices and network interfaces it "
        "never judges (e.g. storage NICs run at a lower rate than the compute NICs of the same link layer, or a "
        "port taken out of service after it had a link); empty: none.")
    fabric_flap_window: str = Field(
        "15m", description="GoodputFabricLinkFlapping: the window link losses are counted in.")
    fabric_flaps: int = Field(
        2, ge=1, description="GoodputFabricLinkFlapping: times a link went down or retrained within the window "
        "(carrier changes count half: each loss is a down and an up). One is a reboot or a reseat; two is a link "
        "that does not stay up.")
    fabric_error_rate: float = Field(
        0.01, gt=0, description="GoodputFabricErrors: link errors per second on one link (fabric_error_counters, or "
        "an interface's receive errors); a healthy link counts none (ibdiagnet flags any symbol error), 0.01 (3 in "
        "5 minutes) leaves room for the odd one.")
    fabric_errors_for: str = Field("10m", description="GoodputFabricErrors: for how long.")
    fabric_congestion_ratio: float = Field(
        0.001, gt=0, le=1, description="GoodputFabricCongestion: share of an RDMA port's packets that carry congestion "
        "marks or notifications (ECN-marked or answered with a CNP, of those received; CNPs handled, of those sent). "
        "DCQCN's usual marking probability tops out at 1% at the switch's upper queue threshold, so 0.1% is a queue "
        "held well into its marking range.")
    fabric_congestion_comm_wait_ratio: float = Field(
        0.3, gt=0, le=1, description="GoodputFabricCongestion: only while the workloads on the node spend at least "
        "this share of their time in comm_wait (congestion that costs no goodput does not page).")
    fabric_congestion_for: str = Field("10m", description="GoodputFabricCongestion: for how long.")
    # --- the funnel's verdict per workload (workload:goodput_bottleneck:info; rules/verdict.py) ----------------
    # It also reads, with the same meaning: throttle_ratio and critical_xids (cluster), collective_hang_seconds,
    # dump_stale_seconds, fabric_error_rate, fabric_congestion_ratio and fabric_congestion_comm_wait_ratio (network),
    # memory_used_ratio with the memory prediction (memory), underused_sm_active_ratio (kernel).
    bottleneck_gpu_recent_window: str = Field(
        "15m", description="Verdict, cluster layer: how long an XID or an uncorrected ECC error on a GPU counts "
        "against the workload, and how long a GPU counts as the workload's after its processes last held it (a "
        "lost GPU's processes are no longer listed, nor those of a job its fault killed).")
    bottleneck_comm_wait_ratio: float = Field(
        0.3, gt=0, le=1, description="Verdict, network layer: share of the workload's accounted time in comm_wait "
        "above which the network holds it back.")
    bottleneck_data_wait_ratio: float = Field(
        0.15, gt=0, le=1, description="Verdict, host layer: share of the workload's accounted time in data_wait above "
        "which the input pipeline holds it back (a fed job hides its loading behind compute: near 0).")
    bottleneck_cpu_pressure_ratio: float = Field(
        0.25, gt=0, le=1, description="Verdict, host layer: share of the short window in which some task on a node "
        "of the workload waited for a CPU (PSI cpu some), above which CPU pressure holds it back.")
    bottleneck_io_pressure_ratio: float = Field(
        0.25, gt=0, le=1, description="Verdict, host layer: share of the short window in which some task on a node "
        "of the workload waited for I/O (PSI io some), above which I/O pressure holds it back.")
    bottleneck_memory_full_ratio: float = Field(
        0.95, gt=0, le=1, description="Verdict, memory layer: share of a GPU's memory in use above which it is near "
        "full (PyTorch's caching allocator keeps what it reserved: a job at its peak shows it too).")
    bottleneck_compute_ratio: float = Field(
        0.5, gt=0, le=1, description="Verdict, kernel layer: the workload's compute share (goodput) at least this "
        "much before its kernels are judged: the time is in the kernels, not lost elsewhere.")
    bottleneck_tensor_active_ratio: float = Field(
        0.2, gt=0, le=1, description="Verdict, kernel layer: mean tensor-pipe activity of the workload's GPUs below "
        "which its kernels leave the tensor cores idle (DCGM; the SMs' activity is judged against "
        "underused_sm_active_ratio).")
    # --- inference (serving engines' metrics, and the client's request events) -----------------------------
    inference_engines: list[str] = Field(
        ["vllm", "sglang", "tgi", "ray_vllm", "triton"], description="Serving engines whose own metrics the "
        "inference rules normalize "
        "(names, labels and buckets in docs/inference-engines.md); the client path (goodput_inference_*) always is.")
    inference_slo: Objectives = Field(
        default_factory=Objectives, description="Default latency objectives of every served model: time to first "
        "token, time per output token (a request's mean after its first token) and the attainment target. Each "
        "threshold must be a bucket bound of every engine's histogram it is judged on (the figure is then exact).")
    inference_slo_engines: dict[str, ObjectivesPart] = Field(
        default_factory=lambda: {"tgi": ObjectivesPart(tpot_seconds=TGI_TPOT_OBJECTIVE)},
        description="Objectives of every model an engine serves, over inference_slo: {engine: {ttft_seconds, "
        "tpot_seconds, target, unjudged}}. The default gives TGI the bound of its geometric buckets nearest 0.1 s (no "
        "round number is one); set it again when you change inference_slo.tpot_seconds. unjudged lists the "
        "objectives the engine cannot judge, so that GoodputInferenceSLOUnmeasured fires only where a judgement "
        "was expected: {tgi: {unjudged: [ttft]}, triton: {unjudged: [tpot]}}.")
    inference_slo_overrides: list[ObjectivesOverride] = Field(
        default_factory=list,
        description="Objectives of some models, over inference_slo and inference_slo_engines: a list of {model, "
        "engine, ttft_seconds, tpot_seconds, target, unjudged}; model (the engine's model label) and engine each "
        "narrow an entry, an entry naming a model wins over one naming only an engine. A threshold must be a bucket "
        "bound of every engine the entry applies to: name the engine where the engines' bounds differ. An entry naming "
        "only an engine is the way to declare its unjudged objectives without repeating inference_slo_engines' "
        "defaults.")
    inference_slo_fast_windows: list[str] = Field(
        ["5m", "1h"], description="GoodputInferenceSLOBurnFast: the short and long windows (the SRE workbook's 5m "
        "and 1h); the short one is at least the recording rules' short window.")
    inference_slo_fast_burn_rate: float = Field(
        14.4, gt=1, description="GoodputInferenceSLOBurnFast: error budget burn rate over both windows (14.4 spends "
        "2% of a 30-day budget in an hour).")
    inference_slo_slow_windows: list[str] = Field(
        ["30m", "6h"],
        description="GoodputInferenceSLOBurnSlow: the short and long windows (the workbook's 30m and 6h).")
    inference_slo_slow_burn_rate: float = Field(
        6, gt=1, description="GoodputInferenceSLOBurnSlow: burn rate over both windows (6 spends 5% of a 30-day "
        "budget in 6 hours).")
    inference_slo_count_aborted: bool = Field(
        False, description="Count aborted requests (finish reason abort: the client went away) among the finished "
        "requests that bound SLO goodput and that an objective nothing can judge is reported for; by default they are "
        "out of the SLO's denominator.")
    inference_slo_unmeasured_for: str = Field(
        "15m", description="GoodputInferenceSLOUnmeasured: for how long a model's requests are judged on an objective "
        "whose threshold bucket its engine does not expose (custom buckets: vLLM's --custom-histogram-buckets, "
        "SGLang's --bucket-*), so that no burn-rate alert can fire for it.")
    inference_kv_cache_saturated_ratio: float = Field(
        0.95, gt=0, le=1, description="GoodputInferenceKVCacheSaturated: share of the KV cache in use.")
    inference_kv_cache_saturated_for: str = Field(
        "10m", description="GoodputInferenceKVCacheSaturated: for how long, with preemptions rising.")
    inference_idle_while_queued_ratio: float = Field(
        0.5, gt=0, le=1, description="GoodputInferenceGPUIdleWhileQueued: idle share of the serving pods' GPUs.")
    inference_idle_while_queued_for: str = Field(
        "10m", description="GoodputInferenceGPUIdleWhileQueued: for how long requests wait while the GPUs idle.")
    exporter_down_for: str = Field("5m", description="GoodputExporterDown: for how long.")
    source_failing_for: str = Field("10m", description="GoodputExporterSourceFailing: for how long.")
    cluster_not_reporting_window: str = Field(
        "1h", description="GoodputClusterNotReporting (global_view only): a cluster seen in this window is "
        "expected to report.")
    cluster_not_reporting_for: str = Field(
        "10m", description="GoodputClusterNotReporting (global_view only): for how long a cluster sent nothing.")

    @field_validator("windows")
    @classmethod
    def _check_windows(cls, value: list[str]) -> list[str]:
        if len(value) < 2:
            raise ValueError("at least two windows: a short one and a baseline")
        for item in value:
            _range(item)
        if [seconds(v) for v in value] != sorted({seconds(v) for v in value}):
            raise ValueError("windows must be distinct and shortest first")
        return value

    @field_validator("slow_groups_interval", "memory_predict_window", "memory_predict_horizon",
                     "goodput_trend_window", "goodput_drop_for", "wasted_progress_window", "mfu_drop_for",
                     "forecast_stale_window", "forecast_interruption_cost", "forecast_best_memory",
                     "deadline_at_risk_for",
                     "idle_while_allocated_for", "straggler_for", "stage_imbalance_for", "straggler_random_for",
                     "step_shift_window", "rank_missing_for",
                     "throttle_for", "reset_required_for", "risk_watch_for", "risk_drain_for",
                     "risk_replace_for", "pcie_degraded_for", "nvlink_errors_for",
                     "memory_exhaustion_for", "exporter_down_for", "source_failing_for", "cluster_not_reporting_window",
                     "cluster_not_reporting_for", "fabric_link_down_for",
                     "fabric_link_down_allocated_window", "fabric_flap_window", "fabric_errors_for",
                     "fabric_congestion_for", "bottleneck_gpu_recent_window", "inference_kv_cache_saturated_for",
                     "inference_idle_while_queued_for", "inference_slo_unmeasured_for")
    @classmethod
    def _check_range(cls, value: str) -> str:
        return _range(value)

    @field_validator("inference_slo_fast_windows", "inference_slo_slow_windows")
    @classmethod
    def _check_burn_windows(cls, value: list[str]) -> list[str]:
        if len(value) != 2:
            raise ValueError("two windows: the short one, then the long one")
        for item in value:
            _range(item)
        if seconds(value[0]) >= seconds(value[1]):
            raise ValueError("the short window first, shorter than the long one")
        return value

    @field_validator("inference_engines")
    @classmethod
    def _check_engines(cls, value: list[str]) -> list[str]:
        from .engines import ENGINES

        unknown = sorted(set(value) - set(ENGINES))
        if unknown:
            raise ValueError(f"unknown engine(s) {unknown}; known: {sorted(ENGINES)}")
        return value

    @model_validator(mode="after")
    def _check_wasted_progress_window(self) -> RulesSettings:
        if seconds(self.wasted_progress_window) < seconds(self.windows[0]):
            raise ValueError(f"wasted_progress_window: {self.wasted_progress_window} is shorter than the short "
                             f"window {self.windows[0]}")
        return self

    @model_validator(mode="after")
    def _check_inference(self) -> RulesSettings:
        short = seconds(self.windows[0])
        for key in ("inference_slo_fast_windows", "inference_slo_slow_windows"):
            window = getattr(self, key)[0]
            if seconds(window) < short or seconds(window) % short:
                raise ValueError(f"{key}: {window} is not a multiple of the short window {self.windows[0]}")
        from .objectives import check_objectives

        check_objectives(self)
        return self

    @field_validator("fabric_error_counters")
    @classmethod
    def _check_counters(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one counter")
        for item in value:
            if not _LABEL.match(item):
                raise ValueError(f"{item!r} is not a counter name")
        return value

    @field_validator("fabric_link_down_ignore")
    @classmethod
    def _check_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value

    @field_validator("node_label", "cluster_label")
    @classmethod
    def _check_label(cls, value: str) -> str:
        if not _LABEL.match(value):
            raise ValueError(f"{value!r} is not a label name")
        return value


def load_settings(path: str | Path | None) -> RulesSettings:
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read rules settings {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"rules settings {path} are not valid YAML: {exc}") from None
    try:
        return RulesSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: "
                             f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid rules settings: {problems}") from None
