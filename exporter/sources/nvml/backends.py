"""Which GPU backend the node reads: the real NVML library, unless simulated GPUs were asked for explicitly
(`simulate.gpus`). The two are peers behind `api.GpuBackend`; this is the one place that chooses."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .api import GpuBackend
from .settings import SimulateConfig

log = logging.getLogger(__name__)


def make_backend(simulate: SimulateConfig) -> GpuBackend:
    if simulate.gpus > 0:
        from .simulated import SimulatedGpus

        log.warning("using %d SIMULATED GPUs (seed %d): these are not real measurements",
                    simulate.gpus, simulate.seed)
        return SimulatedGpus(simulate.gpus, seed=simulate.seed, pattern=simulate.pattern, busy=simulate.busy,
                             idle=simulate.idle)
    from .library import NvmlLibrary

    return NvmlLibrary()


def fault_schedule(backend: GpuBackend, simulate: SimulateConfig,
                   fabric: object = None) -> Callable[[threading.Event], object] | None:
    """What injects `simulate.faults` into simulated GPUs (and the simulated `fabric`, if any) once the daemon
    runs; None when there is nothing to inject (no faults, or real GPUs)."""
    from .simulated import SimulatedGpus, schedule_faults

    if not simulate.faults or not isinstance(backend, SimulatedGpus):
        return None
    return lambda stop: schedule_faults(backend, simulate.faults, stop, fabric)
