"""Which sysfs the fabric source reads: the host's, unless GPUs are simulated, in which case their fabric is
simulated too (NICs beside the simulated GPUs). This is the one place that chooses."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def simulated_fabric(gpu_backend: Any, simulate: Any) -> Any:
    """A SimulatedFabric beside simulated GPUs (`simulate.nics` NICs, default one per GPU up to 8); None for
    real GPUs (the fabric source then reads the host's sysfs at `fabric.sysfs_path`)."""
    from ..nvml.simulated import SimulatedGpus

    if not isinstance(gpu_backend, SimulatedGpus):
        return None
    from .simulated import SimulatedFabric

    nics = min(gpu_backend.count, 8) if simulate.nics is None else simulate.nics
    log.warning("using a SIMULATED fabric of %d NICs: these are not real measurements", nics)
    return SimulatedFabric(gpu_backend.pci_bus_ids(), nics=nics)
