"""Which GPUs there are and which host processes hold them: written by the NVML source, read by the
host source and the attribution sources."""

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


class GpuProcessTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[int, tuple[GpuHolder, ...]] = {}
        self._gpus: tuple[GpuIdentity, ...] = ()

    def replace(self, table: dict[int, tuple[GpuHolder, ...]], gpus: tuple[GpuIdentity, ...] | None = None) -> None:
        """New process table; `gpus`, when given, the identified GPUs (kept across NVML failures:
        a GPU's identity does not change while NVML cannot be asked)."""
        with self._lock:
            self._table = table
            if gpus is not None:
                self._gpus = gpus

    def gpus(self) -> tuple[GpuIdentity, ...]:
        with self._lock:
            return self._gpus

    def snapshot(self) -> dict[int, tuple[GpuHolder, ...]]:
        with self._lock:
            return self._table
