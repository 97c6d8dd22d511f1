"""Report training steps and phases to the node's goodput-exporter, from any training loop.

    from goodput_client import Telemetry

    telemetry = Telemetry()                      # workload and rank from the launcher's environment
    for batch in telemetry.data_wait(loader):    # time spent waiting on the loader -> data_wait
        with telemetry.step(tokens=batch_tokens, samples=len(batch)):
            with telemetry.phase("compute"):
                loss = model(batch).sum(); loss.backward(); optimizer.step()

Standard library only, and cheap to import: the HTTP client, JSON and logging load when a Telemetry
is created or first needs them. The wire format is `goodput_client.contract`.
"""

from __future__ import annotations

from .contract import DEFAULT_SOCKET, PHASES
from .telemetry import Telemetry

__version__ = "0.1.0"
__all__ = ["DEFAULT_SOCKET", "PHASES", "Telemetry", "__version__"]
