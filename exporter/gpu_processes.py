"""Which host processes hold which GPUs: written by the NVML source, read by the host source."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuHolder:
    gpu: str  # index, as in the `gpu` label
    uuid: str
    local_cpus: frozenset[int]  # the GPU's ideal CPU set (its NUMA node); empty when unknown


class GpuProcessTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[int, tuple[GpuHolder, ...]] = {}

    def replace(self, table: dict[int, tuple[GpuHolder, ...]]) -> None:
        with self._lock:
            self._table = table

    def snapshot(self) -> dict[int, tuple[GpuHolder, ...]]:
        with self._lock:
            return self._table
