"""Device ids as device plugins report them -> the GPU on this node they name.

Styles seen in the wild, all accepted:

    GPU-<uuid>                 NVIDIA device plugin, default device-id strategy
    MIG-<uuid>                 a MIG instance (mapped to its parent GPU)
    GPU-<uuid>::<n>            a time-slicing or MPS replica of a shared GPU (NVIDIA plugin sharing)
    <index>, nvidia<index>     device-id strategy "index"; GKE's plugin
    <index>:<mig index>        MIG instance by index (mapped to its parent GPU)
    0000:18:00.0               PCI bus id (domain of 4 or 8 hex digits)
    <vendor>/<class>=<id>      a CDI device name (DRA); <id> is matched as above

An id that names no GPU of this node is unmatched (counted), never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..gpu_processes import GpuIdentity

_INDEX = re.compile(r"^(?:nvidia)?(\d{1,4})$")
_MIG_INDEX = re.compile(r"^(\d{1,4}):\d{1,4}$")
_BUS_ID = re.compile(r"^(?:[0-9a-fA-F]{4}|[0-9a-fA-F]{8}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$")


class GpuMatcher:
    def __init__(self, gpus: Iterable[GpuIdentity]) -> None:
        self._by_uuid: dict[str, GpuIdentity] = {}
        self._by_index: dict[str, GpuIdentity] = {}
        self._by_bus: dict[str, GpuIdentity] = {}
        for gpu in gpus:
            self._by_uuid[gpu.uuid.lower()] = gpu
            for mig in gpu.mig_uuids:
                self._by_uuid[mig.lower()] = gpu
            self._by_index[gpu.gpu] = gpu
            bus = _BUS_ID.match(gpu.pci_bus_id)
            if bus is not None:
                self._by_bus[bus.group(1).lower()] = gpu

    def __len__(self) -> int:
        return len(self._by_index)

    def match(self, device_id: str) -> GpuIdentity | None:
        ident = device_id.strip()
        if "=" in ident:  # CDI name: vendor/class=id
            ident = ident.rpartition("=")[2]
        ident = ident.partition("::")[0]  # shared-GPU replica suffix
        lowered = ident.lower()
        if lowered.startswith(("gpu-", "mig-")):
            return self._by_uuid.get(lowered)
        index = _INDEX.match(lowered) or _MIG_INDEX.match(lowered)
        if index is not None:
            return self._by_index.get(str(int(index.group(1))))
        bus = _BUS_ID.match(lowered)
        if bus is not None:
            return self._by_bus.get(bus.group(1))
        return None
