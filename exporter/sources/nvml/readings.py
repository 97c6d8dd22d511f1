"""The NVML queries that map one answer to series by a fixed rule, as a table: which backend call (or which fields of
the GPU's one nvmlDeviceGetFieldValues call a collection makes), under which key it is remembered as unsupported,
which metrics the answer fills, the extra label values, the unit conversion, and how often it is read. `source.
NvmlSource` reads them all the same way; the queries with logic of their own (utilization samples, NVLink links,
processes, MIG, XID events) stay in the source.

How often: what changes by the second (power, memory, clocks, temperature, throttling, utilization, traffic) at every
collection (`nvml.interval`); what only a fault or a reset changes (ECC error counts, retired pages, row remaps, PCIe
replays, the link's maximum generation and width, the power limit, reserved memory) every `nvml.slow_interval`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.catalog import Metric
from . import metrics as m
from .api import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_GPU_RECOVERY_ACTION,
    FI_PCIE_REPLAY_COUNTER,
    FI_PERF_POLICY,
    FI_REMAPPED_COR,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
    FI_TOTAL_ENERGY,
    RETIREMENT_CAUSES,
    THROTTLE_REASONS,
)


@dataclass(frozen=True)
class Reading:
    key: str  # remembered under this name when the GPU does not support it, and never asked again
    call: str  # the GpuBackend method; "" for a reading answered by `fields`
    metrics: tuple[Metric, ...]  # one per value of the answer (device_memory answers used and total)
    args: tuple[object, ...] = ()  # after the handle
    labels: tuple[str, ...] = ()  # label values after gpu and uuid
    # per metric, label values after `labels` (device_remapped_rows: corrected, uncorrected, then none, none);
    # empty: none for any
    metric_labels: tuple[tuple[str, ...], ...] = ()
    multiply: float = 1.0  # to the metric's base unit: value * multiply / divide
    divide: float = 1.0
    # NVML field ids answering it, one per metric, read in the GPU's one nvmlDeviceGetFieldValues call of the
    # collection instead of a call of its own; empty: `call` answers it
    fields: tuple[int, ...] = ()
    slow: bool = False  # read every nvml.slow_interval (its last answer published in between), not every collection
    # derived, for the source's loop: no conversion (the answer is the value: integers stay integers, 61 not
    # 61.0); the answer is a tuple, one value per metric (device_memory: used, total)
    exact: bool = field(init=False, repr=False, compare=False)
    pair: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.metric_labels and len(self.metric_labels) != len(self.metrics):
            raise ValueError(f"{self.key}: one metric_labels entry per metric")
        if bool(self.fields) == bool(self.call) or (self.fields and len(self.fields) != len(self.metrics)):
            raise ValueError(f"{self.key}: a call, or one field per metric")
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
    Reading("power_limit", "device_power_limit_milliwatts", (m.GPU_POWER_LIMIT,), divide=1000.0, slow=True),
    Reading("energy", "", (m.GPU_ENERGY,), divide=1000.0, fields=(FI_TOTAL_ENERGY,)),
    Reading("temperature", "device_temperature_celsius", (m.GPU_TEMPERATURE,)),
    Reading("memory_reserved", "device_memory_reserved_bytes", (m.GPU_MEMORY_RESERVED,), slow=True),
    Reading("sm_clock", "device_sm_clock_mhz", (m.GPU_SM_CLOCK,), multiply=1e6),
    Reading("memory_clock", "device_memory_clock_mhz", (m.GPU_MEMORY_CLOCK,), multiply=1e6),
    Reading("encoder", "device_encoder_utilization_percent", (m.GPU_ENCODER_UTILIZATION,), divide=100.0),
    Reading("decoder", "device_decoder_utilization_percent", (m.GPU_DECODER_UTILIZATION,), divide=100.0),
    # the violation counters (nanoseconds) as fields: six calls of 0.7-1 ms of CPU each on an H200 were 42% of a
    # collection's CPU in libnvidia-ml; as fields they cost 0.004 ms each (thermal's 0.6 ms)
    *(Reading(f"violation_{reason}", "", (m.GPU_THROTTLE_SECONDS,), labels=(reason,), divide=1e9,
              fields=(FI_PERF_POLICY[policy],)) for policy, reason in THROTTLE_REASONS.items()),
    *(Reading(f"ecc_{error_type}", "", (m.GPU_ECC_ERRORS,), labels=(error_type,), fields=(field,), slow=True)
      for error_type, field in (("corrected", FI_ECC_SBE_VOL_TOTAL), ("uncorrected", FI_ECC_DBE_VOL_TOTAL))),
    Reading("remapped_rows", "",
            (m.GPU_REMAPPED_ROWS, m.GPU_REMAPPED_ROWS, m.GPU_ROW_REMAP_PENDING, m.GPU_ROW_REMAP_FAILURE),
            metric_labels=(("corrected",), ("uncorrected",), (), ()),
            fields=(FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE), slow=True),
    *(Reading(f"retired_pages_{cause}", "", (m.GPU_RETIRED_PAGES,), labels=(cause,),
              fields=(FI_RETIRED_SBE if code == 0 else FI_RETIRED_DBE,), slow=True)
      for code, cause in RETIREMENT_CAUSES.items()),
    Reading("retired_pages_pending", "", (m.GPU_RETIRED_PAGES_PENDING,), fields=(FI_RETIRED_PENDING,), slow=True),
    Reading("pcie_replays", "", (m.GPU_PCIE_REPLAYS,), fields=(FI_PCIE_REPLAY_COUNTER,), slow=True),
    # at every collection: the driver's own word that the GPU must be reset or the node rebooted
    Reading("recovery_action", "", (m.GPU_RECOVERY_ACTION,), fields=(FI_GPU_RECOVERY_ACTION,)),
    Reading("pcie_generation", "device_pcie_link_generation", (m.GPU_PCIE_LINK_GENERATION,)),
    Reading("pcie_max_generation", "device_pcie_link_max_generation", (m.GPU_PCIE_LINK_MAX_GENERATION,), slow=True),
    Reading("pcie_width", "device_pcie_link_width", (m.GPU_PCIE_LINK_WIDTH,)),
    Reading("pcie_max_width", "device_pcie_link_max_width", (m.GPU_PCIE_LINK_MAX_WIDTH,), slow=True),
)
