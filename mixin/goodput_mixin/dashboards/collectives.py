"""Level 2, Collectives and network: is a workload waiting on its collectives or on the wires between GPUs and
nodes. Each collective panel links a workload's series to this dashboard for that workload alone, whose fabric rows
then show its nodes' ports."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .fabric import with_fabric
from .kit import (
    LEVELS,
    Filters,
    Names,
    link_to_workload_fabric,
    new_dashboard,
    of_workload_gpus,
    row,
    table_panel,
    timeseries_panel,
)

LEVEL = LEVELS[1]
COMM_WAIT = 'phase="comm_wait"'


def build(names: Names) -> Dashboard:
    f = Filters(names, node=True, workload=True)
    n = names.node
    fabric = [link_to_workload_fabric()]
    d = new_dashboard(LEVEL, names, node=True, workload=True).with_row(row("Collective state (flight recorder)"))
    d = d.with_panel(timeseries_panel(
        "Sequence lag per rank", "How many collectives each rank is behind the furthest rank of its process group "
        "(enqueued and completed), across nodes. One rank far behind is the one the others wait for; all "
        "ranks at 0 is healthy.",
        "none", [(f"workload_pg_rank:goodput_collective_lag:behind_max{f(node=False)}",
                  "{{workload}} pg {{pg}} rank {{rank}} {{state}}")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Oldest in-flight collective", "How long the oldest unfinished collective of each rank had waited when "
        "the rank last dumped. Growing without bound means a hang: some rank never joined (see Missing ranks).",
        "s", [(f"goodput_collective_oldest_inflight_seconds{f()}", "{{workload}} pg {{pg}} rank {{rank}}")],
        links=fabric))
    d = d.with_panel(table_panel(
        "Missing ranks", "Ranks that have not enqueued the oldest unfinished collective (seq, op) that other ranks "
        "on the same node wait in. Any row here is the cause of a hang: look at that rank's process.",
        "none", [(f"goodput_collective_missing_rank{f()} == 1", "")]))
    d = d.with_panel(timeseries_panel(
        "In-flight collectives", "Collectives each rank enqueued that had not completed when it dumped. A few is "
        "normal with overlap; a count that only grows means the group is stuck.",
        "none", [(f"goodput_collective_inflight{f()}", "{{workload}} pg {{pg}} rank {{rank}}")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Flight-recorder dump age", "Seconds since each rank last wrote its flight-recorder dump. Old dumps make "
        "every panel above stale: the job stopped dumping (or died).",
        "s", [(f"time() - goodput_flight_recorder_dump_timestamp_seconds{f()}", "{{workload}} rank {{rank}}")]))
    d = d.with_row(row("Collective time and bytes by op"))
    d = d.with_panel(timeseries_panel(
        "Collective operations by op", "Collective and point-to-point ops enqueued per second, by op. A drop to "
        "0 while the job runs means it is stuck in one.",
        "ops", [(f"sum by (workload, op) (rate(goodput_collective_operations_total{f()}[$__rate_interval]))",
                 "{{workload}} {{op}}")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Collective bytes by op", "Bytes per second the ranks' collectives move, by op (the larger of input and "
        "output buffers). Compare with NVLink and PCIe throughput below to see if the wires are the limit.",
        "Bps", [(f"sum by (workload, op) (rate(goodput_collective_bytes_total{f()}[$__rate_interval]))",
                 "{{workload}} {{op}}")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Mean collective time by op", "Mean duration of completed collectives as timed by the backend (NCCL with "
        "TORCH_NCCL_ENABLE_TIMING=1; gloo records none). Rising time at constant bytes means slower links or a "
        "slow peer.",
        "s", [(f"sum by (workload, op) (rate(goodput_collective_duration_seconds_sum{f()}[$__rate_interval])) / "
               f"sum by (workload, op) (rate(goodput_collective_duration_seconds_count{f()}[$__rate_interval]))",
               "{{workload}} {{op}}")], links=fabric))
    d = d.with_panel(timeseries_panel(
        "Communication wait share", "Share of each rank's time spent waiting in communication (phase comm_wait). "
        "High on all but one rank: that rank straggles. High on all: the network is the bottleneck.",
        "percentunit", [(f"sum by (workload, rank) (rate(goodput_phase_seconds_total{f(COMM_WAIT)}"
                         "[$__rate_interval])) / sum by (workload, rank) (rate(goodput_phase_seconds_total"
                         f"{f()}[$__rate_interval]))", "{{workload}} rank {{rank}}")], max_value=1, links=fabric))
    d = d.with_row(row("NVLink and PCIe (GPUs of the selected workloads)"))
    gpu_f = f(workload=False)
    d = d.with_panel(timeseries_panel(
        "NVLink throughput", "Bytes per second each GPU sends (+) and receives over all its NVLinks. Flat at the "
        "link's peak during collectives means NVLink is the limit; near 0 where you expect traffic means "
        "collectives go over PCIe or the network instead.",
        "Bps", [(of_workload_gpus(f"sum by ({n}, uuid, gpu) (rate(goodput_gpu_nvlink_transmit_bytes_total{gpu_f}"
                                  "[$__rate_interval]))", names), "{{" + n + "}} GPU {{gpu}} tx"),
                (of_workload_gpus(f"sum by ({n}, uuid, gpu) (rate(goodput_gpu_nvlink_receive_bytes_total{gpu_f}"
                                  "[$__rate_interval]))", names), "{{" + n + "}} GPU {{gpu}} rx")]))
    d = d.with_panel(timeseries_panel(
        "PCIe throughput", "Bytes per second each GPU sends and receives over PCIe (NVML counters). Near the "
        "slot's limit means host transfers (input data, offload, collectives without NVLink) bound the job.",
        "Bps", [(of_workload_gpus(f"rate(goodput_gpu_pcie_transmit_bytes_total{gpu_f}[$__rate_interval])", names),
                 "{{" + n + "}} GPU {{gpu}} tx"),
                (of_workload_gpus(f"rate(goodput_gpu_pcie_receive_bytes_total{gpu_f}[$__rate_interval])", names),
                 "{{" + n + "}} GPU {{gpu}} rx")]))
    return with_fabric(d, names, f)
