"""The `host` source: what the host does to feed the GPUs (CPU, memory, I/O of GPU processes, NUMA, PSI)."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import HostConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import HostSource

    return HostSource(node.gpus, proc_path=settings.proc_path)


SPEC = SourceSpec("host", "Host feeding the GPUs (source `host`)", HostConfig, METRICS, _build,
                  chart_managed=frozenset({"proc_path"}))
