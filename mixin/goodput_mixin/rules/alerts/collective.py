"""Alerts on a training workload's ranks and collectives: a straggler, a collective that hangs or misses a rank.
Group `goodput.alerts.collective` (apart from `goodput.alerts.workload`, so that neither group reads every rank and
every workload figure at once). Each names a workload, so each carries its verdict and the `diagnose` command
(alert.py)."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    node = s.node_label
    return [
        Alert(
            "GoodputStraggler", "straggler.md", "critical",
            f"workload_rank:goodput_straggler_ratio:rate{short} > {s.straggler_ratio}",
            s.straggler_for,
            "One rank of a training workload is much slower than the others.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} spends {{ $value | printf \"%.2f\" }}x "
            "the median rank's time per step outside collectives; every other rank waits for it.",
            per_workload=True),
        Alert(
            "GoodputCollectiveHang", "collective-hang.md", "critical",
            f"goodput_collective_oldest_inflight_seconds > {s.collective_hang_seconds:g}\n"
            f"and on ({s.cluster_label}, instance, workload, rank)\n"
            f"  (time() - goodput_flight_recorder_dump_timestamp_seconds < {s.dump_stale_seconds:g})",
            "0m",
            "A collective has been waiting for minutes.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} has waited "
            "{{ $value | humanizeDuration }} in a collective on process group {{ $labels.pg }} "
            f"(node {{{{ $labels.{node} }}}}).",
            per_workload=True),
        Alert(
            "GoodputCollectiveRankMissing", "collective-rank-missing.md", "critical",
            "goodput_collective_missing_rank == 1", s.rank_missing_for,
            "A rank never joined a collective the others wait in.",
            "Rank {{ $labels.rank }} of workload {{ $labels.workload }} has not enqueued collective "
            "{{ $labels.seq }} ({{ $labels.op }}) on process group {{ $labels.pg }} that other ranks wait in.",
            per_workload=True),
    ]
