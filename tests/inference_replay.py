"""A replay server for the serving engines' `/metrics`: each target serves one exposition, evolving in time, for
Prometheus to scrape (tests/test_inference_live.py).

An `Exposition` keeps every line of its text: comments, HELP/TYPE lines, metric names, label names, label order
and `le` spellings exactly as written. Only the sample values change:
- a counter, and every `_bucket`, `_count` and `_sum` of a histogram, grows linearly from its value in the text:
  value + slope * t;
- a gauge holds a value chosen for it.
The slopes and values come from a `Chooser` (the test's choice). A histogram's slopes are chosen per bucket,
non-cumulative, then summed in `le` order, so every bucket stays cumulative and monotonic; `_count` takes the
slope of `+Inf` (where the text has it) and `_sum` that of the observations' mean times the count.

Time steps once per scrape: a target's n-th scrape (counted from its first, by the clock: n = round(elapsed /
interval)) serves t = OFFSET + n * interval. Prometheus aligns its scrape timestamps to the interval (up to
--scrape.timestamp-tolerance), so each sample's value is exactly linear in its timestamp and a rate over a window
full of samples is the slope to within float rounding. OFFSET puts the text's values in the past, so that no
counter looks newly started (Prometheus stops a rate's extrapolation where a counter would reach zero).

Builders: `catalog_exposition` writes one from mixin/goodput_mixin/rules/engines.py's catalog (names, labels,
buckets) in the engine's client library's format; `tgi_exposition` is TGI's, as its Rust exporter
(metrics-exporter-prometheus 0.15) prints it: no `_total` on counters, integer counts, `le` and values in Rust's
f64 Display (shortest round trip, never an exponent, no ".0" on integers). No real TGI exposition was found
(tests/serving_corpus/PROVENANCE.md), so that one is constructed.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

OFFSET = 100.0  # replayed seconds at a target's first scrape
INF = "+Inf"

Labels = tuple[tuple[str, str], ...]


# --- number formats ----------------------------------------------------------------------------------------------

def python_float(value: float) -> str:
    """prometheus_client's floatToGoString, for the values used here: repr, "+Inf"."""
    if math.isinf(value):
        return INF if value > 0 else "-Inf"
    return repr(float(value))


def rust_float(value: float) -> str:
    """Rust's f64 Display: the shortest decimal that round-trips, never an exponent, integers without ".0"."""
    if math.isinf(value):
        return INF if value > 0 else "-Inf"
    if value == int(value):
        return str(int(value))
    text = repr(float(value))
    return format(Decimal(text), "f") if "e" in text else text


def le_value(le: str) -> float:
    return math.inf if le == INF else float(le)


# --- the test's choice of slopes and values ----------------------------------------------------------------------

@dataclass
class Chooser:
    """Slopes (per second) and gauge values, drawn from a seeded generator per series, so that a test can compute
    what a rule should give from the numbers alone. All are multiples of 1/4 (integers with `integer`): sums of
    them are exact in floats. `gauges` and `histograms` override by metric name: a gauge's value; a histogram's
    non-cumulative per-bucket slopes, given its `le` spellings in order; `counters` a counter's slope."""

    seed: str
    integer: bool = False
    scale: float = 1.0  # every slope times this (a second replica of a server, twice as busy)
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # a counter's slope, by name
    histograms: dict[str, Callable[[list[str]], list[float]]] = field(default_factory=dict)

    def _rng(self, *key: object) -> random.Random:
        return random.Random(f"{self.seed}|{key!r}")

    def _step(self, rng: random.Random, low: int, high: int) -> float:
        return float(rng.randint(low, high)) if self.integer else rng.randint(low * 4, high * 4) / 4

    def counter(self, name: str, labels: Labels) -> float:
        if name in self.counters:
            return self.counters[name] * self.scale
        return self._step(self._rng("c", name, labels), 1, 40) * self.scale

    def gauge(self, name: str, labels: Labels) -> float:
        if name in self.gauges:
            return self.gauges[name]
        rng = self._rng("g", name, labels)
        if "usage" in name or "perc" in name:  # a ratio 0..1
            return rng.randint(1, 15) / 16
        return float(rng.randint(0, 30))

    def buckets(self, base: str, labels: Labels, les: list[str]) -> list[float]:
        """Non-cumulative slopes of the buckets `les` (in `le` order); some zero, the last one not."""
        if base in self.histograms:
            chosen = self.histograms[base](les)
        else:
            rng = self._rng("h", base, labels)
            chosen = [0.0 if rng.random() < 0.3 else self._step(rng, 1, 3) for _ in les]
            if chosen:
                chosen[-1] = chosen[-1] or self._step(rng, 1, 3)
        return [c * self.scale for c in chosen]

    def extra(self, base: str, labels: Labels) -> float:
        """Slope of the observations above the last bucket shown, where `+Inf` is not (a partial histogram)."""
        return self._step(self._rng("x", base, labels), 0, 3) * self.scale


# --- one exposition -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    """One sample line: its name and labels as written, its value in the text, and how it evolves."""

    name: str
    labels: Labels
    kind: str  # "counter" (histogram parts included) | "gauge"
    start: float  # the value in the text
    slope: float  # per second; 0 for a gauge
    value: float  # a gauge's value (counters: unused)
    integer: bool = False  # printed as an integer (Rust's u64 counts)

    def at(self, t: float) -> float:
        return self.value if self.kind == "gauge" else self.start + self.slope * t

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")
_SUFFIXES = ("_bucket", "_count", "_sum")


class Exposition:
    """A text exposition whose sample values evolve; see the module docstring."""

    def __init__(self, text: str, chooser: Chooser, *, rust: bool = False,
                 kinds: dict[str, str] | None = None) -> None:
        """`kinds`: metric name (histograms: without suffix) -> counter | gauge | histogram | summary, for sample
        lines the text gives no TYPE for (excerpts); else a name's suffix decides (_bucket, _count, _sum, _total:
        counter-like; anything else a gauge)."""
        self.rust = rust
        self.lines: list[str | tuple[str, int]] = []  # a line kept as is, or (prefix, index of its series)
        parsed: list[tuple[str, Labels, float, str]] = []
        types = dict(kinds or {})
        for line in text.splitlines():
            if match := _TYPE.match(line):
                types[match.group(1)] = match.group(2)
            if not line.strip() or line.startswith("#"):
                self.lines.append(line)
                continue
            prefix, written = line.rsplit(" ", 1)
            (family,) = text_string_to_metric_families(line + "\n")
            (sample,) = family.samples
            assert sample.value == float(written), line
            self.lines.append((prefix, len(parsed)))
            parsed.append((sample.name, tuple(sample.labels.items()), sample.value, self._kind(sample.name, types)))
        self.series: list[Series] = self._evolve(parsed, chooser)
        self.by_key = {(s.name, s.labels): s for s in self.series}

    @staticmethod
    def _kind(name: str, types: dict[str, str]) -> str:
        if name in types:
            return "counter" if types[name] == "counter" else "gauge"
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) in ("histogram", "summary", None):
                return "histogram"
        if name.endswith("_total") and types.get(name[:-6], "counter") == "counter":
            return "counter"
        return "gauge"

    def _evolve(self, parsed: list[tuple[str, Labels, float, str]], chooser: Chooser) -> list[Series]:
        slopes: dict[int, float] = {}
        # histograms: group the parts of each (base name, labels but le)
        groups: dict[tuple[str, Labels], dict[str, int]] = {}
        for i, (name, labels, _, kind) in enumerate(parsed):
            if kind != "histogram":
                continue
            base, suffix = next((name[: -len(s)], s) for s in _SUFFIXES if name.endswith(s))
            key = (base, tuple((k, v) for k, v in labels if k != "le"))
            part = dict(labels).get("le", "") if suffix == "_bucket" else suffix
            groups.setdefault(key, {})[part] = i
        for (base, labels), parts in groups.items():
            les = sorted((p for p in parts if not p.startswith("_")), key=le_value)
            increments = chooser.buckets(base, labels, les)
            # observations of a bucket taken at half its bound, of +Inf (and above a partial one) at twice the last
            top = 2 * max([le_value(le) for le in les if le != INF] or [1.0])
            cumulative = total = 0.0
            for le, inc in zip(les, increments, strict=True):
                cumulative += inc
                slopes[parts[le]] = cumulative
                total += inc * (le_value(le) / 2 if le != INF else top)
            count = cumulative
            if INF not in les:
                extra = chooser.extra(base, labels)
                count += extra
                total += extra * top
            if "_count" in parts:
                slopes[parts["_count"]] = count
            if "_sum" in parts:
                slopes[parts["_sum"]] = total
        out = []
        for i, (name, labels, start, kind) in enumerate(parsed):
            if kind == "gauge":
                out.append(Series(name, labels, "gauge", start, 0.0, chooser.gauge(name, labels)))
                continue
            slope = slopes[i] if kind == "histogram" else chooser.counter(name, labels)
            integer = self.rust and not name.endswith("_sum")
            out.append(Series(name, labels, "counter", start, slope, 0.0, integer))
        return out

    def render(self, t: float) -> str:
        fmt = rust_float if self.rust else python_float
        out = []
        for line in self.lines:
            if isinstance(line, str):
                out.append(line)
                continue
            prefix, i = line
            series = self.series[i]
            value = series.at(t)
            out.append(f"{prefix} {int(value) if series.integer else fmt(value)}")
        return "\n".join(out) + "\n"


# --- builders -----------------------------------------------------------------------------------------------------

def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return f"{{{inner}}}" if inner else ""


@dataclass(frozen=True)
class Family:
    """One metric family to write: name as scraped (histograms without suffix), kind, label sets, buckets."""

    name: str
    kind: str  # counter | gauge | histogram
    label_sets: Sequence[dict[str, str]] = ({},)
    buckets: tuple[float, ...] = ()
    help: str = ""


def catalog_exposition(families: Sequence[Family], *, le_format: str = "python", sort_labels: bool = False,
                       help_lines: bool = True) -> str:
    """An exposition as the engine's client library writes it, every value 0 (the Exposition evolves them).
    python (prometheus_client): HELP/TYPE under the family name (a counter's without `_total`), `le` as repr,
    buckets then `_count` then `_sum`; `sort_labels`: label names sorted, as its multiprocess mode writes them
    (else `le` last). rust (metrics-exporter-prometheus): TYPE lines only, `le` in f64 Display, buckets then
    `_sum` then `_count`."""
    fmt = rust_float if le_format == "rust" else python_float
    zero = "0" if le_format == "rust" else "0.0"
    out: list[str] = []
    for family in families:
        declared = family.name[:-6] if family.kind == "counter" and family.name.endswith("_total") \
            and le_format == "python" else family.name
        if help_lines:
            out.append(f"# HELP {declared} {family.help or family.name}")
        out.append(f"# TYPE {declared} {family.kind}")
        for labels in family.label_sets:
            pairs = sorted(labels.items()) if sort_labels else list(labels.items())
            if family.kind != "histogram":
                out.append(f"{family.name}{_labels(pairs)} {zero}")
                continue
            for bound in (*family.buckets, math.inf):
                with_le = [*pairs, ("le", fmt(bound))]
                if sort_labels:
                    with_le.sort()
                out.append(f"{family.name}_bucket{_labels(with_le)} {zero}")
            tail = ("_sum", "_count") if le_format == "rust" else ("_count", "_sum")
            out += [f"{family.name}{suffix}{_labels(pairs)} {zero}" for suffix in tail]
    return "\n".join(out) + "\n"


def tgi_buckets(max_tokens: int) -> tuple[float, ...]:
    """router/src/server.rs: token-count histograms' bounds (max / 100) * k, k = 1..100, in f64."""
    return tuple((max_tokens / 100.0) * k for k in range(1, 101))


def tgi_exposition(duration_buckets: tuple[float, ...], max_input_tokens: int = 1024,
                   max_total_tokens: int = 2048) -> str:
    """TGI's router `/metrics` (v3.x), constructed from the catalog's TGI entry (engines.py) and the series its notes
    name: no real exposition was found. TGI registers no descriptions, so there are no HELP lines."""
    families = [
        Family("tgi_request_count", "counter"),
        Family("tgi_request_success", "counter"),
        Family("tgi_request_failure", "counter", [{"err": "validation"}, {"err": "generation"}]),
        Family("tgi_request_duration", "histogram", buckets=duration_buckets),
        Family("tgi_request_queue_duration", "histogram", buckets=duration_buckets),
        Family("tgi_request_mean_time_per_token_duration", "histogram", buckets=duration_buckets),
        Family("tgi_request_input_length", "histogram", buckets=tgi_buckets(max_input_tokens)),
        Family("tgi_request_generated_tokens", "histogram", buckets=tgi_buckets(max_total_tokens)),
        Family("tgi_batch_current_size", "gauge"),
        Family("tgi_batch_current_max_tokens", "gauge"),
        Family("tgi_queue_size", "gauge"),
    ]
    return catalog_exposition(families, le_format="rust", help_lines=False)


# --- the server ---------------------------------------------------------------------------------------------------

class ReplayServer:
    """One HTTP server on a loopback port; target NAME is served at /t/NAME."""

    def __init__(self, targets: dict[str, Exposition], interval: float = 1.0) -> None:
        self.targets = targets
        self.interval = interval
        self.first: dict[str, float] = {}  # target -> time.time() of its first scrape
        self.scrapes: dict[str, int] = dict.fromkeys(targets, 0)
        self._lock = threading.Lock()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.removeprefix("/t/")
                if not self.path.startswith("/t/") or name not in replay.targets:
                    self.send_error(404)
                    return
                body = replay.render(name).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="replay", daemon=True)

    def step(self, name: str) -> int:
        """The scrape's step: whole intervals since the target's first scrape."""
        now = time.time()
        with self._lock:
            first = self.first.setdefault(name, now)
            self.scrapes[name] += 1
        return round((now - first) / self.interval)

    def render(self, name: str) -> str:
        return self.targets[name].render(OFFSET + self.step(name) * self.interval)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/t/{name}"

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
