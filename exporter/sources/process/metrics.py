"""Metrics of the `process` source: which workload and rank each GPU's processes belong to."""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("process")

GPU_WORKLOAD_INFO = _m(
    "goodput_gpu_workload_info", Kind.INFO, "",
    "The workload and rank of a process holding the GPU: as the process declared them to the ingest "
    "API, else from its launcher environment (TORCHELASTIC_RUN_ID, SLURM_JOB_ID or MASTER_ADDR:MASTER_PORT; "
    "RANK or SLURM_PROCID), else the Slurm job of its cgroup. rank is empty when unknown. Join on uuid; "
    "value is always 1.", (*GPU, "workload", "rank"))
ATTRIBUTION_PROCESSES = _m(
    "goodput_attribution_processes", Kind.GAUGE, "",
    "GPU-holding processes by how their workload was learned (state): declared, environment, cgroup; or "
    "why it was not: unattributed (no launcher variable names one), denied (its environment is not "
    "readable: needs root or CAP_SYS_PTRACE), invisible (not in the exporter's PID namespace: needs "
    "hostPID, or gone).", ("state",))
DECLARATIONS_IGNORED = _m(
    "goodput_attribution_declarations_ignored_total", Kind.COUNTER, "",
    "Identities declared over the events socket that were not used, by reason: mixed_identity (a batch "
    "named several workload/rank pairs, so its sender declares none), pid_reused (a declaration dropped "
    "because its PID now belongs to another process).", ("reason",))

METRICS = _m.metrics
