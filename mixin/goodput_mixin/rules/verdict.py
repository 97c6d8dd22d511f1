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

Cheap at 10,000 GPUs: the per-GPU signals are read once, over the short window, in two groups, and only the GPUs
where one holds are recorded (a handful); the workload's GPUs are joined once to those, and twice to the recorded
DCGM averages; the rest reads per-workload and per-node records. Every group runs every `slow_groups_interval`.
The workload group reads the GPU groups one evaluation old, and its own candidates fresh (rules of a group run in
turn).
"""

from __future__ import annotations

from .recording import Group, Rule, held
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


def order(reason: str) -> int:
    """The reason's place in the walk (1 = checked first); healthy's is one past the last."""
    if reason == HEALTHY[1]:
        return len(WALK) + 1
    return next(i for i, (_, r) in enumerate(WALK, 1) if r == reason)


def _candidate(record: str, reason: str, expr: str) -> Rule:
    """A rule recording `expr`'s series (one per GPU or workload) with the reason's place in the walk as value."""
    return {"record": record, "expr": f"{order(reason)} * group without () (\n  {expr}\n)",
            "labels": {"layer": _LAYER_OF[reason], "reason": reason}}


def _per_workload(s: RulesSettings, reason: str, expr: str) -> Rule:
    c = s.cluster_label
    return {"record": CANDIDATE, "expr": f"{order(reason)} * group by ({c}, workload) (\n  {expr}\n)",
            "labels": {"layer": _LAYER_OF[reason], "reason": reason}}


def _gpu_faults(s: RulesSettings) -> list[Rule]:
    """The cluster layer's GPU signals, per GPU, where they hold."""
    w = s.windows[0]
    xids = "|".join(str(x) for x in sorted(set(s.critical_xids)))
    xid = f'goodput_gpu_xid_errors_total{{xid=~"{xids}"}}'
    limits = 'reason=~"power|thermal|board_limit|reliability"'
    return [
        _candidate(GPU_CANDIDATE, "gpu_lost", "goodput_gpu_up == 0"),
        _candidate(GPU_CANDIDATE, "ecc_uncorrected",
                   f'sum without (error_type) (increase(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}'
                   f"[{w}])) > 0"),
        # the first XID of a code creates its series: increase() alone misses it (as GoodputGPUXidCritical)
        _candidate(GPU_CANDIDATE, "xid",
                   f"sum without (xid) (\n    increase({xid}[{w}]) > 0\n    or\n"
                   f"    ({xid} unless {xid} offset {w})\n  )"),
        _candidate(GPU_CANDIDATE, "gpu_throttled",
                   f"sum without (reason) (rate(goodput_gpu_clock_throttle_seconds_total{{{limits}}}[{w}]))"
                   f" > {s.throttle_ratio:g}"),
    ]


def _gpu_use(s: RulesSettings) -> list[Rule]:
    """The host and memory layers' GPU signals, per GPU, where they hold."""
    used = "goodput_gpu_memory_used_bytes / (goodput_gpu_memory_total_bytes > 0)"
    return [
        _candidate(GPU_CANDIDATE, "numa_mismatch", "max without (pid) (goodput_gpu_numa_mismatch) == 1"),
        _candidate(GPU_CANDIDATE, "memory_full", f"{used} > {s.bottleneck_memory_full_ratio:g}"),
        _candidate(GPU_CANDIDATE, "memory_exhaustion_predicted",
                   f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{s.memory_predict_horizon} > 1\n"
                   f"  and {used} > {s.memory_used_ratio:g}"),
    ]


def _workload(s: RulesSettings) -> list[Rule]:
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    recent = s.bottleneck_gpu_recent_window
    held_now = held(s)
    held_recently = f"max by ({c}, {n}, uuid, workload) (max_over_time(goodput_gpu_workload_info[{recent}]))"
    events = "|".join(EVENTS)
    # one signal per GPU, the first in the walk (a GPU may be held by several workloads: the many side is theirs)
    gpu_signals = (f"bottomk by ({c}, {n}, uuid) (1,\n"
                   f'    {GPU_CANDIDATE}{{reason!~"{events}"}}\n    or\n'
                   f'    max_over_time({GPU_CANDIDATE}{{reason=~"{events}"}}[{recent}])\n  )')
    badput = f"workload:goodput_badput_ratio:rate{w}"
    computing = f"workload:goodput_ratio:rate{w} >= {s.bottleneck_compute_ratio:g}"

    def pressure(resource: str, ratio: float) -> str:
        return (f"workload:goodput_node:info\n  and on ({c}, {n})\n"
                f'  rate(goodput_host_pressure_stalled_seconds_total{{resource="{resource}",kind="some"}}[{w}])'
                f" > {ratio:g}")

    def activity(pipe: str, ratio: float) -> str:
        return (f"avg by ({c}, workload) (\n    {held_now}\n    * on ({c}, {n}, uuid) group_left ()\n"
                f"    gpu:goodput_gpu_{pipe}_active_ratio:avg{w}\n  ) < {ratio:g}\n  and on ({c}, workload)\n"
                f"  {computing}")

    phases = f"workload:goodput_phase_seconds:rate{w}"
    healthy = (f'label_replace(\n      label_replace({order("none")} * group by ({c}, workload) ({phases}), '
               f'"layer", "{HEALTHY[0]}", "", ""),\n      "reason", "{HEALTHY[1]}", "", ""\n    )')
    return [
        # the GPUs the workload's processes held within the window, each with its first signal: the cluster, host
        # (NUMA) and memory layers' GPU checks, one join
        {"record": CANDIDATE,
         "expr": f"min by ({c}, workload, layer, reason) (\n  {held_recently}\n"
                 f"  * on ({c}, {n}, uuid) group_left (layer, reason)\n  {gpu_signals}\n)"},
        _per_workload(s, "rank_missing", "goodput_collective_missing_rank == 1"),
        _per_workload(s, "collective_hang",
                      f"goodput_collective_oldest_inflight_seconds > {s.collective_hang_seconds:g}\n"
                      f"  and on ({c}, {n}, workload, rank)\n"
                      f"  (time() - goodput_flight_recorder_dump_timestamp_seconds < {s.dump_stale_seconds:g})"),
        _per_workload(s, "fabric_errors",
                      f"workload_node:goodput_fabric_link_errors:rate{w} > {s.fabric_error_rate:g}"),
        _per_workload(s, "fabric_congestion",
                      f"workload_node:goodput_fabric_congestion_ratio:rate{w} > {s.fabric_congestion_ratio:g}\n"
                      f"  and on ({c}, {n}, workload)\n"
                      f"  workload_node:goodput_comm_wait_ratio:rate{w} > {s.fabric_congestion_comm_wait_ratio:g}"),
        _per_workload(s, "comm_wait", f'{badput}{{phase="comm_wait"}} > {s.bottleneck_comm_wait_ratio:g}'),
        _per_workload(s, "io_pressure", pressure("io", s.bottleneck_io_pressure_ratio)),
        _per_workload(s, "cpu_pressure", pressure("cpu", s.bottleneck_cpu_pressure_ratio)),
        _per_workload(s, "data_wait", f'{badput}{{phase="data_wait"}} > {s.bottleneck_data_wait_ratio:g}'),
        _per_workload(s, "low_sm_activity", activity("sm", s.underused_sm_active_ratio)),
        _per_workload(s, "low_tensor_activity", activity("tensor", s.bottleneck_tensor_active_ratio)),
        # the verdict: of each workload that reports phases, its first candidate in the walk, else healthy. The
        # values are distinct per workload (one series per reason), so bottomk keeps exactly one.
        {"record": VERDICT,
         "expr": f"group by ({c}, workload, layer, reason) (\n  bottomk by ({c}, workload) (1,\n"
                 f"    ({CANDIDATE} and on ({c}, workload) {phases})\n    or\n    {healthy}\n  )\n)"},
    ]


def verdict_groups(s: RulesSettings) -> list[Group]:
    interval = s.slow_groups_interval
    return [
        {"name": "goodput.bottleneck_gpu_faults", "interval": interval, "rules": _gpu_faults(s)},
        {"name": "goodput.bottleneck_gpu_use", "interval": interval, "rules": _gpu_use(s)},
        {"name": "goodput.bottleneck", "interval": interval, "rules": _workload(s)},
    ]
