"""Level 3, Host and input pipeline: is the host (data loading, CPU, NUMA, pressure, PCIe) starving the GPUs."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import LEVELS, Filters, Names, new_dashboard, row, timeseries_panel

LEVEL = LEVELS[2]
DATA_WAIT = 'phase="data_wait"'
INVOLUNTARY = 'kind="involuntary"'


def build(names: Names) -> Dashboard:
    f = Filters(names, node=True, workload=True)
    h = f(workload=False)  # host series name processes, not workloads
    n = names.node
    d = new_dashboard(LEVEL, names, node=True, workload=True).with_row(row("Input pipeline"))
    d = d.with_panel(timeseries_panel(
        "Data-loader wait share", "Share of each rank's time spent waiting for input data (phase data_wait). "
        "Above a few percent means the input pipeline (storage, decoding, too few loader workers, CPU) cannot "
        "keep the GPU fed.",
        "percentunit", [(f"sum by (workload, rank) (rate(goodput_phase_seconds_total{f(DATA_WAIT)}[$__rate_interval]))"
                         f" / sum by (workload, rank) (rate(goodput_phase_seconds_total{f()}[$__rate_interval]))",
                         "{{workload}} rank {{rank}}")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Storage read by GPU processes", "Bytes per second each GPU-holding process reads from storage. A data "
        "wait that rises while reads stay flat points at the storage or network file system.",
        "Bps", [(f"rate(goodput_host_process_read_bytes_total{h}[$__rate_interval])",
                 "{{" + n + "}} {{command}} {{pid}}")]))
    d = d.with_row(row("CPU of the GPU processes"))
    d = d.with_panel(timeseries_panel(
        "CPU of GPU processes", "CPU cores each GPU-holding process uses, user and system. A process pinned at "
        "its core allowance while its GPU idles is CPU-bound (data loading or Python overhead).",
        "short", [(f"sum by ({n}, pid, command, mode) (rate(goodput_host_process_cpu_seconds_total{h}"
                   "[$__rate_interval]))", "{{" + n + "}} {{command}} {{pid}} {{mode}}")]))
    d = d.with_panel(timeseries_panel(
        "Involuntary context switches", "Times per second the kernel took the CPU away from a GPU process that "
        "wanted it. High means the process competes for CPU (too few cores, noisy neighbours).",
        "cps", [(f"rate(goodput_host_process_context_switches_total{f(INVOLUNTARY, workload=False)}"
                 "[$__rate_interval])", "{{" + n + "}} {{command}} {{pid}}")]))
    d = d.with_panel(timeseries_panel(
        "NUMA mismatches", "GPU processes allowed to run on CPUs outside their GPU's local NUMA node (1 each). "
        "Above 0 means host-to-GPU copies cross the socket interconnect: bind the process to the GPU's node.",
        "none", [(f"sum by ({n}, gpu) (goodput_gpu_numa_mismatch{h})", "{{" + n + "}} GPU {{gpu}}")]))
    d = d.with_panel(timeseries_panel(
        "Unreadable GPU processes", "GPU-holding processes the exporter could not read (no hostPID or no "
        "permission). Above 0 means the CPU and NUMA panels miss those processes.",
        "none", [(f"goodput_host_unreadable_gpu_processes{h}", "{{" + n + "}}")]))
    d = d.with_row(row("Node pressure and PCIe"))
    d = d.with_panel(timeseries_panel(
        "CPU, IO and memory pressure", "Share of time some (or all) tasks on the node stalled waiting for CPU, "
        "IO or memory (Linux PSI). Sustained IO or memory pressure slows the input pipeline; CPU pressure "
        "starves the training processes.",
        "percentunit", [(f"rate(goodput_host_pressure_stalled_seconds_total{h}[$__rate_interval])",
                         "{{" + n + "}} {{resource}} {{kind}}")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "PCIe throughput per node", "Bytes per second all GPUs of a node move over PCIe, both directions (NVML "
        "counters). Input batches travel this way: near the slots' limit means host-to-device copies bound "
        "the job.",
        "Bps", [(f"sum by ({n}) (rate(goodput_gpu_pcie_transmit_bytes_total{h}[$__rate_interval]))",
                 "{{" + n + "}} tx"),
                (f"sum by ({n}) (rate(goodput_gpu_pcie_receive_bytes_total{h}[$__rate_interval]))",
                 "{{" + n + "}} rx")]))
    return d
