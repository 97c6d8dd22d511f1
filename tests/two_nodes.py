"""The stack the job-level tests run real jobs on: the demo's two daemons (node A, node B) and one Prometheus (with
Alertmanager) over both, the shipped rules at the demo's short settings, and no simulated job or serving engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from goodput_mixin.demo.stack import Ports, Stack


@contextlib.contextmanager
def two_nodes(workdir: Path, gpus: int = 1, **options: object) -> Iterator[Stack]:
    """Started, and stopped at the end; `options` go to Stack (settings, flight_stale_after, ...)."""
    live = Stack(workdir, Ports.free(), gpus=gpus, ranks=0, nodes=2, job=False, serving=False,
                 **options).start()  # type: ignore[arg-type]
    try:
        yield live
    finally:
        live.stop()
