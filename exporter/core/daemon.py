"""Runs built sources: a runner per source, the snapshot store, the exporter's own health series.

The daemon knows no source by name: `exporter.assemble` builds the enabled sources from the registry and
hands them over with their settings, in registry order.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest

from .. import __version__
from . import health
from .exposition import OPENMETRICS, Batch
from .runner import SourceRunner
from .source import Source
from .store import Store

log = logging.getLogger(__name__)


class StartRefused(Exception):
    """A source must not start, and the daemon with it: what it would serve is served by a running process (the
    events socket of another daemon). Raised from `Source.start()`; anything else a start raises is the source's to
    report from `collect()`."""


@dataclass(frozen=True)
class Scheduled:
    """A built source with how often it collects and how long a collection may take; with `adaptive`, the interval
    moves within [min_interval, max_interval] (None: the interval itself)."""

    source: Source
    interval: float
    timeout: float
    adaptive: bool = False
    min_interval: float | None = None
    max_interval: float | None = None


def _process_metrics() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


class Daemon:
    """Everything but the HTTP server. `start()` launches the sources; `stop()` ends them."""

    def __init__(self, sources: Sequence[Scheduled], backend_name: str, order: Sequence[str] = (),
                 on_start: Sequence[Callable[[threading.Event], object]] = (),
                 http_servers: Callable[[], Sequence[Any]] = tuple) -> None:
        """`order`: source names in the order their series are rendered (the registry's); `on_start`: called
        with the daemon's stop event once the sources run (the simulator's fault schedule); `http_servers`: the HTTP
        servers' connection counts (`core.connections.Connections`: name, open, closed), published with the sources'
        health."""
        self.backend_name = backend_name
        self._http_servers = http_servers
        self._on_start = on_start
        self._process_registry = _process_metrics()
        # the exporter's own series change with every collection but are read only by a scrape: a collection marks
        # them stale (`_self_metrics_stale`), and the scrape that finds them so publishes them first
        self.store = Store(extra=self._render_process_metrics, order=(*order, "exporter"),
                           refresh=self._refresh_self_metrics)
        self._self_lock = threading.Lock()
        self._self_stale = False
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._started = False
        self.runners: dict[str, SourceRunner] = {}
        for item in sources:
            self.runners[item.source.name] = SourceRunner(
                item.source, item.interval, item.timeout, publish=self.store.publish,
                on_done=self._self_metrics_stale, adaptive=item.adaptive, min_interval=item.min_interval,
                max_interval=item.max_interval)
        self.publish_self_metrics()

    def start(self) -> None:
        """Start every source, then their runners. Raises StartRefused (having closed the sources started before)
        when a source refuses to start; the one that refused holds nothing and is not closed."""
        started: list[SourceRunner] = []
        for runner in self.runners.values():
            try:
                runner.source.start()
            except StartRefused:
                for other in reversed(started):
                    try:
                        other.source.close()
                    except Exception:
                        log.exception("source %s: error while closing", other.name)
                raise
            except Exception:  # a source that cannot open what it serves reports it from collect()
                log.exception("source %s: start failed", runner.name)
            started.append(runner)
        for runner in self.runners.values():
            runner.start()
        self._started = True
        for hook in self._on_start:
            hook(self._stop)

    def stop(self) -> None:
        """Stop every runner and close its source, all at once (a source's close may wait for its server's graceful
        shutdown). Safe from any thread and more than once: a later call returns when the first is done."""
        with self._stop_lock:
            if self._stop.is_set() or not self._started:
                self._stop.set()
                return
            self._stop.set()
            stopping = [threading.Thread(target=runner.stop, name=f"stop-{runner.name}")
                        for runner in self.runners.values()]
            for thread in stopping:
                thread.start()
            for thread in stopping:
                thread.join()

    def boost(self, source: str, seconds: float) -> bool:
        """Hold `source` at its min_interval for the next `seconds` (a capture runs and its signals matter more).
        False when no such source runs or it is not adaptive: a fixed interval stays fixed."""
        runner = self.runners.get(source)
        if runner is None or not runner.boost(seconds):
            return False
        log.debug("source %s: held at %gs for %gs", source, runner.interval, seconds)
        return True

    def ready(self) -> dict[str, bool]:
        """Per enabled source: has it finished its first collection, and does it lack nothing (`not_ready`)?"""
        reasons = self.not_ready()
        return {name: name not in reasons for name in self.runners}

    def not_ready(self) -> dict[str, str]:
        """Why each source that is not ready is not: no collection finished yet, or what the source says it still
        lacks, from its `not_ready()` where it has one (a listener waiting for its address, say)."""
        reasons: dict[str, str] = {}
        for name, runner in self.runners.items():
            if not runner.completed.is_set():
                reasons[name] = "no collection finished yet"
                continue
            probe: Callable[[], str | None] | None = getattr(runner.source, "not_ready", None)
            if probe is None:
                continue
            try:
                reason = probe()
            except Exception as exc:  # a broken probe is a source that is not ready, not a failed /readyz
                reason = f"readiness check failed: {exc.__class__.__name__}: {exc}"
            if reason:
                reasons[name] = reason
        return reasons

    def _self_metrics_stale(self) -> None:
        self._self_stale = True

    def _refresh_self_metrics(self) -> None:
        if self._self_stale:
            self._self_stale = False  # before publishing: a collection ending meanwhile marks them again
            self.publish_self_metrics()

    def publish_self_metrics(self) -> None:
        with self._self_lock:
            batch = Batch()
            batch.add(health.BUILD_INFO, (__version__, platform.python_version(), self.backend_name), 1)
            for name, runner in self.runners.items():
                labels = (name,)
                batch.add(health.SOURCE_UP, labels, 1 if runner.up else 0)
                if runner.last_duration is not None:
                    batch.add(health.SOURCE_DURATION, labels, runner.last_duration)
                batch.add(health.SOURCE_INTERVAL, labels, runner.interval)
                if runner.last_success is not None:
                    batch.add(health.SOURCE_LAST_SUCCESS, labels, runner.last_success)
                batch.add(health.SOURCE_COLLECTIONS, labels, runner.collections)
                for reason, count in sorted(runner.errors.items()):
                    batch.add(health.SOURCE_ERRORS, (name, reason), count)
                calls = getattr(runner.source, "library_calls", None)
                for function, count in sorted(calls().items()) if calls is not None else ():
                    batch.add(health.LIBRARY_CALLS, (name, function), count)
            opened: Counter[str] = Counter()
            closed: Counter[tuple[str, str]] = Counter()
            for server in self._http_servers():  # summed by name: a test process may run several daemons
                opened[server.name] += server.open
                for reason, count in dict.copy(server.closed).items():  # one C call: the loop thread adds to it
                    closed[server.name, reason] += count
            for name, count in sorted(opened.items()):
                batch.add(health.HTTP_CONNECTIONS, (name,), count)
            for key, count in sorted(closed.items()):
                batch.add(health.HTTP_CONNECTIONS_CLOSED, key, count)
            self.store.publish("exporter", batch)

    def _render_process_metrics(self, fmt: str) -> bytes:
        if fmt == OPENMETRICS:
            return om_latest(self._process_registry).removesuffix(b"# EOF\n")
        return text_latest(self._process_registry)
