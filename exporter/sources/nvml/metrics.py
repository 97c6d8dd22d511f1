"""Metrics of the `nvml` source: per GPU, from NVML (or the simulated GPUs)."""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("nvml")

GPU_INFO = _m(
    "goodput_gpu_info", Kind.INFO, "",
    "Identity of each GPU seen by NVML; value is always 1.",
    (*GPU, "model", "pci_bus_id", "driver_version"))
PEAK_FLOPS = _m(
    "goodput_gpu_peak_flops", Kind.GAUGE, "flops",
    "Peak dense tensor-core FLOPS of the GPU's model per data type, from NVIDIA's datasheets (absent for a model "
    "not in the table).",
    (*GPU, "dtype"))
GPU_UP = _m(
    "goodput_gpu_up", Kind.GAUGE, "",
    "1 while NVML answers for the GPU, 0 once it is lost (fallen off the bus, needs a reset) or answers "
    "no query at all.",
    GPU)
GPU_LOST = _m(
    "goodput_gpu_lost_total", Kind.COUNTER, "",
    "Times the GPU stopped answering NVML (goodput_gpu_up went to 0) since the exporter started, a GPU lost at "
    "start-up counted once. The risk rules' gpu_flapping reads its rise over the hour: it counts a loss between two "
    "scrapes, which goodput_gpu_up does not show.",
    GPU)
GPU_UTILIZATION = _m(
    "goodput_gpu_utilization_ratio", Kind.GAUGE, "ratio",
    "Share of NVML's last sample period in which any kernel ran (0-1). A snapshot: prefer "
    "rate(goodput_gpu_idle_seconds_total) for averages.",
    GPU)
GPU_IDLE_SECONDS = _m(
    "goodput_gpu_idle_seconds_total", Kind.COUNTER, "seconds",
    "Seconds in which no kernel ran, integrated from every buffered NVML utilization sample "
    "(nvmlDeviceGetSamples), so nothing between polls is missed.",
    GPU)
GPU_SAMPLED_SECONDS = _m(
    "goodput_gpu_sampled_seconds_total", Kind.COUNTER, "seconds",
    "Seconds covered by the integrated utilization samples; the denominator for the idle fraction "
    "(rate(idle) / rate(sampled)).",
    GPU)
GPU_MEMORY_USED = _m(
    "goodput_gpu_memory_used_bytes", Kind.GAUGE, "bytes", "Frame-buffer memory in use.", GPU)
GPU_MEMORY_TOTAL = _m(
    "goodput_gpu_memory_total_bytes", Kind.GAUGE, "bytes", "Frame-buffer memory installed.", GPU)
GPU_MEMORY_RESERVED = _m(
    "goodput_gpu_memory_reserved_bytes", Kind.GAUGE, "bytes",
    "Frame-buffer memory the driver and firmware set aside, which no process can allocate (part of "
    "goodput_gpu_memory_used_bytes); absent where the driver lacks nvmlDeviceGetMemoryInfo_v2.", GPU)
GPU_POWER = _m(
    "goodput_gpu_power_watts", Kind.GAUGE, "watts", "Power draw of the board.", GPU)
GPU_POWER_LIMIT = _m(
    "goodput_gpu_power_limit_watts", Kind.GAUGE, "watts",
    "Power limit the driver enforces on the board: the lowest of the software (nvidia-smi -pl), hardware "
    "and board limits. Power at this limit while clocks drop is power throttling.", GPU)
GPU_ENERGY = _m(
    "goodput_gpu_energy_joules_total", Kind.COUNTER, "joules",
    "Energy used since the driver was loaded (NVML total energy counter).", GPU)
GPU_TEMPERATURE = _m(
    "goodput_gpu_temperature_celsius", Kind.GAUGE, "celsius", "GPU core temperature.", GPU)
GPU_MEMORY_TEMPERATURE = _m(
    "goodput_gpu_memory_temperature_celsius", Kind.GAUGE, "celsius",
    "GPU memory (HBM) temperature; absent where the GPU does not report it.", GPU)
GPU_SM_CLOCK = _m(
    "goodput_gpu_sm_clock_hertz", Kind.GAUGE, "hertz", "Current SM clock.", GPU)
GPU_MEMORY_CLOCK = _m(
    "goodput_gpu_memory_clock_hertz", Kind.GAUGE, "hertz", "Current memory clock.", GPU)
GPU_ENCODER_UTILIZATION = _m(
    "goodput_gpu_encoder_utilization_ratio", Kind.GAUGE, "ratio",
    "Share of NVML's last sample period in which the video encoder (NVENC) ran (0-1).", GPU)
GPU_DECODER_UTILIZATION = _m(
    "goodput_gpu_decoder_utilization_ratio", Kind.GAUGE, "ratio",
    "Share of NVML's last sample period in which the video decoder (NVDEC) ran (0-1).", GPU)
GPU_THROTTLE_SECONDS = _m(
    "goodput_gpu_clock_throttle_seconds_total", Kind.COUNTER, "seconds",
    "Seconds the clocks were held below their target, by reason (NVML violation counters): power, "
    "thermal, sync_boost, board_limit, low_utilization, reliability.",
    (*GPU, "reason"))
GPU_ECC_ERRORS = _m(
    "goodput_gpu_ecc_errors_total", Kind.COUNTER, "",
    "ECC memory errors since the driver was loaded (volatile counters), error_type corrected or "
    "uncorrected.",
    (*GPU, "error_type"))
GPU_REMAPPED_ROWS = _m(
    "goodput_gpu_remapped_rows_total", Kind.COUNTER, "",
    "Memory rows remapped to spare rows over the GPU's life, by the ECC errors that caused it (error_type "
    "corrected or uncorrected); Ampere and later.",
    (*GPU, "error_type"))
GPU_ROW_REMAP_PENDING = _m(
    "goodput_gpu_row_remap_pending", Kind.GAUGE, "",
    "1 while a row remap waits for a GPU reset to take effect (the GPU needs a reset), else 0; Ampere and later.",
    GPU)
GPU_ROW_REMAP_FAILURE = _m(
    "goodput_gpu_row_remap_failure", Kind.GAUGE, "",
    "1 once a row could not be remapped (no spare row left: the GPU needs replacing), else 0; Ampere and later.",
    GPU)
GPU_RETIRED_PAGES = _m(
    "goodput_gpu_retired_pages_total", Kind.COUNTER, "",
    "Memory pages retired over the GPU's life, by cause: single_bit (repeated corrected errors) or double_bit "
    "(an uncorrected error); before Ampere, which remaps rows instead.",
    (*GPU, "cause"))
GPU_RECOVERY_ACTION = _m(
    "goodput_gpu_recovery_action", Kind.GAUGE, "",
    "What the driver says the GPU needs (NVML's GPU recovery action, R570 drivers and later): 0 nothing, 1 a GPU "
    "reset, 2 a node reboot, 3 a drain of peer-to-peer work, 4 a drain and a reset; later drivers add codes. Absent "
    "where the driver does not report it.", GPU)
GPU_RETIRED_PAGES_PENDING = _m(
    "goodput_gpu_retired_pages_pending", Kind.GAUGE, "",
    "1 while a page waits for a GPU reset (or reboot) to be retired, else 0; before Ampere.", GPU)
GPU_XID_ERRORS = _m(
    "goodput_gpu_xid_errors_total", Kind.COUNTER, "",
    "Critical XID error events received from NVML since the exporter started, by XID code.",
    (*GPU, "xid"))
GPU_LAST_XID = _m(
    "goodput_gpu_last_xid_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time of the last XID event on the GPU; absent until one is seen.", GPU)
GPU_PCIE_TX = _m(
    "goodput_gpu_pcie_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the GPU sent over PCIe (NVML field counters; absent where the GPU has none).", GPU)
GPU_PCIE_RX = _m(
    "goodput_gpu_pcie_receive_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the GPU received over PCIe (NVML field counters; absent where the GPU has none).", GPU)
GPU_PCIE_REPLAYS = _m(
    "goodput_gpu_pcie_replays_total", Kind.COUNTER, "",
    "PCIe packets the GPU resent after link errors (NVML replay counter). A steady rise means a marginal "
    "link: riser, slot or cable.", GPU)
GPU_PCIE_LINK_GENERATION = _m(
    "goodput_gpu_pcie_link_generation", Kind.GAUGE, "",
    "PCIe generation the GPU's link runs at now. Many boards drop it while idle to save power; below "
    "goodput_gpu_pcie_link_max_generation while busy, the link trained slower than it can run.", GPU)
GPU_PCIE_LINK_MAX_GENERATION = _m(
    "goodput_gpu_pcie_link_max_generation", Kind.GAUGE, "",
    "Highest PCIe generation the GPU and its slot can both run.", GPU)
GPU_PCIE_LINK_WIDTH = _m(
    "goodput_gpu_pcie_link_width", Kind.GAUGE, "",
    "PCIe lanes the GPU's link runs on now; below goodput_gpu_pcie_link_max_width, host-device bandwidth is "
    "cut in proportion.", GPU)
GPU_PCIE_LINK_MAX_WIDTH = _m(
    "goodput_gpu_pcie_link_max_width", Kind.GAUGE, "",
    "Most PCIe lanes the GPU and its slot can both run.", GPU)
GPU_NVLINK_TX = _m(
    "goodput_gpu_nvlink_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes the GPU sent over NVLink, summed over the GPU's active NVLink links (per link: "
    "goodput_gpu_nvlink_link_transmit_bytes_total, behind nvml.nvlink_per_link).", GPU)
GPU_NVLINK_RX = _m(
    "goodput_gpu_nvlink_receive_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes the GPU received over NVLink, summed over the GPU's active NVLink links (per link: "
    "goodput_gpu_nvlink_link_receive_bytes_total, behind nvml.nvlink_per_link).", GPU)
GPU_NVLINK_ERRORS = _m(
    "goodput_gpu_nvlink_errors_total", Kind.COUNTER, "",
    "NVLink data-link errors summed over the GPU's active NVLink links (NVML's counters, since the driver was "
    "loaded; a link whose counter the driver reset keeps its earlier count, a link first read late counts from "
    "then), by error_type: crc_flit and crc_data (corrupted flits and data, each resent), replay (resends), "
    "recovery (the link retrained). Per-link counts: goodput_gpu_nvlink_link_errors_total, behind "
    "nvml.nvlink_per_link.",
    (*GPU, "error_type"))
GPU_NVLINK_LINK_TX = _m(
    "goodput_gpu_nvlink_link_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes sent on each active NVLink link; only with nvml.nvlink_per_link.", (*GPU, "link"))
GPU_NVLINK_LINK_RX = _m(
    "goodput_gpu_nvlink_link_receive_bytes_total", Kind.COUNTER, "bytes",
    "Data bytes received on each active NVLink link; only with nvml.nvlink_per_link.", (*GPU, "link"))
GPU_NVLINK_LINK_ERRORS = _m(
    "goodput_gpu_nvlink_link_errors_total", Kind.COUNTER, "",
    "Data-link errors on each active NVLink link since the driver was loaded, by error_type (as "
    "goodput_gpu_nvlink_errors_total); only with nvml.nvlink_per_link.",
    (*GPU, "link", "error_type"))
GPU_ALLOCATED = _m(
    "goodput_gpu_allocated", Kind.GAUGE, "",
    "1 when at least one compute process holds the GPU, else 0.", GPU)
GPU_PROCESS_MEMORY = _m(
    "goodput_gpu_process_memory_used_bytes", Kind.GAUGE, "bytes",
    "GPU memory held by each compute process (host PID); also the GPU-to-process mapping.",
    (*GPU, "pid"))
MIG_INFO = _m(
    "goodput_gpu_mig_info", Kind.INFO, "",
    "A MIG instance of the GPU, when MIG mode is on; value is always 1.",
    (*GPU, "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"))
MIG_MEMORY_USED = _m(
    "goodput_gpu_mig_memory_used_bytes", Kind.GAUGE, "bytes", "Memory in use in the MIG instance.",
    (*GPU, "mig_uuid"))
MIG_MEMORY_TOTAL = _m(
    "goodput_gpu_mig_memory_total_bytes", Kind.GAUGE, "bytes", "Memory of the MIG instance.",
    (*GPU, "mig_uuid"))

METRICS = _m.metrics
