"""Text renderers for Prometheus 0.0.4 and OpenMetrics 1.0 exposition.

Rendering is done from a `Batch` (what one source collected) into bytes once per collection, off the
scrape path. prometheus-client's `generate_latest` walks registry objects on every call and is too
slow to run per scrape at our series counts, so series are kept as plain tuples and their label
strings are cached between collections, per metric and label values, with each metric's header.
A collection holds the GIL while it renders, and a scrape waits for it: the per-series loop is kept
to a dictionary lookup, the value's text and one concatenation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from .catalog import Kind, Metric

TEXT = "text"
OPENMETRICS = "openmetrics"
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
}


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

    @staticmethod
    def check(metric: Metric, labels: tuple[str, ...]) -> tuple[str, ...]:
        """`labels`, when they are one value per label of the metric (as `add` checks); else ValueError."""
        if len(labels) != len(metric.labels):
            raise ValueError(f"{metric.name}: expected labels {metric.labels}, got {labels!r}")
        return labels

    def rows(self, metric: Metric) -> list[tuple[tuple[str, ...], Any]]:
        """The metric's (labels, value) rows, for a source that appends many without a call per series. Each
        label tuple must have passed `check` for the metric: a source keeping its label tuples between
        collections checks them once, when it builds them. `prune` drops the metrics left without rows."""
        rows = self.series.get(metric)
        if rows is None:
            rows = self.series[metric] = []
        return rows

    def prune(self) -> None:
        """Forget the metrics that have no rows."""
        for metric in [metric for metric, rows in self.series.items() if not rows]:
            del self.series[metric]

    def values(self, metric: Metric) -> dict[tuple[str, ...], Any]:
        return dict(self.series.get(metric, ()))

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.series.values())


_LABEL_SPECIAL = re.compile('[\\\\"\n\ud800-\udfff]')
_LABEL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}


def _escape_one(match: re.Match[str]) -> str:
    ch = match.group()
    escaped = _LABEL_ESCAPES.get(ch)
    if escaped is not None:
        return escaped
    # a lone surrogate: a byte that was not UTF-8, kept by surrogateescape (U+DC80-U+DCFF: the byte as %XX), or a
    # stray one; written out, so that two values that differ only there stay two series
    code = ord(ch)
    return f"%{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"%u{code:04X}"


def _escape_label(value: str) -> str:
    """A label value as the exposition writes it: backslash, quote and newline escaped as the formats say, and what
    UTF-8 cannot encode written out rather than replaced."""
    return _LABEL_SPECIAL.sub(_escape_one, value) if _LABEL_SPECIAL.search(value) else value


def _label_text(metric: Metric, labels: tuple[str, ...]) -> str:
    """`k1="v1",k2="v2"` for the metric's label names and these values (empty without labels)."""
    return ",".join(f'{k}="{_escape_label(v)}"' for k, v in zip(metric.labels, labels, strict=True))


def _escape_help(text: str, fmt: str) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if fmt == OPENMETRICS else text


def format_value(value: float) -> str:
    if type(value) is not float:  # floats, the common case, go straight to the checks below
        if isinstance(value, int):  # bool and other int subclasses too
            return str(int(value))
        value = float(value)
    if value.is_integer():  # NaN and infinities are not integers
        return str(int(value)) if -1e15 < value < 1e15 else repr(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)

PREFIX_CACHE_SLACK = 1024  # prefixes of series gone that a Renderer keeps beyond those rendered last (see render)


class Renderer:
    """Renders batches; caches each series' `name{labels} ` prefix and each metric's header across renders."""

    def __init__(self) -> None:
        self._prefixes: dict[Metric, dict[tuple[str, ...], str]] = {}
        self._cached = 0  # prefixes held, over all metrics
        self._headers: dict[tuple[Metric, str], str] = {}

    def _new_prefix(self, metric: Metric, labels: tuple[str, ...], prefixes: dict[tuple[str, ...], str]) -> str:
        inner = _label_text(metric, labels)
        prefix = f"{metric.name}{{{inner}}} " if inner else f"{metric.name} "
        prefixes[labels] = prefix
        self._cached += 1
        return prefix

    def _header(self, metric: Metric, fmt: str) -> str:
        text = self._headers.get((metric, fmt))
        if text is None:
            text = self._headers[(metric, fmt)] = header(metric, fmt)
        return text

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

    def _forget_gone(self, batch: Batch, rendered: int) -> None:
        """Keep only the prefixes of the series just rendered, once those of series gone (label values that churn:
        workloads, ranks) outnumber them: the cache is sized by what is live."""
        if self._cached <= 2 * rendered + PREFIX_CACHE_SLACK:
            return
        kept = 0
        for metric, cached in list(self._prefixes.items()):
            rows = batch.series.get(metric)
            if not rows:
                del self._prefixes[metric]
                continue
            live = {labels: cached[labels] for labels, _ in rows if labels in cached}
            self._prefixes[metric] = live
            kept += len(live)
        self._cached = kept

    def render(self, batch: Batch, fmt: str) -> bytes:
        out: list[str] = []
        append = out.append
        rendered = 0
        for metric in sorted(batch.series, key=_order):
            rows = batch.series[metric]
            if not rows:
                continue
            append(self._header(metric, fmt))
            if metric.kind is Kind.HISTOGRAM:
                self._histogram(out, metric, rows)
                continue
            prefixes = self._prefixes.get(metric)
            if prefixes is None:
                prefixes = self._prefixes[metric] = {}
            known = prefixes.get
            rendered += len(rows)
            for labels, value in rows:
                prefix = known(labels)
                if prefix is None:
                    prefix = self._new_prefix(metric, labels, prefixes)
                # ints (most values) inline; format_value gives str(value) for them too
                append(f"{prefix}{value}\n" if type(value) is int else f"{prefix}{format_value(value)}\n")
        self._forget_gone(batch, rendered)
        # Label values come from the system (process names, device names): never fail on bad bytes.
        return "".join(out).encode("utf-8", errors="replace")


def _order(metric: Metric) -> int:
    return metric.order


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
