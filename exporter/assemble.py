"""Builds the daemon from a Config: the GPU backend, then every enabled source of the registry, in order."""

from __future__ import annotations

import logging
from typing import Any

from .config import Config
from .core.connections import OPEN_FILES
from .core.daemon import Daemon, Scheduled
from .core.gpus import NodeGpus
from .sources import SOURCES
from .sources.base import Node
from .sources.fabric.backends import simulated_fabric
from .sources.nvml.backends import fault_schedule, make_backend

log = logging.getLogger(__name__)


def build_daemon(config: Config, backend: Any = None, dcgm_backend: Any = None, fabric: Any = None) -> Daemon:
    """`backend`/`dcgm_backend`/`fabric`: GPU and DCGM backends and a sysfs view to use instead of the ones the
    config names (tests). May raise ConfigError (e.g. an unreadable token file), before anything binds a port."""
    gpu_backend = backend if backend is not None else make_backend(config.simulate)
    if fabric is None:
        fabric = simulated_fabric(gpu_backend, config.simulate)
    node = Node(config=config, gpu_backend=gpu_backend, gpus=NodeGpus(), dcgm_backend=dcgm_backend, fabric=fabric)
    scheduled = []
    for spec in SOURCES:
        settings = getattr(config, spec.name)
        if not settings.enabled:
            log.info("source %s is disabled", spec.name)
            continue
        scheduled.append(Scheduled(spec.build(node, settings), settings.interval, settings.timeout, settings.adaptive,
                                   settings.min_interval, settings.max_interval))
    faults = fault_schedule(node.gpu_backend, config.simulate, node.fabric)
    daemon = Daemon(scheduled, node.gpu_backend.name, order=[spec.name for spec in SOURCES],
                    on_start=[faults] if faults else [], http_servers=lambda: OPEN_FILES.servers)
    node.boost = lambda seconds: [daemon.boost(name, seconds) for name in daemon.runners]
    return daemon
