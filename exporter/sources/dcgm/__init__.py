"""The `dcgm` source: SM, tensor and DRAM activity from DCGM's profiling fields, through DCGM's bindings or a
dcgm-exporter on the node."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import DcgmConfig


def _build(node: Node, settings: Any) -> Source:
    from .backends import make_backend
    from .source import DcgmSource

    backend = node.dcgm_backend
    if settings.mode == "bindings" and backend is None:
        backend = make_backend(settings, node.gpu_backend)
    return DcgmSource(settings, backend, node.gpus, nvml_enabled=node.config.nvml.enabled)


SPEC = SourceSpec(
    "dcgm", "Kernels: SM, tensor, DRAM activity (source `dcgm`, from DCGM or a dcgm-exporter)", DcgmConfig,
    METRICS, _build, chart_managed=frozenset({"enabled", "mode", "hostengine", "exporter_url"}))
