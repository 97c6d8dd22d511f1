"""What every source is: a name and a `collect()` that returns a Batch. Nothing else is shared."""

from __future__ import annotations

from typing import Protocol

from ..exposition import Batch


class SourceError(Exception):
    """A collection failed for a known reason; `reason` becomes the errors_total label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Source(Protocol):
    name: str

    def collect(self) -> Batch:
        """Collect once. Raise SourceError (or anything) to mark the source down."""
        ...

    def close(self) -> None: ...
