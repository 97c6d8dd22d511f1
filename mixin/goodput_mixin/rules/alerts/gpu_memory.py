"""Alerts on GPU memory: about to run out. Group `goodput.alerts.gpu_memory` (it reads every GPU's memory: apart from
`goodput.alerts.gpu_usage`, so that neither group takes a second at 10,000 GPUs)."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    node = s.node_label
    return [
        Alert(
            "GoodputGPUMemoryExhaustionSoon", "gpu-memory-exhaustion.md", "warning",
            f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{s.memory_predict_horizon} > 1\n"
            f"and goodput_gpu_memory_used_bytes / goodput_gpu_memory_total_bytes > {s.memory_used_ratio}",
            s.memory_exhaustion_for,
            "A GPU is about to run out of memory.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} is on course to run "
            f"out of memory within {s.memory_predict_horizon}."),
    ]
