"""Recording rules: raw series -> the numbers people act on, at the gpu, node, workload and cluster
levels, over each window of the settings. Names follow `level:metric:operations`.

Built to stay cheap at 10,000 GPUs (bench/rules_scale.py):
- Raw series are read once per evaluation, over the short window only (5m by default).
- The longer windows (1h) are averages over time of what the short-window rules recorded, at the
  level they recorded it: `avg_over_time(workload:goodput_phase_seconds:rate5m[1h])` reads 600
  recorded series where `rate(goodput_phase_seconds_total[1h])` would read 38,400 raw ones. For a
  steady counter the two agree; when the rate changes, the average of the 5m rates over the hour
  is the hour's rate give or take the first 5 minutes.
- Long-window groups and the DCGM activity classes, which change slowly, are evaluated every
  `slow_groups_interval` (1m), not at every evaluation.
- Groups are kept small: Prometheus evaluates groups concurrently and the rules of one group in turn,
  so a group that reads what another records sees it one evaluation old.
- What changes only when GPUs change hands (the peak FLOPS of each workload's GPUs) and the totals since a
  workload started (lifetime goodput: the counters' last values, no range) are evaluated every
  `slow_groups_interval` too. The seconds redone over `wasted_progress_window` are the average of the
  short-window rate over it, times its length, like the long windows.
"""

from __future__ import annotations

from typing import Any

from goodput_client.contract import FLOPS_DTYPES, PHASES, UNTRACKED_PHASE

from .risk import risk_groups
from .settings import RulesSettings, seconds

Rule = dict[str, Any]
Group = dict[str, Any]

IDLE_KINDS = ("idle", "idle_while_allocated", "idle_unallocated")


def _gpu(s: RulesSettings) -> list[Rule]:
    w = s.windows[0]
    return [
        {"record": f"gpu:goodput_gpu_idle_ratio:rate{w}",
         "expr": f"rate(goodput_gpu_idle_seconds_total[{w}])\n"
                 f"  / (rate(goodput_gpu_sampled_seconds_total[{w}]) > 0)"},
    ]


def _gpu_allocation(s: RulesSettings) -> list[Rule]:
    w = s.windows[0]
    idle = f"gpu:goodput_gpu_idle_ratio:rate{w}"
    return [
        # allocated at any time in the window vs never: idle while someone holds the GPU is waste
        {"record": f"gpu:goodput_gpu_idle_while_allocated_ratio:rate{w}",
         "expr": f"{idle} and (max_over_time(goodput_gpu_allocated[{w}]) == 1)"},
        {"record": f"gpu:goodput_gpu_idle_unallocated_ratio:rate{w}",
         "expr": f"{idle} and (max_over_time(goodput_gpu_allocated[{w}]) == 0)"},
    ]


def _gpu_memory(s: RulesSettings) -> list[Rule]:
    h = s.memory_predict_horizon
    return [
        {"record": f"gpu:goodput_gpu_memory_used_bytes:predict_linear{h}",
         "expr": f"predict_linear(goodput_gpu_memory_used_bytes[{s.memory_predict_window}], {seconds(h)})"},
        {"record": f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{h}",
         "expr": f"gpu:goodput_gpu_memory_used_bytes:predict_linear{h}\n"
                 "  / (goodput_gpu_memory_total_bytes > 0)"},
    ]


def held(s: RulesSettings) -> str:
    """One series per GPU and workload holding it, from the processes (a GPU held by two workloads counts for
    each)."""
    return f"max by ({s.cluster_label}, {s.node_label}, uuid, workload) (goodput_gpu_workload_info)"


PIPES = ("tensor", "fp16", "fp32", "fp64")
ACTIVITY = ("sm", "dram", *PIPES)  # every DCGM ratio averaged per GPU, in the order of their groups


def _gpu_activity(s: RulesSettings) -> list[list[Rule]]:
    """What the GPU did with its time, from DCGM's profiling ratios (absent without the dcgm source)."""
    c, w = s.cluster_label, s.windows[0]

    def recorded(ratio: str) -> str:
        return f"gpu:goodput_gpu_{ratio}_active_ratio:avg{w}"

    def avg(ratio: str) -> Rule:
        # One series per GPU: the whole GPU's where DCGM measures it, else the mean of its MIG GPU
        # instances (dcgm-exporter reports a GPU in MIG mode per instance only; each instance's ratio is of
        # its own slice, so the mean is the GPU's when the instances are the same size).
        metric = f"goodput_gpu_{ratio}_active_ratio"
        return {"record": recorded(ratio),
                "expr": f'avg_over_time({metric}{{gpu_instance_id=""}}[{w}])\n'
                        f"or\navg without (gpu_instance_id) (avg_over_time({metric}{{gpu_instance_id!=\"\"}}[{w}]))"}

    sm, dram = recorded("sm"), recorded("dram")
    cls, code = f"gpu:goodput_gpu_activity_class:avg{w}", f"gpu:goodput_gpu_activity_code:avg{w}"

    def candidate(number: int, expr: str, **labels: str) -> Rule:
        return {"record": code, "expr": f"({expr}) * 0 + {number}", "labels": {"code": str(number), **labels}}

    # One class per GPU, first match wins: underused (SMs mostly idle), compute-bound (a math pipe busy),
    # memory-bound (the memory interface busy), else other (SMs busy with neither saturated: latency, launch
    # or synchronization bound). Value 1, so averages give shares. Each average's group also records the class
    # codes (1-4) it can tell, as candidates (`code`, valued by their number; `pipe` tells the math pipes'
    # apart); the class is then the lowest candidate of each GPU, named by count_values and label_replace.
    # Taking the first match in one rule (`or` over the four branches) read every average again and took 1.1 s on
    # vmalert at 10,000 GPUs; naming each branch and joining them with `or ignoring (class)` is the same in
    # PromQL, but a MetricsQL range query (vmalert's replay, Grafana) gives a GPU the first branch's class at
    # every step where any branch matches. Each average reads 10,000 raw series at 10,000 GPUs and records as
    # many: one group each, so that no group takes a second on either engine (three to a group took 1.1 s on
    # vmalert, bench/results.md).
    candidates = {
        "sm": [candidate(1, f"{sm} < {s.underused_sm_active_ratio:g}"), candidate(4, sm)],
        "dram": [candidate(3, f"{dram} >= {s.memory_bound_dram_ratio:g}")],
        **{pipe: [candidate(2, f"{recorded(pipe)} >= {s.compute_bound_pipe_ratio:g}", pipe=pipe)] for pipe in PIPES},
    }
    averages = [[avg(ratio), *candidates[ratio]] for ratio in ACTIVITY]
    named = f'count_values without () ("code", min without (code, pipe) ({code}))'
    for n, name in enumerate(("underused", "compute_bound", "memory_bound", "other"), 1):
        named = f'label_replace({named}, "class", "{name}", "code", "{n}")'
    classes = [{"record": cls, "expr": f"max without (code) (\n{named}\n)"}]
    shares = [
        # per workload (GPUs attributed by goodput_gpu_workload_info): the share of its GPUs in each class
        {"record": f"workload:goodput_gpu_activity_class_ratio:avg{w}",
         "expr": f"sum by ({c}, workload, class) (\n"
                 f"  {held(s)}\n"
                 f"  * on ({c}, {s.node_label}, uuid) group_left (class) {cls}\n)\n"
                 f"/ ignoring (class) group_left ()\n"
                 f"count by ({c}, workload) (\n"
                 f"  {held(s)}\n"
                 f"  * on ({c}, {s.node_label}, uuid) group_left () {cls}\n)"},
    ]
    return [*averages, classes, shares]


def _attribution(s: RulesSettings) -> list[list[Rule]]:
    """Per workload and per namespace, through who holds each GPU (goodput_gpu_workload_info from the
    processes, goodput_gpu_pod_info from the kubelet)."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    idle = f"gpu:goodput_gpu_idle_ratio:rate{w}"
    infos = {"workload": "goodput_gpu_workload_info", "namespace": "goodput_gpu_pod_info"}
    rules: list[Rule] = [
        # the info series is the many side: a GPU held by two workloads (or MIG slices of two
        # namespaces) counts for each
        {"record": f"{level}:goodput_gpu_idle_ratio:rate{w}",
         "expr": f"avg by ({c}, {level}) (\n  max by ({c}, {n}, uuid, {level}) ({info})\n"
                 f"  * on ({c}, {n}, uuid) group_left () {idle}\n)"}
        for level, info in infos.items()]
    phases = f"workload:goodput_phase_seconds:rate{w}"
    ns = "workload:goodput_namespace:info"
    namespaces: list[Rule] = [
        # the namespace of each workload's GPUs; one per workload (a workload is one job, in one namespace)
        {"record": ns,
         "expr": f"topk by ({c}, workload) (1,\n  max by ({c}, workload, namespace) (\n"
                 f"    {held(s)}\n"
                 f"    * on ({c}, {n}, uuid) group_left (namespace)\n"
                 f"      topk by ({c}, {n}, uuid) (1, max by ({c}, {n}, uuid, namespace) (goodput_gpu_pod_info))\n"
                 "  )\n)"},
        {"record": f"namespace:goodput_ratio:rate{w}",
         "expr": f'sum by ({c}, namespace) (\n  {phases}{{phase="compute"}}\n'
                 f"  * on ({c}, workload) group_left (namespace) {ns}\n)\n"
                 f"/ (sum by ({c}, namespace) (\n  sum without (phase) ({phases})\n"
                 f"  * on ({c}, workload) group_left (namespace) {ns}\n) > 0)"},
    ]
    return [rules, namespaces]


def _level(s: RulesSettings, level: str) -> list[Rule]:
    by = {"node": f"{s.cluster_label}, {s.node_label}", "cluster": s.cluster_label}[level]
    w = s.windows[0]
    rules = [{"record": f"{level}:goodput_gpu_{kind}_ratio:rate{w}",
              "expr": f"avg by ({by}) (gpu:goodput_gpu_{kind}_ratio:rate{w})"} for kind in IDLE_KINDS]
    rules.append({"record": f"{level}:goodput_gpu_allocated_ratio:avg",
                  "expr": f"avg by ({by}) (goodput_gpu_allocated)"})
    return rules


PCIE_DEGRADED = "gpu:goodput_gpu_pcie_link_degraded"
HARD_LIMITS = 'reason=~"power|thermal|board_limit|reliability"'  # the throttle reasons that count against a GPU


def throttled(s: RulesSettings) -> str:
    """The record of each GPU's share of the short window throttled by a hard limit."""
    return f"gpu:goodput_gpu_throttled_ratio:rate{s.windows[0]}"


def _throttled(s: RulesSettings) -> list[Rule]:
    """Read once (four counters of every GPU): the node count, GoodputGPUThrottled and the verdict read the record
    (each read the counters, up to 0.65 s a group at 10,000 GPUs)."""
    w = s.windows[0]
    return [{"record": throttled(s),
             "expr": f"sum without (reason) (rate(goodput_gpu_clock_throttle_seconds_total{{{HARD_LIMITS}}}[{w}]))"}]


def _pcie(s: RulesSettings) -> list[list[Rule]]:
    """The GPUs whose PCIe link runs below what the GPU and its slot allow, by what is degraded (width, generation),
    valued at what the link runs at; GoodputGPUPCIeLinkDegraded and the node count read them. Two groups (each reads
    two or three series of every GPU; together, and twice, they took up to 0.9 s at 10,000 GPUs). Width: never below
    its maximum on a healthy link. Generation: many boards drop it while idle to save power, so it counts only on a
    GPU busy most of the window; and a healthy link reaches its maximum at some point while busy, so the highest
    generation seen over the window is what is compared."""
    w = s.windows[0]
    busy = f"gpu:goodput_gpu_idle_ratio:rate{w} < {1 - s.pcie_degraded_busy_ratio:g}"
    return [
        [{"record": PCIE_DEGRADED,
          "expr": f"max_over_time(goodput_gpu_pcie_link_width[{w}]) < goodput_gpu_pcie_link_max_width",
          "labels": {"degraded": "width"}}],
        [{"record": PCIE_DEGRADED,
          "expr": f"max_over_time(goodput_gpu_pcie_link_generation[{w}]) < goodput_gpu_pcie_link_max_generation\n"
                  f"and {busy}",
          "labels": {"degraded": "generation"}}],
    ]


def _node_health(s: RulesSettings) -> list[list[Rule]]:
    """The GPU health of each node as a few counts and rates, so that the cluster level (a dashboard, a global ruler
    over many clusters) reads a series a node instead of every GPU's. A count covers every GPU the node reports
    (0 when none is affected), but the PCIe one, which only counts the degraded GPUs. Five groups: each count that
    reads several series of every GPU, or a record of every GPU (throttled, PCIe), has its own (eleven in one group
    took 2.3 s at 10,000 GPUs)."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    by, gpu = f"{c}, {n}", f"{c}, {n}, uuid"
    reset_due = "|".join(f"goodput_gpu_{state}" for state in ("row_remap_pending", "row_remap_failure",
                                                               "retired_pages_pending"))
    xid = {"record": "node:goodput_gpus_xid_last_hour:count",
           "expr": f"sum by ({by}) (goodput_gpu_last_xid_timestamp_seconds > bool (time() - 3600))"}
    ecc = {"record": f"node:goodput_gpu_ecc_uncorrected_errors:rate{w}",
           "expr": f'sum by ({by}) (rate(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}[{w}]))'}
    hard = {"record": "node:goodput_gpus_throttled:count",
            "expr": f"sum by ({by}) (max by ({gpu}) ({throttled(s)}) > bool {s.throttle_ratio:g})"}
    reset = {"record": "node:goodput_gpus_reset_required:count",
             "expr": f'sum by ({by}) (max by ({gpu}) ({{__name__=~"{reset_due}"}}) == bool 1)'}
    pcie = {"record": "node:goodput_gpus_pcie_degraded:count",
            "expr": f"count by ({by}) (group by ({gpu}) ({PCIE_DEGRADED}))"}
    lost = {"record": "node:goodput_gpus_lost:count", "expr": f"sum by ({by}) (goodput_gpu_up == bool 0)"}
    sources = {"record": "node:goodput_exporter_source_up:min", "expr": f"min by ({by}) (goodput_exporter_source_up)"}
    ports = {"record": "node:goodput_fabric_ports_not_active:count",
             "expr": f"sum by ({by}) (goodput_fabric_port_state != bool 4)"}
    remapped = {"record": f"node:goodput_gpu_remapped_rows:increase{w}",
                "expr": f"sum by ({by}, error_type) (increase(goodput_gpu_remapped_rows_total[{w}]))"}
    retired = {"record": f"node:goodput_gpu_retired_pages:increase{w}",
               "expr": f"sum by ({by}, cause) (increase(goodput_gpu_retired_pages_total[{w}]))"}
    nvlink = {"record": f"node:goodput_gpu_nvlink_errors:rate{w}",
              "expr": f"sum by ({by}, error_type) (rate(goodput_gpu_nvlink_errors_total[{w}]))"}
    return [[xid, ecc, lost, sources, ports], [reset, remapped, retired], [hard], [pcie], [nvlink]]


def _gpu_long(s: RulesSettings, long: str) -> list[list[Rule]]:
    """The long-window idle ratios, in three groups: the GPU level (10,000 series an hour long each, at
    10,000 GPUs), the allocation split of it, and the levels above (few series)."""
    # For the allocation split this is the mean over the short windows in which the GPU was
    # allocated (or not): a GPU allocated half the hour shows in both, each over its own half.
    short = s.windows[0]

    def avg(level: str, kind: str) -> Rule:
        return {"record": f"{level}:goodput_gpu_{kind}_ratio:rate{long}",
                "expr": f"avg_over_time({level}:goodput_gpu_{kind}_ratio:rate{short}[{long}])"}

    return [
        [avg("gpu", "idle")],
        [avg("gpu", kind) for kind in IDLE_KINDS[1:]],
        [avg(level, kind) for level in ("node", "cluster") for kind in IDLE_KINDS]
        + [avg(level, "idle") for level in ("workload", "namespace")],
    ]


def _goodput(phases: str, w: str) -> list[Rule]:
    """Goodput: the share of accounted time spent computing; badput: the share of every other phase."""
    return [
        {"record": f"workload:goodput_ratio:rate{w}",
         "expr": f'sum without (phase) ({phases}{{phase="compute"}})\n'
                 f"  / (sum without (phase) ({phases}) > 0)"},
        {"record": f"workload:goodput_badput_ratio:rate{w}",
         "expr": f'{phases}{{phase!="compute"}}\n'
                 f"  / ignoring (phase) group_left () (sum without (phase) ({phases}) > 0)"},
    ]


OWN_STAGE = "workload_stage:goodput_step_own_seconds:median"
OWN_STAGED = "workload_stage_rank:goodput_step_own_seconds:mean"


def staged(s: RulesSettings, own: str) -> str:
    """Each rank's own time per step with its pipeline stage (`pipeline_stage`, from goodput_rank_role_info) where the
    job reported its role; without a role, as it is (no stage label: the whole workload is its stage)."""
    c, n = s.cluster_label, s.node_label
    rank = f"{c}, {n}, workload, rank"
    return (f"{own}\n* on ({rank}) group_left (pipeline_stage)\n"
            f"max by ({rank}, pipeline_stage) (goodput_rank_role_info)\nor on ({rank})\n{own}")


def _stragglers(s: RulesSettings, own: str, w: str) -> list[list[Rule]]:
    """Each rank's own time with its stage, the typical own time of each stage (its ranks' median; ranks without a
    role: the workload's), and each rank's own time over its stage's: a pipeline's last stage, slower by
    construction, is compared with itself, not with the faster stages (which would page all its ranks). Of a stage of
    two ranks (two replicas of a pipeline, a 2-rank job) the typical is the faster one's: their median is their mean,
    against which a rank three times slower than its peer reads only 1.5. The join with the roles is recorded once
    and read by the two rules after it (written into each of them, it was read five times: 0.5 s of the group's
    evaluation at 10,000 GPUs). Two rule lists, for two groups: the join alone, then the rules reading it (in one
    group with them, the join took 1.26 s on vmalert at 10,000 GPUs; the hour's six per-rank rules took 0.96 s in
    one group); the others read it an evaluation later, as any group's records."""
    c = s.cluster_label
    typical = f"{OWN_STAGE}{w}"
    by = f"{c}, workload, pipeline_stage"
    ranks = f"{OWN_STAGED}{w}"
    return [[{"record": ranks, "expr": staged(s, own)}], [
        {"record": typical,
         "expr": f"(\n  quantile by ({by}) (0.5, {ranks})\n  and on ({by})\n"
                 f"  count by ({by}) ({ranks}) > 2\n)\nor\nmin by ({by}) ({ranks})"},
        {"record": f"workload_rank:goodput_straggler_ratio:rate{w}",
         "expr": f"{ranks}\n/ on ({c}, workload, pipeline_stage) group_left ()\n  ({typical} > 0)"},
        {"record": f"workload:goodput_straggler_ratio:rate{w}",
         "expr": f"max by ({c}, workload) (workload_rank:goodput_straggler_ratio:rate{w})"},
    ]]


def _workload(s: RulesSettings) -> list[Rule]:
    """Goodput and tokens per workload, from the phases per node the goodput.workload_node groups record (as last
    recorded: a sum of their records, not a second rate over the ranks' phase counters)."""
    c, w = s.cluster_label, s.windows[0]
    phases = f"workload:goodput_phase_seconds:rate{w}"
    return [
        {"record": phases, "expr": f"sum by ({c}, workload, phase) (workload_node:goodput_phase_seconds:rate{w})"},
        *_goodput(phases, w),
        {"record": f"workload:goodput_tokens:rate{w}",
         "expr": f"sum by ({c}, workload) (rate(goodput_tokens_total[{w}]))"},
    ]


STEP_MAX = "workload:goodput_step_duration_seconds:max"
RANKS_STEPPING = "workload:goodput_ranks_stepping:count"


def _step(s: RulesSettings) -> list[Rule]:
    """Per rank, with its node (the label names where a rank runs: an alert on it pages that node's owner); per
    workload, its step time (its slowest rank's mean: in synchronous training every rank's) and how many ranks
    stepped in the window, which the straggler cost reads (each computed there from every rank's series, the cost
    group took 1.2 s at 10,000 GPUs)."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    step = f"workload_rank:goodput_step_duration_seconds:mean{w}"
    return [
        {"record": step,
         "expr": f"sum by ({c}, {n}, workload, rank) (rate(goodput_step_duration_seconds_sum[{w}]))\n"
                 f"  / (sum by ({c}, {n}, workload, rank) (rate(goodput_step_duration_seconds_count[{w}])) > 0)"},
        {"record": f"{STEP_MAX}{w}", "expr": f"max by ({c}, workload) ({step})"},
        {"record": f"{RANKS_STEPPING}{w}", "expr": f"count by ({c}, workload) ({step})"},
    ]


STEP_SHIFT = "workload:goodput_step_time_shift:info"


def _step_shift(s: RulesSettings) -> list[Rule]:
    """What lasting step-time shifts up (the daemon's change detector, per rank) say of a workload within
    `step_shift_window`: a `straggler` when they are on half of its ranks or fewer (ranks slowed that their peers did
    not), a `regression` when on more than half (the job as a whole slowed: new code, data, a shared service). A
    2-rank job with one rank shifted has a straggler; a 1-rank job that shifted, a regression. Its ranks are those with
    a shifts counter (the daemon publishes one, at 0, for each rank it accounts). Value 1, one kind per workload;
    none where no rank shifted up."""
    c, window = s.cluster_label, s.step_shift_window
    counter = 'goodput_step_time_shifts_total{direction="up"}'
    shifted = (f"count by ({c}, workload) (\n    group by ({c}, workload, rank) (increase({counter}[{window}]) > 0)\n"
               "  )")
    ranks = f"count by ({c}, workload) (\n    group by ({c}, workload, rank) ({counter})\n  )"

    # one rank much slower than the median by its own time (the others wait for it) shifts every rank's step time up
    straggling = f"workload:goodput_straggler_ratio:rate{s.windows[0]} > {s.straggler_ratio:g}"

    def kind(name: str, comparison: str, straggler: str) -> Rule:
        return {"record": STEP_SHIFT,
                "expr": f"group by ({c}, workload) (\n  (\n  {shifted}\n  * 2 {comparison} on ({c}, workload)\n"
                        f"  {ranks}\n  )\n  {straggler} on ({c}, workload)\n  {straggling}\n)",
                "labels": {"kind": name}}

    return [kind("straggler", "<=", f"or\n  group by ({c}, workload) ({shifted})\n  and"),
            kind("regression", ">", "unless")]


COLLECTIVE_SECONDS = "workload_pg_rank:goodput_collective_seconds:rate"
COLLECTIVE_WAIT = "workload_rank:goodput_collective_wait_seconds:rate"
STEP_WAIT = "workload_rank:goodput_step_wait_seconds:mean"


def _collective_wait(s: RulesSettings) -> list[Rule]:
    """Each rank's GPU-side wait in collectives, from the durations NCCL times (TORCH_NCCL_ENABLE_TIMING; gloo
    times none, and then there is none). NCCL returns to the CPU once a collective is enqueued, so the CPU's
    comm_wait sees almost nothing of it: the GPU waits, in the collective's kernel, for the last rank to arrive. A
    collective takes the last-arriving rank only its transfer, and every other rank that plus its wait; so over the
    window, per process group, a rank's time in collectives beyond the least of the group's ranks is its wait, summed
    over its groups. A lower bound when the last arrival changes from one collective to the next (the least
    total then holds waits too). One series per rank, process group and op is read (the durations' sums), across
    nodes (each rank's on its own node)."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    seconds_ = f"{COLLECTIVE_SECONDS}{w}"
    return [
        {"record": seconds_,
         "expr": f"sum by ({c}, {n}, workload, pg, rank) (rate(goodput_collective_duration_seconds_sum[{w}]))"},
        {"record": f"{COLLECTIVE_WAIT}{w}",
         "expr": f"sum by ({c}, {n}, workload, rank) (\n  {seconds_}\n"
                 f"  - on ({c}, workload, pg) group_left ()\n  min by ({c}, workload, pg) ({seconds_})\n)"},
    ]


STEPS = "workload_rank:goodput_steps:rate"


def _straggler(s: RulesSettings) -> list[Rule]:
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    step = f"workload_rank:goodput_step_duration_seconds:mean{w}"
    own = f"workload_rank:goodput_step_own_seconds:mean{w}"
    wait = f"{STEP_WAIT}{w}"
    by = f"{c}, {n}, workload, rank"
    steps = f"{STEPS}{w}"
    return [
        # Each rank's steps a second, read by the two rules after it (written into each, the counters were read
        # twice), in this group so that both divide by this evaluation's steps.
        {"record": steps, "expr": f"sum by ({by}) (rate(goodput_steps_total[{w}]))"},
        # What a rank waits in collectives per step: the larger of its comm_wait (the CPU waited: gloo, DDP's hooks)
        # and its GPU-side wait (NCCL, goodput.collective_wait). The two are set apart by a label for the max.
        {"record": wait,
         "expr": f"max by ({by}) (\n"
                 f'  sum by ({by}) (rate(goodput_phase_seconds_total{{phase="comm_wait"}}[{w}]))\n  or\n'
                 f'  label_replace({COLLECTIVE_WAIT}{w}, "side", "gpu", "", "")\n)\n/ ({steps} > 0)'},
        # In synchronous training every rank's step lasts as long as the slowest one's (they all meet in the
        # collectives), so the straggler is found by its own time per step: what it neither waits in collectives
        # nor leaves unmeasured. It waits least because everyone waits for it. What stays unmeasured (`untracked`:
        # a pipeline's bubbles, a wait no probe saw) is never its own time. Read as its elapsed time less its
        # untracked time (in one sum: `or` keeps both, untracked negated; none reported counts 0), per step, less
        # its wait as recorded just before (under vmalert, which reads a group's records back from its store, the
        # wait of the evaluation before: written out here again, the group took 1.1 s at 10,000 GPUs). Jobs that
        # report no phases fall back to their step time. Under NCCL the own time holds the transfer (the CPU sees
        # neither it nor the wait; the GPU-side wait is beyond the last arrival's time), alike on every rank. A wait
        # counted both as untracked and on the GPU is taken once too often: floored at 0.
        {"record": own,
         "expr": f"clamp_min(\n  sum by ({by}) (\n    rate(goodput_elapsed_seconds_total[{w}])\n    or\n"
                 f'    -rate(goodput_phase_seconds_total{{phase="untracked"}}[{w}])\n  )\n  / ({steps} > 0)\n'
                 f"  - {wait},\n  0\n)\nor\n{step}"},
    ]


STRAGGLER_COST = "workload_rank:goodput_straggler_cost_ratio:rate"
STRAGGLER_LOST = "workload_rank:goodput_straggler_lost_gpu_seconds:rate"


OWN_VARIATION = "workload:goodput_step_own_variation_ratio:median"


def _straggler_cost(s: RulesSettings) -> list[Rule]:
    """What stragglers cost each workload: the what-if of ByteDance's analysis (OSDI 2025), S = T_actual / T_ideal,
    with T_ideal the step time were no rank slowed by another's imbalance. A step lasts as long as its slowest rank's
    own time plus the waits no rank escapes (the collectives' transfer). T (the workload's longest mean step) is
    compared with the lesser of two what-ifs:
    - the slowest rank at its stage's typical speed: T - (O_max - M_max), where O_max is the slowest rank's own
      time and M_max the typical own time of the slowest stage (the median of its ranks, the faster of two; without
      roles, of every rank). One slow rank in plain DDP: the whole gap is lost, whatever the job's size.
    - the work balanced across the ranks: O_mean + W_min, every rank's mean own time plus the least any rank waits
      per step (workload_rank:goodput_step_wait_seconds: the transfer, which even the last rank to arrive waits).
      Random imbalance (the slowest rank changing from step to step: uneven batches or sequence lengths) makes every
      rank wait for another in turn, though each rank's mean own time is alike and O_max ~ M_max; a pipeline stage
      slower by construction makes the other stages wait for it in every step. The study counts both as slowdown.
    On the study's published traces (tests/test_straggler_traces.py): S within 3% of the study's for the random and
    the stage kinds; for the worker kind 2.15 against 1.97 (its pipeline bubbles, left untracked, are in neither
    what-if). Two limits of means over a window: bubbles nobody measured (untracked) count as slowdown in the
    balanced what-if; and when every rank waits alike on average (random imbalance in plain data parallelism) the
    least wait holds waits for others and S reads near 1: the share of its step that even the rank waiting least
    spends waiting (workload:goodput_step_wait_min_ratio) bounds that cost, and the random kind is ticketed on
    either.
    Lost GPU-seconds per second are ranks x (1 - 1/S) = ranks x (T - T_ideal) / T. Each culprit (a rank over
    straggler_ratio times its stage's median) is charged its own gap: the share of the job's GPU time and the
    GPU-seconds it would give back alone (with its node and stage labels: the owner to call)."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    own = f"workload_rank:goodput_step_own_seconds:mean{w}"
    typical = f"{OWN_STAGE}{w}"
    step = f"{STEP_MAX}{w}"
    gap = f"(\n  max by ({c}, workload) ({own})\n  - max by ({c}, workload) ({typical})\n)"
    one_slow = f"(\n  {step}\n  - {gap}\n)"
    balanced = (f"(\n  avg by ({c}, workload) ({own})\n  + on ({c}, workload)\n"
                f"  min by ({c}, workload) ({STEP_WAIT}{w})\n)")
    # the lesser what-if (where only one exists, that one): each written once, tagged so that `or` keeps both (each
    # written out twice, in a comparison and its fallbacks, the cost group took 1.9 s at 10,000 GPUs)
    ideal = (f"min by ({c}, workload) (\n  label_replace({one_slow}, \"of\", \"one_slow\", \"\", \"\")\n  or\n"
             f"  label_replace({balanced}, \"of\", \"balanced\", \"\", \"\")\n)")
    ranks = f"{RANKS_STEPPING}{w}"
    cost = f"{STRAGGLER_COST}{w}"
    staged_typical = f'{typical}{{pipeline_stage!=""}}'
    culprit_cost = (f"(workload_rank:goodput_straggler_ratio:rate{w} > {s.straggler_ratio:g}) * 0\n"
                    f"+ on ({c}, {n}, workload, rank) group_left ()\n(\n  {own}\n"
                    f"  - on ({c}, workload) group_left ()\n  max by ({c}, workload) ({typical})\n)\n"
                    f"/ on ({c}, workload) group_left ()\n({step} > 0)")
    slowdown = f"workload:goodput_straggler_slowdown_ratio:rate{w}"
    # the rules after the first two read them as recorded (vmalert: as recorded the evaluation before, which reads a
    # group's records back from its store); each written out again, the group took 1.2 s at 10,000 GPUs
    return [
        {"record": slowdown, "expr": f"{step}\n/ (\n{ideal}\n  > 0\n)"},
        {"record": cost, "expr": culprit_cost},
        {"record": f"workload:goodput_straggler_lost_gpu_seconds:rate{w}",
         "expr": f"{ranks}\n* clamp_min(1 - 1 / ({slowdown} > 0), 0)"},
        {"record": f"{STRAGGLER_LOST}{w}", "expr": f"{cost}\n* on ({c}, workload) group_left ()\n{ranks}"},
        # pipelines: the slowest stage's typical own time over the mean stage's (1 when balanced)
        {"record": f"workload:goodput_stage_imbalance_ratio:rate{w}",
         "expr": f"max by ({c}, workload) ({staged_typical})\n/ avg by ({c}, workload) ({staged_typical})\n"
                 f"and on ({c}, workload)\ncount by ({c}, workload) ({staged_typical}) > 1"},
        # the share of its step that the rank waiting least spends waiting in collectives: near the transfer alone
        # when one rank is slow (it waits for nobody), high when every rank waits for another in turn (or the
        # network is slow: the runbook tells them apart)
        {"record": f"workload:goodput_step_wait_min_ratio:rate{w}",
         "expr": f"min by ({c}, workload) ({STEP_WAIT}{w})\n/ ({step} > 0)"},
        # how much the median rank's own time varies from step to step (the daemon's robust spread over its last 64
        # steps): steady work (a slow node, a slow stage) against batches that differ step to step (random kind)
        {"record": OWN_VARIATION,
         "expr": f"quantile by ({c}, workload) (0.5, goodput_step_own_variation_ratio)"},
    ]


def _workload_long(s: RulesSettings, long: str) -> list[list[Rule]]:
    """The long window per workload; per rank in a group of its own (eleven rules in one group took up to 1 s on
    vmalert at 10,000 GPUs), each reading the short window's records over `long`; and the stragglers over `long` in
    two more, as over the short window (a minute late, as any group's records, is nothing on an hour's averages)."""
    short = s.windows[0]
    phases = f"workload:goodput_phase_seconds:rate{long}"
    own = f"workload_rank:goodput_step_own_seconds:mean{long}"
    workload: list[Rule] = [
        {"record": phases, "expr": f"avg_over_time(workload:goodput_phase_seconds:rate{short}[{long}])"},
        *_goodput(phases, long),
        {"record": f"workload:goodput_tokens:rate{long}",
         "expr": f"avg_over_time(workload:goodput_tokens:rate{short}[{long}])"},
        {"record": f"workload:goodput_mfu_ratio:rate{long}",
         "expr": f"avg_over_time(workload:goodput_mfu_ratio:rate{short}[{long}])"},
    ]
    if long == s.windows[-1]:
        workload += [
            # 0.3 = 30% fewer tokens/s than the workload's own baseline; negative when faster
            {"record": f"workload:goodput_tokens_drop_ratio:rate{short}_vs_{long}",
             "expr": f"1 - workload:goodput_tokens:rate{short} / (workload:goodput_tokens:rate{long} > 0)"},
            {"record": f"workload:goodput_ratio:deriv{s.goodput_trend_window}",
             "expr": f"deriv(workload:goodput_ratio:rate{short}[{s.goodput_trend_window}])"},
        ]
    ranks: list[Rule] = [
        {"record": f"workload_rank:goodput_step_duration_seconds:mean{long}",
         "expr": f"avg_over_time(workload_rank:goodput_step_duration_seconds:mean{short}[{long}])"},
        {"record": own, "expr": f"avg_over_time(workload_rank:goodput_step_own_seconds:mean{short}[{long}])"},
    ]
    return [workload, ranks, *_stragglers(s, own, long)]


def _accounting(s: RulesSettings) -> list[Rule]:
    """Per workload, from the daemon's accounting of each rank: downtime between a crash and the restart, and the
    progress redone after it (the steps since the last checkpoint)."""
    c, w = s.cluster_label, s.windows[0]
    return [
        # summed over the ranks, like the phases: seconds of the ranks' wall time
        {"record": f"workload:goodput_wasted_compute_seconds:rate{w}",
         "expr": f"sum by ({c}, workload) (rate(goodput_wasted_compute_seconds_total[{w}]))"},
        {"record": f"workload:goodput_downtime_seconds:rate{w}",
         "expr": f"sum by ({c}, workload) (rate(goodput_downtime_seconds_total[{w}]))"},
        # the rank that redid most: the ranks of a synchronous job redo the same steps, so this is the job's
        {"record": f"workload:goodput_wasted_seconds:rate{w}",
         "expr": f"max by ({c}, workload) (rate(goodput_wasted_seconds_total[{w}]))"},
    ]


def _breakdown(s: RulesSettings) -> list[Rule]:
    """Where a workload's wall time went (its ranks' elapsed time and downtime), in buckets that add to it: productive
    compute, the compute of redone steps, every other phase (untracked included), downtime. Then each bucket's share."""
    w = s.windows[0]
    phases = f"workload:goodput_phase_seconds:rate{w}"
    compute = f'sum without (phase) ({phases}{{phase="compute"}})'
    wasted = f"workload:goodput_wasted_compute_seconds:rate{w}"
    wall = f"workload:goodput_wall_seconds:rate{w}"
    return [
        {"record": wall,
         "expr": "sum without (phase) (\n"
                 f'  label_replace({phases}{{phase!="compute"}}, "bucket", "$1", "phase", "(.+)")\n)'},
        # compute less what was redone; a rank's redone steps are counted at its restart, all at once, so in the
        # window of a restart they can exceed its compute. Daemons that count no wasted progress: none.
        {"record": wall,
         "expr": f"clamp_min(\n  {compute}\n  - (\n    {wasted}\n    or\n    {compute} * 0\n  ),\n  0\n)",
         "labels": {"bucket": "productive"}},
        {"record": wall, "expr": wasted, "labels": {"bucket": "wasted_progress"}},
        {"record": wall, "expr": f"workload:goodput_downtime_seconds:rate{w}", "labels": {"bucket": "downtime"}},
        {"record": f"workload:goodput_breakdown_ratio:rate{w}",
         "expr": f"{wall}\n  / ignoring (bucket) group_left ()\n  (sum without (bucket) ({wall}) > 0)"},
    ]


def _peak_flops(s: RulesSettings) -> list[list[Rule]]:
    """The peak FLOPS of each workload's GPUs, per data type: one join, and one group, per data type (a GPU has a peak
    per type and may be held by several workloads, and PromQL joins no many to many; the six joins in one group took
    0.5 to 0.65 s at 10,000 GPUs)."""
    c, n = s.cluster_label, s.node_label
    return [[{"record": "workload:goodput_gpu_peak_flops:sum",
              "expr": f"sum by ({c}, workload) (\n  {held(s)}\n  * on ({c}, {n}, uuid) group_left ()\n"
                      f'  goodput_gpu_peak_flops{{dtype="{dtype}"}}\n)',
              "labels": {"dtype": dtype}}]
            for dtype in FLOPS_DTYPES]


def _mfu(s: RulesSettings) -> list[Rule]:
    c, w = s.cluster_label, s.windows[0]
    return [
        # model FLOPs per second over the peak of the workload's GPUs, in the data type they were declared in (a
        # type the GPUs have no peak for counts nothing), summed over the types
        {"record": f"workload:goodput_mfu_ratio:rate{w}",
         "expr": f"sum by ({c}, workload) (\n  sum by ({c}, workload, dtype) (rate(goodput_model_flops_total[{w}]))\n"
                 f"  / on ({c}, workload, dtype)\n  (workload:goodput_gpu_peak_flops:sum > 0)\n)"},
    ]


def _energy(s: RulesSettings) -> list[Rule]:
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    power = f"workload:goodput_gpu_power_watts:rate{w}"
    return [
        # the energy of the GPUs the workload's processes hold, whole (a GPU held by two workloads counts for each)
        {"record": power,
         "expr": f"sum by ({c}, workload) (\n  {held(s)}\n  * on ({c}, {n}, uuid) group_left ()\n"
                 f"  rate(goodput_gpu_energy_joules_total[{w}])\n)"},
        {"record": f"workload:goodput_tokens_per_joule:rate{w}",
         "expr": f"workload:goodput_tokens:rate{w}\n  / ({power} > 0)"},
        # every rank completes every step: the job's steps per second are any rank's (the fastest to report)
        {"record": f"workload:goodput_joules_per_step:rate{w}",
         "expr": f"{power}\n  / (max by ({c}, workload) (rate(goodput_steps_total[{w}])) > 0)"},
    ]


def _accounting_totals(s: RulesSettings) -> list[Rule]:
    c, window, short = s.cluster_label, s.wasted_progress_window, s.windows[0]
    compute, wasted, elapsed, downtime = (f"sum by ({c}, workload) ({metric})" for metric in (
        'goodput_phase_seconds_total{phase="compute"}', "goodput_wasted_compute_seconds_total",
        "goodput_elapsed_seconds_total", "goodput_downtime_seconds_total"))
    return [
        # since each rank first reported (the daemon keeps its counters across restarts): productive compute over
        # the wall time, downtime and redone steps included. The counters' last values: no range is read.
        {"record": "workload:goodput_lifetime_ratio",
         "expr": f"(\n  {compute}\n  - {wasted}\n)\n/ (\n  (\n    {elapsed}\n    + {downtime}\n  ) > 0\n)"},
        # seconds redone over the window: the short-window rate averaged over it, times its length (for a workload
        # younger than the window, what it redid scaled to the window: the same share of its time)
        {"record": f"workload:goodput_wasted_seconds:increase{window}",
         "expr": f"avg_over_time(workload:goodput_wasted_seconds:rate{short}[{window}]) * {seconds(window)}"},
    ]


COLLECTIVE_MISSING = "workload_pg_rank:goodput_collective_rank_missing:info"
WAIT_STARTED = "workload_pg:goodput_collective_wait_started:min"
AWAITED = "workload_pg:goodput_collective_awaited_seq:min"
MISSING_SECONDS = "workload_pg_rank:goodput_collective_missing:seconds"


def _collective_missing(s: RulesSettings) -> list[Rule]:
    """Ranks missing from a collective, whatever node each rank of the process group is on, from each rank's own
    flight-recorder dump: the ranks that wait (a collective in flight) and since when (the dump's time less how long
    its oldest op had waited), the collective the group waits in (the lowest one a rank waits in), and for every rank
    that has not enqueued it, how long after the wait began its own dump still showed so. Dump times are compared,
    never the dumps' raw sequence numbers, so the time between dumps (a healthy rank 20 collectives behind in an
    older dump) does not accuse anyone. A rank waits when its dump, younger than dump_stale_seconds, shows a
    collective in flight for longer than rank_missing_seconds: the ops of a healthy job, in flight for milliseconds,
    and the dumps an earlier attempt of the job left behind, stuck in a wait that ended with it, accuse nobody (and
    the waiting ranks of a healthy fleet are none, which keeps the joins below small). The rules run in turn: each
    reads the one before it fresh."""
    c, n = s.cluster_label, s.node_label
    rank = f"{c}, {n}, workload, rank"
    # each waiting rank's wait, since when: its fresh dump's time less how long its oldest op had waited then
    waiting = [f"(\n  goodput_flight_recorder_dump_timestamp_seconds > time() - {s.dump_stale_seconds:g}\n)",
               f"- on ({rank}) group_right ()",
               f"(goodput_collective_oldest_inflight_seconds > {s.rank_missing_seconds:g})"]

    def indented(spaces: int) -> str:
        return "\n".join(" " * spaces + line for part in waiting for line in part.split("\n"))

    return [
        {"record": WAIT_STARTED,
         "expr": f"min by ({c}, workload, pg) (\n{indented(2)}\n)"},
        # + 1 after the min: on one series per process group that waits, not on every rank's
        {"record": AWAITED,
         "expr": f'min by ({c}, workload, pg) (\n  goodput_collective_last_seq{{state="completed"}}\n'
                 f"  and on ({rank}, pg)\n  (\n{indented(4)}\n  )\n)\n+ 1"},
        {"record": MISSING_SECONDS,
         "expr": f"(\n  max without (state) (\n"
                 f'    goodput_collective_last_seq{{state="enqueued"}}\n'
                 f"    < on ({c}, workload, pg) group_left ()\n    {AWAITED}\n  ) * 0\n"
                 f"  + on ({rank}) group_left ()\n  goodput_flight_recorder_dump_timestamp_seconds\n)\n"
                 f"- on ({c}, workload, pg) group_left ()\n{WAIT_STARTED}"},
        # the culprits: missing across nodes, or by the daemon's own check of the ranks on its node (the fast path);
        # with their namespace and pod where known
        {"record": COLLECTIVE_MISSING,
         "expr": with_pod(s, f"group by ({c}, {n}, workload, pg, rank) (\n  {MISSING_SECONDS} >= "
                             f"{s.rank_missing_seconds:g}\n  or\n  goodput_collective_missing_rank == 1\n)")},
    ]


RANK_POD = "workload_rank:goodput_pod:info"


def _rank_pod(s: RulesSettings) -> list[Rule]:
    """The pod of each rank, where the kubelet source knows it: the pod its GPUs are assigned to."""
    c, n = s.cluster_label, s.node_label
    return [
        {"record": RANK_POD,
         "expr": f"max by ({c}, {n}, workload, rank, namespace, pod) (\n"
                 f'  goodput_gpu_workload_info{{rank!=""}}\n  * on ({c}, {n}, uuid) group_left (namespace, pod)\n'
                 f"  topk by ({c}, {n}, uuid) (1, max by ({c}, {n}, uuid, namespace, pod) (goodput_gpu_pod_info))\n)"},
    ]


def with_pod(s: RulesSettings, expr: str) -> str:
    """`expr` (series of ranks, with the node label) with the rank's namespace and pod where they are known."""
    c, n = s.cluster_label, s.node_label
    return (f"(\n  {expr}\n)\n* on ({c}, {n}, workload, rank) group_left (namespace, pod)\n{RANK_POD}\n"
            f"or\n(\n  {expr}\n)\nunless on ({c}, {n}, workload, rank)\n{RANK_POD}")


def _collective(s: RulesSettings) -> list[Rule]:
    c = s.cluster_label
    seq = 'goodput_collective_last_seq{state=~"enqueued|completed"}'
    return [
        # how many collectives each rank is behind the furthest rank of its process group, from the
        # flight recorder: across nodes, which the node-local missing-rank check cannot see
        {"record": "workload_pg_rank:goodput_collective_lag:behind_max",
         "expr": f"max by ({c}, workload, pg, state) ({seq})\n"
                 f"  - on ({c}, workload, pg, state) group_right\n"
                 f"    max by ({c}, workload, pg, rank, state) ({seq})"},
        {"record": "workload_pg:goodput_collective_lag:max",
         "expr": f"max by ({c}, workload, pg, state) (workload_pg_rank:goodput_collective_lag:behind_max)"},
        {"record": "workload_pg:goodput_collective_oldest_inflight_seconds:max",
         "expr": f"max by ({c}, workload, pg) (goodput_collective_oldest_inflight_seconds)"},
    ]


DIRECTIONS = ("transmit", "receive")
# Receive errors of a network interface: rx_errors includes CRC errors by the kernel's contract (if_link.h), but the
# larger of the two is taken, for a driver that counts CRC errors alone.
INTERFACE_LINK_ERRORS = 'counter=~"rx_errors|rx_crc_errors"'


# goodput_fabric_port_info with an `interface` label naming the network interface behind the RDMA port (RoCE); ports
# without one get none, so `on (..., interface)` matches only interfaces that back an RDMA port.
NETDEV_AS_INTERFACE = 'label_replace(goodput_fabric_port_info, "interface", "$1", "netdev", "(.+)")'


def per_link(s: RulesSettings, port: str, interface: str) -> str:
    """One series per link, from a value per RDMA port and a value per interface: an RDMA port's is the larger of
    its own and that of the interface behind it (for RoCE, mlx5 counts physical errors and carrier changes on the
    netdev, not on the port), labelled device and port; an interface that backs no RDMA port keeps its own,
    labelled interface."""
    c, n = s.cluster_label, s.node_label
    return (f"max without (interface, link_layer, netdev) (\n  {port}\nor\n"
            f"  {interface}\n  * on ({c}, {n}, interface) group_right ()\n  {NETDEV_AS_INTERFACE}\n)\n"
            f"or\n(\n  {interface}\n  unless on ({c}, {n}, interface)\n  {NETDEV_AS_INTERFACE}\n)")


def _fabric(s: RulesSettings) -> list[Rule]:
    """RDMA ports and network interfaces (the fabric source; absent without it), per port, interface and node."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]

    def utilization(kind: str, capacity: str) -> str:
        return "\nor\n".join(
            f"label_replace(\n  rate(goodput_fabric_{kind}_{d}_bytes_total[{w}])\n  / ({capacity} > 0),\n"
            f'  "direction", "{d}", "", ""\n)' for d in DIRECTIONS)

    def node_bytes(d: str) -> str:
        # RDMA ports and the interfaces that back none: a RoCE netdev's own byte counters count what went through
        # the kernel's stack, or (mlx5 in switchdev mode, or a simulation) the port's traffic again
        return (f"sum by ({c}, {n}) (\n  rate(goodput_fabric_port_{d}_bytes_total[{w}])\n  or\n"
                f"  (\n    rate(goodput_fabric_interface_{d}_bytes_total[{w}])\n"
                f"    unless on ({c}, {n}, interface) {NETDEV_AS_INTERFACE}\n  )\n)")

    def by_counter(*metrics: str) -> str:
        # the counter label tells port and interface counters apart (symbol_error, rx_errors, ...): no sum across
        # counters, whose events overlap (rx_crc_errors are among rx_errors)
        return f"sum by ({c}, {n}, counter) (\n  " + "\n  or\n  ".join(
            f"rate({m}[{w}])" for m in metrics) + "\n)"

    return [
        # share of the link rate (sysfs `rate`, or the interface's negotiated speed) used, each way
        {"record": f"port:goodput_fabric_port_utilization_ratio:rate{w}",
         "expr": utilization("port", "goodput_fabric_port_rate_bytes_per_second")},
        {"record": f"interface:goodput_fabric_interface_utilization_ratio:rate{w}",
         "expr": utilization("interface", "goodput_fabric_interface_speed_bytes_per_second")},
        *({"record": f"node:goodput_fabric_{d}_bytes:rate{w}", "expr": node_bytes(d)} for d in DIRECTIONS),
        {"record": f"node:goodput_fabric_errors:rate{w}",
         "expr": by_counter("goodput_fabric_port_errors_total", "goodput_fabric_interface_errors_total")},
        {"record": f"node:goodput_fabric_congestion_packets:rate{w}",
         "expr": by_counter("goodput_fabric_port_congestion_packets_total")},
        {"record": f"node:goodput_fabric_retransmission_events:rate{w}",
         "expr": by_counter("goodput_fabric_port_retransmission_events_total")},
    ]


def _fabric_link(s: RulesSettings) -> list[Rule]:
    """Per link, what the fabric alerts judge: link errors and the share of packets carrying congestion signals."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    counters = "|".join(s.fabric_error_counters)
    port_errors = f'sum without (counter) (rate(goodput_fabric_port_errors_total{{counter=~"{counters}"}}[{w}]))'
    interface_errors = (f"max without (counter) (rate(goodput_fabric_interface_errors_total{{{INTERFACE_LINK_ERRORS}}}"
                        f"[{w}]))")
    port = f"on ({c}, {n}, device, port) group_left ()"
    congestion = "goodput_fabric_port_congestion_packets_total"
    return [
        {"record": f"link:goodput_fabric_link_errors:rate{w}", "expr": per_link(s, port_errors, interface_errors)},
        # received packets that the fabric marked with ECN, or that this port answered with a CNP (the
        # notification point); CNPs this port received and slowed down for (the reaction point), of those it sent
        {"record": f"link:goodput_fabric_congestion_ratio:rate{w}",
         "expr": f"max without (counter) (\n"
                 f'  rate({congestion}{{counter=~"np_ecn_marked_roce_packets|np_cnp_sent"}}[{w}])\n'
                 f"  / {port}\n  (rate(goodput_fabric_port_receive_packets_total[{w}]) > 0)\n"
                 f"or\n"
                 f'  rate({congestion}{{counter="rp_cnp_handled"}}[{w}])\n'
                 f"  / {port}\n  (rate(goodput_fabric_port_transmit_packets_total[{w}]) > 0)\n)"},
    ]


def _fabric_cluster(s: RulesSettings) -> list[Rule]:
    c, w = s.cluster_label, s.windows[0]
    return [
        *({"record": f"cluster:goodput_fabric_{d}_bytes:rate{w}",
           "expr": f"sum by ({c}) (node:goodput_fabric_{d}_bytes:rate{w})"} for d in DIRECTIONS),
        *({"record": f"cluster:goodput_fabric_{m}:rate{w}",
           "expr": f"sum by ({c}, counter) (node:goodput_fabric_{m}:rate{w})"}
          for m in ("errors", "congestion_packets", "retransmission_events")),
    ]


# the phases of a rank's training loop, and the rest (checkpoints, compile, startup, eval, other), one rule each (an
# equality matcher selects faster than a regex), in two groups: one rate over every phase counter of 6,400 ranks took
# 0.8 to 1.1 s on Prometheus at 10,000 GPUs, and the rest in one rule of a negative regex 0.38 s median
LOOP_PHASES = ("compute", "data_wait", "comm_wait", "untracked")


def _workload_node(s: RulesSettings) -> list[list[Rule]]:
    """Each workload's ranks' time per phase per node, in two groups (the loop's phases and the rest: every phase in
    exactly one rule); where each workload runs; how much of its time on each node goes to comm_wait."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    phases = f"workload_node:goodput_phase_seconds:rate{w}"
    comm_wait = f'{phases}{{phase="comm_wait"}}'

    def rate(matcher: str, by: str) -> str:
        return f"sum by ({c}, {n}, workload{by}) (rate(goodput_phase_seconds_total{{phase{matcher}}}[{w}]))"

    def each(names: tuple[str, ...]) -> list[Rule]:
        return [{"record": phases, "expr": rate(f'="{phase}"', ""), "labels": {"phase": phase}} for phase in names]

    # a phase an older or newer daemon names (none, normally) in a rule of its own
    known = (*PHASES, UNTRACKED_PHASE)
    rest = [*each(tuple(p for p in known if p not in LOOP_PHASES)),
            {"record": phases, "expr": rate(f'!~"{"|".join(known)}"', ", phase")}]

    # the nodes of each workload: where a process of it holds a GPU, or where its ranks spend time in phases (a
    # rank gone keeps its accounting published for a while, at rate 0)
    info = [{"record": "workload:goodput_node:info",
             "expr": f"group by ({c}, {n}, workload) (goodput_gpu_workload_info)\n"
                     f"or\ngroup by ({c}, {n}, workload) ({phases} > 0)"}]
    return [each(LOOP_PHASES), rest, info, [
        {"record": f"workload_node:goodput_comm_wait_ratio:rate{w}",
         "expr": f"sum without (phase) ({comm_wait})\n  / (sum without (phase) ({phases}) > 0)"},
        # every workload's ranks on the node together: what GoodputFabricCongestion asks of a node
        {"record": f"node:goodput_comm_wait_ratio:rate{w}",
         "expr": f"sum by ({c}, {n}) ({comm_wait})\n  / (sum by ({c}, {n}) ({phases}) > 0)"},
    ]]


def _workload_fabric(s: RulesSettings) -> list[Rule]:
    """The fabric of the nodes each workload runs on: the node's, whole (a node shared by two workloads counts for
    each), beside the workload's comm_wait share on that node."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]

    def of_node(expr: str) -> str:
        return f"workload:goodput_node:info\n  * on ({c}, {n}) group_left ()\n  {expr}"

    return [
        *({"record": f"workload_node:goodput_fabric_{d}_bytes:rate{w}",
           "expr": of_node(f"node:goodput_fabric_{d}_bytes:rate{w}")} for d in DIRECTIONS),
        {"record": f"workload_node:goodput_fabric_link_errors:rate{w}",
         "expr": of_node(f"sum by ({c}, {n}) (link:goodput_fabric_link_errors:rate{w})")},
        # the node's most congested RDMA port
        {"record": f"workload_node:goodput_fabric_congestion_ratio:rate{w}",
         "expr": of_node(f"max by ({c}, {n}) (link:goodput_fabric_congestion_ratio:rate{w})")},
        # every kind of transport retry together (out of sequence, timeouts, NAK retries, ...)
        {"record": f"workload_node:goodput_fabric_retransmission_events:rate{w}",
         "expr": of_node(f"sum by ({c}, {n}) (node:goodput_fabric_retransmission_events:rate{w})")},
    ]


def _groups(names: tuple[str, ...], rule_lists: list[list[Rule]], interval: str | None = None) -> list[Group]:
    """One group per list of rules, named in order (a rule set split so that no group reads too much)."""
    return [{"name": name, **({"interval": interval} if interval else {}), "rules": rules}
            for name, rules in zip(names, rule_lists, strict=True)]


def recording_groups(s: RulesSettings) -> list[Group]:
    groups: list[Group] = [
        {"name": "goodput.gpu", "rules": _gpu(s)},
        {"name": "goodput.gpu_allocation", "rules": _gpu_allocation(s)},
        {"name": "goodput.gpu_memory", "rules": _gpu_memory(s)},
        {"name": "goodput.node", "rules": _level(s, "node")},
        {"name": "goodput.cluster", "rules": _level(s, "cluster")},
        {"name": "goodput.gpu_throttled", "rules": _throttled(s)},
        *_groups(("goodput.gpu_pcie_width", "goodput.gpu_pcie_generation"), _pcie(s)),
        *_groups(tuple(f"goodput.node_health{part}" for part in ("", "_memory", "_throttled", "_pcie", "_nvlink")),
                 _node_health(s)),
        *risk_groups(s),
        {"name": "goodput.workload", "rules": _workload(s)},
        {"name": "goodput.step", "rules": _step(s)},
        {"name": "goodput.collective_wait", "rules": _collective_wait(s)},
        {"name": "goodput.straggler", "rules": _straggler(s)},
        {"name": "goodput.step_shift", "interval": s.slow_groups_interval, "rules": _step_shift(s)},
        *_groups(("goodput.straggler_stage", "goodput.straggler_ratio"),
                 _stragglers(s, f"workload_rank:goodput_step_own_seconds:mean{s.windows[0]}", s.windows[0])),
        {"name": "goodput.straggler_cost", "rules": _straggler_cost(s)},
        *_groups(("goodput.attribution", "goodput.attribution_namespace"), _attribution(s)),
        {"name": "goodput.collective", "rules": _collective(s)},
        {"name": "goodput.collective_missing", "rules": _collective_missing(s)},
        {"name": "goodput.rank_pod", "interval": s.slow_groups_interval, "rules": _rank_pod(s)},
        # the fabric: raw counters per port and node, per link, then the levels that read those
        {"name": "goodput.fabric", "rules": _fabric(s)},
        {"name": "goodput.fabric_link", "rules": _fabric_link(s)},
        {"name": "goodput.fabric_cluster", "rules": _fabric_cluster(s)},
        *_groups(("goodput.workload_node", "goodput.workload_node_other", "goodput.workload_node_info",
                  "goodput.workload_node_comm_wait"),
                 _workload_node(s)),
        {"name": "goodput.workload_fabric", "rules": _workload_fabric(s)},
        # the wall-time breakdown reads the phases (goodput.workload_node) and the accounting; MFU the peaks (slow)
        {"name": "goodput.accounting", "rules": _accounting(s)},
        {"name": "goodput.breakdown", "rules": _breakdown(s)},
        {"name": "goodput.mfu", "rules": _mfu(s)},
        {"name": "goodput.energy", "rules": _energy(s)},
        *_groups(tuple(f"goodput.peak_flops.{dtype}" for dtype in FLOPS_DTYPES), _peak_flops(s),
                 s.slow_groups_interval),
        {"name": "goodput.accounting_totals", "interval": s.slow_groups_interval, "rules": _accounting_totals(s)},
    ]
    # the class reads the averages (one evaluation old), the shares the class
    groups += _groups((*(f"goodput.gpu_activity.{ratio}" for ratio in ACTIVITY), "goodput.gpu_activity_class",
                       "goodput.gpu_activity_share"), _gpu_activity(s), s.slow_groups_interval)
    for long in s.windows[1:]:
        groups += [
            *_groups((f"goodput.gpu.{long}", f"goodput.gpu_allocation.{long}", f"goodput.rollup.{long}"),
                     _gpu_long(s, long), s.slow_groups_interval),
            *_groups((f"goodput.workload.{long}", f"goodput.workload_rank.{long}", f"goodput.straggler_stage.{long}",
                      f"goodput.straggler_ratio.{long}"), _workload_long(s, long), s.slow_groups_interval),
        ]
    return groups
