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
    FE_GPU,
    FIELD_NAMES,
    PROFILING_NOT_SUPPORTED,
    DcgmError,
    DcgmGpu,
    DcgmInstance,
    Entity,
    Latest,
)

# DCGM field id -> key of SimulatedGpus.truth_activity: the field's name, lower case, less its prefix
# and "pipe_" (DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE -> tensor_hmma_active); the byte rates by direction
TRUTH_KEYS = {
    field_id: name.removeprefix("DCGM_FI_PROF_").removeprefix("PIPE_").removesuffix("_BYTES").lower()
    for field_id, name in FIELD_NAMES.items()
}
MIG_ENTITY_BASE = 100  # DCGM numbers GPU instances apart from GPUs; the simulator's start here


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
        self._entities: tuple[Entity, ...] = ()
        self._interval = 1.0
        self._supported: frozenset[int] | None = None  # None: every field
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

    def support_only(self, field_ids: frozenset[int] | None) -> None:
        """An older GPU: watching any other profiling field is refused (None: every field)."""
        with self._lock:
            self._supported = field_ids

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

    def gpu_instances(self) -> list[DcgmInstance]:
        with self._lock:
            self._check()
        return [DcgmInstance(MIG_ENTITY_BASE + 8 * i + gi, i, gi)
                for i in range(self.sim.count) for gi in self.sim.mig_gpu_instances(i)]

    def watch(self, field_ids: Sequence[int], interval: float, entities: Sequence[Entity]) -> None:
        with self._lock:
            self._check()
            if self._profiling_error is not None:
                raise self._profiling_error
            unknown = [f for f in field_ids if f not in TRUTH_KEYS]
            if unknown:
                raise DcgmError(-13, f"simulated: unknown fields {unknown}")  # DCGM_ST_UNKNOWN_FIELD
            if self._supported is not None and not set(field_ids) <= self._supported:
                raise DcgmError(PROFILING_NOT_SUPPORTED, "simulated: a field is not supported on this GPU")
            self._watched = tuple(field_ids)
            self._entities = tuple(entities)
            self._interval = interval
            # DCGM's UpdateAllFields(1), which the bindings call right after watching, makes it sample at
            # once: the first read finds values. Here, as if it had watched one period more already.
            self._watch_start = self._clock() - 2 * interval

    def latest_period(self, now: float | None = None) -> tuple[float, float]:
        """The sampling period whose averages `latest()` returns at `now` (sim-clock times)."""
        now = self._clock() if now is None else now
        end = now // self._interval * self._interval
        return end - self._interval, end

    def latest(self) -> Latest:
        """Each watched entity's averages; a MIG instance reports the activity of its whole GPU."""
        with self._lock:
            self._check()
            watched, entities, start = self._watched, self._entities, self._watch_start
        t0, t1 = self.latest_period()
        out: dict[Entity, dict[int, float]] = {}
        for entity in entities:
            group, entity_id = entity
            index = entity_id if group == FE_GPU else (entity_id - MIG_ENTITY_BASE) // 8
            if t0 < start or self.sim.is_lost(index):  # no full period sampled yet, or a lost GPU: blanks
                out[entity] = {}
                continue
            truth = self.sim.truth_activity(index, t0, t1)
            out[entity] = {field: truth[TRUTH_KEYS[field]] for field in watched}
        return Latest(out)

    def disconnect(self) -> None:
        with self._lock:
            self._connected = False
            self._watched = ()
            self._entities = ()
