"""Level 1, Cluster overview: is the cluster doing useful work, and where to look first: the funnel's verdict on each
workload comes first."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import (
    LAYER_COLORS,
    LEVELS,
    Filters,
    Names,
    labels_table_panel,
    link_to_level,
    link_to_workload,
    new_dashboard,
    row,
    stat_panel,
    table_panel,
    timeseries_panel,
    verdict_in_walk_order,
)

LEVEL = LEVELS[0]
SERVING = LEVELS[6]


def build(names: Names) -> Dashboard:
    f = Filters(names)
    s = names.settings
    goodput = names.rule("workload", "goodput_ratio", "rate")
    idle = {kind: names.rule("cluster", f"goodput_gpu_idle{kind}_ratio", "rate")
            for kind in ("", "_while_allocated", "_unallocated")}
    d = new_dashboard(LEVEL, names, also_down=(SERVING,)).with_row(row("Verdict"))
    d = d.with_panel(labels_table_panel(
        "Verdict per workload", "The funnel's verdict on each workload now: the first layer, walked top-down (cluster, "
        "network, host, memory, kernel), whose check explains the goodput the job loses, and the signal that decided "
        "it (reason); healthy when none does. The jobs held back earliest in the walk come first (walk step: the "
        "check's place in it). Start with the top row: click it for the Workload dashboard, or run `goodput-exporter "
        "diagnose --workload <workload>` for every check with its figure. Only workloads that report phases are "
        "judged.",
        verdict_in_walk_order(f), ["workload", "layer", "reason"], value="walk step",
        colored={"layer": LAYER_COLORS}, width=24, height=8, links=[link_to_workload("${__data.fields.workload}")]))
    d = d.with_row(row("Goodput"))
    d = d.with_panel(stat_panel(
        "Goodput", "Share of accounted job time spent computing, averaged over the workloads (compute seconds "
        "over all phase seconds the jobs report). Low means time goes to data waits, communication, checkpoints "
        "or restarts: open the Workload dashboard to see which phase.",
        "percentunit", [(f"avg({goodput}{f()})", "")]))
    d = d.with_panel(stat_panel(
        "Tokens per second", "Tokens all workloads processed per second. A drop with unchanged GPU count means "
        "the jobs slowed down (stragglers, hangs, data stalls) or stopped.",
        "short", [(f"sum({names.rule('workload', 'goodput_tokens', 'rate')}{f()})", "")]))
    d = d.with_panel(stat_panel(
        "Idle while allocated", "Share of time no kernel ran on GPUs a process holds. High means jobs hold GPUs "
        "they do not keep busy (input pipeline, communication, host); see levels 2 and 3.",
        "percentunit", [(f"{idle['_while_allocated']}{f()}", "")]))
    d = d.with_panel(stat_panel(
        "Idle unallocated", "Share of time no kernel ran on GPUs no process holds: capacity nobody uses. High "
        "means the scheduler leaves GPUs empty.",
        "percentunit", [(f"{idle['_unallocated']}{f()}", "")]))
    d = d.with_panel(stat_panel(
        "Straggling ranks", f"Ranks whose own time per step is over {s.straggler_ratio:g}x their workload's "
        "median rank (the GoodputStraggler threshold). Above 0: one slow rank holds the whole job back.",
        "none", [(f"count({names.rule('workload_rank', 'goodput_straggler_ratio', 'rate')}{f()} "
                  f"> {s.straggler_ratio:g})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "Hung collectives", f"Process groups whose oldest in-flight collective has waited over "
        f"{s.collective_hang_seconds:g}s (the GoodputCollectiveHang threshold). Above 0: a job is stuck; open "
        "Collectives and network.",
        "none", [(f"count(workload_pg:goodput_collective_oldest_inflight_seconds:max{f()} "
                  f"> {s.collective_hang_seconds:g})", "")], no_value="0"))
    d = d.with_row(row("GPU health"))
    d = d.with_panel(stat_panel(
        "GPUs with an XID in the last hour", "GPUs that reported an XID error event in the last hour. Any "
        "critical XID (e.g. 79 fallen off the bus, 48 double-bit ECC) usually needs the job restarted elsewhere.",
        "none", [(f"sum(node:goodput_gpus_xid_last_hour:count{f()})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "Uncorrected ECC errors", "Uncorrected ECC memory errors per second across the cluster. Above 0 means "
        "corrupted results or a crash to come: drain the GPU.",
        "cps", [(f"sum({names.rule('node', 'goodput_gpu_ecc_uncorrected_errors', 'rate')}{f()})", "")],
        no_value="0"))
    d = d.with_panel(stat_panel(
        "Throttled GPUs", f"GPUs whose clocks power, thermal, board or reliability limits held down over "
        f"{s.throttle_ratio:.0%} of the time. Above 0: the silicon runs slower than bought; see Kernels and silicon.",
        "none", [(f"sum(node:goodput_gpus_throttled:count{f()})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "GPUs needing a reset", "GPUs with a row remap or page retirement that only a GPU reset applies, or a row "
        "remap that failed (GoodputGPUResetRequired). Above 0: drain and reset them; replace those whose remap "
        "failed.",
        "none", [(f"sum(node:goodput_gpus_reset_required:count{f()})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "Degraded PCIe links", "GPUs whose PCIe link runs on fewer lanes than GPU and slot allow, or, while busy, "
        "at a lower generation (idle GPUs lower it to save power). Above 0: host-device copies are slower there; "
        "see Kernels and silicon.",
        "none", [(f"sum(node:goodput_gpus_pcie_degraded:count{f()})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "Lost GPUs", "GPUs NVML no longer answers for (fallen off the bus, need a reset). Above 0: the jobs on "
        "them have failed or will.",
        "none", [(f"sum(node:goodput_gpus_lost:count{f()})", "")], no_value="0"))
    d = d.with_panel(stat_panel(
        "Nodes by failure risk", "Nodes by their worst GPU's risk level (docs/health.md: NVIDIA's XID catalogue and "
        "memory error guidance): ok; watch, a worsening trend (a ticket); drain, a GPU that needs a reset or will "
        "fail its job (drained at the job's next checkpoint by `goodput-exporter health`); replace, an RMA case. "
        "A level no node is at is not shown.",
        "none", [(f"sum by (level) (cluster:goodput_nodes_at_risk_level:count{f(node=False)})", "{{level}}")],
        width=6))
    d = d.with_panel(labels_table_panel(
        "Nodes at risk", "Each node with a GPU at watch or worse, its worst level (1 watch, 2 drain, 3 replace), "
        "worst first; `goodput-exporter health --dry-run` on the node says why and what it would do.",
        f"sort_desc(node:goodput_gpu_risk_level:max{f()} > 0)", [s.node_label], value="level", width=6))
    d = d.with_panel(stat_panel(
        "GPUs allocated", "Share of GPUs at least one compute process holds. Low with queued work means "
        "scheduling or fragmentation leaves GPUs empty.",
        "percentunit", [(f"avg(cluster:goodput_gpu_allocated_ratio:avg{f()})", "")]))
    d = d.with_panel(stat_panel(
        "Exporters up", "Exporters whose every source collected successfully last time, over all exporters. "
        "Below 100% means some nodes' numbers are missing or stale.",
        "percentunit", [(f"avg(node:goodput_exporter_source_up:min{f()})", "")]))
    d = d.with_row(row("Fabric"))
    d = d.with_panel(stat_panel(
        "Fabric traffic", "Bytes per second all nodes send through their RDMA ports and other network interfaces. "
        "A drop while the jobs run means they stopped communicating (a hang) or lost links.",
        "Bps", [(f"sum({names.rule('cluster', 'goodput_fabric_transmit_bytes', 'rate')}{f()})", "")], width=6))
    d = d.with_panel(stat_panel(
        "RDMA ports not active", "RDMA ports whose state is not ACTIVE, on every node: ports nobody cabled count "
        "too, so compare with yesterday. GoodputFabricLinkDown pages on those that lost their link on nodes in use; "
        "Collectives and network names them.",
        "none", [(f"sum(node:goodput_fabric_ports_not_active:count{f()})", "")], width=6))
    d = d.with_panel(stat_panel(
        "Links counting errors", f"Links (RDMA ports, interfaces) counting over {s.fabric_error_rate:g} link errors "
        "a second (the GoodputFabricErrors threshold). Above 0: a cable or transceiver to replace.",
        "none", [(f"count({names.rule('link', 'goodput_fabric_link_errors', 'rate')}{f()} > "
                  f"{s.fabric_error_rate:g}) or vector(0)", "")], width=6))
    d = d.with_panel(stat_panel(
        "Congested ports", f"RoCE ports on which over {s.fabric_congestion_ratio:.1%} of packets carry congestion "
        "marks or notifications (ECN, CNP). Above 0 with a high comm_wait: the network holds the jobs back.",
        "none", [(f"count({names.rule('link', 'goodput_fabric_congestion_ratio', 'rate')}{f()} > "
                  f"{s.fabric_congestion_ratio:g}) or vector(0)", "")], width=6))
    d = d.with_row(row("Serving"))
    serving = [link_to_level(SERVING, "Serving (inference SLOs)")]
    joint = names.rule("workload", "goodput_inference_slo_joint_attainment_ratio", "rate")
    exact, lower = f('bound="exact"'), f('bound="lower"')
    known = f"sum without (bound) ({joint}{exact}) or sum without (bound) ({joint}{lower})"
    d = d.with_panel(stat_panel(
        "Served models below their SLO target", "Served models (inference) whose share of requests known to meet "
        "both latency objectives is below their target over the short window. Above 0: open Serving for which "
        "objective they miss and why.",
        "none", [(f"count(({known}) < 1 - workload:goodput_inference_slo_error_budget:ratio{f()}) or vector(0)",
                  "")], width=6, links=serving))
    d = d.with_panel(stat_panel(
        "Inference SLO goodput", "Requests per second the served models finished within both latency objectives, "
        "summed. Compare with the throughput beside it: the gap is requests served too slowly.",
        "reqps", [(f"sum({names.rule('workload', 'goodput_inference_slo_goodput', 'rate')}{f()})", "")], width=6,
        links=serving))
    d = d.with_panel(stat_panel(
        "Inference throughput", "Requests per second the served models finished, whatever the reason and "
        "latency.",
        "reqps", [(f"sum({names.rule('workload', 'goodput_inference_requests', 'rate')}{f()})", "")], width=6,
        links=serving))
    d = d.with_panel(stat_panel(
        "Serving GPUs idle", "Share of time no kernel ran on the GPUs under the served models (their mean). High "
        "while requests wait: the engines, not the GPUs, hold the requests back.",
        "percentunit", [(f"avg({names.rule('workload', 'goodput_inference_gpu_idle_ratio', 'rate')}{f()})", "")],
        width=6, links=serving))
    d = d.with_row(row("Over time"))
    d = d.with_panel(timeseries_panel(
        "Goodput by workload", "Each workload's goodput (compute share of its time) over the short window. A "
        "step down marks when a job started losing time; the Workload dashboard splits it by phase.",
        "percentunit", [(f"{goodput}{f()}", "{{workload}}")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "GPU idle share", "Share of time no kernel ran, for all GPUs, allocated ones and unallocated ones. "
        "Allocated GPUs idling is lost goodput; unallocated idling is unused capacity.",
        "percentunit", [(f"{idle['']}{f()}", "all GPUs"), (f"{idle['_while_allocated']}{f()}", "allocated"),
                        (f"{idle['_unallocated']}{f()}", "unallocated")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Memory repairs", "Memory rows the GPUs remapped to spare rows (A100, H100 and later), by the kind of "
        "ECC error behind it, and pages they retired (older GPUs), over the short window. Each uncorrected one "
        "leaves a GPU waiting for a reset (GPUs needing a reset); a GPU that keeps repairing is wearing out.",
        "short", [(f"sum by (error_type) ({names.rule('node', 'goodput_gpu_remapped_rows', 'increase')}{f()})",
                   "rows remapped, {{error_type}} errors"),
                  (f"sum by (cause) ({names.rule('node', 'goodput_gpu_retired_pages', 'increase')}{f()})",
                   "pages retired, {{cause}}")]))
    d = d.with_panel(timeseries_panel(
        "NVLink errors", "NVLink data-link errors per second across the selected GPUs, by kind: CRC errors, "
        "replays and recoveries. A rise on a few links points at a bridge, cable or switch port; the Kernels and "
        "silicon dashboard names the link.",
        "cps", [(f"sum by (error_type) ({names.rule('node', 'goodput_gpu_nvlink_errors', 'rate')}{f()})",
                 "{{error_type}}")]))
    d = d.with_row(row("Worst first"))
    d = d.with_panel(table_panel(
        "Workloads by goodput", "The ten workloads with the lowest goodput now. Start with the top row: open "
        "the Workload dashboard with it selected.",
        "percentunit", [(f"bottomk(10, {goodput}{f()})", "")]))
    d = d.with_panel(table_panel(
        "Nodes by idle allocated GPUs", "The ten nodes whose allocated GPUs idle the most now. A node far above "
        "the rest points at its host (input pipeline, CPU, NUMA): open Host and input pipeline for it.",
        "percentunit", [(f"topk(10, {names.rule('node', 'goodput_gpu_idle_while_allocated_ratio', 'rate')}{f()})",
                         "")]))
    d = d.with_panel(table_panel(
        "Namespaces by idle GPUs", "Per Kubernetes namespace (from the kubelet's pod-resources API): the idle "
        "share of the GPUs its pods hold, and its goodput. A team holding GPUs that idle is the first "
        "conversation to have. Empty off Kubernetes or with the kubelet source off.",
        "percentunit", [(f"topk(10, {names.rule('namespace', 'goodput_gpu_idle_ratio', 'rate')}{f()})", "idle"),
                        (f"{names.rule('namespace', 'goodput_ratio', 'rate')}{f()}", "goodput")], width=24))
    return d
