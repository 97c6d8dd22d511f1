"""The host source: what the host does to feed the GPUs.

Per GPU-holding process (PIDs from the NVML source): CPU time, resident memory, threads, context
switches, storage I/O, and whether its CPU affinity stays on the GPU's NUMA node. For the node:
pressure stall information (PSI). General host metrics are node_exporter's job, not ours.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psutil

from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source
from . import metrics as c

log = logging.getLogger(__name__)

PRESSURE_RESOURCES = ("cpu", "io", "memory")


def parse_pressure(text: str) -> dict[str, float]:
    """`some avg10=0.00 avg60=0.00 avg300=0.00 total=12345` lines -> {"some": seconds, ...}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            key, _, value = item.partition("=")
            if key == "total" and value.isdigit():
                out[kind] = int(value) / 1e6  # microseconds
    return out


class HostSource(Source):
    name = "host"

    def __init__(self, table: NodeGpus, proc_path: str = "/proc") -> None:
        self.table = table
        self.proc_path = Path(proc_path)
        if proc_path != "/proc":
            psutil.PROCFS_PATH = proc_path
        self._cache: dict[int, psutil.Process] = {}
        self._unreadable_logged: set[int] = set()

    def collect(self) -> Batch:
        batch = Batch()
        table = self.table.holders()
        unreadable = 0
        for pid, holders in table.items():
            if not self._collect_process(pid, holders, batch):
                unreadable += 1
        for pid in list(self._cache):
            if pid not in table:
                del self._cache[pid]
        self._unreadable_logged &= set(table)
        batch.add(c.HOST_UNREADABLE, (), unreadable)
        self._collect_pressure(batch)
        return batch

    def _collect_process(self, pid: int, holders: tuple, batch: Batch) -> bool:
        try:
            proc = self._cache.get(pid)
            if proc is None or not proc.is_running():  # new, or the PID was reused by another process
                proc = self._cache[pid] = psutil.Process(pid)
            with proc.oneshot():
                command = proc.name()
                cpu = proc.cpu_times()
                rss = proc.memory_info().rss
                threads = proc.num_threads()
                switches = proc.num_ctx_switches()
                affinity = frozenset(proc.cpu_affinity() or ())
                try:
                    io = proc.io_counters()
                except (psutil.AccessDenied, AttributeError):
                    io = None
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess) as exc:
            self._cache.pop(pid, None)
            if pid not in self._unreadable_logged:
                self._unreadable_logged.add(pid)
                log.info("host: cannot read GPU process %d (%s); without hostPID or privileges "
                         "processes of other containers are not visible", pid, exc.__class__.__name__)
            return False
        labels = (str(pid), command)
        batch.add(c.HOST_PROC_CPU, (*labels, "user"), cpu.user)
        batch.add(c.HOST_PROC_CPU, (*labels, "system"), cpu.system)
        batch.add(c.HOST_PROC_RSS, labels, rss)
        batch.add(c.HOST_PROC_THREADS, labels, threads)
        batch.add(c.HOST_PROC_CTX, (*labels, "voluntary"), switches.voluntary)
        batch.add(c.HOST_PROC_CTX, (*labels, "involuntary"), switches.involuntary)
        if io is not None:
            batch.add(c.HOST_PROC_READ, labels, io.read_bytes)
            batch.add(c.HOST_PROC_WRITTEN, labels, io.write_bytes)
        for holder in holders:
            if holder.local_cpus and affinity:
                mismatch = 0 if affinity <= holder.local_cpus else 1
                batch.add(c.HOST_NUMA_MISMATCH, (holder.gpu, holder.uuid, str(pid)), mismatch)
        return True

    def _collect_pressure(self, batch: Batch) -> None:
        for resource in PRESSURE_RESOURCES:
            try:
                text = (self.proc_path / "pressure" / resource).read_text()
            except OSError:
                continue  # no PSI in this kernel (or disabled): the series are simply absent
            for kind, seconds in parse_pressure(text).items():
                batch.add(c.HOST_PRESSURE, (resource, kind), seconds)

    def close(self) -> None:
        self._cache.clear()
