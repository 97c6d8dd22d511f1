"""How often the nvml source reads what: the defaults of nvml.interval and nvml.slow_interval, and how much of a
GPU's utilization NVML keeps between two reads. Plain constants, so that the source needs no settings model."""

from __future__ import annotations

# NVML keeps about this many seconds of a GPU's utilization samples: an nvml source that polls less often than this
# loses the samples in between, and its idle counter is no longer exact
NVML_SAMPLE_SECONDS = 20.0
# nvml.interval: what changes by the second (power, memory, clocks, temperature, throttling, utilization, traffic).
# The idle counter integrates every buffered sample at any interval up to NVML_SAMPLE_SECONDS; the gauges are as
# fresh as this; about 20 NVML calls per GPU per collection
INTERVAL = 5.0
# nvml.slow_interval: what only a fault, a reset or an operator changes (ECC error counts, retired pages, row
# remapping, PCIe replays, the link's maximum generation and width, the power limit, reserved memory, NVLink error
# counters: one call per link and counter, 72 on an H100)
SLOW_INTERVAL = 30.0
