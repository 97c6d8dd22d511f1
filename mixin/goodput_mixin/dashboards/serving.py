"""Level 7, Serving: the served models (inference) against their latency objectives: SLO attainment and SLO
goodput, error budget burn, latency quantiles against the objectives, the engines' queues, KV cache and tokens,
and the GPUs under each model, with links down to their memory, kernels and the cluster.

Everything reads the inference recording rules (rules/inference.py): `workload:` series per served model, labelled
cluster, namespace, workload, model and engine, whatever engine serves it (vLLM, SGLang, TGI, the client path)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable

from .kit import (
    LEVELS,
    Names,
    joined_table_panel,
    link_to_level,
    link_to_node,
    new_dashboard,
    query_variable,
    row,
    stat_panel,
    timeseries_panel,
)

LEVEL = LEVELS[6]
MEMORY, KERNELS, CLUSTER = LEVELS[3], LEVELS[4], LEVELS[0]
QUANTILES = (0.5, 0.9, 0.99)
# histogram (recorded bucket rates) -> panel title, what it measures, the objective it is judged on
LATENCIES = {
    "time_to_first_token_seconds": ("Time to first token", "time from a request's arrival to its first output "
                                    "token: queueing plus prefill", "ttft"),
    "time_per_output_token_seconds": ("Time per output token", "a request's mean time per output token after the "
                                      "first: the decode speed a user sees", "tpot"),
    "inter_token_latency_seconds": ("Inter-token latency", "time between consecutive output tokens (or chunks); "
                                    "spikes are decode steps stalled by prefills or preemptions", ""),
    "e2e_request_latency_seconds": ("End-to-end request latency", "time from a request's arrival to its last "
                                    "token: grows with output length as well as with load", ""),
    "queue_time_seconds": ("Queue time", "time a request waited before the engine scheduled it: the first "
                           "thing to grow when arrivals outrun the batch", ""),
}
MODEL = "{{workload}} {{model}}"


def variables(names: Names) -> list[QueryVariable]:
    """cluster, namespace, model and engine, from the served models' finished requests (every engine and the client
    path record them); each narrows the next."""
    source = names.rule("workload", "goodput_inference_requests", "rate")
    c = names.cluster
    return [
        query_variable("cluster", "Cluster", f"label_values({source}, {c})"),
        query_variable("namespace", "Namespace", f'label_values({source}{{{c}=~"$cluster"}}, namespace)'),
        query_variable("model", "Model", f'label_values({source}{{{c}=~"$cluster", namespace=~"$namespace"}}, model)'),
        query_variable("engine", "Engine", f'label_values({source}{{{c}=~"$cluster", namespace=~"$namespace", '
                                           'model=~"$model"}, engine)'),
    ]


def build(names: Names) -> Dashboard:
    s = names.settings
    c, n, short = names.cluster, names.node, names.short

    def f(*extra: str) -> str:
        """The dashboard's variables as matchers of a served model's series."""
        return "{" + ", ".join([f'{c}=~"$cluster"', 'namespace=~"$namespace"', 'model=~"$model"',
                                'engine=~"$engine"', *extra]) + "}"

    keys = f"{c}, namespace, workload, model, engine"
    attainment = names.rule("workload", "goodput_inference_slo_attainment_ratio", "rate")
    joint = names.rule("workload", "goodput_inference_slo_joint_attainment_ratio", "rate")
    budget = f"workload:goodput_inference_slo_error_budget:ratio{f()}"
    requests = names.rule("workload", "goodput_inference_requests", "rate")
    throughput = f"sum without (reason) ({requests}{f()})"
    slo_goodput = f"{names.rule('workload', 'goodput_inference_slo_goodput', 'rate')}{f()}"
    # what is known to have met both objectives: the client path's exact count, else the lower bound
    exact, lower = f('bound="exact"'), f('bound="lower"')
    known = f"sum without (bound) ({joint}{exact}) or sum without (bound) ({joint}{lower})"

    def error(window: str) -> str:
        return f"workload:goodput_inference_slo_error_ratio:rate{window}{f()}"

    fast, slow = s.inference_slo_fast_windows, s.inference_slo_slow_windows
    d = new_dashboard(LEVEL, names, own_variables=variables(names)).with_row(row("SLO"))
    d = d.with_panel(stat_panel(
        f"SLO attainment ({short})", "Share of each served model's requests known to have met both latency "
        "objectives (time to first token and time per output token) over the short window: exact where the "
        "client path counted it per request, else the lower bound of the two histograms' figures (an engine's "
        f"histograms do not say how many requests met both). Below the target ({s.inference_slo.target:.3g} by "
        "default) spends error budget.",
        "percentunit", [(known, MODEL)], width=6))
    d = d.with_panel(stat_panel(
        "SLO goodput", "Requests per second that finished within both objectives (finished requests times the "
        "attainment above). The serving equivalent of goodput: compare with the throughput beside it.",
        "reqps", [(slo_goodput, MODEL)], width=6))
    d = d.with_panel(stat_panel(
        "Throughput", "Requests per second each served model finished over the short window, whatever the "
        "reason (stop, length, abort, error) and whether or not they met the objectives.",
        "reqps", [(throughput, MODEL)], width=6))
    d = d.with_panel(stat_panel(
        f"Error budget burn rate ({fast[1]})", f"How fast each model spends its error budget: the error ratio "
        f"over {fast[1]} over the budget (1 - target). 1 spends it exactly over the SLO period; "
        f"GoodputInferenceSLOBurnFast pages at {s.inference_slo_fast_burn_rate:g} (over {fast[0]} too), "
        f"GoodputInferenceSLOBurnSlow at {s.inference_slo_slow_burn_rate:g} over {slow[0]} and {slow[1]}.",
        "none", [(f"{error(fast[1])} / {budget}", MODEL)], width=6))
    objectives = f('objective=~"ttft|tpot|both"')
    d = d.with_panel(timeseries_panel(
        "SLO attainment per objective", "Share of each model's requests that met each objective over the short "
        "window: ttft and tpot from the engine's histograms (the bucket at the objective), both where the client "
        "path counted it. The joint attainment of an engine is known only within bounds (lower: max(0, ttft + "
        "tpot - 1), upper: the smaller of the two); the target line is 1 - each model's error budget.",
        "percentunit", [(f"{attainment}{objectives}", MODEL + " {{objective}}"),
                        (f"{joint}{f()}", MODEL + " both ({{bound}} bound)"),
                        (f"1 - {budget}", MODEL + " target")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "SLO goodput vs throughput", "Requests per second finished within both objectives against all finished "
        "requests. The gap is requests served too slowly: load (the queue below) or slow decode steps (time per "
        "output token, the GPUs underneath).",
        "reqps", [(slo_goodput, MODEL + " SLO goodput"), (throughput, MODEL + " throughput")]))
    d = d.with_panel(timeseries_panel(
        "Requests no histogram judges", "Requests per second each model finished (aborted ones out) with nothing to "
        "judge an objective on: its engine has no histogram for it (TGI: time to first token; Triton, vLLM before "
        "0.11, SGLang before 0.5.22: time per output token). Such a model has no SLO goodput rather than one "
        "counting the objective as met; its burn rate counts the misses of what is judged; "
        "GoodputInferenceSLOUnmeasured fires.",
        "reqps", [(f"workload:goodput_inference_slo_unjudged_requests:rate{short}{f()}", MODEL + " {{objective}}")]))
    d = d.with_panel(timeseries_panel(
        "Bucket each objective is judged at", "The histogram bound each objective is read at, per model: the "
        "objective itself where the engine has that bucket, else the nearest bound below it that its scrape has "
        "(older or custom buckets). Below the objective, attainment is a lower bound: requests between the two "
        "count as missed.",
        "s", [(f"workload:goodput_inference_slo_judged_bound_seconds:min{f()}", MODEL + " {{objective}}")]))
    d = d.with_row(row("Error budget burn"))
    for name, (low, high), rate in (("Fast", fast, s.inference_slo_fast_burn_rate),
                                    ("Slow", slow, s.inference_slo_slow_burn_rate)):
        alert = f"GoodputInferenceSLOBurn{name}"
        d = d.with_panel(timeseries_panel(
            f"{name} burn: error ratio over {low} and {high}", f"Share of requests known to have missed an "
            f"objective (1 - the exact joint attainment, else 1 - its upper bound) over {low} and {high}, against "
            f"the error budget times {rate:g}. {alert} fires while both windows are over that line: at that rate the "
            f"budget of a 30-day SLO lasts {30 / rate:.2g} days.",
            "percentunit", [(error(low), f"{MODEL} over {low}"), (error(high), f"{MODEL} over {high}"),
                            (f"{budget} * {rate:g}", f"{MODEL} budget x {rate:g}")], max_value=1))
    d = d.with_row(row("Latency against the objectives"))
    defaults = {"ttft": s.inference_slo.ttft_seconds, "tpot": s.inference_slo.tpot_seconds}
    for histogram, (title, what, objective) in LATENCIES.items():
        buckets = f"workload:goodput_inference_{histogram}_bucket:rate{short}{f()}"
        targets = [(f"histogram_quantile({q:g}, sum by ({keys}, le) ({buckets}))", f"{MODEL} p{q * 100:g}")
                   for q in QUANTILES]
        description = f"p50, p90 and p99 of the {what}, per served model over the short window."
        if objective:
            default = defaults[objective]
            client = (f'goodput_inference_slo_objective_seconds{{{c}=~"$cluster", namespace=~"$namespace", '
                      f'model=~"$model", objective="{objective}"}}')
            targets.append((f"max by (model) ({client}) or max by (model) ({budget}) * 0 + {default:g}",
                            "{{model}} objective"))
            description += (f" The objective line is the one the client path reports "
                            f"(goodput_inference_slo_objective_seconds), else the settings' default "
                            f"(inference_slo.{objective}_seconds, {default:g} s); models or engines with objectives "
                            "of their own (inference_slo_engines, inference_slo_overrides) are judged at theirs. "
                            "A p90 over the line means over 10% of requests miss it.")
        d = d.with_panel(timeseries_panel(f"{title} p50/p90/p99", description, "s", targets,
                                          width=24 if histogram == "queue_time_seconds" else 12))
    d = d.with_row(row("Engine"))
    d = d.with_panel(timeseries_panel(
        "Requests running and waiting", "Requests in the engine's running batch and waiting in its queue, summed "
        "over the model's servers. Waiting that keeps growing means arrivals outrun the batch: time to first "
        "token grows with it.",
        "short", [(f"workload:goodput_inference_requests_running:sum{f()}", MODEL + " running"),
                  (f"workload:goodput_inference_requests_waiting:sum{f()}", MODEL + " waiting")]))
    d = d.with_panel(timeseries_panel(
        "KV cache usage", f"Share of the KV cache in use, on the fullest server of each model. Near 1 the engine "
        f"preempts requests to make room (GoodputInferenceKVCacheSaturated at {s.inference_kv_cache_saturated_ratio:g} "
        f"for {s.inference_kv_cache_saturated_for} with preemptions rising).",
        "percentunit", [(f"workload:goodput_inference_kv_cache_usage_ratio:max{f()}", MODEL)], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Preemptions", "Requests per second the engine preempted (evicted from the batch, their KV cache "
        "recomputed or swapped later) over the short window. Any sustained rate means the KV cache is too small "
        "for the load: every preemption redoes work and adds latency.",
        "cps", [(f"{names.rule('workload', 'goodput_inference_preemptions', 'rate')}{f()}", MODEL)]))
    d = d.with_panel(timeseries_panel(
        "Prompt and generation tokens per second", "Prompt tokens (prefill) and generated tokens (decode) per "
        "second of finished requests, over the short window. Generation tokens per second per GPU is the "
        "engine's useful output.",
        "short", [(f"{names.rule('workload', 'goodput_inference_prompt_tokens', 'rate')}{f()}", MODEL + " prompt"),
                  (f"{names.rule('workload', 'goodput_inference_generation_tokens', 'rate')}{f()}",
                   MODEL + " generation")]))
    d = d.with_panel(timeseries_panel(
        "Queue and compute time per request", "Seconds each finished request spent queued and executing, on "
        "average over the short window, from engines that count the time itself (Triton's cumulative queue and "
        "compute microseconds). The others' queue time is the histogram above.",
        "s", [(f"{names.rule('workload', 'goodput_inference_queue_seconds', 'rate')}{f()}\n  / {throughput}",
               MODEL + " queue"),
              (f"{names.rule('workload', 'goodput_inference_compute_seconds', 'rate')}{f()}\n  / {throughput}",
               MODEL + " compute")]))
    d = d.with_panel(timeseries_panel(
        "Finished requests by reason", "Requests per second that finished, by the engine's finish reason: stop "
        "(end of sequence), length (max tokens), abort (the client went away: often a timeout on a slow "
        "request), error.",
        "reqps", [(f"{requests}{f()}", MODEL + " {{reason}}")], stacked=True, width=24))
    d = d.with_row(row("GPUs underneath"))
    info = f"workload:goodput_inference_gpu:info{f()}"

    def per_gpu(expr: str) -> str:
        return f"{info} * on ({c}, {n}, uuid) group_left (gpu) (\n  {expr}\n)"

    on_gpu = f"{c}, {n}, uuid, gpu"
    node_links = [link_to_node(MEMORY, "GPU memory of this node", "${__data.fields." + n + "}"),
                  link_to_node(KERNELS, "Kernels and silicon of this node", "${__data.fields." + n + "}"),
                  link_to_level(CLUSTER, "Cluster overview")]
    level_links = [link_to_level(MEMORY, "GPU memory (all nodes)"), link_to_level(KERNELS, "Kernels and silicon "
                   "(all nodes)"), link_to_level(CLUSTER, "Cluster overview")]
    d = d.with_panel(stat_panel(
        "Serving GPUs", "GPUs under each served model: those the kubelet assigned to its pods, else those its "
        "processes hold.", "none", [(f"workload:goodput_inference_gpus:count{f()}", MODEL)], width=6,
        links=level_links))
    d = d.with_panel(stat_panel(
        "Power of the serving GPUs", "Board power drawn by the GPUs under each served model, summed.",
        "watt", [(f"workload:goodput_inference_gpu_power_watts:sum{f()}", MODEL)], width=6, links=level_links))
    d = d.with_panel(stat_panel(
        "Fullest serving GPU", "Frame-buffer memory in use over installed, on the fullest GPU of each served "
        "model. Engines preallocate the KV cache, so high is normal; KV cache usage above says how full it is.",
        "percentunit", [(f"workload:goodput_inference_gpu_memory_used_ratio:max{f()}", MODEL)], width=6,
        links=level_links))
    d = d.with_panel(stat_panel(
        "Requests waiting", "Requests queued across the served models. Waiting while the GPUs below idle points "
        "at the engine's scheduler or its limits, not at the GPUs.",
        "short", [(f"sum(workload:goodput_inference_requests_waiting:sum{f()})", "")], width=6, no_value="0"))
    d = d.with_panel(timeseries_panel(
        "Idle share of the serving GPUs", f"Share of time no kernel ran on the GPUs under each served model (their "
        "mean), against the requests waiting. High while requests wait is GoodputInferenceGPUIdleWhileQueued "
        f"(idle over {s.inference_idle_while_queued_ratio:g} for {s.inference_idle_while_queued_for}): the engine, "
        "not the GPUs, holds the requests back.",
        "percentunit", [(f"{names.rule('workload', 'goodput_inference_gpu_idle_ratio', 'rate')}{f()}", MODEL)],
        max_value=1, links=level_links))
    d = d.with_panel(timeseries_panel(
        "Memory used share of the serving GPUs", "Frame-buffer memory in use over installed, on the fullest GPU "
        "of each served model, over time. A rise beyond the engine's preallocation is activations or a leak: "
        "GPU memory has the per-process view.",
        "percentunit", [(f"workload:goodput_inference_gpu_memory_used_ratio:max{f()}", MODEL)], max_value=1,
        links=level_links))
    d = d.with_panel(joined_table_panel(
        "GPUs under each served model", "One row per GPU under a served model (from "
        "workload:goodput_inference_gpu:info): its node and uuid, its idle share over the short window, its power "
        "and its memory in use over installed. Click a row for that node's GPU memory or kernels dashboard.",
        "percentunit", [
            (per_gpu(f"max by ({on_gpu}) ({names.rule('gpu', 'goodput_gpu_idle_ratio', 'rate')}{{{c}=~\"$cluster\"}})"),
             "Idle", "percentunit"),
            (per_gpu(f'max by ({on_gpu}) (goodput_gpu_power_watts{{{c}=~"$cluster"}})'), "Power", "watt"),
            (per_gpu(f'max by ({on_gpu}) (goodput_gpu_memory_used_bytes{{{c}=~"$cluster"}})\n'
                     f'  / max by ({on_gpu}) (goodput_gpu_memory_total_bytes{{{c}=~"$cluster"}} > 0)'),
             "Memory used", "percentunit")],
        links=node_links))
    return d
