"""The funnel's verdict per workload: the first level, walked top-down, that explains the goodput a job loses.

`workload:goodput_bottleneck:info{layer, reason}` (value 1): exactly one series per workload that reports phases
(`workload:goodput_phase_seconds:rate5m`), `layer` one of cluster, network, host, memory, kernel, healthy, and
`reason` the signal that decided it (`none` when healthy). The walk, in order (`WALK`): the first check that holds
wins, across layers and within one; within a layer a cause comes before the symptom it explains (fabric errors
before comm_wait, I/O pressure before data_wait), and what stops a job before what slows it.

- cluster: a GPU of the workload lost (goodput_gpu_up 0), an uncorrected ECC error or a critical XID within
  `bottleneck_gpu_recent_window`, clocks held down by power, thermal, board or reliability limits more than
  `throttle_ratio` of the short window;
- network: a rank missing from a collective, a collective hung (the GoodputCollectiveHang condition), link errors
  (`fabric_error_rate`) or congestion (`fabric_congestion_ratio`, where the workload's ranks on that node wait in
  comm_wait over `fabric_congestion_comm_wait_ratio`) on a node of the workload (the fabric source), comm_wait over
  `bottleneck_comm_wait_ratio` of its accounted time;
- host: I/O or CPU pressure (PSI `some`) on a node of the workload, a process of it allowed off its GPU's NUMA node,
  data_wait over `bottleneck_data_wait_ratio`;
- memory: a GPU of the workload over `bottleneck_memory_full_ratio` of its memory, or on course to run out within
  `memory_predict_horizon` past `memory_used_ratio` (the GoodputGPUMemoryExhaustionSoon condition);
- kernel: with its compute share at `bottleneck_compute_ratio` or more, its GPUs' mean SM activity under
  `underused_sm_active_ratio`, or their mean tensor-pipe activity under `bottleneck_tensor_active_ratio` (DCGM);
- healthy: none of the above.

Records: `gpu:goodput_bottleneck_candidate:order{layer, reason}` for each GPU signal that holds, and
`workload:goodput_bottleneck_candidate:order{layer, reason}` for each check a workload fails (what a dashboard or
`diagnose` lists beside the verdict; of the signals of one GPU, only its first: the workload's GPUs are joined to
one signal each); their value is the check's place in the walk, so the verdict is the lowest.

Each check is declared once (`checks`): its terms (the figure it compares, one series per GPU, node or workload,
against its threshold), the rule's condition written from them, and the alert whose runbook says what to do when it
decides. `goodput-exporter diagnose` reads the same declarations, so the figure it shows beside each threshold is
the one the rule compared.

Cheap at 10,000 GPUs: the per-GPU signals are read once, over the short window, in two groups, and only the GPUs
where one holds are recorded (a handful); the workload's GPUs are joined once to those, and twice to the recorded
DCGM averages; the rest reads per-workload and per-node records. Every group runs every `slow_groups_interval`.
The workload group reads the GPU groups one evaluation old, and its own candidates fresh (rules of a group run in
turn).
"""

from __future__ import annotations

from dataclasses import dataclass

from .recording import COLLECTIVE_MISSING, Group, Rule, held, throttled
from .settings import RulesSettings

# The walk: (layer, reason), first match wins. A candidate's value is its place here (1-based); healthy comes last.
WALK: tuple[tuple[str, str], ...] = (
    ("cluster", "gpu_lost"),
    ("cluster", "ecc_uncorrected"),
    ("cluster", "xid"),
    ("cluster", "gpu_throttled"),
    ("network", "rank_missing"),
    ("network", "collective_hang"),
    ("network", "fabric_errors"),
    ("network", "fabric_congestion"),
    ("network", "comm_wait"),
    ("host", "io_pressure"),
    ("host", "cpu_pressure"),
    ("host", "numa_mismatch"),
    ("host", "data_wait"),
    ("memory", "memory_full"),
    ("memory", "memory_exhaustion_predicted"),
    ("kernel", "low_sm_activity"),
    ("kernel", "low_tensor_activity"),
)
LAYERS = ("cluster", "network", "host", "memory", "kernel", "healthy")
HEALTHY = ("healthy", "none")
# GPU signals that are events: they count for bottleneck_gpu_recent_window after they happen
EVENTS = ("ecc_uncorrected", "xid")

GPU_CANDIDATE = "gpu:goodput_bottleneck_candidate:order"
CANDIDATE = "workload:goodput_bottleneck_candidate:order"
VERDICT = "workload:goodput_bottleneck:info"

_LAYER_OF = {reason: layer for layer, reason in WALK}
# the walk goes through the layers in the order of LAYERS
assert list(dict.fromkeys(layer for layer, _ in WALK)) == list(LAYERS[:-1])

# what a series of a term's figure is about, and so how `diagnose` joins it to a workload: a GPU (through the
# processes that held it within bottleneck_gpu_recent_window), a node (workload:goodput_node:info), or the workload
# itself (the series carry its label: per workload, rank, node of it or process group)
PER = ("gpu", "node", "workload")


@dataclass(frozen=True)
class Term:
    """One comparison of a check: a figure (PromQL, one series per `per`) against a threshold."""

    name: str  # what the figure is, in words (diagnose prints it)
    per: str  # one of PER
    figure: str  # as the rule compares it
    op: str  # ">", ">=", "<" or "=="
    threshold: float
    # what diagnose reads instead of `figure`, where the rule counts an event for longer than the figure's window
    shown: str | None = None
    absent_is_zero: bool = False  # no series means none (the figure exists only where something happened)

    @property
    def condition(self) -> str:
        return f"{self.figure} {self.op} {self.threshold:g}"

    @property
    def worst(self) -> str:
        """The aggregation that picks, of a workload's series, the one closest to failing: max or min."""
        return "min" if self.op == "<" or (self.op == "==" and self.threshold == 0) else "max"


@dataclass(frozen=True)
class Check:
    """One step of the walk: the terms it compares, the rule's condition built from them, and the alert whose runbook
    says what to do when it decides the verdict."""

    layer: str
    reason: str
    per: str  # "gpu": recorded per GPU (GPU_CANDIDATE), then joined to workloads; "workload": per workload
    terms: tuple[Term, ...]
    expr: str  # the condition, as the rule writes it
    alert: str
    # series of the workload (each a selector of a name with its label) that tell the causes of a failure apart
    hints: tuple[str, ...] = ()

    @property
    def order(self) -> int:
        return order(self.reason)


def order(reason: str) -> int:
    """The reason's place in the walk (1 = checked first); healthy's is one past the last."""
    if reason == HEALTHY[1]:
        return len(WALK) + 1
    return next(i for i, (_, r) in enumerate(WALK, 1) if r == reason)


def _check(reason: str, per: str, alert: str, *terms: Term, expr: str | None = None,
           hints: tuple[str, ...] = ()) -> Check:
    """A check whose condition is its one term's, unless `expr` joins several."""
    if expr is None:
        (term,) = terms
        expr = term.condition
    return Check(_LAYER_OF[reason], reason, per, terms, expr, alert, hints)


def checks(s: RulesSettings) -> tuple[Check, ...]:
    """Every check of the walk, in its order."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    recent = s.bottleneck_gpu_recent_window
    xids = "|".join(str(x) for x in sorted(set(s.critical_xids)))
    xid = f'goodput_gpu_xid_errors_total{{xid=~"{xids}"}}'
    used = "goodput_gpu_memory_used_bytes / (goodput_gpu_memory_total_bytes > 0)"
    badput = f"workload:goodput_badput_ratio:rate{w}"

    def ecc(window: str) -> str:
        return (f'sum without (error_type) (increase(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}'
                f"[{window}]))")

    # the first XID of a code creates its series: increase() alone misses it (as GoodputGPUXidCritical)
    def xid_count(window: str) -> str:
        return (f"sum without (xid) (\n    increase({xid}[{window}]) > 0\n    or\n"
                f"    ({xid} unless {xid} offset {window})\n  )")

    def pressure(resource: str, ratio: float) -> tuple[Term, str]:
        term = Term(f"{resource} pressure (PSI some) on its nodes", "node",
                    f'rate(goodput_host_pressure_stalled_seconds_total{{resource="{resource}",kind="some"}}[{w}])',
                    ">", ratio)
        return term, f"workload:goodput_node:info\n  and on ({c}, {n})\n  {term.condition}"

    computing = Term("compute share", "workload", f"workload:goodput_ratio:rate{w}", ">=", s.bottleneck_compute_ratio)

    def activity(pipe: str, ratio: float) -> tuple[Term, Term, str]:
        term = Term(f"mean {'SM' if pipe == 'sm' else 'tensor-pipe'} activity of its GPUs", "workload",
                    f"avg by ({c}, workload) (\n    {held(s)}\n    * on ({c}, {n}, uuid) group_left ()\n"
                    f"    gpu:goodput_gpu_{pipe}_active_ratio:avg{w}\n  )", "<", ratio)
        return term, computing, f"{term.condition}\n  and on ({c}, workload)\n  {computing.condition}"

    hang = Term("oldest in-flight collective, seconds", "workload", "goodput_collective_oldest_inflight_seconds", ">",
                s.collective_hang_seconds)
    dump_age = Term("age of its flight-recorder dump, seconds", "workload",
                    "time() - goodput_flight_recorder_dump_timestamp_seconds", "<", s.dump_stale_seconds)
    congestion = Term("congestion-marked share of packets on its nodes", "workload",
                      f"workload_node:goodput_fabric_congestion_ratio:rate{w}", ">", s.fabric_congestion_ratio)
    node_comm_wait = Term("comm_wait share on that node", "workload", f"workload_node:goodput_comm_wait_ratio:rate{w}",
                          ">", s.fabric_congestion_comm_wait_ratio)
    predicted = Term(f"memory use in {s.memory_predict_horizon}, predicted, share of total", "gpu",
                     f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{s.memory_predict_horizon}", ">", 1)
    in_use = Term("memory in use, share of total", "gpu", used, ">", s.memory_used_ratio)
    io, io_expr = pressure("io", s.bottleneck_io_pressure_ratio)
    cpu, cpu_expr = pressure("cpu", s.bottleneck_cpu_pressure_ratio)
    sm, sm_computing, sm_expr = activity("sm", s.underused_sm_active_ratio)
    tensor, tensor_computing, tensor_expr = activity("tensor", s.bottleneck_tensor_active_ratio)
    found = (
        _check("gpu_lost", "gpu", "GoodputGPUXidCritical", Term("GPU up", "gpu", "goodput_gpu_up", "==", 0)),
        _check("ecc_uncorrected", "gpu", "GoodputGPUEccUncorrectable",
               Term(f"uncorrected ECC errors in {recent}", "gpu", ecc(w), ">", 0, shown=ecc(recent))),
        _check("xid", "gpu", "GoodputGPUXidCritical",
               Term(f"critical XIDs in {recent}", "gpu", xid_count(w), ">", 0, shown=xid_count(recent),
                    absent_is_zero=True),
               expr=xid_count(w)),
        _check("gpu_throttled", "gpu", "GoodputGPUThrottled",
               Term("share of time throttled (power, thermal, board, reliability)", "gpu",
                    throttled(s), ">", s.throttle_ratio)),
        _check("rank_missing", "workload", "GoodputCollectiveRankMissing",
               Term("a rank missing from a collective", "workload", COLLECTIVE_MISSING, "==", 1,
                    absent_is_zero=True)),
        _check("collective_hang", "workload", "GoodputCollectiveHang", hang, dump_age,
               expr=f"{hang.condition}\n  and on ({c}, {n}, workload, rank)\n  ({dump_age.condition})"),
        _check("fabric_errors", "workload", "GoodputFabricErrors",
               Term("link errors per second on its nodes", "workload",
                    f"workload_node:goodput_fabric_link_errors:rate{w}", ">", s.fabric_error_rate)),
        _check("fabric_congestion", "workload", "GoodputFabricCongestion", congestion, node_comm_wait,
               expr=f"{congestion.condition}\n  and on ({c}, {n}, workload)\n  {node_comm_wait.condition}"),
        _check("comm_wait", "workload", "GoodputDrop",
               Term("comm_wait share", "workload", f'{badput}{{phase="comm_wait"}}', ">",
                    s.bottleneck_comm_wait_ratio),
               # one rank slower than the rest (they wait for it) or the network (all wait alike)
               hints=(f"workload_rank:goodput_straggler_ratio:rate{w}", "workload:goodput_step_time_shift:info")),
        _check("io_pressure", "workload", "GoodputDrop", io, expr=io_expr),
        _check("cpu_pressure", "workload", "GoodputDrop", cpu, expr=cpu_expr),
        _check("numa_mismatch", "gpu", "GoodputDrop",
               Term("a process allowed off its GPU's NUMA node", "gpu",
                    "max without (pid) (goodput_gpu_numa_mismatch)", "==", 1)),
        _check("data_wait", "workload", "GoodputDrop",
               Term("data_wait share", "workload", f'{badput}{{phase="data_wait"}}', ">",
                    s.bottleneck_data_wait_ratio)),
        _check("memory_full", "gpu", "GoodputGPUMemoryExhaustionSoon",
               Term("memory in use, share of total", "gpu", used, ">", s.bottleneck_memory_full_ratio)),
        _check("memory_exhaustion_predicted", "gpu", "GoodputGPUMemoryExhaustionSoon", predicted, in_use,
               expr=f"{predicted.condition}\n  and {in_use.condition}"),
        _check("low_sm_activity", "workload", "GoodputMFUDrop", sm, sm_computing, expr=sm_expr),
        _check("low_tensor_activity", "workload", "GoodputMFUDrop", tensor, tensor_computing, expr=tensor_expr),
    )
    assert [(check.layer, check.reason) for check in found] == list(WALK)
    return found


def _candidate(record: str, check: Check) -> Rule:
    """A rule recording the check's series (one per GPU) with its place in the walk as value."""
    return {"record": record, "expr": f"{check.order} * group without () (\n  {check.expr}\n)",
            "labels": {"layer": check.layer, "reason": check.reason}}


def _per_workload(s: RulesSettings, check: Check) -> Rule:
    c = s.cluster_label
    return {"record": CANDIDATE, "expr": f"{check.order} * group by ({c}, workload) (\n  {check.expr}\n)",
            "labels": {"layer": check.layer, "reason": check.reason}}


def _gpu(s: RulesSettings, layers: tuple[str, ...]) -> list[Rule]:
    """The GPU signals of these layers, per GPU, where they hold."""
    return [_candidate(GPU_CANDIDATE, check) for check in checks(s) if check.per == "gpu" and check.layer in layers]


def first_of(series: str, by: str) -> str:
    """Of each group of `series` (labels `by`), the series of the smallest value: bottomk by (by) (1, series), written
    as a comparison with the group's minimum. VictoriaMetrics before 1.97 (its issue 5509; Debian bookworm ships
    1.79) gets bottomk wrong in range queries (vmalert's replay, Grafana): at a step where the group has k or more
    series without a value it returns none. Parenthesised, as `==` binds looser than arithmetic. The values are
    distinct within a group (one per reason), so no tie keeps two."""
    return f"(\n  (\n    {series}\n  )\n  == on ({by}) group_left ()\n  min by ({by}) (\n    {series}\n  )\n)"


def _workload(s: RulesSettings) -> list[Rule]:
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    recent = s.bottleneck_gpu_recent_window
    held_recently = f"max by ({c}, {n}, uuid, workload) (max_over_time(goodput_gpu_workload_info[{recent}]))"
    events = "|".join(EVENTS)
    # one signal per GPU, the first in the walk (a GPU may be held by several workloads: the many side is theirs)
    signals = (f'{GPU_CANDIDATE}{{reason!~"{events}"}}\n    or\n'
               f'    max_over_time({GPU_CANDIDATE}{{reason=~"{events}"}}[{recent}])')
    gpu_signals = first_of(signals, f"{c}, {n}, uuid")
    phases = f"workload:goodput_phase_seconds:rate{w}"
    healthy = (f'label_replace(\n      label_replace({order("none")} * group by ({c}, workload) ({phases}), '
               f'"layer", "{HEALTHY[0]}", "", ""),\n      "reason", "{HEALTHY[1]}", "", ""\n    )')
    return [
        # the GPUs the workload's processes held within the window, each with its first signal: the cluster, host
        # (NUMA) and memory layers' GPU checks, one join
        {"record": CANDIDATE,
         "expr": f"min by ({c}, workload, layer, reason) (\n  {held_recently}\n"
                 f"  * on ({c}, {n}, uuid) group_left (layer, reason)\n  {gpu_signals}\n)"},
        *(_per_workload(s, check) for check in checks(s) if check.per == "workload"),
        # the verdict: of each workload that reports phases, its first candidate in the walk, else healthy. The
        # values are distinct per workload (one series per reason), so first_of keeps exactly one.
        {"record": VERDICT,
         "expr": f"group by ({c}, workload, layer, reason) (\n  "
                 + first_of(f"({CANDIDATE} and on ({c}, workload) {phases})\n    or\n    {healthy}",
                            f"{c}, workload") + "\n)"},
    ]


def verdict_groups(s: RulesSettings) -> list[Group]:
    interval = s.slow_groups_interval
    return [
        {"name": "goodput.bottleneck_gpu_faults", "interval": interval, "rules": _gpu(s, ("cluster",))},
        # the host's and the memory's apart: together they took up to 1.05 s on vmalert at 10,000 GPUs
        {"name": "goodput.bottleneck_gpu_host", "interval": interval, "rules": _gpu(s, ("host",))},
        {"name": "goodput.bottleneck_gpu_memory", "interval": interval, "rules": _gpu(s, ("memory",))},
        {"name": "goodput.bottleneck", "interval": interval, "rules": _workload(s)},
    ]
