"""Alerts on a training workload's progress: goodput drops, progress lost to restarts, MFU drops, a finish forecast
past the workload's deadline. Group
`goodput.alerts.workload` (its ranks and collectives: `goodput.alerts.collective`). Each names a workload, so each
carries its verdict and the `diagnose` command (alert.py)."""

from __future__ import annotations

from ..forecast import DEADLINE, FINISH_P50, P50
from ..settings import RulesSettings, seconds
from .alert import Alert


def _recorded(s: RulesSettings, record: str) -> str:
    """The value of a workload's recorded series, as a percentage, in an annotation."""
    c = s.cluster_label
    return (f'{{{{ with printf "{record}{{{c}=%q,workload=%q}}" $labels.{c} $labels.workload | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }}")


def alerts(s: RulesSettings) -> list[Alert]:
    short, base = s.windows[0], s.windows[-1]
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
            "GoodputDeadlineAtRisk", "deadline-at-risk.md", "warning",
            f"{FINISH_P50}\n  - {DEADLINE}\n  > 0",
            s.deadline_at_risk_for,
            "A training workload is forecast to finish after its deadline.",
            f"Workload {{{{ $labels.workload }}}} is forecast (P50) to finish {{{{ $value | humanizeDuration }}}} "
            f"after the deadline it declared, for {s.deadline_at_risk_for}: at its step time, badput and "
            "interruption risk, {{ with printf \"" + P50 + f"{{{s.cluster_label}=%q,workload=%q}}\" "
            f"$labels.{s.cluster_label} $labels.workload | query }}}}{{{{ . | first | value | humanizeDuration }}}}"
            "{{ end }} to go.",
            per_workload=True),
        Alert(
            "GoodputMFUDrop", "mfu-drop.md", "warning",
            f"1 - {mfu}{short} / ({mfu}{base} > 0) > {s.mfu_drop_ratio}",
            s.mfu_drop_for,
            "A training workload uses much less of its GPUs' peak FLOPS than it did.",
            f"Workload {{{{ $labels.workload }}}}'s model FLOPs utilization is {_recorded(s, mfu + short)}, {pct} "
            f"below its own {base} baseline of {_recorded(s, mfu + base)}, for {s.mfu_drop_for}.",
            per_workload=True),
    ]
