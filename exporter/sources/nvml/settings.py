"""Settings of the `nvml` source, and of the simulated GPUs that stand in for NVML when asked for."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ...core.settings import Duration, Section, SourceConfig


class NvmlConfig(SourceConfig):
    pass


FaultKind = Literal["lost", "xid", "ecc", "throttle", "hang", "raise", "row_remap_pending", "pcie_degraded",
                    "nvlink_errors"]


class FaultSpec(Section):
    at: Duration = Field(description="Seconds after start when the fault is injected.")
    gpu: int = Field(0, ge=0, description="GPU index.")
    kind: FaultKind = Field(description=(
        "One of: lost, xid, ecc, throttle, hang (NVML calls block), raise, row_remap_pending (an uncorrectable "
        "error's row remap waits for a reset), pcie_degraded (the PCIe link trains at gen 3 x8, below gen 5 x16), "
        "nvlink_errors (CRC and replay errors rise on a link)."))
    xid: int = Field(79, ge=0, description="XID code for kind=xid.")
    count: int = Field(1, ge=1, description="Number of errors for kind=ecc / xid.")
    uncorrected: bool = Field(False, description="For kind=ecc: uncorrected errors.")
    reason: Literal["power", "thermal"] = Field("thermal", description="For kind=throttle.")
    duration: Duration = Field(30.0, description="How long a throttle, hang or burst of NVLink errors lasts.")
    link: int = Field(0, ge=0, lt=18, description="For kind=nvlink_errors: the NVLink link (a simulated H100 has 18).")


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
    faults: list[FaultSpec] = Field(default_factory=list, description="Faults injected on a schedule.")

    @model_validator(mode="after")
    def _faults_name_simulated_gpus(self) -> SimulateConfig:
        for i, fault in enumerate(self.faults):
            if fault.gpu >= self.gpus:
                raise ValueError(f"faults.{i}.gpu: GPU {fault.gpu} is not simulated (gpus: {self.gpus})")
        return self
