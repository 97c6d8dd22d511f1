"""What a metric is, and how a source declares its own.

Each source declares its metrics in its own `metrics.py` through a `Declarer` for its name; the registry
(`exporter.sources`) gathers every source's metrics and the exporter's own into the one catalog that the
renderer, the generated reference (`docs/metrics.md`) and the tests read. A metric that is not declared
cannot be emitted: a Batch only takes declared `Metric` objects.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"
    HISTOGRAM = "histogram"


_ORDER = itertools.count()

# Labels every per-GPU series starts with.
GPU = ("gpu", "uuid")


@dataclass(frozen=True, eq=False)  # identity hash: one object per metric, hashed per series
class Metric:
    name: str
    kind: Kind
    unit: str  # unit as in the name suffix ("seconds", "bytes", "bytes_per_second", ...) or "" for none
    help: str
    labels: tuple[str, ...]
    source: str
    buckets: tuple[float, ...] = ()  # histogram upper bounds, +Inf implied
    # declaration order: the order series are rendered in and listed in the reference
    order: int = field(default_factory=lambda: next(_ORDER), compare=False)

    @property
    def family(self) -> str:
        """OpenMetrics family name: counters drop `_total`, infos drop `_info`."""
        if self.kind is Kind.COUNTER:
            return self.name.removesuffix("_total")
        if self.kind is Kind.INFO:
            return self.name.removesuffix("_info")
        return self.name


class Declarer:
    """Declares the metrics of one source, in order: `_m = Declarer("nvml")`, then `X = _m(...)` per metric,
    and `METRICS = _m.metrics` once at the end of the module."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._metrics: list[Metric] = []

    def __call__(self, name: str, kind: Kind, unit: str, help: str, labels: tuple[str, ...],
                 buckets: tuple[float, ...] = ()) -> Metric:
        if any(m.name == name for m in self._metrics):
            raise ValueError(f"metric {name} declared twice")
        metric = Metric(name, kind, unit, help, labels, self.source, buckets)
        self._metrics.append(metric)
        return metric

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return tuple(self._metrics)


def gather(groups: list[tuple[Metric, ...]]) -> dict[str, Metric]:
    """name -> Metric over every group, refusing a name declared by two sources."""
    catalog: dict[str, Metric] = {}
    for group in groups:
        for metric in group:
            if metric.name in catalog:
                raise ValueError(f"metric {metric.name} declared by {catalog[metric.name].source} and {metric.source}")
            catalog[metric.name] = metric
    return catalog
