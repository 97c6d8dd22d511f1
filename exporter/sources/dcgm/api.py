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
FUNCTION_NOT_FOUND = -20  # DCGM_ST_FUNCTION_NOT_FOUND: the bindings lack the call
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
FI_PROF_PIPE_TENSOR_IMMA_ACTIVE = 1013
FI_PROF_PIPE_TENSOR_HMMA_ACTIVE = 1014
FI_PROF_PIPE_TENSOR_DFMA_ACTIVE = 1015
FI_PROF_PIPE_INT_ACTIVE = 1016

# Field id -> the name DCGM (and dcgm-exporter) gives it. The first twelve are DCGM's original profiling
# set, there on every data-center GPU since Volta; the tensor sub-pipes and the integer pipe came later
# and are not on every GPU (DFMA: Ampere and newer), so DCGM is asked for them separately.
FIELD_NAMES = {
    FI_PROF_GR_ENGINE_ACTIVE: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
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
    FI_PROF_PIPE_TENSOR_IMMA_ACTIVE: "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    FI_PROF_PIPE_TENSOR_HMMA_ACTIVE: "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    FI_PROF_PIPE_TENSOR_DFMA_ACTIVE: "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    FI_PROF_PIPE_INT_ACTIVE: "DCGM_FI_PROF_PIPE_INT_ACTIVE",
}
PROFILING_FIELDS = tuple(FIELD_NAMES)
BASE_FIELDS = PROFILING_FIELDS[:12]  # what DCGM is asked for when it refuses the whole set
RATE_FIELDS = frozenset({FI_PROF_PCIE_TX_BYTES, FI_PROF_PCIE_RX_BYTES, FI_PROF_NVLINK_TX_BYTES,
                         FI_PROF_NVLINK_RX_BYTES})  # bytes per second
RATIO_FIELDS = frozenset(PROFILING_FIELDS) - RATE_FIELDS  # 0-1

# DCGM's entity groups (dcgm_fields.h DCGM_FE_*): a whole GPU, or a MIG GPU instance.
FE_GPU = 1
FE_GPU_I = 4
# DCGM's blank values (dcgm_structs.h): "no value" markers, DCGM_FP64_IS_BLANK(v) being v >= 2**47 and
# DCGM_INT64_IS_BLANK(v) v >= 0x7ffffffffffffff0. The profiling fields are doubles (the ratios) or int64
# (the byte rates), so one test covers both: no ratio exceeds 1 and no link moves 140 TB/s.
FP64_BLANK = 140737488355328.0


def is_blank(value: float) -> bool:
    return value >= FP64_BLANK


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


Entity = tuple[int, int]  # (DCGM entity group: FE_GPU or FE_GPU_I, DCGM entity id)


@dataclass(frozen=True)
class DcgmGpu:
    gpu_id: int  # DCGM's GPU id (usually, not always, the NVML index)
    uuid: str


@dataclass(frozen=True)
class DcgmInstance:
    """A MIG GPU instance as DCGM knows it."""

    entity_id: int  # DCGM's entity id of the instance (entity group FE_GPU_I)
    gpu_id: int  # DCGM's id of its GPU
    instance_id: int  # NVML's GPU instance id: goodput_gpu_mig_info's gpu_instance_id


@dataclass
class Latest:
    """What `DcgmBackend.latest` returns."""

    values: dict[Entity, dict[int, float]] = field(default_factory=dict)  # entity -> field id -> value
    stale: int = 0  # samples left out for being older than STALE_AFTER_INTERVALS watch intervals


# The DCGM function behind each DcgmBackend method (its main one: connecting also initialises, listing GPUs also
# reads the default group): the `call` label of goodput_exporter_library_calls_total
DCGM_FUNCTIONS = {
    "connect": "dcgmConnect_v2",
    "gpus": "dcgmGetDeviceAttributes",
    "gpu_instances": "dcgmGetGpuInstanceHierarchy",
    "watch": "dcgmWatchFields",
    "latest": "dcgmGetLatestValues_v2",
    "disconnect": "dcgmDisconnect",
}


class DcgmBackend(Protocol):
    """Methods raise `DcgmError`."""

    name: str  # "dcgm" or "simulated"

    def connect(self) -> None:
        """Load DCGM and connect to its host engine (or start the embedded one)."""
        ...

    def gpus(self) -> list[DcgmGpu]: ...

    def gpu_instances(self) -> list[DcgmInstance]:
        """The MIG GPU instances of every GPU in MIG mode; empty where none is."""
        ...

    def watch(self, field_ids: Sequence[int], interval: float, entities: Sequence[Entity]) -> None:
        """Have DCGM sample these fields of these entities every `interval` seconds in the background."""
        ...

    def latest(self) -> Latest:
        """The latest sampled value of each watched field: {entity: {field id: value}}; a field with no
        value yet (or none for this entity), or only a stale one (counted), is absent."""
        ...

    def disconnect(self) -> None: ...
