"""The `health` source: publishes what `goodput-exporter health` (the node health check Slurm and
node-problem-detector run) decided, from the state file it keeps (exporter.health.state)."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import HealthSourceConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import HealthSource

    return HealthSource(settings.state_file)


SPEC = SourceSpec("health", "Node health check decisions (source `health`)", HealthSourceConfig, METRICS, _build)
