"""The node's GPU table: which GPUs this node has and which host processes hold them.

Filled by the nvml source; read by the sources that need to name a GPU the way NVML does (dcgm matches
DCGM's or a dcgm-exporter's GPUs by UUID; host, kubelet and process follow processes and devices to GPUs).
One lock, one table: what a reader gets is always one consistent snapshot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuHolder:
    gpu: str  # index, as in the `gpu` label
    uuid: str
    local_cpus: frozenset[int]  # the GPU's ideal CPU set (its NUMA node); empty when unknown


@dataclass(frozen=True)
class GpuIdentity:
    """How device plugins may name a GPU: its index, UUID, PCI bus id, device minor number
    (/dev/nvidia<minor>), or one of its MIG instances."""

    gpu: str  # index, as in the `gpu` label
    uuid: str
    pci_bus_id: str
    mig_uuids: tuple[str, ...] = ()
    minor: int | None = None  # None when NVML does not report it


class NodeGpus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index_by_uuid: dict[str, str] = {}
        self._holders: dict[int, tuple[GpuHolder, ...]] = {}
        self._gpus: tuple[GpuIdentity, ...] = ()

    def record(self, uuid: str, index: str) -> None:
        """NVML identified GPU `uuid` at `index`. A UUID recorded earlier at the same index is one NVML
        no longer lists there (the GPU was replaced or reset to another UUID): it is forgotten, so two
        UUIDs never map to one `gpu`."""
        with self._lock:
            kept = {u: i for u, i in self._index_by_uuid.items() if i != index and u != uuid}
            self._index_by_uuid = {**kept, uuid: index}

    def index_by_uuid(self) -> dict[str, str]:
        """UUID -> NVML index (as in the `gpu` label); empty while NVML has identified no GPU."""
        with self._lock:
            return self._index_by_uuid

    def replace(self, holders: dict[int, tuple[GpuHolder, ...]],
                gpus: tuple[GpuIdentity, ...] | None = None) -> None:
        """New process table (PID -> the GPUs it holds); `gpus`, when given, the identified GPUs (kept across
        NVML failures: a GPU's identity does not change while NVML cannot be asked)."""
        with self._lock:
            self._holders = holders
            if gpus is not None:
                self._gpus = gpus

    def gpus(self) -> tuple[GpuIdentity, ...]:
        with self._lock:
            return self._gpus

    def holders(self) -> dict[int, tuple[GpuHolder, ...]]:
        """PID -> the GPUs the process holds."""
        with self._lock:
            return self._holders
