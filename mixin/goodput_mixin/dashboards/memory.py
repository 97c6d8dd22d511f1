"""Level 4, GPU memory: used vs total per GPU, the trend, and when it runs out."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import LEVELS, Filters, Names, new_dashboard, row, table_panel, timeseries_panel

LEVEL = LEVELS[3]


def build(names: Names) -> Dashboard:
    f = Filters(names, node=True)
    n = names.node
    horizon = names.settings.memory_predict_horizon
    predicted = f"gpu:goodput_gpu_memory_used_bytes:predict_linear{horizon}"
    exhaustion = f"gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear{horizon}"
    gpu = "{{" + n + "}} GPU {{gpu}}"
    d = new_dashboard(LEVEL, names, node=True).with_row(row("Now"))
    d = d.with_panel(timeseries_panel(
        "Memory used share per GPU", "Frame-buffer memory in use over memory installed, per GPU. Near 1 means "
        "the next larger batch, longer sequence or fragmentation spike fails with out-of-memory.",
        "percentunit", [(f"goodput_gpu_memory_used_bytes{f()} / (goodput_gpu_memory_total_bytes{f()} > 0)", gpu)],
        max_value=1))
    d = d.with_panel(timeseries_panel(
        "Memory used vs total", "Bytes in use per GPU, with each GPU's installed memory as the ceiling. The gap "
        "between the two is the headroom.",
        "bytes", [(f"goodput_gpu_memory_used_bytes{f()}", f"{gpu} used"),
                  (f"goodput_gpu_memory_total_bytes{f()}", f"{gpu} total")]))
    d = d.with_panel(timeseries_panel(
        "Memory per process", "GPU memory each compute process holds (host PID). One process growing while "
        "the others stay flat is a leak or a cache that never shrinks.",
        "bytes", [(f"goodput_gpu_process_memory_used_bytes{f()}", gpu + " pid {{pid}}")]))
    d = d.with_panel(timeseries_panel(
        "Headroom", "Bytes still free per GPU (installed minus used). Shrinking steadily under a constant "
        "workload means memory is leaking.",
        "bytes", [(f"goodput_gpu_memory_total_bytes{f()} - goodput_gpu_memory_used_bytes{f()}", gpu)]))
    d = d.with_row(row(f"Trend: the next {horizon}"))
    d = d.with_panel(timeseries_panel(
        f"Predicted use in {horizon}", f"Memory each GPU will use in {horizon} at the last "
        f"{names.settings.memory_predict_window}'s trend (predict_linear). Above the total means it runs out "
        "before then unless the trend changes.",
        "bytes", [(f"{predicted}{f()}", f"{gpu} predicted"), (f"goodput_gpu_memory_total_bytes{f()}", f"{gpu} total")]))
    d = d.with_panel(table_panel(
        "GPUs closest to exhaustion", f"The ten GPUs with the highest predicted use in {horizon} over their "
        "total. Above 100% means out-of-memory within the horizon at the current trend "
        "(GoodputGPUMemoryExhaustionSoon fires once use is also high).",
        "percentunit", [(f"topk(10, {exhaustion}{f()})", "")]))
    return d
