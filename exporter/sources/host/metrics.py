"""Metrics of the `host` source: what the host does to feed the GPUs."""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("host")

PROC = ("pid", "command")
HOST_PROC_CPU = _m(
    "goodput_host_process_cpu_seconds_total", Kind.COUNTER, "seconds",
    "CPU time of each GPU-holding process, mode user or system.", (*PROC, "mode"))
HOST_PROC_RSS = _m(
    "goodput_host_process_resident_memory_bytes", Kind.GAUGE, "bytes",
    "Resident memory of each GPU-holding process.", PROC)
HOST_PROC_THREADS = _m(
    "goodput_host_process_threads", Kind.GAUGE, "", "Threads of each GPU-holding process.", PROC)
HOST_PROC_CTX = _m(
    "goodput_host_process_context_switches_total", Kind.COUNTER, "",
    "Context switches of each GPU-holding process, kind voluntary or involuntary (involuntary ones "
    "mean the process wanted CPU it did not get).", (*PROC, "kind"))
HOST_PROC_READ = _m(
    "goodput_host_process_read_bytes_total", Kind.COUNTER, "bytes",
    "Bytes each GPU-holding process read from storage (absent without permission to read its I/O).",
    PROC)
HOST_PROC_WRITTEN = _m(
    "goodput_host_process_written_bytes_total", Kind.COUNTER, "bytes",
    "Bytes each GPU-holding process wrote to storage (absent without permission to read its I/O).",
    PROC)
HOST_NUMA_MISMATCH = _m(
    "goodput_gpu_numa_mismatch", Kind.GAUGE, "",
    "1 when a process holding the GPU may run on CPUs outside the GPU's local NUMA node (its CPU "
    "affinity is not within the GPU's ideal CPU set), else 0.",
    (*GPU, "pid"))
HOST_UNREADABLE = _m(
    "goodput_host_unreadable_gpu_processes", Kind.GAUGE, "",
    "GPU-holding processes the host source could not read (not visible without hostPID, or no "
    "permission).", ())
HOST_PRESSURE = _m(
    "goodput_host_pressure_stalled_seconds_total", Kind.COUNTER, "seconds",
    "Time tasks on the node were stalled for a resource (cpu, io, memory), kind some or full, from "
    "/proc/pressure (PSI); absent where the kernel has no PSI.",
    ("resource", "kind"))

METRICS = _m.metrics
