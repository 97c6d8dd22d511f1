"""The GPU backend interface: the NVML calls the exporter uses, as plain Python.

Two peers implement it: `nvml_lib.NvmlLibrary` (nvidia-ml-py against the driver) and
`simulated.SimulatedGpus`. Both raise `GpuError` with NVML's own return codes, so the NVML source
handles a real driver and the simulator with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# NVML return codes (nvml.h); the simulator raises the same ones.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13  # the driver is older than the call
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25  # the driver has the call but not this version of its structure
UNKNOWN = 999

ERROR_NAMES = {
    NOT_SUPPORTED: "not_supported",
    NO_PERMISSION: "no_permission",
    NOT_FOUND: "not_found",
    DRIVER_NOT_LOADED: "driver_not_loaded",
    TIMEOUT: "timeout",
    LIBRARY_NOT_FOUND: "library_not_found",
    FUNCTION_NOT_FOUND: "function_not_found",
    GPU_IS_LOST: "gpu_is_lost",
    ARGUMENT_VERSION_MISMATCH: "argument_version_mismatch",
    UNKNOWN: "unknown",
}

# NVML perf policies (violation counters) -> our `reason` label.
THROTTLE_REASONS = {
    0: "power",
    1: "thermal",
    2: "sync_boost",
    3: "board_limit",
    4: "low_utilization",
    5: "reliability",
}

# Retired-page causes (nvmlPageRetirementCause_t) -> our `cause` label.
RETIREMENT_CAUSES = {
    0: "single_bit",  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    1: "double_bit",  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
}

# NVLink data-link error counters (nvmlNvLinkErrorCounter_t) -> our `error_type` label.
NVLINK_ERRORS = {
    0: "replay",  # NVML_NVLINK_ERROR_DL_REPLAY
    1: "recovery",  # NVML_NVLINK_ERROR_DL_RECOVERY
    2: "crc_flit",  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    3: "crc_data",  # NVML_NVLINK_ERROR_DL_CRC_DATA
}

# NVML field ids used through nvmlDeviceGetFieldValues (nvml.h NVML_FI_DEV_*), which reads many in one call.
FI_ECC_SBE_VOL_TOTAL = 3  # single-bit (corrected) ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors)
FI_ECC_DBE_VOL_TOTAL = 4  # double-bit (uncorrected) ones
FI_RETIRED_SBE = 29  # pages retired for multiple single-bit errors, as nvmlDeviceGetRetiredPages
FI_RETIRED_DBE = 30  # pages retired for a double-bit error
FI_RETIRED_PENDING = 31  # 1 when a page waits for a reset to be retired
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83  # mJ since the driver was loaded, as nvmlDeviceGetTotalEnergyConsumption
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY_COUNTER = 94  # as nvmlDeviceGetPcieReplayCounter
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
FI_REMAPPED_COR = 142  # rows remapped after correctable errors, as nvmlDeviceGetRemappedRows
FI_REMAPPED_UNC = 143  # after uncorrectable ones
FI_REMAPPED_PENDING = 144  # 1 when a remap waits for a reset
FI_REMAPPED_FAILURE = 145  # 1 when a row could not be remapped
# what the driver says the GPU needs now (nvml.h NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R570 and later; the state the
# driver's XID 154 reports a change of): nvmlDeviceGpuRecoveryAction_t, 0 none, 1 GPU reset, 2 node reboot, 3 drain
# peer-to-peer, 4 drain and reset; later drivers add more. Older drivers do not know the field: unsupported
FI_GPU_RECOVERY_ACTION = 230
# the violation counters (NVML_FI_DEV_PERF_POLICY_*), by perf policy: nanoseconds, as nvmlDeviceGetViolationStatus
# answers (side by side on an H200, driver 580.159.04: the same counts, the field ~0.13 s behind), for 0.004 ms of
# CPU each inside the one field call where the call costs 0.7-1 ms
FI_PERF_POLICY = {0: 74, 1: 75, 2: 76, 3: 77, 4: 78, 5: 79}
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198

# The NVML function behind each GpuBackend method: the `call` label of goodput_exporter_library_calls_total (the
# simulated backend's calls count under the same names). pynvml makes some of them twice (a first call for the size
# of the answer): bench/nvml_real.py counts those C calls apart.
NVML_FUNCTIONS = {
    "init": "nvmlInit",
    "shutdown": "nvmlShutdown",
    "driver_version": "nvmlSystemGetDriverVersion",
    "device_count": "nvmlDeviceGetCount",
    "device_handle": "nvmlDeviceGetHandleByIndex",
    "device_name": "nvmlDeviceGetName",
    "device_uuid": "nvmlDeviceGetUUID",
    "device_pci_bus_id": "nvmlDeviceGetPciInfo",
    "device_minor_number": "nvmlDeviceGetMinorNumber",
    "device_utilization_percent": "nvmlDeviceGetUtilizationRates",
    "device_utilization_samples": "nvmlDeviceGetSamples",
    "device_memory": "nvmlDeviceGetMemoryInfo",
    "device_power_milliwatts": "nvmlDeviceGetPowerUsage",
    "device_power_limit_milliwatts": "nvmlDeviceGetEnforcedPowerLimit",
    "device_temperature_celsius": "nvmlDeviceGetTemperature",
    "device_sm_clock_mhz": "nvmlDeviceGetClockInfo",
    "device_memory_clock_mhz": "nvmlDeviceGetClockInfo",
    "device_memory_reserved_bytes": "nvmlDeviceGetMemoryInfo_v2",
    "device_encoder_utilization_percent": "nvmlDeviceGetEncoderUtilization",
    "device_decoder_utilization_percent": "nvmlDeviceGetDecoderUtilization",
    "device_pcie_link_generation": "nvmlDeviceGetCurrPcieLinkGeneration",
    "device_pcie_link_max_generation": "nvmlDeviceGetMaxPcieLinkGeneration",
    "device_pcie_link_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "device_pcie_link_max_width": "nvmlDeviceGetMaxPcieLinkWidth",
    "device_field_values": "nvmlDeviceGetFieldValues",
    "device_nvlink_active": "nvmlDeviceGetNvLinkState",
    "device_nvlink_error_count": "nvmlDeviceGetNvLinkErrorCounter",
    "device_compute_processes": "nvmlDeviceGetComputeRunningProcesses",
    "device_cpu_affinity": "nvmlDeviceGetCpuAffinity",
    "device_mig_enabled": "nvmlDeviceGetMigMode",
    "device_mig_handles": "nvmlDeviceGetMigDeviceHandleByIndex",
    "mig_instance_ids": "nvmlDeviceGetGpuInstanceId",
    "xid_events_register": "nvmlDeviceRegisterEvents",
    "xid_events_poll": "nvmlEventSetWait",
}


class GpuError(Exception):
    """An NVML error: `code` is NVML's return code."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = code
        super().__init__(message or f"NVML error {ERROR_NAMES.get(code, code)}")

    @property
    def reason(self) -> str:
        return "nvml_" + ERROR_NAMES.get(self.code, str(self.code))


Handle = Any  # opaque: a ctypes pointer for NVML, an object for the simulator


@dataclass(frozen=True)
class Process:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int


class GpuBackend(Protocol):
    """What the NVML source needs from a GPU library. Methods raise `GpuError`."""

    name: str  # "nvml" or "simulated"

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> Handle: ...
    def device_name(self, handle: Handle) -> str: ...
    def device_uuid(self, handle: Handle) -> str: ...
    def device_pci_bus_id(self, handle: Handle) -> str: ...

    def device_minor_number(self, handle: Handle) -> int:
        """The N of the device node /dev/nvidiaN (not the NVML index: the two orders can differ)."""
        ...

    def device_utilization_percent(self, handle: Handle) -> int: ...

    def device_utilization_samples(self, handle: Handle, since_us: int) -> list[tuple[int, float]]:
        """Buffered GPU-utilization samples newer than `since_us`: (timestamp µs, percent)."""
        ...

    def device_memory(self, handle: Handle) -> tuple[int, int]:
        """(used, total) bytes."""
        ...

    def device_power_milliwatts(self, handle: Handle) -> int: ...
    def device_power_limit_milliwatts(self, handle: Handle) -> int:
        """The power limit the driver enforces (the lowest of the software, hardware and board limits)."""
        ...

    def device_temperature_celsius(self, handle: Handle) -> int: ...
    def device_sm_clock_mhz(self, handle: Handle) -> int: ...
    def device_memory_clock_mhz(self, handle: Handle) -> int: ...

    def device_memory_reserved_bytes(self, handle: Handle) -> int:
        """Frame-buffer memory the driver and firmware reserve (nvmlDeviceGetMemoryInfo_v2)."""
        ...

    def device_encoder_utilization_percent(self, handle: Handle) -> int: ...
    def device_decoder_utilization_percent(self, handle: Handle) -> int: ...

    def device_pcie_link_generation(self, handle: Handle) -> int:
        """The generation the link runs at now (many boards drop it while idle, to save power)."""
        ...

    def device_pcie_link_max_generation(self, handle: Handle) -> int:
        """The highest generation this GPU and the slot it sits in can both run."""
        ...

    def device_pcie_link_width(self, handle: Handle) -> int:
        """Lanes the link runs on now."""
        ...

    def device_pcie_link_max_width(self, handle: Handle) -> int:
        """The most lanes this GPU and the slot it sits in can both run."""
        ...

    def device_field_values(self, handle: Handle, fields: list[tuple[int, int]]) -> list[int | GpuError | None]:
        """Integer values of (field id, scope id) pairs, all in one call: None where the field is not supported (or
        the driver lacks it), the GpuError where reading it failed otherwise."""
        ...

    def device_nvlink_active(self, handle: Handle, link: int) -> bool: ...

    def device_nvlink_error_count(self, handle: Handle, link: int, counter: int) -> int:
        """A data-link error counter of the link (`counter`: a key of NVLINK_ERRORS)."""
        ...

    def device_compute_processes(self, handle: Handle) -> list[Process]: ...
    def device_cpu_affinity(self, handle: Handle) -> frozenset[int]: ...
    def device_mig_enabled(self, handle: Handle) -> bool: ...
    def device_mig_handles(self, handle: Handle) -> list[Handle]: ...
    def mig_instance_ids(self, handle: Handle) -> tuple[int, int]: ...

    def xid_events_register(self, handle: Handle) -> None:
        """Subscribe to critical XID events of the device."""
        ...

    def xid_events_poll(self) -> list[XidEvent]:
        """Drain pending XID events without blocking."""
        ...
