"""Settings of the `nvml` source, and of the simulated GPUs that stand in for NVML when asked for."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ...core.settings import Duration, Section, SourceConfig
from .cadence import INTERVAL, NVML_SAMPLE_SECONDS, SLOW_INTERVAL


class NvmlConfig(SourceConfig):
    interval: Duration = Field(
        INTERVAL, description="How often the source collects: utilization, memory, power, energy, temperature, "
        "clocks, throttling, PCIe and NVLink traffic, processes. The idle counter integrates every utilization sample "
        f"NVML keeps (about {NVML_SAMPLE_SECONDS:g}s of them) whatever the interval, so it is exact at any interval up "
        "to that; a shorter one only makes the gauges fresher, at the cost of one more collection's NVML calls "
        "(about 15 per GPU on an H200: bench/results.md counts them by function).")
    slow_interval: Duration = Field(
        SLOW_INTERVAL, description="How often what only a fault, a reset or an operator changes is read: ECC error "
        "counts, retired pages, row remapping, PCIe replays, the PCIe link's maximum generation and width, the power "
        "limit, reserved memory, NVLink error counters (one call per link and counter: 72 on an H100). Published with "
        "every collection in between, as last read.")
    nvlink_per_link: bool = Field(
        False, description="Also publish each active NVLink link's byte and error counters (a `link` label: 108 "
        "more series per H100). For finding which link of a GPU counts errors; the per-GPU totals are always "
        "published.")

    @model_validator(mode="after")
    def _check_sample_buffer(self) -> NvmlConfig:
        """An adaptive interval never grows past what NVML keeps (a fixed one is the operator's explicit choice)."""
        if self.adaptive and self.max_interval > NVML_SAMPLE_SECONDS:
            raise ValueError(f"max_interval {self.max_interval:g}s is longer than the {NVML_SAMPLE_SECONDS:g}s of "
                             f"utilization samples NVML keeps: samples would be lost (set max_interval to "
                             f"{NVML_SAMPLE_SECONDS:g}s or less)")
        return self


FaultKind = Literal["lost", "xid", "ecc", "throttle", "hang", "raise", "row_remap_pending", "pcie_degraded",
                    "nvlink_errors", "link_down", "link_flap", "symbol_errors", "congestion", "link_degraded"]
FABRIC_FAULTS = frozenset({"link_down", "link_flap", "symbol_errors", "congestion", "link_degraded"})


class FaultSpec(Section):
    at: Duration = Field(description="Seconds after start when the fault is injected.")
    gpu: int = Field(0, ge=0, description="GPU index.")
    kind: FaultKind = Field(description=(
        "One of: lost, xid, ecc, throttle, hang (NVML calls block), raise, row_remap_pending (an uncorrectable "
        "error's row remap waits for a reset), pcie_degraded (the PCIe link trains at gen 3 x8, below gen 5 x16), "
        "nvlink_errors (CRC and replay errors rise on a link); on the simulated fabric's NIC `nic`: link_down, "
        "link_flap (down 1 s every 4 s), symbol_errors, congestion (ECN marks and CNPs), link_degraded (half "
        "rate)."))
    xid: int = Field(79, ge=0, description="XID code for kind=xid.")
    count: int = Field(1, ge=1, description="Number of errors for kind=ecc / xid.")
    uncorrected: bool = Field(False, description="For kind=ecc: uncorrected errors.")
    reason: Literal["power", "thermal"] = Field("thermal", description="For kind=throttle.")
    duration: Duration = Field(30.0, description="How long a throttle, hang or burst of NVLink errors lasts.")
    link: int = Field(0, ge=0, lt=18, description="For kind=nvlink_errors: the NVLink link (a simulated H100 has 18).")
    nic: int = Field(0, ge=0, description="For the fabric kinds: the simulated NIC (mlx5_<nic>).")


def simulate_shorthand(value: Any) -> Any:
    if isinstance(value, int | str) and not isinstance(value, bool):
        return {"gpus": value}
    return value


class SimulateConfig(Section):
    gpus: int = Field(0, ge=0, le=1024, description="Simulated GPUs instead of NVML; 0 uses real NVML.")
    seed: int = Field(1, description="Seed of the simulated workload, for repeatable runs.")
    pattern: Literal["training", "square"] = Field(
        "training", description="training: compute bursts, data stalls, checkpoint pauses; "
        "square: busy/idle alternating exactly.")
    busy: Duration = Field(0.1, description="Busy time per cycle for pattern=square.")
    idle: Duration = Field(0.1, description="Idle time per cycle for pattern=square.")
    nics: int | None = Field(
        None, ge=0, le=8, description="Simulated RDMA NICs for the fabric source (at most 8), NIC i on GPU i's "
        "PCIe switch; default one per simulated GPU, at most 8.")
    faults: list[FaultSpec] = Field(default_factory=list, description="Faults injected on a schedule.")

    @property
    def nic_count(self) -> int:
        return min(self.gpus, 8) if self.nics is None else self.nics

    @model_validator(mode="after")
    def _faults_name_simulated_gpus(self) -> SimulateConfig:
        for i, fault in enumerate(self.faults):
            if fault.gpu >= self.gpus:
                raise ValueError(f"faults.{i}.gpu: GPU {fault.gpu} is not simulated (gpus: {self.gpus})")
            if fault.kind in FABRIC_FAULTS and fault.nic >= self.nic_count:
                raise ValueError(f"faults.{i}.nic: NIC {fault.nic} is not simulated (nics: {self.nic_count})")
        return self
