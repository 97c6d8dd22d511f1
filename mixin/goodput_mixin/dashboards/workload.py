"""Level 6, Workload: one job's verdict first (the funnel's layer and reason, the checks it fails, what its step-time
shifts say), then its goodput (now and over its lifetime), MFU, energy per token and per step, where its wall time
went, badput by phase, its ranks' step times and their changes, stragglers, collectives, and the network of the nodes
it runs on."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat, table
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from ..rules import forecast as fc
from ..rules.recording import STEP_SHIFT
from ..rules.verdict import CANDIDATE, VERDICT
from .kit import (
    LAYER_COLORS,
    LEVELS,
    Filters,
    Names,
    fixed_color,
    labels_table_panel,
    link_to_workload_fabric,
    new_dashboard,
    row,
    stat_panel,
    table_panel,
    timeseries_panel,
)

LEVEL = LEVELS[5]

# The buckets of workload:goodput_breakdown_ratio, each in a fixed colour: goodput green, lost progress and downtime
# red, waiting on data or peers orange and purple, checkpoints blue, compile and startup yellow, evaluation light
# purple, the rest grey.
BUCKET_COLORS = {
    "productive": "green", "wasted_progress": "red", "data_wait": "orange", "comm_wait": "purple",
    "checkpoint_save": "blue", "checkpoint_restore": "light-blue", "compile": "yellow", "startup": "light-yellow",
    "eval": "light-purple", "other": "#8f8f8f", "untracked": "#c7c7c7", "downtime": "dark-red",
}
# What the ranks' lasting step-time shifts up say of the job (workload:goodput_step_time_shift:info), shown by the
# Step-time shift panel as the value at its index: no shift, a straggler, a job-wide regression.
SHIFT_KINDS = (("no shift", "green"), ("straggler", "orange"), ("regression", "red"))


def _verdict(names: Names, f: Filters) -> list[table.Panel | stat.Panel]:
    """The verdict row: the job's verdict, the checks it fails beside it, and what its step-time shifts say."""
    c = names.cluster
    kinds = f" or on ({c}, workload) ".join(
        f"{value} * {STEP_SHIFT}" + f('kind="' + kind + '"') for value, (kind, _) in enumerate(SHIFT_KINDS) if value)
    shift = (f"max by ({c}, workload) ({kinds} or on ({c}, workload) "
             f"0 * group by ({c}, workload) (goodput_step_time_baseline_seconds{f()}))")
    shift_panel = (stat_panel(
        "Step-time shift", "What lasting shifts up of the ranks' step time (the daemon's change detector) within "
        f"the last {names.settings.step_shift_window} say of the job: a straggler when they are on half of its ranks "
        "or fewer (Step-time baseline per rank, below, shows which stepped up), a regression when on more than half "
        "(the whole job slowed: code, data, a shared service); no shift otherwise. Ranks that meet at every step all "
        "slow down behind one straggler: Own time per step per rank names it. Empty until the detector has a "
        "baseline (after the job's first steps).",
        "none", [(shift, "{{workload}}")], width=6, height=6)
        .mappings([model.ValueMap(options={str(value): model.ValueMappingResult(text=kind, color=color, index=value)
                                           for value, (kind, color) in enumerate(SHIFT_KINDS)})])
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME))
    return [
        labels_table_panel(
            "Verdict", "The funnel's verdict on the job now: the first layer, walked top-down (cluster, network, "
            "host, memory, kernel), whose check explains the goodput it loses, and the signal that decided it "
            "(reason); healthy when none does. The rows below hold the evidence; `goodput-exporter diagnose "
            "--workload <workload>` prints every check with its figure. Empty for a job that reports no phases.",
            f"{VERDICT}{f()}", ["workload", "layer", "reason"], colored={"layer": LAYER_COLORS}, width=8, height=6),
        labels_table_panel(
            "Failing checks", "Every check of the walk the job fails now, in the order of the walk (walk step: the "
            "check's place in it): the first is the verdict, the others are what to look at once it is fixed, or "
            "what it causes. Empty for a healthy job.",
            f"{CANDIDATE}{f()}", ["workload", "layer", "reason"], value="walk step",
            colored={"layer": LAYER_COLORS}, width=10, height=6),
        shift_panel,
    ]


def _forecast(names: Names, f: Filters) -> list[stat.Panel | table.Panel]:
    """When the job finishes (docs/forecast.md): empty for a job that declared no target or stopped stepping. Below
    it, the job's runs (its lineage, where it names the job across them)."""
    band = "{{workload}} P50", "{{workload}} P90"
    c = names.cluster
    return [
        stat_panel(
            "Progress", "The job's step number over its target step (its max_steps: a framework's, "
            "GOODPUT_TARGET_STEPS, Telemetry.target). Empty when the job declared no target.",
            "percentunit", [(f"{fc.PROGRESS}{f()}", "{{workload}}")], width=4, no_value="no target"),
        stat_panel(
            "Time to finish", "P50 and P90 of the time left: the steps left at the job's robust step time, stretched "
            "by its overhead between steps, plus the interruptions expected over it times what each costs it "
            "(docs/forecast.md). Empty without a target or without a step in the last minutes.",
            "s", [(f"{fc.P50}{f()}", band[0]), (f"{fc.P90}{f()}", band[1])], width=6, no_value="no forecast"),
        stat_panel(
            "Finishes at", "The date the job finishes, P50 and P90; GoodputDeadlineAtRisk tickets a P50 past the "
            "deadline it declared (GOODPUT_DEADLINE).",
            "dateTimeAsIso", [(f"{fc.FINISH_P50}{f()} * 1000", band[0]), (f"{fc.FINISH_P90}{f()} * 1000", band[1])],
            width=6, no_value="no forecast"),
        stat_panel(
            "GPU-hours to finish", "GPU-hours the job still needs (one GPU per rank), P50 and P90.",
            "short", [(f"{fc.GPU_HOURS_P50}{f()}", band[0]), (f"{fc.GPU_HOURS_P90}{f()}", band[1])], width=4,
            no_value="no forecast"),
        stat_panel(
            "Badput ahead", "GPU-hours of the time left that the job would not spend at its best sustained goodput "
            "(its best hour): what fixing its badput is worth from here.",
            "short", [(f"{fc.BADPUT_GPU_HOURS}{f()}", "{{workload}}")], width=4, no_value="no forecast"),
        labels_table_panel(
            "Runs", "The job's runs (its launches: a torchrun run id, a Slurm job ID) and when each started, where "
            "the job is named across them (GOODPUT_JOB): one job, one forecast, one lifetime goodput; each new run "
            "counts as a restart (its gap as downtime, the steps it redoes as wasted progress). Empty for a job its "
            "launcher names: each of its runs is a workload of its own.",
            f"min by ({c}, workload, run) (goodput_workload_run_start_timestamp_seconds{f()}) * 1000",
            ["workload", "run"], value="started", unit="dateTimeAsIso", width=24, height=5),
    ]


def build(names: Names) -> Dashboard:
    f = Filters(names, workload=True)
    s = names.settings
    short, long = names.short, names.long
    rank = "{{workload}} rank {{rank}}"
    fabric = [link_to_workload_fabric()]
    d = new_dashboard(LEVEL, names, workload=True).with_row(row("Verdict"))
    for panel in _verdict(names, f):
        d = d.with_panel(panel)
    d = d.with_row(row("Forecast"))
    for panel in _forecast(names, f):
        d = d.with_panel(panel)
    d = d.with_row(row("Goodput"))
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
        "comm_wait, checkpoint_save, checkpoint_restore, compile, startup, eval and other; untracked (run time no "
        "phase covers); downtime (between a crash and the restart). Wall time includes the downtime and the redone "
        "steps.",
        "percentunit", [(f"{names.rule('workload', 'goodput_breakdown_ratio', 'rate')}{f()}", "{{bucket}}")],
        stacked=True, max_value=1, width=24, colors=BUCKET_COLORS))
    d = d.with_panel(timeseries_panel(
        "Goodput and badput by phase", "Share of the job's run time per phase: compute is goodput; data_wait, "
        "comm_wait, checkpoint_save, checkpoint_restore, compile, startup, eval, other and untracked (time no phase "
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
        "Slowdown from stragglers", "The step time over the step time the job would have with every rank at its "
        "stage's typical speed (1 = none). A pipeline stage slower by construction does not count (its ranks are "
        "compared with each other); uneven work that makes a different rank the slowest at each step barely shows "
        "here (GoodputStragglerRandom).",
        "none", [(f"{names.rule('workload', 'goodput_straggler_slowdown_ratio', 'rate')}{f()}", "{{workload}}")]))
    d = d.with_panel(timeseries_panel(
        "GPU time lost to stragglers", "GPUs' worth of time the job loses waiting for its stragglers (GPU-seconds "
        "a second: ranks x (1 - 1/slowdown)), and what each culprit rank would give back at its stage's typical "
        "speed.",
        "none", [(f"{names.rule('workload', 'goodput_straggler_lost_gpu_seconds', 'rate')}{f()}", "{{workload}}"),
                 (f"{names.rule('workload_rank', 'goodput_straggler_lost_gpu_seconds', 'rate')}{f()}",
                  f"{rank} on {{{{{s.node_label}}}}}")]))
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
    d = d.with_row(row("Step-time changes"))
    d = d.with_panel(timeseries_panel(
        "Step time, last minute and last hour", "Each rank's step time at two time scales, from the daemon: the "
        "median of its steps in the last minute (1m), and the median of its last hour's per-minute medians (1h). "
        "A 1m line that leaves its 1h line and stays away is a lasting change; one that comes back is a transient "
        "(a checkpoint, an evaluation).",
        "s", [("goodput_step_time_seconds" + f('window="' + scale + '"'), f"{rank} {scale}") for scale in ("1m", "1h")],
        width=8))
    d = d.with_panel(timeseries_panel(
        "Step-time baseline per rank", "The step time each rank's change detector holds as its normal level: it "
        "ignores spikes and moves only at a lasting shift. A step on one rank is a new straggler; on every rank, a "
        "job-wide regression (Step-time shift, at the top), or, where the ranks meet at every step, one straggler "
        "they all wait for (Own time per step per rank tells).",
        "s", [(f"goodput_step_time_baseline_seconds{f()}", rank)], width=8))
    d = d.with_panel(timeseries_panel(
        "Step-time shifts", "Lasting shifts of each rank's step time the change detector found, per interval, up "
        "(slower, red) or down (faster, green). Compare the time of a shift up with the verdict's signals and the "
        "phases above.",
        "none", [(f"increase(goodput_step_time_shifts_total{f()}[$__rate_interval])", rank + " {{direction}}")],
        width=8)
        .draw_style(common.GraphDrawStyle.BARS)
        .override_by_regexp(".* up$", [fixed_color("red")])
        .override_by_regexp(".* down$", [fixed_color("green")]))
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
