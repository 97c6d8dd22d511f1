"""The shipped recording rules and alert expressions on Prometheus and on VictoriaMetrics + vmalert agree over the
same backfilled hour (issue 21), or differ by a documented, measured amount.

tests/rules_equivalence.py writes the hour (three nodes of 8 GPUs, a training job, one that starts and ends, vLLM,
SGLang, TGI, Triton and Ray Serve vLLM pods, faults that make every alert's expression return something, jittered
scrapes, a 6.5-minute scraper outage, a daemon restart), loads the same samples into both, evaluates the rules level
by level on each engine's side (Prometheus's range queries; vmalert's replay) and compares every recorded series
sample by sample: the same label sets, a sample at the same instants, values within 1% of the larger (1e-9 near
zero). The data is deterministic, so the sizes below are exact; after a change to the rules or the data,
`.venv/bin/python tests/rules_equivalence.py --measured` prints them again (and without the flag, the differences
sample by sample).

Every difference found comes from one of CAUSES. A rule changed so that both agree is not listed: it must agree
(gpu:goodput_gpu_activity_class:avg5m, whose `or ignoring (class)` chain became a code named by count_values; the
verdict's two `bottomk by (g) (1, X)`, now a comparison with the group's minimum, which VictoriaMetrics before 1.97
gets right in range queries too: see first_of in mixin/goodput_mixin/rules/verdict.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import rules_equivalence as eq

CAUSES = {
    "rate": (
        "PromQL's rate() and increase() read only the samples inside the window and extrapolate their increase to "
        "the window's edges; MetricsQL's also read the last sample before the window and do not extrapolate. They "
        "agree on a counter that grows steadily. Otherwise MetricsQL's window reaches about one scrape interval "
        "further back: the two differ by about (scrape interval / window) x (the rate at the window's start minus "
        "its mean over the window), here (30 s scrapes, 5m windows) a median of 1.9% and up to 11% on request "
        "counters with a 20% wave and a 2.4x step. Where a counter starts, stops or pauses inside the window, "
        "PromQL averages its increase over the whole window and MetricsQL takes the slope of the samples it has: "
        "MetricsQL is up to 86% higher a minute after a job starts, up to 83% while samples stop (a job's end, a "
        "scraper outage), and one side is 0 for an evaluation after a rate drops to 0 (100%). An event counter's "
        "increase differs by whole events: one between the last sample before the window and the first inside it "
        "counts in MetricsQL only (3 against 2.07 link flaps in 15m, 2 against 1.11 uncorrectable ECC errors in "
        "5m), and PromQL's count of whole events is not whole (2.08 for 2). Everything computed from these rates "
        "carries it: a 1h average of a 5m rate for the hour (finetune's tokens:rate1h is 11% apart from 4 minutes "
        "after the job ended to the end of the hour, 86% the minute after it started, when the average holds one "
        "sample), a ratio of two rates much less (its numerator and denominator move together), a ratio's distance "
        "from 1 much more: the forecast's badput GPU-hours scale with 1 - (the 1h goodput / its best), up to 15% apart "
        "after the crash at 25m (1.87 against 2.21 GPU-hours at 48m) while the 1h goodputs are under 1% apart."),
    "rate-presence": (
        "Samples on one side only, from the same rate() computation. MetricsQL's increase() of the first sample "
        "after a gap is the change since the sample before the gap (0 for a counter that did not move), and its "
        "rate() of a window with no sample is 0 when a sample lies within about 1.25 scrape intervals before it; "
        "PromQL needs two samples inside the window (vmalert only: every node0 rate one evaluation after its "
        "scraper stopped). Comparisons fall on different sides where the rates differ: `> 0` guards (the step "
        "means after the hang stopped the steps: vmalert still sees the step before the window) and alert "
        "thresholds (GoodputDrop and GoodputMFUDrop hold on Prometheus for minutes while node0's samples stop, as "
        "its rate falls and the drop ratio passes 0.3; not on vmalert)."),
}


@dataclass(frozen=True)
class Known:
    """A documented difference and its measured size, which it may not exceed."""

    causes: tuple[str, ...]
    max_relative: float  # the largest |a - b| / max(|a|, |b|) of a sample both sides have (1.0: one side 0)
    differing: int  # samples both sides have that are more than 1% apart
    only_prometheus: int  # samples Prometheus has and vmalert does not
    only_victoria: int


# recorded series (by record name) that differ, out of the 98,000 samples compared
KNOWN: dict[str, Known] = {
    "cluster:goodput_fabric_congestion_packets:rate5m": Known(("rate",), 0.997, 65, 0, 0),
    "cluster:goodput_fabric_errors:rate5m": Known(("rate",), 0.854, 97, 0, 0),
    "cluster:goodput_fabric_receive_bytes:rate5m": Known(("rate",), 0.346, 22, 0, 0),
    "cluster:goodput_fabric_retransmission_events:rate5m": Known(("rate",), 0.376, 58, 0, 0),
    "cluster:goodput_fabric_transmit_bytes:rate5m": Known(("rate",), 0.346, 22, 0, 0),
    "cluster:goodput_gpu_idle_ratio:rate5m": Known(("rate",), 0.033, 11, 0, 0),
    "cluster:goodput_gpu_idle_while_allocated_ratio:rate5m": Known(("rate",), 0.121, 21, 0, 0),
    "gpu:goodput_bottleneck_candidate:order": Known(("rate-presence",), 0.0, 0, 1, 1),
    "gpu:goodput_gpu_idle_ratio:rate5m": Known(("rate",), 1.0, 662, 0, 0),
    "gpu:goodput_gpu_idle_while_allocated_ratio:rate1h": Known(("rate",), 0.056, 140, 0, 0),
    "gpu:goodput_gpu_idle_while_allocated_ratio:rate5m": Known(("rate",), 1.0, 662, 0, 0),
    "gpu:goodput_gpu_throttled_ratio:rate5m": Known(("rate", "rate-presence"), 0.828, 100, 0, 8),
    "interface:goodput_fabric_interface_utilization_ratio:rate5m": Known(("rate",), 0.828, 164, 0, 0),
    "link:goodput_fabric_congestion_ratio:rate5m": Known(("rate",), 0.999, 71, 0, 0),
    "link:goodput_fabric_link_errors:rate5m": Known(("rate", "rate-presence"), 0.854, 69, 0, 5),
    "namespace:goodput_gpu_idle_ratio:rate1h": Known(("rate",), 0.054, 50, 0, 0),
    "namespace:goodput_gpu_idle_ratio:rate5m": Known(("rate",), 1.0, 117, 0, 0),
    "namespace:goodput_ratio:rate5m": Known(("rate",), 1.0, 13, 0, 0),
    "node:goodput_comm_wait_ratio:rate5m": Known(("rate",), 0.063, 15, 0, 0),
    "node:goodput_fabric_congestion_packets:rate5m": Known(("rate", "rate-presence"), 0.999, 74, 0, 4),
    "node:goodput_fabric_errors:rate5m": Known(("rate", "rate-presence"), 0.854, 97, 0, 8),
    "node:goodput_fabric_receive_bytes:rate5m": Known(("rate", "rate-presence"), 0.827, 80, 0, 1),
    "node:goodput_fabric_retransmission_events:rate5m": Known(("rate", "rate-presence"), 0.852, 212, 0, 2),
    "node:goodput_fabric_transmit_bytes:rate5m": Known(("rate", "rate-presence"), 0.827, 80, 0, 1),
    "node:goodput_gpu_ecc_uncorrected_errors:rate5m": Known(("rate", "rate-presence"), 0.446, 5, 0, 1),
    "node:goodput_gpu_idle_ratio:rate5m": Known(("rate",), 1.0, 41, 0, 0),
    "node:goodput_gpu_idle_while_allocated_ratio:rate1h": Known(("rate",), 0.054, 35, 0, 0),
    "node:goodput_gpu_idle_while_allocated_ratio:rate5m": Known(("rate",), 1.0, 43, 0, 0),
    "node:goodput_gpu_nvlink_errors:rate5m": Known(("rate", "rate-presence"), 0.09, 45, 0, 4),
    "node:goodput_gpu_remapped_rows:increase5m": Known(("rate", "rate-presence"), 0.041, 5, 0, 4),
    "node:goodput_gpu_retired_pages:increase5m": Known(("rate", "rate-presence"), 0.446, 51, 0, 4),
    "node:goodput_gpus_throttled:count": Known(("rate", "rate-presence"), 1.0, 2, 0, 1),
    "port:goodput_fabric_port_utilization_ratio:rate5m": Known(("rate",), 0.827, 458, 0, 0),
    "server:goodput_inference_compute_seconds:rate5m": Known(("rate",), 0.029, 45, 0, 0),
    "server:goodput_inference_generation_tokens:rate5m": Known(("rate",), 0.111, 270, 0, 0),
    "server:goodput_inference_preemptions:rate5m": Known(("rate",), 1.0, 10, 0, 0),
    "server:goodput_inference_prompt_tokens:rate5m": Known(("rate",), 0.111, 269, 0, 0),
    "server:goodput_inference_queue_seconds:rate5m": Known(("rate",), 0.029, 45, 0, 0),
    "server:goodput_inference_requests:rate5m": Known(("rate",), 0.112, 647, 0, 0),
    "workload:goodput_badput_gpu_hours_to_finish:vs_best": Known(("rate",), 0.154, 29, 0, 0),
    "workload:goodput_badput_ratio:rate1h": Known(("rate",), 0.157, 90, 0, 0),
    "workload:goodput_badput_ratio:rate5m": Known(("rate",), 1.0, 57, 0, 0),
    "workload:goodput_bottleneck:info": Known(("rate-presence",), 0.0, 0, 2, 3),
    "workload:goodput_bottleneck_candidate:order": Known(("rate-presence",), 0.0, 0, 2, 6),
    "workload:goodput_breakdown_ratio:rate5m": Known(("rate",), 1.0, 80, 0, 0),
    "workload:goodput_downtime_seconds:rate5m": Known(("rate-presence",), 0.0, 0, 0, 1),
    "workload:goodput_gpu_idle_ratio:rate1h": Known(("rate",), 0.054, 50, 0, 0),
    "workload:goodput_gpu_idle_ratio:rate5m": Known(("rate",), 1.0, 74, 0, 0),
    "workload:goodput_gpu_power_watts:rate5m": Known(("rate",), 0.828, 63, 0, 0),
    "workload:goodput_inference_compute_seconds:rate5m": Known(("rate",), 0.029, 45, 0, 0),
    "workload:goodput_inference_e2e_request_latency_seconds_bucket:rate5m": Known(("rate",), 1.0, 5560, 0, 0),
    "workload:goodput_inference_generation_tokens:rate5m": Known(("rate",), 0.111, 270, 0, 0),
    "workload:goodput_inference_gpu_idle_ratio:rate5m": Known(("rate",), 0.087, 379, 0, 0),
    "workload:goodput_inference_inter_token_latency_seconds_bucket:rate5m": Known(("rate",), 0.697, 4709, 0, 0),
    "workload:goodput_inference_preemptions:rate5m": Known(("rate",), 1.0, 10, 0, 0),
    "workload:goodput_inference_prompt_tokens:rate5m": Known(("rate",), 0.111, 269, 0, 0),
    "workload:goodput_inference_queue_seconds:rate5m": Known(("rate",), 0.029, 45, 0, 0),
    "workload:goodput_inference_queue_time_seconds_bucket:rate5m": Known(("rate",), 1.0, 7018, 0, 0),
    "workload:goodput_inference_requests:rate5m": Known(("rate",), 0.112, 647, 0, 0),
    "workload:goodput_inference_slo_attainment_ratio:rate30m": Known(("rate",), 0.015, 14, 0, 0),
    "workload:goodput_inference_slo_attainment_ratio:rate5m": Known(("rate",), 0.144, 21, 0, 0),
    "workload:goodput_inference_slo_error_ratio:rate1h": Known(("rate",), 0.061, 29, 0, 0),
    "workload:goodput_inference_slo_error_ratio:rate30m": Known(("rate",), 0.071, 68, 0, 0),
    "workload:goodput_inference_slo_error_ratio:rate5m": Known(("rate",), 0.768, 241, 0, 0),
    "workload:goodput_inference_slo_error_ratio:rate6h": Known(("rate",), 0.052, 12, 0, 0),
    "workload:goodput_inference_slo_goodput:rate5m": Known(("rate",), 1.0, 223, 0, 0),
    "workload:goodput_inference_slo_joint_attainment_ratio:rate1h": Known(("rate",), 0.018, 10, 0, 0),
    "workload:goodput_inference_slo_joint_attainment_ratio:rate30m": Known(("rate",), 0.046, 20, 0, 0),
    "workload:goodput_inference_slo_joint_attainment_ratio:rate5m": Known(("rate",), 1.0, 29, 0, 0),
    "workload:goodput_inference_slo_met_requests:rate5m": Known(("rate",), 0.042, 588, 0, 0),
    "workload:goodput_inference_slo_requests:rate30m": Known(("rate",), 0.011, 12, 0, 0),
    "workload:goodput_inference_slo_requests:rate5m": Known(("rate",), 0.111, 579, 0, 0),
    "workload:goodput_inference_slo_unjudged_requests:rate5m": Known(("rate",), 0.03, 93, 0, 0),
    "workload:goodput_inference_time_per_output_token_seconds_bucket:rate5m": Known(("rate",), 1.0, 6001, 0, 0),
    "workload:goodput_inference_time_to_first_token_seconds_bucket:rate5m": Known(("rate",), 1.0, 4401, 0, 0),
    "workload:goodput_joules_per_step:rate5m": Known(("rate", "rate-presence"), 0.87, 9, 0, 1),
    "workload:goodput_mfu_ratio:rate1h": Known(("rate",), 0.863, 71, 0, 0),
    "workload:goodput_mfu_ratio:rate5m": Known(("rate",), 1.0, 25, 0, 0),
    "workload:goodput_phase_seconds:rate1h": Known(("rate",), 0.863, 375, 0, 0),
    "workload:goodput_phase_seconds:rate5m": Known(("rate", "rate-presence"), 1.0, 146, 0, 10),
    "workload:goodput_ranks_stepping:count5m": Known(("rate-presence",), 0.0, 0, 0, 1),
    "workload:goodput_ratio:deriv1h": Known(("rate", "rate-presence"), 0.1, 35, 0, 1),
    "workload:goodput_ratio:rate5m": Known(("rate",), 1.0, 13, 0, 0),
    "workload:goodput_step_duration_seconds:max5m": Known(("rate", "rate-presence"), 0.025, 4, 0, 1),
    "workload:goodput_step_time_shift:info": Known(("rate-presence",), 0.0, 0, 0, 2),
    "workload:goodput_step_wait_min_ratio:rate5m": Known(("rate", "rate-presence"), 0.395, 6, 0, 1),
    "workload:goodput_straggler_lost_gpu_seconds:rate5m": Known(("rate", "rate-presence"), 0.15, 11, 0, 1),
    "workload:goodput_straggler_ratio:rate1h": Known(("rate",), 0.121, 4, 0, 0),
    "workload:goodput_straggler_ratio:rate5m": Known(("rate", "rate-presence"), 0.291, 7, 0, 1),
    "workload:goodput_straggler_slowdown_ratio:rate5m": Known(("rate", "rate-presence"), 0.126, 5, 0, 1),
    "workload:goodput_tokens:rate1h": Known(("rate",), 0.863, 71, 0, 0),
    "workload:goodput_tokens:rate5m": Known(("rate", "rate-presence"), 1.0, 29, 0, 1),
    "workload:goodput_tokens_drop_ratio:rate5m_vs_1h": Known(("rate", "rate-presence"), 1.0, 90, 0, 1),
    "workload:goodput_tokens_per_joule:rate5m": Known(("rate",), 1.0, 10, 0, 0),
    "workload:goodput_wall_seconds:rate5m": Known(("rate", "rate-presence"), 1.0, 156, 0, 12),
    "workload:goodput_wasted_compute_seconds:rate5m": Known(("rate", "rate-presence"), 1.0, 8, 0, 1),
    "workload:goodput_wasted_seconds:increase1h": Known(("rate",), 0.101, 16, 0, 0),
    "workload:goodput_wasted_seconds:rate5m": Known(("rate", "rate-presence"), 1.0, 8, 0, 1),
    "workload_node:goodput_comm_wait_ratio:rate5m": Known(("rate",), 0.063, 15, 0, 0),
    "workload_node:goodput_fabric_congestion_ratio:rate5m": Known(("rate",), 0.999, 155, 0, 0),
    "workload_node:goodput_fabric_link_errors:rate5m": Known(("rate",), 0.854, 125, 0, 0),
    "workload_node:goodput_fabric_receive_bytes:rate5m": Known(("rate",), 0.827, 165, 0, 0),
    "workload_node:goodput_fabric_retransmission_events:rate5m": Known(("rate",), 0.852, 204, 0, 0),
    "workload_node:goodput_fabric_transmit_bytes:rate5m": Known(("rate",), 0.827, 165, 0, 0),
    "workload_node:goodput_phase_seconds:rate5m": Known(("rate", "rate-presence"), 1.0, 146, 0, 10),
    "workload_rank:goodput_step_duration_seconds:mean5m": Known(("rate", "rate-presence"), 0.025, 32, 0, 8),
    "workload_rank:goodput_step_own_seconds:mean1h": Known(("rate",), 0.164, 6, 0, 0),
    "workload_rank:goodput_step_own_seconds:mean5m": Known(("rate", "rate-presence"), 0.289, 50, 0, 8),
    "workload_rank:goodput_step_wait_seconds:mean5m": Known(("rate", "rate-presence"), 0.38, 67, 0, 8),
    "workload_rank:goodput_steps:rate5m": Known(("rate", "rate-presence"), 1.0, 196, 0, 8),
    "workload_rank:goodput_straggler_cost_ratio:rate5m": Known(("rate", "rate-presence"), 0.338, 4, 0, 2),
    "workload_rank:goodput_straggler_lost_gpu_seconds:rate5m": Known(("rate", "rate-presence"), 0.338, 4, 0, 2),
    "workload_rank:goodput_straggler_ratio:rate1h": Known(("rate",), 0.166, 5, 0, 0),
    "workload_rank:goodput_straggler_ratio:rate5m": Known(("rate", "rate-presence"), 0.291, 8, 0, 8),
    "workload_stage_rank:goodput_step_own_seconds:mean1h": Known(("rate",), 0.164, 6, 0, 0),
    "workload_stage_rank:goodput_step_own_seconds:mean5m": Known(("rate", "rate-presence"), 0.289, 50, 0, 8),
    "workload_stage:goodput_step_own_seconds:median5m": Known(("rate", "rate-presence"), 0.02, 4, 0, 1),
}

# alert expressions that differ (labels without __name__, as an alert's)
KNOWN_ALERTS: dict[str, Known] = {
    "GoodputDrop": Known(("rate", "rate-presence"), 0.091, 4, 10, 1),
    "GoodputFabricCongestion": Known(("rate",), 0.112, 2, 0, 0),
    "GoodputFabricErrors": Known(("rate",), 0.854, 69, 0, 0),
    "GoodputFabricLinkFlapping": Known(("rate", "rate-presence"), 0.311, 14, 0, 1),
    "GoodputGPUEccUncorrectable": Known(("rate",), 0.445, 5, 0, 0),
    "GoodputGPUIdleWhileAllocated": Known(("rate", "rate-presence"), 0.076, 26, 2, 0),
    "GoodputGPUNVLinkErrors": Known(("rate",), 0.09, 42, 0, 0),
    "GoodputGPUThrottled": Known(("rate", "rate-presence"), 0.275, 7, 1, 1),
    "GoodputInferenceGPUIdleWhileQueued": Known(("rate",), 0.066, 2, 0, 0),
    "GoodputInferenceSLOBurnFast": Known(("rate", "rate-presence"), 0.04, 7, 0, 1),
    "GoodputInferenceSLOBurnSlow": Known(("rate", "rate-presence"), 0.052, 10, 5, 6),
    "GoodputInferenceSLOUnmeasured": Known(("rate",), 0.03, 93, 0, 0),
    "GoodputMFUDrop": Known(("rate", "rate-presence"), 0.089, 4, 7, 1),
    "GoodputStraggler": Known(("rate", "rate-presence"), 0.291, 4, 0, 2),
    "GoodputWastedProgress": Known(("rate",), 0.039, 11, 0, 0),
}

# rules the data does not exercise: rule id -> why
NOT_EXERCISED: dict[str, str] = {
    "GoodputCollectiveHang{severity=critical}": "the hour's hang has a rank missing from it (rank 5), which pages as "
    "GoodputCollectiveRankMissing instead; a hang every rank joined is tested by promtool "
    "(rules/tests/alerts.test.yml)",
    "workload:goodput_gpu_peak_flops:sum{dtype=fp4}": "the hour's GPUs are H100s, which have no FP4 peak (Blackwell "
    "is the first); its rule is the other data types' join with another dtype",
    "workload_node:goodput_phase_seconds:rate5m": "the rule for phase names the rules do not know (an older daemon's "
    "`checkpoint`): the hour's daemon sends none (rules/tests/recording.test.yml has one)",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> eq.Report:
    return eq.run(Path(tmp_path_factory.mktemp("equivalence")))


def _check(kind: str, diffs: dict[str, eq.Difference], known: dict[str, Known]) -> list[str]:
    problems = []
    for name, d in sorted(diffs.items()):
        k = known.get(name)
        if k is None:
            if not d.agrees:
                problems.append(f"{kind} {name} differs: {d.differing}/{d.compared} samples more than 1% apart "
                                f"(worst: {d.worst}), {d.only_prometheus} on Prometheus only, {d.only_victoria} on "
                                f"vmalert only; e.g. {d.examples[:3]}")
            continue
        if d.agrees:
            problems.append(f"{kind} {name} agrees now: take it out of the documented differences")
        elif (d.max_relative > k.max_relative or d.differing > k.differing or d.only_prometheus > k.only_prometheus
              or d.only_victoria > k.only_victoria):
            problems.append(f"{kind} {name} differs more than documented: {d.max_relative:.3f}, {d.differing}, "
                            f"{d.only_prometheus}, {d.only_victoria} > {k}; worst: {d.worst}")
    return problems


def test_rules_evaluate_on_both(report: eq.Report) -> None:
    assert not report.errors, report.errors
    assert report.levels >= 4  # the recorded series read each other four deep: each level loaded before the next


def test_every_rule_produces_series_on_both(report: eq.Report) -> None:
    missing = [f"{rule}: Prometheus {p}, vmalert {v} series" for rule, (p, v) in report.produced.items()
               if not (p and v) and rule not in NOT_EXERCISED]
    assert not missing, "rules with no result in the compared hour: " + "; ".join(missing)
    stale = [rule for rule in NOT_EXERCISED if any(report.produced[rule])]
    assert not stale, f"exercised now, take them out of NOT_EXERCISED: {stale}"


def test_recorded_series_agree_or_differ_as_documented(report: eq.Report) -> None:
    assert set(KNOWN) <= set(report.recorded), set(KNOWN) - set(report.recorded)
    problems = _check("record", report.recorded, KNOWN)
    assert not problems, "\n".join(problems)


def test_alert_expressions_agree_or_differ_as_documented(report: eq.Report) -> None:
    assert set(KNOWN_ALERTS) <= set(report.alerts), set(KNOWN_ALERTS) - set(report.alerts)
    problems = _check("alert", report.alerts, KNOWN_ALERTS)
    assert not problems, "\n".join(problems)


def test_documented_causes_exist() -> None:
    for name, k in {**KNOWN, **KNOWN_ALERTS}.items():
        assert k.causes and set(k.causes) <= set(CAUSES), name
