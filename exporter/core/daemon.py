"""Runs built sources: a runner per source, the snapshot store, the exporter's own health series.

The daemon knows no source by name: `exporter.assemble` builds the enabled sources from the registry and
hands them over with their settings, in registry order.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
                 on_start: Sequence[Callable[[threading.Event], object]] = ()) -> None:
        """`order`: source names in the order their series are rendered (the registry's); `on_start`: called
        with the daemon's stop event once the sources run (the simulator's fault schedule)."""
        self.backend_name = backend_name
        self._on_start = on_start
        self._process_registry = _process_metrics()
        self.store = Store(extra=self._render_process_metrics, order=(*order, "exporter"))
        self._self_lock = threading.Lock()
        self._stop = threading.Event()
        self.runners: dict[str, SourceRunner] = {}
        for item in sources:
            self.runners[item.source.name] = SourceRunner(
                item.source, item.interval, item.timeout, publish=self.store.publish,
                on_done=self.publish_self_metrics, adaptive=item.adaptive, min_interval=item.min_interval,
                max_interval=item.max_interval)
        self.publish_self_metrics()

    def start(self) -> None:
        for runner in self.runners.values():
            try:
                runner.source.start()
            except Exception:  # a source that cannot open what it serves reports it from collect()
                log.exception("source %s: start failed", runner.name)
        for runner in self.runners.values():
            runner.start()
        for hook in self._on_start:
            hook(self._stop)

    def stop(self) -> None:
        self._stop.set()
        for runner in self.runners.values():
            runner.stop()

    def boost(self, source: str, seconds: float) -> bool:
        """Hold `source` at its min_interval for the next `seconds` (a capture runs and its signals matter more).
        False when no such source runs or it is not adaptive: a fixed interval stays fixed."""
        runner = self.runners.get(source)
        if runner is None or not runner.boost(seconds):
            return False
        log.debug("source %s: held at %gs for %gs", source, runner.interval, seconds)
        return True

    def ready(self) -> dict[str, bool]:
        """Per enabled source: has it finished its first collection?"""
        return {name: runner.completed.is_set() for name, runner in self.runners.items()}

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
            self.store.publish("exporter", batch)

    def _render_process_metrics(self, fmt: str) -> bytes:
        if fmt == OPENMETRICS:
            return om_latest(self._process_registry).removesuffix(b"# EOF\n")
        return text_latest(self._process_registry)
