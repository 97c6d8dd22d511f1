"""The DCGM backend interface: what the dcgm source needs from DCGM, as plain Python.

Two peers implement it: `bindings.DcgmBindings` (DCGM's own Python bindings, loaded from the
directory DCGM installs them in, against nv-hostengine or an embedded engine) and
`simulated.SimulatedDcgm` (over the simulated GPUs). Both raise `DcgmError` with DCGM's own status
codes (dcgm_structs.h), so the source handles real DCGM and the simulator with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# DCGM status codes (dcgm_structs.h); the simulator raises the same ones.
GENERIC_ERROR = -3
NOT_SUPPORTED = -6
INIT_ERROR = -7
TIMEOUT = -11
NO_DATA = -14
NO_PERMISSION = -17
GPU_IS_LOST = -18
CONNECTION_NOT_VALID = -21
LIBRARY_NOT_FOUND = -25
REQUIRES_ROOT = -29
MODULE_NOT_LOADED = -33
IN_USE = -34
PROFILING_NOT_SUPPORTED = -36
PROFILING_LIBRARY_ERROR = -37
PROFILING_MULTI_PASS = -38
INSUFFICIENT_DRIVER_VERSION = -44
NVML_NOT_LOADED = -56

ERROR_NAMES = {
    GENERIC_ERROR: "generic_error",
    NOT_SUPPORTED: "not_supported",
    INIT_ERROR: "init_error",
    TIMEOUT: "timeout",
    NO_DATA: "no_data",
    NO_PERMISSION: "no_permission",
    GPU_IS_LOST: "gpu_is_lost",
    CONNECTION_NOT_VALID: "connection_not_valid",
    LIBRARY_NOT_FOUND: "library_not_found",
    REQUIRES_ROOT: "requires_root",
    MODULE_NOT_LOADED: "module_not_loaded",
    IN_USE: "in_use",
    PROFILING_NOT_SUPPORTED: "profiling_not_supported",
    PROFILING_LIBRARY_ERROR: "profiling_library_error",
    PROFILING_MULTI_PASS: "profiling_multi_pass",
    INSUFFICIENT_DRIVER_VERSION: "insufficient_driver_version",
    NVML_NOT_LOADED: "nvml_not_loaded",
}

# Codes that mean the profiling fields cannot be watched on this node as it is: retrying every
# interval only repeats the error, so the source waits before asking again.
PROFILING_UNAVAILABLE = frozenset({
    NOT_SUPPORTED, PROFILING_NOT_SUPPORTED, PROFILING_LIBRARY_ERROR, PROFILING_MULTI_PASS, REQUIRES_ROOT,
    MODULE_NOT_LOADED, INSUFFICIENT_DRIVER_VERSION,
})

# DCGM field ids (dcgm_fields.h) of the profiling fields we watch.
FI_PROF_GR_ENGINE_ACTIVE = 1001
FI_PROF_SM_ACTIVE = 1002
FI_PROF_SM_OCCUPANCY = 1003
FI_PROF_PIPE_TENSOR_ACTIVE = 1004
FI_PROF_DRAM_ACTIVE = 1005
FI_PROF_PIPE_FP64_ACTIVE = 1006
FI_PROF_PIPE_FP32_ACTIVE = 1007
FI_PROF_PIPE_FP16_ACTIVE = 1008
FI_PROF_PCIE_TX_BYTES = 1009
FI_PROF_PCIE_RX_BYTES = 1010
FI_PROF_NVLINK_TX_BYTES = 1011
FI_PROF_NVLINK_RX_BYTES = 1012

# Field id -> the name DCGM (and dcgm-exporter) gives it.
FIELD_NAMES = {
    FI_PROF_SM_ACTIVE: "DCGM_FI_PROF_SM_ACTIVE",
    FI_PROF_SM_OCCUPANCY: "DCGM_FI_PROF_SM_OCCUPANCY",
    FI_PROF_PIPE_TENSOR_ACTIVE: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    FI_PROF_DRAM_ACTIVE: "DCGM_FI_PROF_DRAM_ACTIVE",
    FI_PROF_PIPE_FP64_ACTIVE: "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    FI_PROF_PIPE_FP32_ACTIVE: "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    FI_PROF_PIPE_FP16_ACTIVE: "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    FI_PROF_PCIE_TX_BYTES: "DCGM_FI_PROF_PCIE_TX_BYTES",
    FI_PROF_PCIE_RX_BYTES: "DCGM_FI_PROF_PCIE_RX_BYTES",
    FI_PROF_NVLINK_TX_BYTES: "DCGM_FI_PROF_NVLINK_TX_BYTES",
    FI_PROF_NVLINK_RX_BYTES: "DCGM_FI_PROF_NVLINK_RX_BYTES",
}
PROFILING_FIELDS = tuple(FIELD_NAMES)
RATIO_FIELDS = frozenset(PROFILING_FIELDS[:7])  # 0-1 ratios; the other four are bytes per second


# A sample older than this many watch intervals means DCGM's sampler stopped updating the field: it
# is dropped (and counted), not exported as if it were current.
STALE_AFTER_INTERVALS = 3.0


class DcgmError(Exception):
    """A DCGM error: `code` is DCGM's status code. `reason` becomes the source's error label."""

    def __init__(self, code: int, message: str = "", reason: str | None = None) -> None:
        self.code = code
        self._reason = reason
        super().__init__(message or f"DCGM error {ERROR_NAMES.get(code, code)}")

    @property
    def reason(self) -> str:
        return self._reason or "dcgm_" + ERROR_NAMES.get(self.code, "error")


@dataclass(frozen=True)
class DcgmGpu:
    gpu_id: int  # DCGM's GPU id (usually, not always, the NVML index)
    uuid: str


@dataclass
class Latest:
    """What `DcgmBackend.latest` returns."""

    values: dict[int, dict[int, float]] = field(default_factory=dict)  # DCGM GPU id -> field id -> value
    stale: int = 0  # samples left out for being older than STALE_AFTER_INTERVALS watch intervals


class DcgmBackend(Protocol):
    """Methods raise `DcgmError`."""

    name: str  # "dcgm" or "simulated"

    def connect(self) -> None:
        """Load DCGM and connect to its host engine (or start the embedded one)."""
        ...

    def gpus(self) -> list[DcgmGpu]: ...

    def watch(self, field_ids: Sequence[int], interval: float) -> None:
        """Have DCGM sample these fields of every GPU every `interval` seconds in the background."""
        ...

    def latest(self) -> Latest:
        """The latest sampled value of each watched field: {DCGM GPU id: {field id: value}}; a field
        with no value yet (or none for this GPU), or only a stale one (counted), is absent."""
        ...

    def disconnect(self) -> None: ...
