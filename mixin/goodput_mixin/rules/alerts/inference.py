"""Alerts on served models: latency SLO burn rates (the SRE workbook's multi-window, multi-burn-rate form), a
saturated KV cache, and requests that wait while the GPUs under them idle. Group `goodput.alerts.inference`."""

from __future__ import annotations

from ..objectives import unjudged as unjudged_matchers
from ..settings import RulesSettings
from .alert import Alert

_BUDGET = "workload:goodput_inference_slo_error_budget:ratio"
_WHO = "{{ $labels.model }} ({{ $labels.engine }}{{ with $labels.namespace }}, namespace {{ . }}{{ end }})"


def _burn(windows: list[str], rate: float) -> str:
    """Both windows burn the error budget at least `rate` times as fast as the objective allows."""
    return "\nand\n".join(f"workload:goodput_inference_slo_error_ratio:rate{w}\n  > {rate:g} * {_BUDGET}"
                          for w in reversed(windows))


def _unmeasured(s: RulesSettings) -> str:
    """A model's objective that nothing judges (no bucket at or below its threshold; no histogram for it at all),
    unless the settings declare that its engine (or the model) does not judge it: the objective is then known to be
    unwatched, and paging on it for as long as the model serves would only teach the team to silence the alert."""
    short = s.windows[0]
    judged = f"workload:goodput_inference_slo_requests:rate{short}"
    unjudged = f"workload:goodput_inference_slo_unjudged_requests:rate{short}"
    declared = unjudged_matchers(s)

    def unless(record: str) -> str:
        return "".join(f"\n  unless {record}{{{matchers}}}" for matchers in declared)

    met = f"workload:goodput_inference_slo_met_requests:rate{short}"
    if not declared:
        return f"(\n  {judged} > 0\n  unless\n  {met}\n)\nor\n{unjudged} > 0"
    return f"(\n  {judged} > 0\n  unless\n  {met}{unless(judged)}\n)\nor\n({unjudged} > 0{unless(unjudged)}\n)"


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    fast, slow = s.inference_slo_fast_windows, s.inference_slo_slow_windows
    error = "{{ $value | humanizePercentage }}"
    return [
        Alert(
            "GoodputInferenceSLOBurnFast", "inference-slo-burn.md", "critical",
            _burn(fast, s.inference_slo_fast_burn_rate), "0m",
            "A served model is spending its latency error budget fast.",
            f"{_WHO}: {error} of its requests missed a latency objective over the last {fast[1]}, and still over the "
            f"last {fast[0]}: more than {s.inference_slo_fast_burn_rate:g}x the budget's rate."),
        Alert(
            "GoodputInferenceSLOBurnSlow", "inference-slo-burn.md", "warning",
            _burn(slow, s.inference_slo_slow_burn_rate), "0m",
            "A served model is spending its latency error budget steadily.",
            f"{_WHO}: {error} of its requests missed a latency objective over the last {slow[1]}, and still over the "
            f"last {slow[0]}: more than {s.inference_slo_slow_burn_rate:g}x the budget's rate."),
        Alert(
            "GoodputInferenceSLOUnmeasured", "inference-slo-unmeasured.md", "warning",
            _unmeasured(s),
            s.inference_slo_unmeasured_for,
            "A served model's latency objective cannot be judged: its engine has no histogram or no bucket for it.",
            f"{_WHO} serves requests, but nothing judges its {{{{ $labels.objective }}}} objective: its engine "
            "exposes no histogram for it (TGI: time to first token; Triton: time per output token; SGLang before "
            "0.5.22 and vLLM before 0.11: time per output token), or the histogram has no bucket at or below the "
            "threshold (custom buckets?). Its joint attainment, SLO goodput, error ratio and burn-rate alerts are "
            "absent rather than counting the objective as met."),
        Alert(
            "GoodputInferenceKVCacheSaturated", "inference-kv-cache-saturated.md", "warning",
            f"server:goodput_inference_kv_cache_usage_ratio:max >= {s.inference_kv_cache_saturated_ratio:g}\n"
            f"and\nserver:goodput_inference_preemptions:rate{short} > 0",
            s.inference_kv_cache_saturated_for,
            "A serving engine's KV cache is full and it preempts requests.",
            "{{ $labels.model }} on {{ $labels.instance }}{{ with $labels.pod }} (pod {{ . }}){{ end }} "
            "({{ $labels.engine }}): the KV cache is nearly full and requests are preempted "
            f"(recomputed or swapped) for {s.inference_kv_cache_saturated_for}."),
        Alert(
            "GoodputInferenceGPUIdleWhileQueued", "inference-gpu-idle-while-queued.md", "warning",
            f"workload:goodput_inference_gpu_idle_ratio:rate{short} > {s.inference_idle_while_queued_ratio:g}\n"
            "and\nworkload:goodput_inference_requests_waiting:sum > 0",
            s.inference_idle_while_queued_for,
            "Requests wait while the GPUs serving them are idle.",
            f"{_WHO}: requests have waited for {s.inference_idle_while_queued_for} while its GPUs were idle "
            "{{ $value | humanizePercentage }} of the time."),
    ]
