"""How long a source waits before trying again what failed to start (a library's initialisation, a connection): the
first retry after `first` seconds, then twice as long each time up to `most`; a success starts it over."""

from __future__ import annotations

import time
from collections.abc import Callable


class Backoff:
    def __init__(self, first: float = 5.0, most: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < first <= most:
            raise ValueError(f"need 0 < first <= most, got {first:g} and {most:g}")
        self.first = first
        self.most = most
        self._clock = clock
        self.delay = 0.0  # seconds between the last failure and the next try; 0 before any failure
        self.failures = 0  # in a row
        self._next = 0.0  # clock time of the next try

    def due(self) -> bool:
        """May it be tried now (never failed, succeeded since, or the wait is over)?"""
        return self.failures == 0 or self._clock() >= self._next

    def remaining(self) -> float:
        """Seconds until the next try (0 when due)."""
        return 0.0 if self.failures == 0 else max(0.0, self._next - self._clock())

    def failed(self) -> float:
        """A try failed: the next waits twice as long as the last (the first `first`). Returns that wait."""
        self.delay = self.first if self.failures == 0 else min(self.delay * 2, self.most)
        self.failures += 1
        self._next = self._clock() + self.delay
        return self.delay

    def succeeded(self) -> None:
        self.failures = 0
        self.delay = 0.0
