"""Repeated log lines, rate-limited and summarised: a flood of bad requests, or step-time shifts of many ranks, must
not flood the daemon's log.

`RepeatFilter` sits on the daemon's log handler. Lines are alike when they come from the same logger, at the same
level, with the same message template (their arguments may differ: each sender, rank or byte count). Of alike lines,
the first `burst` in each `window` seconds are written; the rest are counted, and the next one written after that
window says how many were not ("... [312 more like this in the last 60s were not logged]").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

BURST = 5  # alike lines written per window
WINDOW = 60.0  # seconds
MAX_KEYS = 1024  # kinds of line tracked at once; past it those whose window ended are forgotten


class RepeatFilter(logging.Filter):
    def __init__(self, burst: int = BURST, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        # (logger, level, template) -> [window start, lines in it, lines not written since the last written]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            state = self._seen.get(key)
            if state is None:
                if len(self._seen) >= MAX_KEYS:
                    self._forget(now)
                state = self._seen[key] = [now, 0, 0]
            elif now - state[0] >= self.window:
                state[0], state[1] = now, 0
            if state[1] >= self.burst:
                state[2] += 1
                return False
            state[1] += 1
            skipped, state[2] = int(state[2]), 0
        if skipped:
            record.msg = f"{record.msg} [{skipped} more like this in the last {self.window:g}s were not logged]"
        return True

    def _forget(self, now: float) -> None:
        for key in [k for k, s in self._seen.items() if now - s[0] >= self.window]:
            del self._seen[key]
        if len(self._seen) >= MAX_KEYS:
            self._seen.clear()
