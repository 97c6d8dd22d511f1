"""The `nvml` source: per-GPU telemetry from NVML, or from the simulated GPUs that stand in for it."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import NvmlConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import NvmlSource

    return NvmlSource(node.gpu_backend, node.gpus, nvlink_per_link=settings.nvlink_per_link,
                      slow_interval=settings.slow_interval)


SPEC = SourceSpec("nvml", "GPU (source `nvml`)", NvmlConfig, METRICS, _build)
