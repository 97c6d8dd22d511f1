"""The fabric source: InfiniBand, RoCE, EFA and Ethernet ports from sysfs, and which NIC each GPU talks through.

Everything is read from sysfs (see sysfs.py for the view it reads through) on each collection: a few hundred
small files on a node with 8 NICs. The PCI topology changes only when GPUs or NICs come and go, so it is
computed again only when the set of GPUs or RDMA devices changes, or every TOPOLOGY_EVERY seconds.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source, SourceError
from ..process.procenv import Invisible, read_environ
from . import ethernet, nccl, rdma
from . import metrics as c
from .counters import Wraps
from .reading import Problems, listdir
from .sysfs import SysfsView
from .topology import Topology, gpu_nic_paths

log = logging.getLogger(__name__)

TOPOLOGY_EVERY = 300.0
# what decides which NICs NCCL may use (nccl.py): the two lists, and the variables that pick its transport
NCCL_VARIABLES = frozenset({nccl.IB_HCA, nccl.SOCKET_IFNAME, "NCCL_IB_DISABLE", "NCCL_NET"})


class FabricSource(Source):
    name = "fabric"

    def __init__(self, view: SysfsView, table: NodeGpus, interfaces: str = "", proc_path: str = "/proc") -> None:
        self.view = view
        self.table = table
        self.pattern = re.compile(interfaces) if interfaces else None
        self.proc_path = proc_path
        self.wraps = Wraps()
        self.problems = Problems()
        self._topology: Topology | None = None
        self._topology_key: tuple[object, ...] = ()
        self._topology_at = 0.0
        # (pid, start time) -> its NCCL variables; None: unreadable. The start time tells a reused PID apart.
        self._environ: dict[tuple[int, str], dict[str, str] | None] = {}
        self._unplaced_logged: set[str] = set()
        self._topology_failed = False

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
        try:
            self._collect_topology(batch)
        except Exception:  # a sysfs the topology code did not foresee must not take the port series down with it
            if not self._topology_failed:
                log.exception("fabric: the GPU-NIC topology could not be computed from %s", self.view.name)
            self._topology_failed = True
            batch.errors.append("fabric_topology")
        else:
            self._topology_failed = False
        self.wraps.sweep()
        for device, count in sorted(self.problems.unreadable.items()):
            batch.add(c.UNREADABLE, (device,), count)
            batch.errors.extend(["fabric_unreadable_file"] * count)
        self.problems.end()
        return batch

    # --- topology -----------------------------------------------------------------------------------------------

    def _current_topology(self) -> Topology:
        """The PCI topology, computed again when the GPUs or RDMA devices change, or every TOPOLOGY_EVERY s."""
        gpus = tuple((int(g.gpu), g.uuid, g.pci_bus_id) for g in self.table.gpus() if g.gpu.isdigit())
        key = (gpus, tuple(listdir(self.view, rdma.ROOT)), tuple(listdir(self.view, ethernet.ROOT)))
        now = time.monotonic()
        if self._topology is None or key != self._topology_key or now - self._topology_at >= TOPOLOGY_EVERY:
            self._topology = gpu_nic_paths(self.view, gpus)
            self._topology_key, self._topology_at = key, now
            unplaced = {*self._topology.unreadable_nics, *self._topology.unreadable_gpus}
            for name in sorted(unplaced - self._unplaced_logged):
                log.warning("fabric: cannot place %s on the PCI tree of %s; it is left out of the GPU-NIC topology",
                            name, self.view.name)
            self._unplaced_logged = unplaced
        return self._topology

    def _collect_topology(self, batch: Batch) -> None:
        topology = self._current_topology()  # a NIC or GPU it cannot place is logged once, and left out
        batch.errors.extend(["fabric_unplaced"] * (len(topology.unreadable_nics) + len(topology.unreadable_gpus)))
        for placed in topology.nics:
            where = placed.place
            batch.add(c.NIC_TOPOLOGY, (placed.nic.device, where.pci_bus_id, str(where.numa_node), where.pcie_switch,
                                       where.root_complex), 1)
        by_uuid = {}
        for gpu in topology.gpus:
            where = gpu.place
            labels = (str(gpu.index), gpu.uuid)
            by_uuid[gpu.uuid] = gpu
            batch.add(c.GPU_TOPOLOGY, (*labels, where.pci_bus_id, str(where.numa_node), where.pcie_switch,
                                       where.root_complex), 1)
            for p in gpu.nic_paths:
                batch.add(c.GPU_NIC, (*labels, p.device, p.port, p.path), 1)
            for p in gpu.preferred:
                batch.add(c.GPU_PREFERRED_NIC, (*labels, p.device, p.port, p.path), 1)
        self._collect_nccl(batch, topology, by_uuid)

    def _start_time(self, pid: int) -> str:
        """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the PID, names one process."""
        try:
            with open(f"{self.proc_path}/{pid}/stat", "rb") as handle:
                stat = handle.read(4096)
        except OSError:
            return ""
        fields = stat.rpartition(b")")[2].split()  # after the command, which may hold spaces: field 3 on
        return fields[19].decode() if len(fields) > 19 else ""

    def _collect_nccl(self, batch: Batch, topology: Topology, by_uuid: dict) -> None:  # type: ignore[type-arg]
        """Per GPU-holding process that sets NCCL_IB_HCA or NCCL_SOCKET_IFNAME: whether that keeps each of its GPUs
        off all of the GPU's preferred NICs."""
        holders = self.table.holders()
        keys = {pid: (pid, self._start_time(pid)) for pid in holders}
        for key in set(self._environ) - set(keys.values()):
            del self._environ[key]
        nics = [placed.nic for placed in topology.nics]
        for pid, gpus in holders.items():
            key = keys[pid]
            if key not in self._environ:  # the environment a process was exec'd with never changes
                try:
                    self._environ[key] = read_environ(Path(self.proc_path), pid, NCCL_VARIABLES)
                except Invisible:
                    self._environ[key] = None
            env = self._environ[key]
            if not env:
                continue
            allowed = nccl.allowed(env, nics)
            if allowed is None:
                continue
            for holder in gpus:
                gpu = by_uuid.get(holder.uuid)
                if gpu is None or not gpu.preferred:
                    continue
                verdict = nccl.excluded_preferred(allowed, [(p.device, p.port) for p in gpu.preferred])
                for variable, excluded in sorted(verdict.items()):
                    batch.add(c.GPU_NIC_EXCLUDED, (holder.gpu, holder.uuid, str(pid), variable), 1 if excluded else 0)
