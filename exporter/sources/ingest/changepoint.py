"""A rank's step time: its normal level, the lasting shifts of that level, and its summaries at three scales.

The detector is Page's two-sided CUSUM (E. S. Page, "Continuous inspection schemes", Biometrika 41 (1954)
100-115) in its tabular form: a reference value k of half the smallest shift worth finding, a decision threshold
h in standard deviations (D. C. Montgomery, "Introduction to Statistical Quality Control", the chapter on the
cumulative sum chart). It runs on the logarithm of the step time, so that a shift is a ratio whatever a step's
length, and it is made robust because step times are neither Gaussian nor independent:

- the baseline is the median of the first `warmup` steps and the scale their median absolute deviation (times
  1.4826; F. R. Hampel, "The influence curve and its role in robust estimation", JASA 69 (1974) 383-393), so a
  slow first step or a checkpoint during the warmup sets neither;
- steps enter the sums through a running median of 5 (J. W. Tukey, "Exploratory Data Analysis", 1977): a
  checkpoint or an evaluation that takes 3-20x for one or two steps never reaches them, however large; and a
  step's excess is clipped to CLIP standard deviations, so a longer burst adds little;
- a sum over the threshold is confirmed by a second, plain test once it has lasted MIN_RUN steps: the median of
  the last MIN_RUN steps, and of the last half of them (the change is still there: not a burst that has passed),
  must differ by at least `min_ratio` from the median of the up to REFERENCE steps before the sum left zero
  (since the last shift). Step times on a real machine wander by a few percent over hundreds of steps, so the
  test compares with the level just before the change, not the warmup's. It is tried at each step while the sum
  stays over; a sum that fails it for MIN_RUN steps more was a burst, or a drift too small or too slow to be a
  shift: the baseline quietly becomes that level before it and the sums start again;
- after a shift the detector warms up again, from the MIN_RUN steps that showed it on, so the new level becomes
  the baseline and a later shift is measured from it (`baseline` shows the new level at once).

Slow trends that never make a step change are for the summaries: the last step, the median of the last minute,
and the median of the last hour's per-minute medians. Memory is bounded whatever the step rate (RECENT log step
times, MINUTE_CAP steps of the last minute, HOUR per-minute medians); an observe costs a few µs (bench/
changepoint.py). No I/O, no lock: the caller holds its own.
"""

from __future__ import annotations

import math
from collections import deque

# the defaults come from bench/changepoint.py on the real step times of bench/data/: the smallest min_ratio with
# no false alarm there and every shift of 10% or more found within 50 steps (shifts of 5% sit in those series' noise)
DEFAULT_THRESHOLD = 8.0  # h, in robust standard deviations of log step time
DEFAULT_MIN_RATIO = 0.06  # the smallest relative shift reported
DEFAULT_WARMUP = 30  # steps that set a baseline
MAX_WARMUP = 1000
SMOOTH = 5  # the running median's width: spikes of up to (SMOOTH - 1) / 2 steps never reach the sums
CLIP = 3.0  # a step adds at most this many robust standard deviations over k to a sum
MIN_RUN = 32  # steps a sum must have lasted before it can be a shift
REFERENCE = 256  # steps before a sum's run that are its reference level
MIN_SCALE = 0.005  # the scale's floor (log units, ~0.5%): steps timed to the same microsecond have a MAD of 0
RECENT = 512  # log step times kept to measure a shift's size, its reference, and warm up after it
MINUTE_CAP = 1024  # steps kept for the current minute's median: the last ones, at a high step rate
HOUR = 60  # per-minute medians kept
MAD_SIGMA = 1.4826  # MAD of a normal distribution -> its standard deviation


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class StepTimeDetector:
    """One rank's step-time change detector and summaries; `observe` each step's duration as it arrives."""

    def __init__(self, *, threshold: float = DEFAULT_THRESHOLD, min_ratio: float = DEFAULT_MIN_RATIO,
                 warmup: int = DEFAULT_WARMUP) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, not {threshold}")
        if not 0 <= min_ratio < 10:
            raise ValueError(f"min_ratio must be in [0, 10), not {min_ratio}")
        if not SMOOTH <= warmup <= MAX_WARMUP:
            raise ValueError(f"warmup must be in [{SMOOTH}, {MAX_WARMUP}] steps, not {warmup}")
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.warmup = warmup
        self._min_shift = math.log1p(min_ratio)  # in log units
        self._k = self._min_shift / 2
        self._level: float | None = None  # the baseline, log seconds
        self._scale = MIN_SCALE
        self._warming: list[float] = []  # log step times towards the next baseline
        self._provisional: float | None = None  # after a shift, the new level until the warmup sets it
        self._smooth: deque[float] = deque(maxlen=SMOOTH)
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._steps = 0  # steps observed (valid durations)
        self._epoch = 0  # the step count where the current level began (a shift's first step)
        self._reference: tuple[tuple[int, int], float] = ((0, 0), 0.0)  # ((direction, run start), its level)
        self._up = self._down = 0.0  # the CUSUM sums, log units
        self._up_since = self._down_since = 0  # the step count when each sum last left zero
        # summaries
        self._last: float | None = None
        self._minute: deque[tuple[float, float]] = deque(maxlen=MINUTE_CAP)  # (time, duration), last 60 s
        self._open_minute: int | None = None  # the minute (time // 60) the newest steps belong to
        self._minutes: deque[tuple[int, float]] = deque(maxlen=HOUR)  # (minute, its median), closed minutes

    @property
    def baseline(self) -> float | None:
        """The normal step time in seconds: the warmup's median, or after a shift the new level; None before the
        first warmup ends."""
        level = self._provisional if self._provisional is not None else self._level
        return None if level is None else math.exp(level)

    def observe(self, duration: float, now: float) -> int:
        """One step's duration (seconds) received at `now`: +1 when it confirms a lasting slowdown, -1 a lasting
        speed-up, else 0. Durations that are not positive and finite count in no summary and no sum."""
        if not (duration > 0 and math.isfinite(duration)):
            return 0
        self._summarize(duration, now)
        x = math.log(duration)
        self._steps += 1
        self._smooth.append(x)
        self._recent.append(x)
        if self._level is None or self._provisional is not None:
            self._warm(x)
            return 0
        filtered = _median(list(self._smooth))
        excess = filtered - self._level
        cap = self._k + CLIP * self._scale
        excess = max(-cap, min(cap, excess))
        if self._up == 0.0:
            self._up_since = self._steps
        if self._down == 0.0:
            self._down_since = self._steps
        self._up = max(0.0, self._up + excess - self._k)
        self._down = max(0.0, self._down - excess - self._k)
        limit = self.threshold * self._scale
        if self._up > limit:
            return self._confirm(+1)
        if self._down > limit:
            return self._confirm(-1)
        return 0

    def _confirm(self, direction: int) -> int:
        """A sum is over the threshold. Once it has lasted MIN_RUN steps, a shift if the last MIN_RUN steps, and
        the last half of them, differ by min_ratio from the level before the sum's run; checked at each step until
        the run is twice that long, and then the baseline becomes that level and the sums start again."""
        since = self._up_since if direction > 0 else self._down_since
        run = self._steps - since + 1
        if run < MIN_RUN:
            return 0
        recent = list(self._recent)
        if self._reference[0] != (direction, since):  # the steps before a run stay the same while it grows
            end = max(0, len(recent) - run)
            before = recent[max(0, end - REFERENCE, len(recent) - (self._steps - self._epoch + 1)):end]
            assert self._level is not None
            self._reference = ((direction, since), _median(before) if len(before) >= self.warmup else self._level)
        reference = self._reference[1]
        window = recent[-MIN_RUN:]
        level = _median(window)
        latest = _median(window[MIN_RUN // 2:])  # still there at the end: not a burst that has passed
        if min(level - reference, latest - reference) * direction >= self._min_shift:
            self._up = self._down = 0.0
            self._provisional = level
            self._epoch = self._steps - MIN_RUN + 1
            self._warming = window[-self.warmup:]
            if len(self._warming) >= self.warmup:
                self._settle()
            return direction
        if run >= 2 * MIN_RUN:
            self._level = reference
            self._up = self._down = 0.0
        return 0

    def _warm(self, x: float) -> None:
        self._warming.append(x)
        if len(self._warming) >= self.warmup:
            self._settle()

    def _settle(self) -> None:
        """The warmup is complete: its median is the baseline, its MAD the scale."""
        level = _median(self._warming)
        self._scale = max(MIN_SCALE, MAD_SIGMA * _median([abs(x - level) for x in self._warming]))
        self._level = level
        self._provisional = None
        self._warming = []
        self._up = self._down = 0.0

    def _summarize(self, duration: float, now: float) -> None:
        self._roll(now)
        self._last = duration
        self._minute.append((now, duration))
        if self._open_minute is None:
            self._open_minute = int(now // 60)

    def _roll(self, now: float) -> None:
        """Close the open minute once `now` is past it (its median joins the hour's), and drop steps older than a
        minute."""
        minute = int(now // 60)
        if self._open_minute is not None and minute > self._open_minute:
            start = self._open_minute * 60
            values = [d for t, d in self._minute if t >= start]
            if values:
                self._minutes.append((self._open_minute, _median(values)))
            self._open_minute = minute
        while self._minute and self._minute[0][0] <= now - 60:
            self._minute.popleft()

    def summaries(self, now: float) -> dict[str, float]:
        """{"last": the last step, "1m": the median of the steps of the last 60 s (at most the last MINUTE_CAP),
        "1h": the median of the per-minute medians of the last 60 minutes, the current one so far included (a job
        in its first minute has an hour of one minute)}, seconds; only those known."""
        self._roll(now)
        out: dict[str, float] = {}
        if self._last is not None:
            out["last"] = self._last
        if self._minute:
            out["1m"] = _median([d for _, d in self._minute])
        current = int(now // 60)
        hour = [m for minute, m in self._minutes if minute > current - HOUR]
        if self._open_minute == current:
            so_far = [d for t, d in self._minute if t >= current * 60]
            if so_far:
                hour.append(_median(so_far))
        if hour:
            out["1h"] = _median(hour)
        return out
