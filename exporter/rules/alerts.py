"""Alerting rules: prefix Goodput, a severity (critical pages, warning tickets), a static summary, a
templated description naming the workload, rank, node or GPU, and a runbook in docs/runbooks/.

Each alert is declared once here with the runbook file it links to; a test checks every runbook exists
and every alert has promtool tests that make it fire and keep it silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import RulesSettings

Rule = dict[str, object]


@dataclass(frozen=True)
class Alert:
    name: str
    runbook: str  # file name under docs/runbooks/
    severity: str
    expr: str
    for_: str
    summary: str
    description: str

    def rule(self, s: RulesSettings) -> Rule:
        rule: Rule = {"alert": self.name, "expr": self.expr}
        if self.for_ not in ("0m", "0s"):
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description,
                               "runbook_url": f"{s.runbook_base_url.rstrip('/')}/{self.runbook}"}
        return rule


def alerts(s: RulesSettings) -> list[Alert]:
    short, base = s.windows[0], s.windows[-1]
    node = s.node_label
    pct = "{{ $value | humanizePercentage }}"
    xids = "|".join(str(x) for x in sorted(set(s.critical_xids)))
    xid_series = f'goodput_gpu_xid_errors_total{{xid=~"{xids}"}}'
    return [
        Alert(
            "GoodputDrop", "goodput-drop.md", "critical",
            f"workload:goodput_tokens_drop_ratio:rate{short}_vs_{base} > {s.goodput_drop_ratio}\n"
            f"or\n1 - workload:goodput_ratio:rate{short} / (workload:goodput_ratio:rate{base} > 0)"
            f" > {s.goodput_drop_ratio}",
            s.goodput_drop_for,
            "A training workload is making much less progress than it did.",
            f"Workload {{{{ $labels.workload }}}} is {pct} below its own {base} baseline (tokens/s or goodput) "
            f"for {s.goodput_drop_for}."),
        Alert(
            "GoodputGPUIdleWhileAllocated", "gpu-idle-while-allocated.md", "warning",
            f"gpu:goodput_gpu_idle_while_allocated_ratio:rate{short} > {s.idle_while_allocated_ratio}",
            s.idle_while_allocated_for,
            "A GPU held by a job sits idle.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} is allocated but "
            f"idle {pct} of the time."),
        Alert(
            "GoodputStraggler", "straggler.md", "critical",
            f"workload_rank:goodput_straggler_ratio:rate{short} > {s.straggler_ratio}",
            s.straggler_for,
            "One rank of a training workload is much slower than the others.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} spends {{ $value | printf \"%.2f\" }}x "
            "the median rank's time per step outside collectives; every other rank waits for it."),
        Alert(
            "GoodputCollectiveHang", "collective-hang.md", "critical",
            f"goodput_collective_oldest_inflight_seconds > {s.collective_hang_seconds:g}\n"
            "and on (instance, workload, rank)\n"
            f"  (time() - goodput_flight_recorder_dump_timestamp_seconds < {s.dump_stale_seconds:g})",
            "0m",
            "A collective has been waiting for minutes.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} has waited "
            "{{ $value | humanizeDuration }} in a collective on process group {{ $labels.pg }} "
            f"(node {{{{ $labels.{node} }}}})."),
        Alert(
            "GoodputCollectiveRankMissing", "collective-rank-missing.md", "critical",
            "goodput_collective_missing_rank == 1", s.rank_missing_for,
            "A rank never joined a collective the others wait in.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} has not enqueued collective "
            "{{ $labels.seq }} ({{ $labels.op }}) on process group {{ $labels.pg }} that other ranks wait in."),
        Alert(
            "GoodputGPUXidCritical", "gpu-xid-critical.md", "critical",
            f"increase({xid_series}[{short}]) > 0\nor\n({xid_series} unless {xid_series} offset {short})",
            "0m",
            "A GPU reported a critical XID error.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} reported XID "
            "{{ $labels.xid }}."),
        Alert(
            "GoodputGPUEccUncorrectable", "gpu-ecc-uncorrectable.md", "critical",
            f'increase(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}[{short}]) > 0', "0m",
            "A GPU had uncorrectable memory errors.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} had "
            f"{{{{ $value | printf \"%.0f\" }}}} uncorrectable ECC errors in {short}."),
        Alert(
            "GoodputGPUThrottled", "gpu-throttled.md", "warning",
            f"sum without (reason) (rate(goodput_gpu_clock_throttle_seconds_total"
            f'{{reason=~"power|thermal|board_limit|reliability"}}[{short}])) > {s.throttle_ratio}',
            s.throttle_for,
            "A GPU's clocks are held down.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} was throttled by "
            f"power, thermal, board or reliability limits {pct} of the time."),
        Alert(
            "GoodputGPUMemoryExhaustionSoon", "gpu-memory-exhaustion.md", "warning",
            f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{s.memory_predict_horizon} > 1\n"
            f"and goodput_gpu_memory_used_bytes / goodput_gpu_memory_total_bytes > {s.memory_used_ratio}",
            s.memory_exhaustion_for,
            "A GPU is about to run out of memory.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} is on course to run "
            f"out of memory within {s.memory_predict_horizon}."),
        Alert(
            "GoodputExporterDown", "exporter-down.md", "warning",
            f'up{{job="{s.exporter_job}"}} == 0', s.exporter_down_for,
            "Prometheus cannot scrape a goodput-exporter.",
            f"The goodput-exporter on {{{{ $labels.{node} }}}} has not answered Prometheus for "
            f"{s.exporter_down_for}: that node's GPUs and jobs are unobserved."),
        Alert(
            "GoodputExporterSourceFailing", "exporter-source-failing.md", "warning",
            "goodput_exporter_source_up == 0", s.source_failing_for,
            "A goodput-exporter source keeps failing.",
            f"Source {{{{ $labels.source }}}} of the goodput-exporter on {{{{ $labels.{node} }}}} has failed "
            f"for {s.source_failing_for}; goodput_exporter_source_errors_total says why."),
    ]


# Small groups, by what they watch: Prometheus evaluates groups concurrently, each group's rules in turn.
GROUPS = {
    "goodput.alerts.workload": ("GoodputDrop", "GoodputStraggler", "GoodputCollectiveHang",
                                "GoodputCollectiveRankMissing"),
    "goodput.alerts.gpu_health": ("GoodputGPUXidCritical", "GoodputGPUEccUncorrectable", "GoodputGPUThrottled"),
    "goodput.alerts.gpu_usage": ("GoodputGPUIdleWhileAllocated", "GoodputGPUMemoryExhaustionSoon"),
    "goodput.alerts.exporter": ("GoodputExporterDown", "GoodputExporterSourceFailing"),
}


def alert_groups(s: RulesSettings) -> list[dict[str, object]]:
    by_name = {a.name: a for a in alerts(s)}
    grouped = [name for names in GROUPS.values() for name in names]
    if sorted(grouped) != sorted(by_name):
        raise AssertionError(f"every alert belongs to one group: {sorted(set(by_name) ^ set(grouped))}")
    return [{"name": group, "rules": [by_name[name].rule(s) for name in names]} for group, names in GROUPS.items()]
