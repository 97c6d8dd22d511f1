"""The NVML queries that map one answer to series by a fixed rule, as a table: which backend call, under which
key it is remembered as unsupported, which metrics the answer fills, the extra label values, and the unit
conversion. `source.NvmlSource` reads them all the same way; the queries with logic of their own (utilization
samples, field values, processes, MIG, XID events) stay in the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.catalog import Metric
from . import metrics as m
from .api import THROTTLE_REASONS


@dataclass(frozen=True)
class Reading:
    key: str  # remembered under this name when the GPU does not support it, and never asked again
    call: str  # the GpuBackend method
    metrics: tuple[Metric, ...]  # one per value of the answer (device_memory answers used and total)
    args: tuple[object, ...] = ()  # after the handle
    labels: tuple[str, ...] = ()  # label values after gpu and uuid
    multiply: float = 1.0  # to the metric's base unit: value * multiply / divide
    divide: float = 1.0
    # derived, for the source's loop: no conversion (the answer is the value: integers stay integers, 61 not
    # 61.0); the answer is a tuple, one value per metric (device_memory: used, total)
    exact: bool = field(init=False, repr=False, compare=False)
    pair: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exact", self.multiply == 1.0 and self.divide == 1.0)
        object.__setattr__(self, "pair", len(self.metrics) > 1)

    def convert(self, value: float) -> float:
        if self.exact:
            return value
        return value * self.multiply / self.divide


READINGS: tuple[Reading, ...] = (
    Reading("utilization", "device_utilization_percent", (m.GPU_UTILIZATION,), divide=100.0),
    Reading("memory", "device_memory", (m.GPU_MEMORY_USED, m.GPU_MEMORY_TOTAL)),
    Reading("power", "device_power_milliwatts", (m.GPU_POWER,), divide=1000.0),
    Reading("power_limit", "device_power_limit_milliwatts", (m.GPU_POWER_LIMIT,), divide=1000.0),
    Reading("energy", "device_energy_millijoules", (m.GPU_ENERGY,), divide=1000.0),
    Reading("temperature", "device_temperature_celsius", (m.GPU_TEMPERATURE,)),
    Reading("sm_clock", "device_sm_clock_mhz", (m.GPU_SM_CLOCK,), multiply=1e6),
    *(Reading(f"violation_{reason}", "device_violation_nanoseconds", (m.GPU_THROTTLE_SECONDS,), args=(policy,),
              labels=(reason,), divide=1e9) for policy, reason in THROTTLE_REASONS.items()),
    *(Reading(f"ecc_{error_type}", "device_ecc_errors", (m.GPU_ECC_ERRORS,), args=(uncorrected,),
              labels=(error_type,)) for error_type, uncorrected in (("corrected", False), ("uncorrected", True))),
)
