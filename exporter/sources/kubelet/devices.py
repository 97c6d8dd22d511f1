"""Device ids as device plugins report them -> the GPU on this node they name.

Styles seen in the wild, all accepted:

    GPU-<uuid>                 NVIDIA device plugin, default device-id strategy
    MIG-<uuid>                 a MIG instance (its parent GPU, and the instance in mig_uuid)
    GPU-<uuid>::<n>            a time-slicing or MPS replica of a shared GPU (NVIDIA plugin sharing)
    <index>                    device-id strategy "index": the NVML index
    nvidia<minor>              GKE's plugin: the device node /dev/nvidia<minor>, matched on the GPU's
                               minor number (which need not equal its NVML index)
    <index>:<mig index>        MIG instance by index (its parent GPU, and the instance in mig_uuid)
    0001:18:00.0               PCI bus id, compared in full: domain (4 or 8 hex digits, as a number),
                               bus, device and function
    <vendor>/<class>=<id>      a CDI device name (DRA); <id> is matched as above

DRA devices of NVIDIA's driver (gpu.nvidia.com) are named `gpu-<n>` in the driver's pool: older
releases of the driver number them by NVML index, newer ones by minor number, so `gpu-<n>` is matched
only when both readings name the same GPU. Their MIG devices (`gpu-<n>-mig-...`) do not name the
instance and are not matched.

An id that names no GPU of this node is unmatched (counted), never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ...core.gpus import GpuIdentity

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"

_INDEX = re.compile(r"^(\d{1,4})$")
_MINOR = re.compile(r"^nvidia(\d{1,4})$")
_MIG_INDEX = re.compile(r"^(\d{1,4}):(\d{1,4})$")
_BUS_ID = re.compile(r"^([0-9a-f]{4}|[0-9a-f]{8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_DRA_GPU = re.compile(r"^gpu-(\d{1,4})$")


@dataclass(frozen=True, slots=True)
class Match:
    gpu: GpuIdentity
    mig_uuid: str = ""  # the MIG instance, when the id names one; empty for a whole GPU


def bus_address(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id such as 00000000:18:00.0, or None."""
    match = _BUS_ID.match(text.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return domain, bus, device, function


class GpuMatcher:
    def __init__(self, gpus: Iterable[GpuIdentity]) -> None:
        self._by_uuid: dict[str, Match] = {}
        self._by_index: dict[int, GpuIdentity] = {}
        self._by_minor: dict[int, GpuIdentity] = {}
        self._by_bus: dict[tuple[int, int, int, int], GpuIdentity] = {}
        for gpu in gpus:
            self._by_uuid[gpu.uuid.lower()] = Match(gpu)
            for mig in gpu.mig_uuids:
                self._by_uuid[mig.lower()] = Match(gpu, mig)
            if gpu.gpu.isdigit():
                self._by_index[int(gpu.gpu)] = gpu
            if gpu.minor is not None:
                self._by_minor[gpu.minor] = gpu
            address = bus_address(gpu.pci_bus_id)
            if address is not None:
                self._by_bus[address] = gpu

    def __len__(self) -> int:
        return len(self._by_index)

    def match(self, device_id: str) -> Match | None:
        """The GPU (and MIG instance) a device plugin's id or a CDI device name names, or None."""
        ident = device_id.strip()
        if "=" in ident:  # CDI name: vendor/class=id
            ident = ident.rpartition("=")[2]
        ident = ident.partition("::")[0]  # shared-GPU replica suffix
        lowered = ident.lower()
        if lowered.startswith(("gpu-", "mig-")):
            return self._by_uuid.get(lowered)
        index = _INDEX.match(lowered)
        if index is not None:
            gpu = self._by_index.get(int(index.group(1)))
            return Match(gpu) if gpu is not None else None
        minor = _MINOR.match(lowered)
        if minor is not None:
            gpu = self._by_minor.get(int(minor.group(1)))
            return Match(gpu) if gpu is not None else None
        mig = _MIG_INDEX.match(lowered)
        if mig is not None:
            gpu = self._by_index.get(int(mig.group(1)))
            position = int(mig.group(2))
            if gpu is None or position >= len(gpu.mig_uuids):
                return None
            return Match(gpu, gpu.mig_uuids[position])
        address = bus_address(lowered)
        if address is not None:
            gpu = self._by_bus.get(address)
            return Match(gpu) if gpu is not None else None
        return None

    def match_dra(self, driver: str, device: str) -> Match | None:
        """The GPU a DRA device of NVIDIA's driver names by its pool device name (`gpu-<n>`), or None."""
        if driver != NVIDIA_DRA_DRIVER:
            return None
        name = _DRA_GPU.match(device)
        if name is None:
            return None
        n = int(name.group(1))
        by_index, by_minor = self._by_index.get(n), self._by_minor.get(n)
        if by_index is None or (self._by_minor and by_minor is not by_index):
            return None  # the two numberings disagree, or name no GPU here: never guess
        return Match(by_index)
