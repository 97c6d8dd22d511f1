"""The `fabric` source: InfiniBand, RoCE, EFA and Ethernet ports from sysfs, and which NIC each GPU uses."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import FabricConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import FabricSource
    from .sysfs import HostSysfs

    view = node.fabric if node.fabric is not None else HostSysfs(settings.sysfs_path)
    return FabricSource(view, node.gpus, interfaces=settings.interfaces, proc_path=node.config.host.proc_path)


SPEC = SourceSpec("fabric", "Network fabric: InfiniBand, RoCE, Ethernet and GPU-NIC topology (source `fabric`)",
                  FabricConfig, METRICS, _build, chart_managed=frozenset({"sysfs_path"}))
