"""What a source declares once, in its folder's `__init__.py`: a `SourceSpec`. The registry
(`exporter.sources.SOURCES`) lists the specs; everything else is derived from them: the config sections, flags
and environment variables, the daemon's wiring, the order of series, the metrics reference, the chart's values
schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.catalog import Metric
from ..core.gpus import NodeGpus
from ..core.settings import SourceConfig
from ..core.source import Source, SourceError

__all__ = ["Node", "Source", "SourceError", "SourceSpec"]


@dataclass
class Node:
    """What the sources of one node share; handed to every source's build function, in registry order."""

    config: Any  # the root Config (exporter.config): web, log, every source's section, simulate
    gpu_backend: Any  # sources.nvml.api.GpuBackend: the NVML library, or the simulated GPUs
    gpus: NodeGpus  # filled by the nvml source, read by the others
    dcgm_backend: Any = None  # sources.dcgm.api.DcgmBackend; None: the dcgm source makes its own
    fabric: Any = None  # sources.fabric.sysfs.SysfsView: the simulated fabric; None: the host's sysfs
    # what processes declared over the events socket (ingest's, for process): set by a source built earlier
    declarations: Callable[[], Any] | None = None
    # (workload, rank) -> when the rank's process was found ended (wall-clock seconds: its `end` event, or the process
    # that reported for it exited); ingest's, for flight, whose dumps written before then are the dead process's
    rank_ends: Callable[[], dict[tuple[str, str], float]] | None = None
    # asks the ranks of a workload on this node for captures: (workload, ranks, trigger, detail) -> the capture's
    # id or None; ingest's (its captures), for flight's hangs and missing ranks; None: captures are off
    captures: Callable[[str, list[str], str, str], Any] | None = None
    # holds every adaptive source at its shortest interval for the given seconds (the daemon's, set once it is built)
    boost: Callable[[float], Any] | None = None


@dataclass(frozen=True)
class SourceSpec:
    name: str  # the config section, the `source` label, the flags' prefix (--<name>.<key>)
    title: str  # its heading in docs/metrics.md
    settings: type[SourceConfig]  # its config section: every scalar field is also a flag and a variable
    metrics: tuple[Metric, ...]  # everything it may emit
    # builds the source from the node and its settings; import heavy modules inside, not at the top: the
    # registry is imported by the config layer and the generators, which never build a source
    build: Callable[[Node, Any], Source]
    # keys of its section that the Helm chart sets itself (mounts, downward API): not settable in `config`
    chart_managed: frozenset[str] = frozenset()
