"""Wires a Config into running parts: backend, sources, runners, the store and its self-metrics."""

from __future__ import annotations

import logging
import platform
import threading

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest

from . import __version__
from . import catalog as c
from .config import Config
from .dcgm.api import DcgmBackend
from .exposition import OPENMETRICS, Batch
from .gpu.api import GpuBackend
from .gpu_inventory import GpuInventory
from .gpu_processes import GpuProcessTable
from .ingest.listener import IngestServer
from .ingest.state import IngestSource, IngestState
from .runner import SourceRunner
from .sources.base import Source
from .sources.dcgm import DcgmSource
from .sources.flight import FlightSource
from .sources.host import HostSource
from .sources.nvml import NvmlSource
from .sources.process import ProcessSource
from .store import Store

log = logging.getLogger(__name__)


def make_backend(config: Config) -> GpuBackend:
    """The real NVML library unless simulated GPUs were asked for explicitly."""
    sim = config.simulate
    if sim.gpus > 0:
        from .gpu.simulated import SimulatedGpus

        log.warning("using %d SIMULATED GPUs (seed %d): these are not real measurements", sim.gpus, sim.seed)
        return SimulatedGpus(sim.gpus, seed=sim.seed, pattern=sim.pattern, busy=sim.busy, idle=sim.idle)
    from .gpu.nvml_lib import NvmlLibrary

    return NvmlLibrary()


def make_dcgm_backend(config: Config, gpus: GpuBackend) -> DcgmBackend:
    """DCGM's own bindings, or the simulated DCGM over simulated GPUs (a peer, chosen here only)."""
    from .gpu.simulated import SimulatedGpus

    if isinstance(gpus, SimulatedGpus):
        from .dcgm.simulated import SimulatedDcgm

        return SimulatedDcgm(gpus)
    from .dcgm.bindings import DcgmBindings

    return DcgmBindings(config.dcgm.bindings_path, config.dcgm.hostengine)


def _process_metrics() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


class Daemon:
    """Everything but the HTTP server. `start()` launches the sources; `stop()` ends them."""

    def __init__(self, config: Config, backend: GpuBackend | None = None,
                 dcgm_backend: DcgmBackend | None = None) -> None:
        self.config = config
        self.backend = backend if backend is not None else make_backend(config)
        self.dcgm_backend = dcgm_backend
        self.gpu_processes = GpuProcessTable()
        self.gpu_inventory = GpuInventory()
        self._process_registry = _process_metrics()
        self.store = Store(extra=self._render_process_metrics)
        self.ingest_state: IngestState | None = None
        self.ingest_source: IngestSource | None = None
        self.ingest_server: IngestServer | None = None
        if config.ingest.enabled:
            ingest = config.ingest
            self.ingest_state = IngestState(ingest.max_workloads, ingest.max_ranks, ingest.idle_timeout)
            self.ingest_source = IngestSource(self.ingest_state)
            self.ingest_server = IngestServer(ingest, self.ingest_state)  # reads the token: ConfigError
        self._self_lock = threading.Lock()
        self._stop = threading.Event()
        self.runners: dict[str, SourceRunner] = {}
        for name, source_config in config.sources().items():
            if not source_config.enabled:
                log.info("source %s is disabled", name)
                continue
            source = self._make_source(name)
            self.runners[name] = SourceRunner(
                source, source_config.interval, source_config.timeout,
                publish=self.store.publish, on_done=self.publish_self_metrics)
        self.publish_self_metrics()

    def _make_source(self, name: str) -> Source:
        if name == "nvml":
            return NvmlSource(self.backend, self.gpu_processes, inventory=self.gpu_inventory)
        if name == "dcgm":
            dcgm = self.config.dcgm
            if dcgm.mode == "bindings" and self.dcgm_backend is None:
                self.dcgm_backend = make_dcgm_backend(self.config, self.backend)
            return DcgmSource(dcgm, self.dcgm_backend, self.gpu_inventory,
                              nvml_enabled=self.config.nvml.enabled)
        if name == "host":
            return HostSource(self.gpu_processes, proc_path=self.config.host.proc_path)
        if name == "ingest" and self.ingest_source is not None:
            return self.ingest_source
        if name == "flight":
            return FlightSource(self.config.flight)
        if name == "kubelet":
            # imported here: grpc and protobuf cost about 15 MB and 40 ms, and the source is off by default
            from .sources.kubelet import KubeletSource

            return KubeletSource(self.config.kubelet, self.gpu_processes)
        if name == "process":
            declared = self.ingest_state.declared if self.ingest_state is not None else None
            return ProcessSource(self.gpu_processes, proc_path=self.config.host.proc_path, declared=declared)
        raise ValueError(f"unknown source {name}")

    def start(self) -> None:
        if self.ingest_server is not None and self.ingest_source is not None:
            try:
                self.ingest_server.start()
            except OSError as exc:  # metrics keep being served; the ingest source reports why it is down
                log.error("ingest: %s; training jobs cannot report to this node", exc)
                self.ingest_source.listen_error = str(exc)
        for runner in self.runners.values():
            runner.start()
        if self.config.simulate.gpus and self.config.simulate.faults:
            from .gpu.simulated import SimulatedGpus, schedule_faults

            if isinstance(self.backend, SimulatedGpus):
                schedule_faults(self.backend, self.config.simulate.faults, self._stop)

    def stop(self) -> None:
        self._stop.set()
        if self.ingest_server is not None:
            self.ingest_server.stop()
        for runner in self.runners.values():
            runner.stop()

    def ready(self) -> dict[str, bool]:
        """Per enabled source: has it finished its first collection?"""
        return {name: runner.completed.is_set() for name, runner in self.runners.items()}

    def publish_self_metrics(self) -> None:
        with self._self_lock:
            batch = Batch()
            batch.add(c.BUILD_INFO, (__version__, platform.python_version(), self.backend.name), 1)
            for name, runner in self.runners.items():
                labels = (name,)
                batch.add(c.SOURCE_UP, labels, 1 if runner.up else 0)
                if runner.last_duration is not None:
                    batch.add(c.SOURCE_DURATION, labels, runner.last_duration)
                if runner.last_success is not None:
                    batch.add(c.SOURCE_LAST_SUCCESS, labels, runner.last_success)
                batch.add(c.SOURCE_COLLECTIONS, labels, runner.collections)
                for reason, count in sorted(runner.errors.items()):
                    batch.add(c.SOURCE_ERRORS, (name, reason), count)
            self.store.publish("exporter", batch)

    def _render_process_metrics(self, fmt: str) -> bytes:
        if fmt == OPENMETRICS:
            return om_latest(self._process_registry).removesuffix(b"# EOF\n")
        return text_latest(self._process_registry)
