"""The NVML queries that map one answer to series by a fixed rule, as a table: which backend call, under which
key it is remembered as unsupported, which metrics the answer fills, the extra label values, and the unit
conversion. `source.NvmlSource` reads them all the same way; the queries with logic of their own (utilization
samples, field values, NVLink links, processes, MIG, XID events) stay in the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.catalog import Metric
from . import metrics as m
from .api import RETIREMENT_CAUSES, THROTTLE_REASONS


@dataclass(frozen=True)
class Reading:
    key: str  # remembered under this name when the GPU does not support it, and never asked again
    call: str  # the GpuBackend method
    metrics: tuple[Metric, ...]  # one per value of the answer (device_memory answers used and total)
    args: tuple[object, ...] = ()  # after the handle
    labels: tuple[str, ...] = ()  # label values after gpu and uuid
    # per metric, label values after `labels` (device_remapped_rows: corrected, uncorrected, then none, none);
    # empty: none for any
    metric_labels: tuple[tuple[str, ...], ...] = ()
    multiply: float = 1.0  # to the metric's base unit: value * multiply / divide
    divide: float = 1.0
    # derived, for the source's loop: no conversion (the answer is the value: integers stay integers, 61 not
    # 61.0); the answer is a tuple, one value per metric (device_memory: used, total)
    exact: bool = field(init=False, repr=False, compare=False)
    pair: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.metric_labels and len(self.metric_labels) != len(self.metrics):
            raise ValueError(f"{self.key}: one metric_labels entry per metric")
        object.__setattr__(self, "exact", self.multiply == 1.0 and self.divide == 1.0)
        object.__setattr__(self, "pair", len(self.metrics) > 1)

    def label_values(self, gpu: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """Each metric's label values for the GPU's (gpu, uuid)."""
        extra = self.metric_labels or ((),) * len(self.metrics)
        return tuple((*gpu, *self.labels, *own) for own in extra)

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
    Reading("memory_reserved", "device_memory_reserved_bytes", (m.GPU_MEMORY_RESERVED,)),
    Reading("sm_clock", "device_sm_clock_mhz", (m.GPU_SM_CLOCK,), multiply=1e6),
    Reading("memory_clock", "device_memory_clock_mhz", (m.GPU_MEMORY_CLOCK,), multiply=1e6),
    Reading("encoder", "device_encoder_utilization_percent", (m.GPU_ENCODER_UTILIZATION,), divide=100.0),
    Reading("decoder", "device_decoder_utilization_percent", (m.GPU_DECODER_UTILIZATION,), divide=100.0),
    *(Reading(f"violation_{reason}", "device_violation_nanoseconds", (m.GPU_THROTTLE_SECONDS,), args=(policy,),
              labels=(reason,), divide=1e9) for policy, reason in THROTTLE_REASONS.items()),
    *(Reading(f"ecc_{error_type}", "device_ecc_errors", (m.GPU_ECC_ERRORS,), args=(uncorrected,),
              labels=(error_type,)) for error_type, uncorrected in (("corrected", False), ("uncorrected", True))),
    Reading("remapped_rows", "device_remapped_rows",
            (m.GPU_REMAPPED_ROWS, m.GPU_REMAPPED_ROWS, m.GPU_ROW_REMAP_PENDING, m.GPU_ROW_REMAP_FAILURE),
            metric_labels=(("corrected",), ("uncorrected",), (), ())),
    *(Reading(f"retired_pages_{cause}", "device_retired_pages", (m.GPU_RETIRED_PAGES,), args=(code,),
              labels=(cause,)) for code, cause in RETIREMENT_CAUSES.items()),
    Reading("retired_pages_pending", "device_retired_pages_pending", (m.GPU_RETIRED_PAGES_PENDING,)),
    Reading("pcie_replays", "device_pcie_replay_count", (m.GPU_PCIE_REPLAYS,)),
    Reading("pcie_generation", "device_pcie_link_generation", (m.GPU_PCIE_LINK_GENERATION,)),
    Reading("pcie_max_generation", "device_pcie_link_max_generation", (m.GPU_PCIE_LINK_MAX_GENERATION,)),
    Reading("pcie_width", "device_pcie_link_width", (m.GPU_PCIE_LINK_WIDTH,)),
    Reading("pcie_max_width", "device_pcie_link_max_width", (m.GPU_PCIE_LINK_MAX_WIDTH,)),
)
