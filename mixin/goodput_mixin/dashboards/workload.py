"""Level 6, Workload: one job's goodput (now and over its lifetime), MFU, energy per token and per step, where its
wall time went, badput by phase, its ranks' step times, stragglers, collectives, and the network of the nodes it
runs on."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import (
    LEVELS,
    Filters,
    Names,
    link_to_workload_fabric,
    new_dashboard,
    row,
    stat_panel,
    table_panel,
    timeseries_panel,
)

LEVEL = LEVELS[5]

# The buckets of workload:goodput_breakdown_ratio, each in a fixed colour: goodput green, lost progress and downtime
# red, waiting on data or peers orange and purple, checkpoints blue, compile and startup yellow, the rest grey.
BUCKET_COLORS = {
    "productive": "green", "wasted_progress": "red", "data_wait": "orange", "comm_wait": "purple",
    "checkpoint_save": "blue", "checkpoint_restore": "light-blue", "compile": "yellow", "startup": "light-yellow",
    "other": "#8f8f8f", "untracked": "#c7c7c7", "downtime": "dark-red",
}


def build(names: Names) -> Dashboard:
    f = Filters(names, workload=True)
    s = names.settings
    short, long = names.short, names.long
    rank = "{{workload}} rank {{rank}}"
    fabric = [link_to_workload_fabric()]
    d = new_dashboard(LEVEL, names, workload=True).with_row(row("Goodput"))
    d = d.with_panel(stat_panel(
        f"Goodput ({short})", "Share of the job's run time (the wall time its processes ran: every phase, untracked "
        "time included) spent computing, over the short window. Low means the phases below eat the time. Downtime "
        "and redone steps count only in Lifetime goodput and Where the time went.",
        "percentunit", [(f"{names.rule('workload', 'goodput_ratio', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        f"Goodput ({long})", "The same over the baseline window. Short well below baseline: something changed "
        "recently (GoodputDrop fires on this).",
        "percentunit", [(f"{names.rule_long('workload', 'goodput_ratio', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        "Lifetime goodput", "Productive seconds (compute, less the compute of steps redone after a restart) over all "
        "the wall time since the workload first started on the node, including the downtime between a crash and "
        "the restart and the steps redone since the last checkpoint.",
        "percentunit", [(f"workload:goodput_lifetime_ratio{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        "MFU", f"Model FLOPs utilization over the short window ({short}): the model FLOPs the job reported over the "
        "peak dense tensor FLOPS of its GPUs in its declared data type. Empty when the job reports no FLOPs or "
        "the GPU model's peak is unknown.",
        "percentunit", [(f"{names.rule('workload', 'goodput_mfu_ratio', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        "Tokens per second", "Tokens the job processes per second over the short window. Compare with the drop "
        "beside.", "short", [(f"{names.rule('workload', 'goodput_tokens', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        f"Tokens/s below the {long} baseline", "How far tokens per second are below the job's own baseline "
        f"(0.3 = 30% fewer). Above {s.goodput_drop_ratio:g} for long pages as GoodputDrop.",
        "percentunit", [(f"workload:goodput_tokens_drop_ratio:rate{short}_vs_{long}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        "Tokens per joule", "Tokens the job processes per joule its GPUs draw, over the short window (tokens per "
        "second over the power of the GPUs its processes hold).",
        "short", [(f"{names.rule('workload', 'goodput_tokens_per_joule', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(stat_panel(
        "Joules per step", "Energy the job's GPUs draw per training step, over the short window (their power over "
        "the job's steps per second).",
        "joule", [(f"{names.rule('workload', 'goodput_joules_per_step', 'rate')}{f()}", "{{workload}}")], width=6))
    d = d.with_panel(timeseries_panel(
        "Where the time went", "The job's wall time split into buckets that add to 100%: productive compute; "
        "wasted_progress (compute of steps redone since the last checkpoint); the waits and overheads data_wait, "
        "comm_wait, checkpoint_save, checkpoint_restore, compile, startup and other; untracked (run time no phase "
        "covers); downtime (between a crash and the restart). Wall time includes the downtime and the redone steps.",
        "percentunit", [(f"{names.rule('workload', 'goodput_breakdown_ratio', 'rate')}{f()}", "{{bucket}}")],
        stacked=True, max_value=1, width=24, colors=BUCKET_COLORS))
    d = d.with_panel(timeseries_panel(
        "Goodput and badput by phase", "Share of the job's run time per phase: compute is goodput; data_wait, "
        "comm_wait, checkpoint_save, checkpoint_restore, compile, startup, other and untracked (time no phase "
        "covers) are badput. The largest badput band says which level to open: data_wait -> Host, comm_wait -> "
        "Collectives.",
        "percentunit", [(f"{names.rule('workload', 'goodput_ratio', 'rate')}{f()}", "compute (goodput)"),
                        (f"{names.rule('workload', 'goodput_badput_ratio', 'rate')}{f()}", "{{phase}}")],
        stacked=True, max_value=1, width=24))
    d = d.with_panel(timeseries_panel(
        "Idle share of the job's GPUs", "Share of time no kernel ran on the GPUs the job's processes hold "
        "(attributed from the processes NVML lists on each GPU). High while the job runs is time lost to "
        "something other than the GPU: the phases above say what.",
        "percentunit", [(f"{names.rule('workload', 'goodput_gpu_idle_ratio', 'rate')}{f()}", "{{workload}}")],
        max_value=1))
    d = d.with_panel(timeseries_panel(
        "The job's GPUs by activity class", "Share of the job's GPUs that were underused, compute-bound, "
        "memory-bound or other over the short window (DCGM profiling). A compute-bound job is doing its "
        "math; memory-bound or underused GPUs are where kernel work pays off. Needs DCGM.",
        "percentunit", [(f"{names.rule('workload', 'goodput_gpu_activity_class_ratio', 'avg')}{f()}", "{{class}}")],
        stacked=True, max_value=1))
    d = d.with_row(row("Ranks"))
    d = d.with_panel(timeseries_panel(
        "Step time per rank", "Mean wall time of a step per rank. In synchronous training all ranks meet in the "
        "all-reduce, so they match; a rise on all of them is the job slowing down.",
        "s", [(f"{names.rule('workload_rank', 'goodput_step_duration_seconds', 'mean')}{f()}", rank)]))
    d = d.with_panel(timeseries_panel(
        "Own time per step per rank", "Each rank's time per step outside communication waits. The straggler is the "
        "rank with the most own time: the others wait for it in the all-reduce.",
        "s", [(f"{names.rule('workload_rank', 'goodput_step_own_seconds', 'mean')}{f()}", rank)]))
    d = d.with_panel(timeseries_panel(
        "Straggler ratio per rank", f"Each rank's own time per step over the median rank's. Above "
        f"{s.straggler_ratio:g} for long is a straggler (GoodputStraggler): check that rank's GPU (Kernels and "
        "silicon) and host.",
        "none", [(f"{names.rule('workload_rank', 'goodput_straggler_ratio', 'rate')}{f()}", rank)]))
    d = d.with_panel(timeseries_panel(
        "Step time p95 per rank", "95th percentile of step time per rank, from the step histogram. Far above the "
        "mean means occasional slow steps (checkpoints, garbage collection, data hiccups).",
        "s", [(f"histogram_quantile(0.95, sum by (le, workload, rank) "
               f"(rate(goodput_step_duration_seconds_bucket{f()}[$__rate_interval])))", rank)]))
    d = d.with_panel(timeseries_panel(
        "Time since last event", "Seconds since each rank last reported to the exporter. Growing means the rank "
        "stopped (hung, crashed, or lost its connection).",
        "s", [(f"time() - goodput_workload_last_event_timestamp_seconds{f()}", rank)]))
    d = d.with_panel(timeseries_panel(
        "Restarts", "Restarts each rank reported in the window. Every restart loses the progress since the last "
        "checkpoint plus startup time.",
        "none", [(f"increase(goodput_workload_restarts_total{f()}[$__rate_interval])", rank)]))
    d = d.with_row(row("Collectives"))
    d = d.with_panel(timeseries_panel(
        "Collective lag per rank", "Collectives each rank is behind the furthest rank of its process group. A "
        "rank that falls behind and stays there is the one the group waits for.",
        "none", [(f"workload_pg_rank:goodput_collective_lag:behind_max{f()}", rank + " pg {{pg}} {{state}}")],
        links=fabric))
    d = d.with_panel(timeseries_panel(
        "Oldest in-flight collective per group", "Longest wait of an unfinished collective in each process group. "
        f"Over {s.collective_hang_seconds:g}s is a hang (GoodputCollectiveHang).",
        "s", [(f"workload_pg:goodput_collective_oldest_inflight_seconds:max{f()}", "{{workload}} pg {{pg}}")],
        links=fabric))
    d = d.with_panel(table_panel(
        "Missing ranks", "Ranks that have not joined the collective other ranks wait in: the cause of a hang.",
        "none", [(f"goodput_collective_missing_rank{f()} == 1", "")], width=24))
    d = d.with_row(row("Network of the job's nodes"))
    on_node = "{{workload}} {{" + names.node + "}}"
    d = d.with_panel(timeseries_panel(
        "Communication wait share per node", "Share of the time the job's ranks on each node spend waiting on "
        "communication (phase comm_wait). High on every node while the fabric below is busy, erroring or congested: "
        "the network holds the job back (the series link to the fabric of its nodes).",
        "percentunit", [(f"{names.rule('workload_node', 'goodput_comm_wait_ratio', 'rate')}{f()}", on_node)],
        max_value=1, links=fabric))
    d = d.with_panel(timeseries_panel(
        "Fabric traffic of the job's nodes", "Bytes per second the RDMA ports and other network interfaces of each "
        "node the job runs on send and receive (the whole node's: other jobs on it count too).",
        "Bps", [(f"{names.rule('workload_node', 'goodput_fabric_transmit_bytes', 'rate')}{f()}", on_node + " tx"),
                (f"{names.rule('workload_node', 'goodput_fabric_receive_bytes', 'rate')}{f()}", on_node + " rx")],
        links=fabric))
    d = d.with_panel(timeseries_panel(
        "Fabric trouble on the job's nodes", "Per node of the job: link errors per second (symbol, receive, "
        "integrity), transport retries per second (out of sequence, timeouts, NAK retries). Either on one node "
        "points at its links; open the fabric of the job's nodes for the port.",
        "cps", [(f"{names.rule('workload_node', 'goodput_fabric_link_errors', 'rate')}{f()}", on_node + " link errors"),
                (f"{names.rule('workload_node', 'goodput_fabric_retransmission_events', 'rate')}{f()}",
                 on_node + " retries")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Fabric congestion on the job's nodes", "Per node of the job, its most congested RoCE port: the share of "
        "packets carrying congestion marks or notifications (ECN, CNP). Up together with the communication wait "
        "share: the fabric is congested (GoodputFabricCongestion).",
        "percentunit", [(f"{names.rule('workload_node', 'goodput_fabric_congestion_ratio', 'rate')}{f()}", on_node)],
        links=fabric))
    return d
