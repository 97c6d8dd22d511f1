"""Which DCGM backend the source reads: DCGM's own bindings, or the simulated DCGM over simulated GPUs (a peer
behind the same interface, chosen here and nowhere else)."""

from __future__ import annotations

from typing import Any

from .api import DcgmBackend
from .settings import DcgmConfig


def make_backend(settings: DcgmConfig, gpus: Any) -> DcgmBackend:
    from ..nvml.simulated import SimulatedGpus

    if isinstance(gpus, SimulatedGpus):
        from .simulated import SimulatedDcgm

        return SimulatedDcgm(gpus)
    from .bindings import DcgmBindings

    return DcgmBindings(settings.bindings_path, settings.hostengine)
