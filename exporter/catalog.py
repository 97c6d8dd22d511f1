"""The one declaration of every metric the exporter writes.

Sources, the renderer, the generated reference (`docs/metrics.md`) and the tests all read this
module. A metric that is not declared here cannot be emitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, eq=False)  # identity hash: one object per metric, hashed per series
class Metric:
    name: str
    kind: Kind
    unit: str  # unit as in the name suffix ("seconds", "bytes", "bytes_per_second", ...) or "" for none
    help: str
    labels: tuple[str, ...]
    source: str
    buckets: tuple[float, ...] = ()  # histogram upper bounds, +Inf implied

    @property
    def family(self) -> str:
        """OpenMetrics family name: counters drop `_total`, infos drop `_info`."""
        if self.kind is Kind.COUNTER:
            return self.name.removesuffix("_total")
        if self.kind is Kind.INFO:
            return self.name.removesuffix("_info")
        return self.name


CATALOG: dict[str, Metric] = {}

GPU = ("gpu", "uuid")


def _m(name: str, kind: Kind, unit: str, help: str, labels: tuple[str, ...], source: str,
       buckets: tuple[float, ...] = ()) -> Metric:
    if name in CATALOG:
        raise ValueError(f"metric {name} declared twice")
    metric = Metric(name, kind, unit, help, labels, source, buckets)
    CATALOG[name] = metric
    return metric


# --- nvml: per GPU --------------------------------------------------------------------------------
GPU_INFO = _m(
    "goodput_gpu_info", Kind.INFO, "",
    "Identity of each GPU seen by NVML; value is always 1.",
    (*GPU, "model", "pci_bus_id", "driver_version"), "nvml")
GPU_UP = _m(
    "goodput_gpu_up", Kind.GAUGE, "",
    "1 while NVML answers for the GPU, 0 once it is lost (fallen off the bus, needs a reset) or answers "
    "no query at all.",
    GPU, "nvml")
GPU_UTILIZATION = _m(
    "goodput_gpu_utilization_ratio", Kind.GAUGE, "ratio",
    "Share of NVML's last sample period in which any kernel ran (0-1). A snapshot: prefer "
    "rate(goodput_gpu_idle_seconds_total) for averages.",
    GPU, "nvml")
GPU_IDLE_SECONDS = _m(
    "goodput_gpu_idle_seconds_total", Kind.COUNTER, "seconds",
    "Seconds in which no kernel ran, integrated from every buffered NVML utilization sample "
    "(nvmlDeviceGetSamples), so nothing between polls is missed.",
    GPU, "nvml")
GPU_SAMPLED_SECONDS = _m(
    "goodput_gpu_sampled_seconds_total", Kind.COUNTER, "seconds",
    "Seconds covered by the integrated utilization samples; the denominator for the idle fraction "
    "(rate(idle) / rate(sampled)).",
    GPU, "nvml")
GPU_MEMORY_USED = _m(
    "goodput_gpu_memory_used_bytes", Kind.GAUGE, "bytes", "Frame-buffer memory in use.", GPU, "nvml")
GPU_MEMORY_TOTAL = _m(
    "goodput_gpu_memory_total_bytes", Kind.GAUGE, "bytes", "Frame-buffer memory installed.", GPU, "nvml")
GPU_POWER = _m(
    "goodput_gpu_power_watts", Kind.GAUGE, "watts", "Power draw of the board.", GPU, "nvml")
GPU_POWER_LIMIT = _m(
    "goodput_gpu_power_limit_watts", Kind.GAUGE, "watts",
    "Power limit the driver enforces on the board: the lowest of the software (nvidia-smi -pl), hardware "
    "and board limits. Power at this limit while clocks drop is power throttling.", GPU, "nvml")
GPU_ENERGY = _m(
    "goodput_gpu_energy_joules_total", Kind.COUNTER, "joules",
    "Energy used since the driver was loaded (NVML total energy counter).", GPU, "nvml")
GPU_TEMPERATURE = _m(
    "goodput_gpu_temperature_celsius", Kind.GAUGE, "celsius", "GPU core temperature.", GPU, "nvml")
GPU_SM_CLOCK = _m(
    "goodput_gpu_sm_clock_hertz", Kind.GAUGE, "hertz", "Current SM clock.", GPU, "nvml")
GPU_THROTTLE_SECONDS = _m(
    "goodput_gpu_clock_throttle_seconds_total", Kind.COUNTER, "seconds",
    "Seconds the clocks were held below their target, by reason (NVML violation counters): power, "
    "thermal, sync_boost, board_limit, low_utilization, reliability.",
    (*GPU, "reason"), "nvml")
GPU_ECC_ERRORS = _m(
    "goodput_gpu_ecc_errors_total", Kind.COUNTER, "",
    "ECC memory errors since the driver was loaded (volatile counters), error_type corrected or "
    "uncorrected.",
    (*GPU, "error_type"), "nvml")
GPU_XID_ERRORS = _m(
    "goodput_gpu_xid_errors_total", Kind.COUNTER, "",
    "Critical XID error events received from NVML since the exporter started, by XID code.",
    (*GPU, "xid"), "nvml")
GPU_LAST_XID = _m(
    "goodput_gpu_last_xid_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time of the last XID event on the GPU; absent until one is seen.", GPU, "nvml")
GPU_PCIE_TX = _m(
    "goodput_gpu_pcie_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the GPU sent over PCIe (NVML field counters; absent where the GPU has none).", GPU, "nvml")
GPU_PCIE_RX = _m(
    "goodput_gpu_pcie_receive_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the GPU received over PCIe (NVML field counters; absent where the GPU has none).", GPU, "nvml")
GPU_NVLINK_TX = _m(
    "goodput_gpu_nvlink_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes sent on each active NVLink link.", (*GPU, "link"), "nvml")
GPU_NVLINK_RX = _m(
    "goodput_gpu_nvlink_receive_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes received on each active NVLink link.", (*GPU, "link"), "nvml")
GPU_ALLOCATED = _m(
    "goodput_gpu_allocated", Kind.GAUGE, "",
    "1 when at least one compute process holds the GPU, else 0.", GPU, "nvml")
GPU_PROCESS_MEMORY = _m(
    "goodput_gpu_process_memory_used_bytes", Kind.GAUGE, "bytes",
    "GPU memory held by each compute process (host PID); also the GPU-to-process mapping.",
    (*GPU, "pid"), "nvml")
MIG_INFO = _m(
    "goodput_gpu_mig_info", Kind.INFO, "",
    "A MIG instance of the GPU, when MIG mode is on; value is always 1.",
    (*GPU, "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"), "nvml")
MIG_MEMORY_USED = _m(
    "goodput_gpu_mig_memory_used_bytes", Kind.GAUGE, "bytes", "Memory in use in the MIG instance.",
    (*GPU, "mig_uuid"), "nvml")
MIG_MEMORY_TOTAL = _m(
    "goodput_gpu_mig_memory_total_bytes", Kind.GAUGE, "bytes", "Memory of the MIG instance.",
    (*GPU, "mig_uuid"), "nvml")

# --- dcgm: what the kernels do (DCGM profiling fields) ------------------------------------------
_DCGM = ("Read from DCGM's profiling field {field} (through DCGM's Python bindings, or from a "
         "dcgm-exporter on the node); averaged by DCGM over its sampling period: dcgm.interval with "
         "dcgm.mode=bindings, dcgm-exporter's own collection interval (its -c, 30 s by default) with "
         "dcgm.mode=exporter.")
GPU_SM_ACTIVE = _m(
    "goodput_gpu_sm_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles in which an SM had at least one warp resident, averaged over all SMs (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_SM_ACTIVE"), GPU, "dcgm")
GPU_SM_OCCUPANCY = _m(
    "goodput_gpu_sm_occupancy_ratio", Kind.GAUGE, "ratio",
    "Warps resident on the SMs as a share of the most they can hold, averaged over all SMs (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_SM_OCCUPANCY"), GPU, "dcgm")
GPU_TENSOR_ACTIVE = _m(
    "goodput_gpu_tensor_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the tensor (HMMA/IMMA) pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), GPU, "dcgm")
GPU_DRAM_ACTIVE = _m(
    "goodput_gpu_dram_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the device memory interface was sending or receiving data (0-1); near 1 means "
    "memory-bound. " + _DCGM.format(field="DCGM_FI_PROF_DRAM_ACTIVE"), GPU, "dcgm")
GPU_FP16_ACTIVE = _m(
    "goodput_gpu_fp16_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP16 pipes were active, tensor pipes not included (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP16_ACTIVE"), GPU, "dcgm")
GPU_FP32_ACTIVE = _m(
    "goodput_gpu_fp32_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP32 pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP32_ACTIVE"), GPU, "dcgm")
GPU_FP64_ACTIVE = _m(
    "goodput_gpu_fp64_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP64 pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP64_ACTIVE"), GPU, "dcgm")
_DCGM_RATE = ("A rate DCGM measures, averaged over its sampling period (dcgm.interval with "
              "dcgm.mode=bindings; dcgm-exporter's -c interval, 30 s by default, with dcgm.mode=exporter, "
              "even where dcgm-exporter types the field as a counter); a gauge, not a counter, "
              "because only the latest average is seen. Where NVML gives the byte counter "
              "{counter}, prefer rate() of it: it misses nothing between samples.")
GPU_DCGM_PCIE_TX = _m(
    "goodput_gpu_pcie_transmit_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU sent over PCIe, protocol headers included (DCGM_FI_PROF_PCIE_TX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_pcie_transmit_bytes_total"), GPU, "dcgm")
GPU_DCGM_PCIE_RX = _m(
    "goodput_gpu_pcie_receive_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU received over PCIe, protocol headers included "
    "(DCGM_FI_PROF_PCIE_RX_BYTES). " + _DCGM_RATE.format(counter="goodput_gpu_pcie_receive_bytes_total"),
    GPU, "dcgm")
GPU_DCGM_NVLINK_TX = _m(
    "goodput_gpu_nvlink_transmit_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU sent over all its NVLinks together (DCGM_FI_PROF_NVLINK_TX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_nvlink_transmit_bytes_total (per link)"), GPU, "dcgm")
GPU_DCGM_NVLINK_RX = _m(
    "goodput_gpu_nvlink_receive_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU received over all its NVLinks together (DCGM_FI_PROF_NVLINK_RX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_nvlink_receive_bytes_total (per link)"), GPU, "dcgm")

# --- host: what the host does to feed the GPUs ----------------------------------------------------
PROC = ("pid", "command")
HOST_PROC_CPU = _m(
    "goodput_host_process_cpu_seconds_total", Kind.COUNTER, "seconds",
    "CPU time of each GPU-holding process, mode user or system.", (*PROC, "mode"), "host")
HOST_PROC_RSS = _m(
    "goodput_host_process_resident_memory_bytes", Kind.GAUGE, "bytes",
    "Resident memory of each GPU-holding process.", PROC, "host")
HOST_PROC_THREADS = _m(
    "goodput_host_process_threads", Kind.GAUGE, "", "Threads of each GPU-holding process.", PROC, "host")
HOST_PROC_CTX = _m(
    "goodput_host_process_context_switches_total", Kind.COUNTER, "",
    "Context switches of each GPU-holding process, kind voluntary or involuntary (involuntary ones "
    "mean the process wanted CPU it did not get).", (*PROC, "kind"), "host")
HOST_PROC_READ = _m(
    "goodput_host_process_read_bytes_total", Kind.COUNTER, "bytes",
    "Bytes each GPU-holding process read from storage (absent without permission to read its I/O).",
    PROC, "host")
HOST_PROC_WRITTEN = _m(
    "goodput_host_process_written_bytes_total", Kind.COUNTER, "bytes",
    "Bytes each GPU-holding process wrote to storage (absent without permission to read its I/O).",
    PROC, "host")
HOST_NUMA_MISMATCH = _m(
    "goodput_gpu_numa_mismatch", Kind.GAUGE, "",
    "1 when a process holding the GPU may run on CPUs outside the GPU's local NUMA node (its CPU "
    "affinity is not within the GPU's ideal CPU set), else 0.",
    (*GPU, "pid"), "host")
HOST_UNREADABLE = _m(
    "goodput_host_unreadable_gpu_processes", Kind.GAUGE, "",
    "GPU-holding processes the host source could not read (not visible without hostPID, or no "
    "permission).", (), "host")
HOST_PRESSURE = _m(
    "goodput_host_pressure_stalled_seconds_total", Kind.COUNTER, "seconds",
    "Time tasks on the node were stalled for a resource (cpu, io, memory), kind some or full, from "
    "/proc/pressure (PSI); absent where the kernel has no PSI.",
    ("resource", "kind"), "host")

# --- ingest: what training jobs report ------------------------------------------------------------
WR = ("workload", "rank")
PHASES = ("compute", "data_wait", "comm_wait", "checkpoint", "startup", "other")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STEP_DURATION = _m(
    "goodput_step_duration_seconds", Kind.HISTOGRAM, "seconds",
    "Wall time of each training step reported by the job.", WR, "ingest", STEP_BUCKETS)
STEPS = _m("goodput_steps_total", Kind.COUNTER, "", "Training steps completed.", WR, "ingest")
TOKENS = _m("goodput_tokens_total", Kind.COUNTER, "", "Tokens processed by completed steps.", WR, "ingest")
SAMPLES = _m("goodput_samples_total", Kind.COUNTER, "", "Samples processed by completed steps.", WR, "ingest")
PHASE_SECONDS = _m(
    "goodput_phase_seconds_total", Kind.COUNTER, "seconds",
    "Seconds the job spent per phase: compute (useful work), data_wait, comm_wait, checkpoint, startup, "
    "other (badput).", (*WR, "phase"), "ingest")
RESTARTS = _m(
    "goodput_workload_restarts_total", Kind.COUNTER, "", "Restarts the job reported.", WR, "ingest")
LAST_EVENT = _m(
    "goodput_workload_last_event_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the daemon last accepted an event from the workload's rank.", WR, "ingest")
INGEST_ACCEPTED = _m(
    "goodput_ingest_events_accepted_total", Kind.COUNTER, "",
    "Events accepted from training jobs, by type (step, phase, lifecycle).", ("type",), "ingest")
INGEST_REJECTED = _m(
    "goodput_ingest_rejected_requests_total", Kind.COUNTER, "",
    "Event requests rejected whole, by reason: invalid (bad JSON, types, values, unknown phase), oversize "
    "(body or batch too large), unauthorized (missing or wrong token), workload_cap, rank_cap.",
    ("reason",), "ingest")

# --- flight: PyTorch flight-recorder dumps ------------------------------------------------------
FR = ("workload", "rank")
PG = (*FR, "pg")
COLLECTIVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
COLLECTIVE_GROUP_INFO = _m(
    "goodput_collective_group_info", Kind.INFO, "",
    "A process group the rank's flight recorder knows, with its description (default_pg, or the name "
    "given to new_group); value is always 1.", (*PG, "desc"), "flight")
COLLECTIVE_LAST_SEQ = _m(
    "goodput_collective_last_seq", Kind.GAUGE, "",
    "Sequence number of the last collective the rank enqueued, started or completed on the process "
    "group (state). enqueued and completed are 0 before the first; started is absent where the backend "
    "does not track starts (gloo) and before the first start. Compare across ranks to see who is "
    "behind.", (*PG, "state"), "flight")
COLLECTIVE_INFLIGHT = _m(
    "goodput_collective_inflight", Kind.GAUGE, "",
    "Collectives and point-to-point ops of the process group that the rank enqueued and that had not "
    "completed when it dumped.", PG, "flight")
COLLECTIVE_OLDEST_INFLIGHT = _m(
    "goodput_collective_oldest_inflight_seconds", Kind.GAUGE, "seconds",
    "How long the oldest in-flight op of the process group had been waiting when the rank dumped (0 "
    "when none). Add time() - goodput_flight_recorder_dump_timestamp_seconds for its age now.",
    PG, "flight")
COLLECTIVE_OPS = _m(
    "goodput_collective_operations_total", Kind.COUNTER, "",
    "Collective and point-to-point ops the rank enqueued, by op (all_reduce, broadcast, send, ...), "
    "counted once each as dumps reveal them.", (*PG, "op"), "flight")
COLLECTIVE_BYTES = _m(
    "goodput_collective_bytes_total", Kind.COUNTER, "bytes",
    "Bytes of the rank's ops as they are enqueued: the larger of each op's input and output buffers "
    "(tensor sizes times dtype width), by op; an op with a dtype of unknown width adds 0.",
    (*PG, "op"), "flight")
COLLECTIVE_DURATION = _m(
    "goodput_collective_duration_seconds", Kind.HISTOGRAM, "seconds",
    "Duration of each completed op as timed by the backend (NCCL with TORCH_NCCL_ENABLE_TIMING=1; "
    "gloo records none).", (*PG, "op"), "flight", COLLECTIVE_BUCKETS)
COLLECTIVE_MISSING_RANK = _m(
    "goodput_collective_missing_rank", Kind.GAUGE, "",
    "1 for each rank that has not enqueued the oldest unfinished collective (seq, op) of the process "
    "group while other ranks on this node wait in it; only ranks whose dumps are on this node are "
    "checked.", ("workload", "pg", "rank", "seq", "op"), "flight")
FR_DUMP_TIMESTAMP = _m(
    "goodput_flight_recorder_dump_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the rank's dump file was last written; its age is time() minus this.", FR, "flight")
FR_ENTRIES_LOST = _m(
    "goodput_flight_recorder_entries_lost_total", Kind.COUNTER, "",
    "Entries that left the rank's ring buffer between two dumps before the exporter saw them (dump "
    "more often, or raise TORCH_FR_BUFFER_SIZE).", FR, "flight")
FR_FILES = _m(
    "goodput_flight_recorder_files", Kind.GAUGE, "",
    "Dump files the flight source currently reads.", (), "flight")
FR_REJECTED = _m(
    "goodput_flight_recorder_rejected_total", Kind.COUNTER, "",
    "Dump files rejected, each version of a file counted once, by reason: empty, truncated, corrupt, "
    "unsafe (a pickle asking to run code), bad_schema, unknown_version, too_large (on disk, or for the "
    "parser's memory), not_regular, unreadable, bad_name, duplicate_rank (a second file for one rank), "
    "too_many_files.", ("reason",), "flight")

# --- kubelet: which pod each GPU is assigned to ------------------------------------------------
GPU_POD_INFO = _m(
    "goodput_gpu_pod_info", Kind.INFO, "",
    "The pod and container the kubelet assigned the GPU to (pod-resources API); one series per container and "
    "MIG instance. mig_uuid names the MIG instance (MIG-...) when the device is one, and is empty for a whole "
    "GPU (including a time-sliced or MPS share of one). Join on uuid, aggregating first where a GPU has "
    "several (max by (instance, uuid, namespace, pod)); value is always 1. With kubelet.pod_labels set, also one "
    "label_<name> label per listed pod label (from the Kubernetes API; empty when the pod has no such label or "
    "the API could not be asked), to join on instead of copying labels onto every GPU series.",
    (*GPU, "mig_uuid", "pod", "namespace", "container"), "kubelet")
KUBELET_SKIPPED = _m(
    "goodput_kubelet_skipped_devices", Kind.GAUGE, "",
    "GPU devices in the kubelet's last answer that were not attributed, by reason: unmatched (the device id, "
    "or the DRA device, names no GPU NVML sees on this node), invalid (its pod, namespace or container name, "
    "or its device id, cannot be valid). Counted per device, after kubelet.gpu_resources: devices of other "
    "resources are not counted.", ("reason",), "kubelet")
KUBELET_POD_LABELS_UP = _m(
    "goodput_kubelet_pod_labels_up", Kind.GAUGE, "",
    "1 while the label_* labels on goodput_gpu_pod_info come from a Kubernetes API answer at most 3 kubelet "
    "intervals old, 0 while they are left out because the API server could not be asked (why: "
    "goodput_exporter_source_errors_total{source=\"kubelet\",reason=~\"pod_labels_.*\"}); absent when "
    "kubelet.pod_labels is empty.", (), "kubelet")

# --- process: which workload and rank each GPU's processes belong to ------------------------------
GPU_WORKLOAD_INFO = _m(
    "goodput_gpu_workload_info", Kind.INFO, "",
    "The workload and rank of a process holding the GPU: as the process declared them to the ingest "
    "API, else from its launcher environment (TORCHELASTIC_RUN_ID, SLURM_JOB_ID or MASTER_ADDR:MASTER_PORT; "
    "RANK or SLURM_PROCID), else the Slurm job of its cgroup. rank is empty when unknown. Join on uuid; "
    "value is always 1.", (*GPU, "workload", "rank"), "process")
ATTRIBUTION_PROCESSES = _m(
    "goodput_attribution_processes", Kind.GAUGE, "",
    "GPU-holding processes by how their workload was learned (state): declared, environment, cgroup; or "
    "why it was not: unattributed (no launcher variable names one), denied (its environment is not "
    "readable: needs root or CAP_SYS_PTRACE), invisible (not in the exporter's PID namespace: needs "
    "hostPID, or gone).", ("state",), "process")
DECLARATIONS_IGNORED = _m(
    "goodput_attribution_declarations_ignored_total", Kind.COUNTER, "",
    "Identities declared over the events socket that were not used, by reason: mixed_identity (a batch "
    "named several workload/rank pairs, so its sender declares none), pid_reused (a declaration dropped "
    "because its PID now belongs to another process).", ("reason",), "process")

# --- the exporter itself --------------------------------------------------------------------------
SRC = ("source",)
SOURCE_UP = _m(
    "goodput_exporter_source_up", Kind.GAUGE, "",
    "1 when the source's last collection succeeded, else 0.", SRC, "exporter")
SOURCE_DURATION = _m(
    "goodput_exporter_source_collection_duration_seconds", Kind.GAUGE, "seconds",
    "Wall time of the source's last finished collection.", SRC, "exporter")
SOURCE_LAST_SUCCESS = _m(
    "goodput_exporter_source_last_success_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time of the source's last successful collection; absent before the first.", SRC, "exporter")
SOURCE_COLLECTIONS = _m(
    "goodput_exporter_source_collections_total", Kind.COUNTER, "",
    "Collections the source finished, successful or not.", SRC, "exporter")
SOURCE_ERRORS = _m(
    "goodput_exporter_source_errors_total", Kind.COUNTER, "",
    "Errors of the source by reason: timeout (a call hung past the source's timeout), exception, "
    "nvml_not_found, nvml_<error> for NVML errors, and source-specific reasons.",
    (*SRC, "reason"), "exporter")
BUILD_INFO = _m(
    "goodput_exporter_build_info", Kind.INFO, "",
    "Version of the exporter and the GPU backend it uses (nvml or simulated); value is always 1.",
    ("version", "python_version", "gpu_backend"), "exporter")

SOURCES_ORDER = ("nvml", "dcgm", "host", "ingest", "flight", "kubelet", "process", "exporter")


def metrics_for(source: str) -> list[Metric]:
    return [m for m in CATALOG.values() if m.source == source]
