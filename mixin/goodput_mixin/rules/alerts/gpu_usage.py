"""Alerts on how GPUs are used: allocated but idle. Group `goodput.alerts.gpu_usage`."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    node = s.node_label
    pct = "{{ $value | humanizePercentage }}"
    return [
        Alert(
            "GoodputGPUIdleWhileAllocated", "gpu-idle-while-allocated.md", "warning",
            f"gpu:goodput_gpu_idle_while_allocated_ratio:rate{short} > {s.idle_while_allocated_ratio}",
            s.idle_while_allocated_for,
            "A GPU held by a job sits idle.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} is allocated but "
            f"idle {pct} of the time."),
    ]
