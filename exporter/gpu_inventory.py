"""Which GPUs this node has, by UUID: written by the NVML source, read by sources that match other
tools' GPU ids to ours (DCGM numbers GPUs its own way; a dcgm-exporter labels them by UUID)."""

from __future__ import annotations

import threading


class GpuInventory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index_by_uuid: dict[str, str] = {}

    def record(self, uuid: str, index: str) -> None:
        """NVML identified GPU `uuid` at `index`. A UUID recorded earlier at the same index is one NVML
        no longer lists there (the GPU was replaced or reset to another UUID): it is forgotten, so two
        UUIDs never map to one `gpu`."""
        with self._lock:
            kept = {u: i for u, i in self._index_by_uuid.items() if i != index and u != uuid}
            self._index_by_uuid = {**kept, uuid: index}

    def snapshot(self) -> dict[str, str]:
        """UUID -> NVML index (as in the `gpu` label); empty while NVML has identified no GPU."""
        with self._lock:
            return self._index_by_uuid
