"""The sources, and the one registry of them.

Adding a source is one folder (`sources/<name>/`: its settings, metrics, source and `SPEC`) and one name in
`NAMES`. Order matters twice: it is the order of the sections in the docs and of the blocks on /metrics, and a
source is built after those it reads from (process reads what ingest learned).
"""

from __future__ import annotations

from importlib import import_module

from ..core import health as own_health
from ..core.catalog import Metric, gather
from .base import SourceSpec

NAMES = ("nvml", "dcgm", "fabric", "host", "ingest", "flight", "kubelet", "process", "health")

SOURCES: tuple[SourceSpec, ...] = tuple(import_module(f"{__name__}.{name}").SPEC for name in NAMES)
BY_NAME: dict[str, SourceSpec] = {spec.name: spec for spec in SOURCES}

# Every metric the exporter may write: each source's, then the exporter's own (source "exporter").
CATALOG: dict[str, Metric] = gather([*(spec.metrics for spec in SOURCES), own_health.METRICS])
