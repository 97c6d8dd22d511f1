"""Runs one source in the background on its interval (fixed, or adapted to its data), with a timeout, and keeps
its health."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from .adaptive import Cadence
from .exposition import Batch
from .source import Source, SourceError

log = logging.getLogger(__name__)


class SourceRunner:
    """Calls `source.collect()` every `interval` seconds in a worker thread.

    A collection that raises or runs past `timeout` is counted by reason and logged; the source is
    marked down and its series are withdrawn (stale numbers would mislead). A hung call is left to
    finish: no new collection starts until it returns, so hung calls never pile up threads.

    With `adaptive`, the interval follows the source's batches within [min_interval, max_interval]
    (`adaptive.Cadence`), and `boost()` holds it at min_interval for a while (a capture runs).
    """

    def __init__(
        self,
        source: Source,
        interval: float,
        timeout: float,
        publish: Callable[[str, Batch | None], None],
        on_done: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        adaptive: bool = False,
        min_interval: float | None = None,
        max_interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the wall clock of the last-success timestamp; `monotonic`: the clock the batches are timed
        on and a boost lasts on (tests run them on a manual one)."""
        self.source = source
        self.name = source.name
        self.cadence = Cadence(interval, adaptive, min_interval, max_interval, clock=monotonic)
        self.timeout = timeout
        self._publish = publish
        self._on_done = on_done
        self._clock = clock
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and boost(): the loop stops waiting
        self._thread = threading.Thread(target=self._loop, name=f"source-{self.name}", daemon=True)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"collect-{self.name}")
        self._hung: Future[Batch] | None = None
        self._last_reason: str | None = None
        # Health, read by the self-metrics renderer.
        self.up = False
        self.completed = threading.Event()  # finished at least one collection, well or not
        self.collections = 0
        self.last_duration: float | None = None
        self.last_success: float | None = None
        self.errors: Counter[str] = Counter()

    @property
    def interval(self) -> float:
        """Seconds between collections now."""
        return self.cadence.interval

    def boost(self, seconds: float) -> bool:
        """Collect at min_interval for the next `seconds`, starting now. False (and nothing done) unless the
        source is adaptive: a fixed interval stays fixed."""
        if not self.cadence.boost(seconds):
            return False
        self._wake.set()
        return True

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(wait)
        self._worker.shutdown(wait=False, cancel_futures=True)
        try:
            self.source.close()
        except Exception:  # closing must never take the daemon down
            log.exception("source %s: error while closing", self.name)

    def _loop(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self.run_once()
            scheduled = deadline
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:  # a slow collection: skip the missed ticks, do not burst
                deadline = now
            while self._wake.wait(deadline - now):
                if self._stop.is_set():
                    return
                self._wake.clear()  # a boost: the next collection is due min_interval after this one's tick
                deadline = min(deadline, scheduled + self.interval)
                now = time.monotonic()
                if deadline < now:
                    deadline = now

    def run_once(self) -> None:
        if self._hung is not None:
            if not self._hung.done():
                return  # still stuck; counted once when it timed out
            log.info("source %s: the hung collection returned after all", self.name)
            self._hung = None
        started = time.monotonic()
        taken = self._monotonic()
        future = self._worker.submit(self.source.collect)
        try:
            batch = future.result(timeout=self.timeout)
        except FutureTimeout:
            self._hung = future
            self._fail("timeout", f"collection still running after {self.timeout:g}s (timeout)")
        except SourceError as exc:
            self._fail(exc.reason, str(exc))
        except Exception as exc:
            self._fail("exception", f"{exc.__class__.__name__}: {exc}", exc_info=exc)
        else:
            try:
                self._succeed(batch)
            except Exception as exc:  # a batch that cannot be published must not end the loop
                self._fail("publish", f"{exc.__class__.__name__}: {exc}", exc_info=exc)
            else:
                self._adapt(batch, taken)
        self.last_duration = time.monotonic() - started
        self.collections += 1
        self.completed.set()
        self._health_changed()

    def _health_changed(self) -> None:
        try:
            self._on_done()
        except Exception:
            log.exception("source %s: updating self-metrics failed", self.name)

    def _succeed(self, batch: Batch) -> None:
        # health before the batch: a scrape that finds the batch's series finds the source up with them
        for reason in batch.errors:
            self.errors[reason] += 1
        if not self.up and self._last_reason is not None:
            log.info("source %s: recovered", self.name)
        self.up = True
        self._last_reason = None
        self.last_success = self._clock()
        self._health_changed()
        self._publish(self.name, batch)

    def _adapt(self, batch: Batch, taken: float) -> None:
        before = self.cadence.interval
        try:
            self.cadence.collected(batch, taken)
        except Exception:  # measuring a batch must never cost the source its health
            log.exception("source %s: measuring the batch's change failed", self.name)
            return
        after = self.cadence.interval
        if after != before:
            log.debug("source %s: interval %gs -> %gs (%.0f%% of its metrics changed)", self.name, before, after,
                      100 * (self.cadence.last_share or 0.0))

    def _fail(self, reason: str, message: str, exc_info: BaseException | None = None) -> None:
        self.errors[reason] += 1
        self.cadence.failed()
        try:
            self._publish(self.name, None)
        except Exception:
            log.exception("source %s: withdrawing its series failed", self.name)
        if self.up or reason != self._last_reason:  # log transitions, not every failed tick
            # once stop() is called, a collection cut off by the source's close() is expected, not news
            level = logging.INFO if self._stop.is_set() else logging.WARNING
            log.log(level, "source %s is down (%s): %s", self.name, reason, message, exc_info=exc_info)
        self.up = False
        self._last_reason = reason
