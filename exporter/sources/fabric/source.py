"""The fabric source: InfiniBand, RoCE, EFA and Ethernet ports from sysfs, and which NIC each GPU talks through.

Everything is read from sysfs (see sysfs.py for the view it reads through) on each collection: a few hundred
small files on a node with 8 NICs. The PCI topology changes only when GPUs or NICs come and go, so it is
computed again only when the set of GPUs or RDMA devices changes, or every TOPOLOGY_EVERY seconds.
"""

from __future__ import annotations

import logging
import re

from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source, SourceError
from . import ethernet, rdma
from . import metrics as c
from .counters import Wraps
from .reading import Problems
from .sysfs import SysfsView

log = logging.getLogger(__name__)

TOPOLOGY_EVERY = 300.0


class FabricSource(Source):
    name = "fabric"

    def __init__(self, view: SysfsView, table: NodeGpus, interfaces: str = "", proc_path: str = "/proc") -> None:
        self.view = view
        self.table = table
        self.pattern = re.compile(interfaces) if interfaces else None
        self.proc_path = proc_path
        self.wraps = Wraps()
        self.problems = Problems()

    def start(self) -> None:
        log.info("fabric: reading %s", self.view.name)

    def collect(self) -> Batch:
        if not self.view.exists("class/net"):  # every Linux sysfs has it, even without a network interface
            raise SourceError("fabric_no_sysfs", f"{self.view.name} has no class/net: is the host's /sys mounted "
                              "there (fabric.sysfs_path)?")
        batch = Batch()
        self.problems.begin()
        rdma.collect(self.view, batch, self.wraps, self.problems)
        ethernet.collect(self.view, batch, self.problems, self.pattern)
        self.wraps.sweep()
        for device, count in sorted(self.problems.unreadable.items()):
            batch.add(c.UNREADABLE, (device,), count)
        self.problems.end()
        return batch
