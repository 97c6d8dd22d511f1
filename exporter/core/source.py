"""What every source is to the runtime: a name, a `collect()` that returns a Batch, and a lifecycle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .exposition import Batch


class SourceError(Exception):
    """A collection failed for a known reason; `reason` becomes the errors_total label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Source(Protocol):
    """Sources subclass it explicitly, and so inherit a lifecycle that does nothing where they need none."""

    name: str

    def start(self) -> None:
        """Open what the source serves or watches (the events socket, say), before its first collection.
        Failing to must not raise: the source reports it from `collect()` and the daemon keeps serving."""

    def collect(self) -> Batch:
        """Collect once. Raise SourceError (or anything) to mark the source down."""
        ...

    def not_ready(self) -> str | None:
        """Why the source cannot do all its work yet although it collects (its events server still waits for an
        address, say), or None when it can. /readyz answers 503 and names the reason meanwhile."""
        return None

    def library_calls(self) -> Mapping[str, int]:
        """Calls made so far to the library the source reads (NVML, DCGM), by function; empty for a source that reads
        none. Published as goodput_exporter_library_calls_total."""
        return {}

    def close(self) -> None:
        """Release what the source holds (connections, worker processes, servers)."""
