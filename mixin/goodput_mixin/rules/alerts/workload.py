"""Alerts on a training workload: goodput drops, progress lost to restarts, MFU drops, stragglers, collectives that
hang or miss a rank. Group `goodput.alerts.workload`. Each names a workload, so each carries its verdict and the
`diagnose` command (alert.py)."""

from __future__ import annotations

from ..settings import RulesSettings, seconds
from .alert import Alert


def _recorded(s: RulesSettings, record: str) -> str:
    """The value of a workload's recorded series, as a percentage, in an annotation."""
    c = s.cluster_label
    return (f'{{{{ with printf "{record}{{{c}=%q,workload=%q}}" $labels.{c} $labels.workload | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }}")


def alerts(s: RulesSettings) -> list[Alert]:
    short, base = s.windows[0], s.windows[-1]
    node = s.node_label
    pct = "{{ $value | humanizePercentage }}"
    wasted = s.wasted_progress_window
    mfu = "workload:goodput_mfu_ratio:rate"
    return [
        Alert(
            "GoodputDrop", "goodput-drop.md", "critical",
            f"workload:goodput_tokens_drop_ratio:rate{short}_vs_{base} > {s.goodput_drop_ratio}\n"
            f"or\n1 - workload:goodput_ratio:rate{short} / (workload:goodput_ratio:rate{base} > 0)"
            f" > {s.goodput_drop_ratio}",
            s.goodput_drop_for,
            "A training workload is making much less progress than it did.",
            f"Workload {{{{ $labels.workload }}}} is {pct} below its own {base} baseline (tokens/s or goodput) "
            f"for {s.goodput_drop_for}.",
            per_workload=True),
        Alert(
            "GoodputWastedProgress", "wasted-progress.md", "warning",
            f"workload:goodput_wasted_seconds:increase{wasted}\n  > {s.wasted_progress_ratio:g} * {seconds(wasted)}",
            "0m",
            "A training workload keeps redoing steps lost to restarts.",
            f"Workload {{{{ $labels.workload }}}} redid {{{{ $value | humanizeDuration }}}} of steps in the last "
            f"{wasted} (more than {s.wasted_progress_ratio * 100:g}% of it): the progress since its last checkpoint, "
            "lost at each restart.",
            per_workload=True),
        Alert(
            "GoodputMFUDrop", "mfu-drop.md", "warning",
            f"1 - {mfu}{short} / ({mfu}{base} > 0) > {s.mfu_drop_ratio}",
            s.mfu_drop_for,
            "A training workload uses much less of its GPUs' peak FLOPS than it did.",
            f"Workload {{{{ $labels.workload }}}}'s model FLOPs utilization is {_recorded(s, mfu + short)}, {pct} "
            f"below its own {base} baseline of {_recorded(s, mfu + base)}, for {s.mfu_drop_for}.",
            per_workload=True),
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
