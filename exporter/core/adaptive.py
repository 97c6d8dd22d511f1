"""Adaptive collection intervals: how much a source's batches change, and the interval that follows from it.

The runner stays generic: it knows no source's series, only what the catalog says of each metric (its kind and
unit). After each successful collection the batch is measured metric by metric, on one figure per metric, the sum
of its series (one C-level pass over the rows: about 60 µs for the nvml source's 1,224 series on 8 GPUs, against
550 µs for the collection itself, where Python code per series cost 350 µs):

* a gauge's figure is its sum. A counter always moves, so its value says nothing; its rate does (a GPU's busy
  share, a link's traffic): the figure is the rate of its sum over the last interval, and a reset (the sum going
  backwards) is a change. A histogram is a counter of its observations; an info series (always 1) changes only by
  its label sets;
* the figure changed when it left the range of its recent figures by more than TOLERANCE: 5% of its size, or 5
  points per series for a `ratio` gauge and a `seconds` counter (whose rate is a share of time: 0.001 -> 0.002 of
  a 0-1 share is no news). The recent range is the lowest and highest figure of the last MEMORY / 2 to MEMORY
  seconds (two windows of MEMORY / 2, the older dropped as a new one starts). Comparing with the range rather
  than with the previous figure is what tells a lasting change from a workload's texture: a training job's data
  stalls empty its GPUs every few seconds, and a plain comparison with the last batch reads each stall as fast
  change and holds such a job at min_interval for good; once seen, the next stall is inside the range. A level
  not seen for a minute or two (a job starting or ending, a checkpoint pause longer than the stalls) is outside;
* a metric that appeared, disappeared or changed its number of series changed.

The share of changed metrics is the change measure. Above FAST_SHARE the interval halves (not below
min_interval); at STEADY_SHARE or below for STEADY_RUNS collections in a row it grows by GROWTH (not above
max_interval); in between it holds. A boost (a capture is running) holds min_interval until it ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from operator import itemgetter

from .catalog import Kind, Metric
from .exposition import Batch

TOLERANCE = 0.05  # a move beyond the recent range, relative to the figure (or absolute per series, for shares)
EPSILON = 1e-9  # moves smaller than this never count (figures near 0)
MEMORY = 120.0  # seconds: a level seen within the last MEMORY / 2 to MEMORY seconds is within the range
RESCALED = 0.1  # the interval shortened by more than this share: counters' ranges widen (see `_widen`)
FAST_SHARE = 0.10  # more of the metrics than this changed: the signals change fast, halve the interval
STEADY_SHARE = 0.0  # this share or less changed: a steady collection
STEADY_RUNS = 5  # steady collections in a row before the interval grows
GROWTH = 1.5  # the interval's growth after STEADY_RUNS steady collections
SHRINK = 0.5  # the interval's factor after a fast-changing collection

_SHARE_UNITS = {Kind.GAUGE: frozenset({"ratio"}), Kind.COUNTER: frozenset({"seconds"}),
                Kind.HISTOGRAM: frozenset()}
_value = itemgetter(1)


class _Figure:
    """One metric's state: its series count, last sum (counters), and its figures' range in the current window
    and the one before."""

    __slots__ = ("count", "hi", "kind", "labels", "lo", "old_hi", "old_lo", "share", "total")

    def __init__(self, kind: Kind, count: int, total: float, labels: frozenset[tuple[str, ...]] | None,
                 share: bool) -> None:
        self.kind = kind
        self.count = count
        self.total = total
        self.labels = labels
        self.share = share  # judged on absolute moves per series
        self.lo = self.hi = self.old_lo = self.old_hi = math.nan  # no figure yet (a counter's needs two batches)

    def start(self, level: float) -> None:
        self.lo = self.hi = self.old_lo = self.old_hi = level


class ChangeMeter:
    """Measures each batch of a source against the recent ones."""

    def __init__(self) -> None:
        self._figures: dict[Metric, _Figure] = {}
        self._at: float | None = None
        self._elapsed = 0.0  # seconds between the last two batches
        self._window = 0.0  # when the current window began

    def reset(self) -> None:
        """Forget the past batches (after a failed collection: rates across the gap mean nothing)."""
        self._figures = {}
        self._at = None

    def _widen(self, factor: float) -> None:
        """The interval shortened by `factor`: a rate over a shorter window strays further from its mean (a stall
        of the same length is a larger share of it), so the counters' ranges, learned over longer windows, are
        widened around their middles by as much. Without this, a shorter interval reads the workload's own
        texture as news and shortens again, down to min_interval. A longer interval needs nothing: rates over
        longer windows stray less, and the range learned before is wide enough."""
        for figure in self._figures.values():
            if figure.kind is Kind.GAUGE or figure.lo != figure.lo:
                continue
            for low, high in (("lo", "hi"), ("old_lo", "old_hi")):
                lo, hi = getattr(figure, low), getattr(figure, high)
                middle, half = (lo + hi) / 2, (hi - lo) / 2 * factor
                setattr(figure, low, middle - half)
                setattr(figure, high, middle + half)

    def measure(self, batch: Batch, at: float) -> float | None:
        """Share (0-1) of the batch's metrics that changed, for a batch taken at `at` (seconds, any monotonic
        clock); None for the first batch after a start or a reset. Remembers `batch` for the next call."""
        figures = self._figures
        first = self._at is None
        elapsed = 0.0 if self._at is None else at - self._at
        if 0 < elapsed < (1 - RESCALED) * self._elapsed:
            self._widen(self._elapsed / elapsed)
        self._at, self._elapsed = at, elapsed
        turn = first or at - self._window >= MEMORY / 2  # a new window: the current one becomes the old one
        if turn:
            self._window = at
        changed = total = 0
        present = set()
        for metric, rows in batch.series.items():
            count = len(rows)
            if not count:
                continue
            present.add(metric)
            total += 1
            kind = metric.kind
            labels = None
            if kind is Kind.INFO:
                labels = frozenset(map(itemgetter(0), rows))
                figure_sum = 0.0
            elif kind is Kind.HISTOGRAM:
                figure_sum = float(sum(value[0][-1] for _, value in rows))
            else:
                figure_sum = float(sum(map(_value, rows)))
            old = figures.get(metric)
            if old is None or old.count != count or old.labels != labels:
                if not first:
                    changed += 1
                figure = figures[metric] = _Figure(kind, count, figure_sum, labels,
                                                   metric.unit in _SHARE_UNITS.get(kind, ()))
                if kind is Kind.GAUGE:
                    figure.start(figure_sum)
                continue
            if kind is Kind.INFO:
                continue
            if kind is Kind.GAUGE:
                level = figure_sum
            else:
                if figure_sum < old.total:  # a reset
                    changed += 1
                    old.total = figure_sum
                    old.lo = old.hi = old.old_lo = old.old_hi = math.nan
                    continue
                level = (figure_sum - old.total) / elapsed if elapsed > 0 else 0.0
                old.total = figure_sum
            if not math.isfinite(level):
                continue
            lo, hi = old.lo, old.hi
            if lo != lo:  # NaN: a counter's first rate
                old.start(level)
                continue
            low, high = min(lo, old.old_lo), max(hi, old.old_hi)
            if level < low or level > high:
                tol = TOLERANCE * count if old.share else TOLERANCE * max(abs(low), abs(high), abs(level))
                if (low - level if level < low else level - high) > max(tol, EPSILON):
                    changed += 1
            if turn:
                old.old_lo, old.old_hi, old.lo, old.hi = lo, hi, level, level
            elif level < lo:
                old.lo = level
            elif level > hi:
                old.hi = level
        if len(present) != len(figures):
            for metric in [metric for metric in figures if metric not in present]:
                del figures[metric]
                changed += 1
                total += 1
        if first:
            return None
        return changed / total if total else 0.0


class Cadence:
    """The interval a source runs at now: fixed (`adaptive` off: always `interval`), or adapted to how fast its
    batches change, within [min_interval, max_interval], starting at `interval`."""

    def __init__(self, interval: float, adaptive: bool = False, min_interval: float | None = None,
                 max_interval: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.base = interval
        self.adaptive = adaptive
        self.min_interval = interval if min_interval is None else min_interval
        self.max_interval = interval if max_interval is None else max_interval
        if not self.min_interval <= interval <= self.max_interval:
            raise ValueError(f"need min_interval {self.min_interval:g} <= interval {interval:g} <= "
                             f"max_interval {self.max_interval:g}")
        self._clock = clock
        self._adapted = interval  # the interval the batches ask for, boost aside
        self._steady = 0  # steady collections in a row
        self._boosted_until = float("-inf")
        self.meter = ChangeMeter()
        self.last_share: float | None = None

    @property
    def interval(self) -> float:
        """Seconds until the next collection."""
        if not self.adaptive:
            return self.base
        if self._clock() < self._boosted_until:
            return self.min_interval
        return self._adapted

    def boost(self, seconds: float) -> bool:
        """Hold min_interval for `seconds` from now (longer boosts already running are kept). False, and nothing
        done, when the source is not adaptive."""
        if not self.adaptive:
            return False
        self._boosted_until = max(self._boosted_until, self._clock() + seconds)
        return True

    def collected(self, batch: Batch, at: float) -> None:
        """After a successful collection taken at `at` (the runner's monotonic clock)."""
        if not self.adaptive:
            return
        share = self.last_share = self.meter.measure(batch, at)
        if share is None:
            return
        if share > FAST_SHARE:
            self._steady = 0
            self._adapted = max(self.min_interval, self._adapted * SHRINK)
        elif share <= STEADY_SHARE:
            self._steady += 1
            if self._steady >= STEADY_RUNS:
                self._steady = 0
                self._adapted = min(self.max_interval, self._adapted * GROWTH)
        else:
            self._steady = 0

    def failed(self) -> None:
        """After a failed collection: the interval holds, the next batch starts a new comparison."""
        if self.adaptive:
            self._steady = 0
            self.meter.reset()
