"""Text renderers for Prometheus 0.0.4 and OpenMetrics 1.0 exposition.

Rendering is done from a `Batch` (what one source collected) into bytes once per collection, off the
scrape path. prometheus-client's `generate_latest` walks registry objects on every call and is too
slow to run per scrape at our series counts, so series are kept as plain tuples and their label
strings are cached between collections.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .catalog import CATALOG, Kind, Metric

TEXT = "text"
OPENMETRICS = "openmetrics"
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}
_ORDER = {name: i for i, name in enumerate(CATALOG)}


class Batch:
    """Series one source collected in one pass, keyed by catalog metric."""

    __slots__ = ("errors", "series")

    def __init__(self) -> None:
        self.series: dict[Metric, list[tuple[tuple[str, ...], Any]]] = {}
        self.errors: list[str] = []  # non-fatal problems met while collecting, as error reasons

    def add(self, metric: Metric, labels: tuple[str, ...], value: Any) -> None:
        """`value` is a number; for a histogram, (cumulative bucket counts incl. +Inf, sum)."""
        if len(labels) != len(metric.labels):
            raise ValueError(f"{metric.name}: expected labels {metric.labels}, got {labels!r}")
        rows = self.series.get(metric)
        if rows is None:
            rows = self.series[metric] = []
        rows.append((labels, value))

    def values(self, metric: Metric) -> dict[tuple[str, ...], Any]:
        return dict(self.series.get(metric, ()))

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.series.values())


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _label_text(metric: Metric, labels: tuple[str, ...]) -> str:
    """`k1="v1",k2="v2"` for the metric's label names and these values (empty without labels)."""
    return ",".join(f'{k}="{_escape_label(v)}"' for k, v in zip(metric.labels, labels, strict=True))


def _escape_help(text: str, fmt: str) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if fmt == OPENMETRICS else text


def format_value(value: float) -> str:
    if isinstance(value, int):  # bool and other int subclasses too
        return str(int(value))
    if value != value:  # NaN
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class Renderer:
    """Renders batches; caches each series' `name{labels}` prefix across renders."""

    def __init__(self) -> None:
        self._prefix: dict[tuple[str, tuple[str, ...]], str] = {}

    def _series_prefix(self, name: str, metric: Metric, labels: tuple[str, ...]) -> str:
        key = (name, labels)
        prefix = self._prefix.get(key)
        if prefix is None:
            inner = _label_text(metric, labels)
            prefix = f"{name}{{{inner}}} " if inner else f"{name} "
            if len(self._prefix) > 200_000:  # bound the cache if label values churn
                self._prefix.clear()
            self._prefix[key] = prefix
        return prefix

    def _histogram(self, out: list[str], metric: Metric, rows: list) -> None:  # type: ignore[type-arg]
        """Rows hold (cumulative bucket counts incl. +Inf, sum); `le` comes from the catalog."""
        bounds = [format_value(float(b)) if b != int(b) else f"{b:.1f}" for b in metric.buckets] + ["+Inf"]
        name = metric.name
        for labels, (counts, total) in rows:
            inner = _label_text(metric, labels)
            sep = "," if inner else ""
            for le, count in zip(bounds, counts, strict=True):
                out.append(f'{name}_bucket{{{inner}{sep}le="{le}"}} {format_value(count)}\n')
            suffix = f"{{{inner}}} " if inner else " "
            out.append(f"{name}_sum{suffix}{format_value(total)}\n")
            out.append(f"{name}_count{suffix}{format_value(counts[-1])}\n")

    def render(self, batch: Batch, fmt: str) -> bytes:
        out: list[str] = []
        for metric in sorted(batch.series, key=lambda m: _ORDER[m.name]):
            rows = batch.series[metric]
            if not rows:
                continue
            out.append(header(metric, fmt))
            name = metric.name
            if metric.kind is Kind.HISTOGRAM:
                self._histogram(out, metric, rows)
                continue
            for labels, value in rows:
                out.append(self._series_prefix(name, metric, labels) + format_value(value) + "\n")
        # Label values come from the system (process names, device names): never fail on bad bytes.
        return "".join(out).encode("utf-8", errors="replace")


def header(metric: Metric, fmt: str) -> str:
    if fmt == OPENMETRICS:
        family = metric.family
        lines = f"# HELP {family} {_escape_help(metric.help, fmt)}\n# TYPE {family} {metric.kind.value}\n"
        if metric.unit and metric.unit != "ratio" and family.endswith("_" + metric.unit):
            lines += f"# UNIT {family} {metric.unit}\n"
        return lines
    kind = "gauge" if metric.kind is Kind.INFO else metric.kind.value
    return f"# HELP {metric.name} {_escape_help(metric.help, fmt)}\n# TYPE {metric.name} {kind}\n"


def join(parts: Iterable[bytes], fmt: str) -> bytes:
    body = b"".join(parts)
    if fmt == OPENMETRICS:
        body += b"# EOF\n"
    return body
