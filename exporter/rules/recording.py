"""Recording rules: raw series -> the numbers people act on, at the gpu, node, workload and cluster
levels, over each window of the settings. Names follow `level:metric:operations`."""

from __future__ import annotations

from typing import Any

from .settings import RulesSettings, seconds

Rule = dict[str, Any]
Group = dict[str, Any]


def _gpu(s: RulesSettings) -> list[Rule]:
    rules: list[Rule] = []
    for w in s.windows:
        idle = f"gpu:goodput_gpu_idle_ratio:rate{w}"
        rules += [
            {"record": idle,
             "expr": f"rate(goodput_gpu_idle_seconds_total[{w}])\n"
                     f"  / (rate(goodput_gpu_sampled_seconds_total[{w}]) > 0)"},
            # allocated at any time in the window vs never: idle while someone holds the GPU is waste
            {"record": f"gpu:goodput_gpu_idle_while_allocated_ratio:rate{w}",
             "expr": f"{idle} and (max_over_time(goodput_gpu_allocated[{w}]) == 1)"},
            {"record": f"gpu:goodput_gpu_idle_unallocated_ratio:rate{w}",
             "expr": f"{idle} and (max_over_time(goodput_gpu_allocated[{w}]) == 0)"},
        ]
    rules.append({
        "record": f"gpu:goodput_gpu_memory_used_bytes:predict_linear{s.memory_predict_horizon}",
        "expr": f"predict_linear(goodput_gpu_memory_used_bytes[{s.memory_predict_window}], "
                f"{seconds(s.memory_predict_horizon)})"})
    rules.append({
        "record": f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{s.memory_predict_horizon}",
        "expr": f"gpu:goodput_gpu_memory_used_bytes:predict_linear{s.memory_predict_horizon}\n"
                "  / (goodput_gpu_memory_total_bytes > 0)"})
    return rules


def _node_cluster(s: RulesSettings) -> list[Rule]:
    node = f"{s.cluster_label}, {s.node_label}"
    rules: list[Rule] = []
    for level, by in (("node", node), ("cluster", s.cluster_label)):
        for w in s.windows:
            for kind in ("idle", "idle_while_allocated", "idle_unallocated"):
                rules.append({"record": f"{level}:goodput_gpu_{kind}_ratio:rate{w}",
                              "expr": f"avg by ({by}) (gpu:goodput_gpu_{kind}_ratio:rate{w})"})
        rules.append({"record": f"{level}:goodput_gpu_allocated_ratio:avg",
                      "expr": f"avg by ({by}) (goodput_gpu_allocated)"})
    return rules


def _workload(s: RulesSettings) -> list[Rule]:
    c = s.cluster_label
    rules: list[Rule] = []
    for w in s.windows:
        phases = f"workload:goodput_phase_seconds:rate{w}"
        step = f"workload_rank:goodput_step_duration_seconds:mean{w}"
        own = f"workload_rank:goodput_step_own_seconds:mean{w}"
        rules += [
            {"record": phases,
             "expr": f"sum by ({c}, workload, phase) (rate(goodput_phase_seconds_total[{w}]))"},
            # goodput: the share of accounted time spent computing; badput: the share of every other phase
            {"record": f"workload:goodput_ratio:rate{w}",
             "expr": f'sum without (phase) ({phases}{{phase="compute"}})\n'
                     f"  / (sum without (phase) ({phases}) > 0)"},
            {"record": f"workload:goodput_badput_ratio:rate{w}",
             "expr": f'{phases}{{phase!="compute"}}\n'
                     f"  / ignoring (phase) group_left () (sum without (phase) ({phases}) > 0)"},
            {"record": step,
             "expr": f"sum by ({c}, workload, rank) (rate(goodput_step_duration_seconds_sum[{w}]))\n"
                     f"  / (sum by ({c}, workload, rank) (rate(goodput_step_duration_seconds_count[{w}])) > 0)"},
            # In synchronous training every rank's step lasts as long as the slowest one's (they all
            # meet in the all-reduce), so the straggler is found by its own time per step: every phase
            # but comm_wait. It waits least because everyone waits for it. Jobs that report no phases
            # fall back to their step time.
            {"record": own,
             "expr": f'sum by ({c}, workload, rank) (rate(goodput_phase_seconds_total{{phase!="comm_wait"}}[{w}]))\n'
                     f"  / (sum by ({c}, workload, rank) (rate(goodput_steps_total[{w}])) > 0)\n"
                     f"or\n{step}"},
            {"record": f"workload_rank:goodput_straggler_ratio:rate{w}",
             "expr": f"{own}\n  / on ({c}, workload) group_left ()\n"
                     f"    (quantile by ({c}, workload) (0.5, {own}) > 0)"},
            {"record": f"workload:goodput_straggler_ratio:rate{w}",
             "expr": f"max by ({c}, workload) (workload_rank:goodput_straggler_ratio:rate{w})"},
            {"record": f"workload:goodput_tokens:rate{w}",
             "expr": f"sum by ({c}, workload) (rate(goodput_tokens_total[{w}]))"},
        ]
    short, base = s.windows[0], s.windows[-1]
    rules += [
        # 0.3 = 30% fewer tokens/s than the workload's own baseline; negative when faster
        {"record": f"workload:goodput_tokens_drop_ratio:rate{short}_vs_{base}",
         "expr": f"1 - workload:goodput_tokens:rate{short} / (workload:goodput_tokens:rate{base} > 0)"},
        {"record": f"workload:goodput_ratio:deriv{s.goodput_trend_window}",
         "expr": f"deriv(workload:goodput_ratio:rate{short}[{s.goodput_trend_window}])"},
    ]
    return rules


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


def recording_groups(s: RulesSettings) -> list[Group]:
    return [
        {"name": "goodput.gpu", "rules": _gpu(s)},
        {"name": "goodput.node_cluster", "rules": _node_cluster(s)},
        {"name": "goodput.workload", "rules": _workload(s)},
        {"name": "goodput.collective", "rules": _collective(s)},
    ]
