"""Simulated DCGM: a peer of `bindings.DcgmBindings` over the simulated GPUs.

Values are DCGM's: each watched profiling field is the exact average over the last full sampling
period (the watch interval), computed from the simulated GPUs' activity profiles, so tests can hold
the source's numbers against `SimulatedGpus.truth_activity`. Failures DCGM shows in practice are
injected through methods: the host engine dying, profiling not supported (e.g. a consumer GPU, or
another profiler holding the counters).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..nvml.simulated import SimulatedGpus
from .api import (
    CONNECTION_NOT_VALID,
    FI_PROF_DRAM_ACTIVE,
    FI_PROF_NVLINK_RX_BYTES,
    FI_PROF_NVLINK_TX_BYTES,
    FI_PROF_PCIE_RX_BYTES,
    FI_PROF_PCIE_TX_BYTES,
    FI_PROF_PIPE_FP16_ACTIVE,
    FI_PROF_PIPE_FP32_ACTIVE,
    FI_PROF_PIPE_FP64_ACTIVE,
    FI_PROF_PIPE_TENSOR_ACTIVE,
    FI_PROF_SM_ACTIVE,
    FI_PROF_SM_OCCUPANCY,
    DcgmError,
    DcgmGpu,
    Latest,
)

# DCGM field id -> key of SimulatedGpus.truth_activity
TRUTH_KEYS = {
    FI_PROF_SM_ACTIVE: "sm_active",
    FI_PROF_SM_OCCUPANCY: "sm_occupancy",
    FI_PROF_PIPE_TENSOR_ACTIVE: "tensor_active",
    FI_PROF_DRAM_ACTIVE: "dram_active",
    FI_PROF_PIPE_FP64_ACTIVE: "fp64_active",
    FI_PROF_PIPE_FP32_ACTIVE: "fp32_active",
    FI_PROF_PIPE_FP16_ACTIVE: "fp16_active",
    FI_PROF_PCIE_TX_BYTES: "pcie_tx",
    FI_PROF_PCIE_RX_BYTES: "pcie_rx",
    FI_PROF_NVLINK_TX_BYTES: "nvlink_tx",
    FI_PROF_NVLINK_RX_BYTES: "nvlink_rx",
}


class SimulatedDcgm:
    """Same surface as `DcgmBindings`; see `api.DcgmBackend`."""

    name = "simulated"

    def __init__(self, gpus: SimulatedGpus, clock: Callable[[], float] | None = None) -> None:
        self.sim = gpus
        self._clock = clock or gpus.now
        self._lock = threading.Lock()
        self._engine_up = True
        self._profiling_error: DcgmError | None = None
        self._connected = False
        self._watched: tuple[int, ...] = ()
        self._interval = 1.0
        self._watch_start = 0.0
        self.connects = 0  # how often a client connected (tests: reconnection after an engine restart)

    # --- fault injection (not part of the DCGM surface) ---------------------------------------------

    def stop_hostengine(self) -> None:
        """nv-hostengine dies: every call fails as with a broken connection, until it is started."""
        with self._lock:
            self._engine_up = False
            self._connected = False
            self._watched = ()

    def start_hostengine(self) -> None:
        with self._lock:
            self._engine_up = True

    def set_profiling_unsupported(self, code: int | None) -> None:
        """Make watching profiling fields fail with `code` (e.g. PROFILING_NOT_SUPPORTED); None: allow."""
        with self._lock:
            self._profiling_error = None if code is None else DcgmError(code, "simulated: profiling unavailable")

    # --- the DCGM surface ---------------------------------------------------------------------------

    def _check(self) -> None:
        if not self._engine_up:
            raise DcgmError(CONNECTION_NOT_VALID, "simulated: the host engine is not running")
        if not self._connected:
            raise DcgmError(CONNECTION_NOT_VALID, "simulated: not connected")

    def connect(self) -> None:
        with self._lock:
            if not self._engine_up:
                raise DcgmError(CONNECTION_NOT_VALID, "simulated: connection refused (no host engine)")
            self._connected = True
            self.connects += 1

    def gpus(self) -> list[DcgmGpu]:
        with self._lock:
            self._check()
        return [DcgmGpu(i, self.sim.uuid(i)) for i in range(self.sim.count)]

    def watch(self, field_ids: Sequence[int], interval: float) -> None:
        with self._lock:
            self._check()
            if self._profiling_error is not None:
                raise self._profiling_error
            unknown = [f for f in field_ids if f not in TRUTH_KEYS]
            if unknown:
                raise DcgmError(-13, f"simulated: unknown fields {unknown}")  # DCGM_ST_UNKNOWN_FIELD
            self._watched = tuple(field_ids)
            self._interval = interval
            self._watch_start = self._clock()

    def latest_period(self, now: float | None = None) -> tuple[float, float]:
        """The sampling period whose averages `latest()` returns at `now` (sim-clock times)."""
        now = self._clock() if now is None else now
        end = now // self._interval * self._interval
        return end - self._interval, end

    def latest(self) -> Latest:
        with self._lock:
            self._check()
            watched, start = self._watched, self._watch_start
        t0, t1 = self.latest_period()
        if t0 < start:  # no full period sampled since the watch began: DCGM has only blanks
            return Latest({i: {} for i in range(self.sim.count)})
        out: dict[int, dict[int, float]] = {}
        for index in range(self.sim.count):
            if self.sim.is_lost(index):  # DCGM keeps the GPU, with blank values
                out[index] = {}
                continue
            truth = self.sim.truth_activity(index, t0, t1)
            out[index] = {field: truth[TRUTH_KEYS[field]] for field in watched}
        return Latest(out)

    def disconnect(self) -> None:
        with self._lock:
            self._connected = False
            self._watched = ()
