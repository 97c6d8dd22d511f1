"""The `process` source: which workload and rank each GPU's processes belong to."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import ProcessConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import ProcessSource

    return ProcessSource(node.gpus, proc_path=node.config.host.proc_path, declared=node.declarations)


SPEC = SourceSpec("process", "Workloads and ranks (source `process`, from GPU processes)", ProcessConfig, METRICS,
                  _build)
