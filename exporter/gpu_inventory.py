"""Which GPUs this node has, by UUID: written by the NVML source, read by sources that match other
tools' GPU ids to ours (DCGM numbers GPUs its own way; a dcgm-exporter labels them by UUID)."""

from __future__ import annotations

import threading


class GpuInventory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index_by_uuid: dict[str, str] = {}

    def record(self, uuid: str, index: str) -> None:
        with self._lock:
            self._index_by_uuid = {**self._index_by_uuid, uuid: index}

    def snapshot(self) -> dict[str, str]:
        """UUID -> NVML index (as in the `gpu` label); empty while NVML has identified no GPU."""
        with self._lock:
            return self._index_by_uuid
