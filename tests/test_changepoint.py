"""The step-time change detector (exporter/sources/ingest/changepoint.py) on real recorded step times.

The series in bench/data/ are PyTorch training loops timed step by step on a CPU (bench/record_steps.py);
these tests inject the same kinds of spikes and shifts as bench/changepoint.py, but restate the injection
here, and hold the detector to the issue's acceptance on every series: no alarm from spikes alone, every
shift of 10% or more found within 50 steps. The data is fixed, so each run gives the same answer.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from exporter.sources.ingest.changepoint import DEFAULT_WARMUP, StepTimeDetector

DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
SERIES = sorted(path.stem for path in DATA.glob("*.txt"))
POSITIONS = (600, 1200, 1800, 2400)
START = 1_760_000_000.0


def recorded(name: str) -> list[float]:
    return [int(line) / 1e6 for line in (DATA / f"{name}.txt").read_text().splitlines()
            if line and not line.startswith("#")]


def spiked(durations: list[float]) -> list[float]:
    """A checkpoint step every 50 steps at 10x, and a two-step evaluation every 200 at 20x."""
    return [d * (10 if i % 50 == 49 else 1) * (20 if i % 200 in (125, 126) else 1) for i, d in enumerate(durations)]


def shifted(durations: list[float], ratio: float, at: int) -> list[float]:
    return [d * (1 + ratio) if i >= at else d for i, d in enumerate(durations)]


def feed(durations: list[float], detector: StepTimeDetector | None = None) -> list[tuple[int, int]]:
    """(index, direction) of each alarm, the durations themselves as the clock."""
    detector = detector or StepTimeDetector()
    now, out = START, []
    for i, duration in enumerate(durations):
        now += duration
        direction = detector.observe(duration, now)
        if direction:
            out.append((i, direction))
    return out


def test_there_are_recorded_series_to_test_on() -> None:
    assert len(SERIES) >= 3
    for name in SERIES:
        text = (DATA / f"{name}.txt").read_text()
        assert text.startswith("# "), f"{name}: the header that says how it was recorded"
        assert len(recorded(name)) > max(POSITIONS) + 100


@pytest.mark.parametrize("name", SERIES)
def test_spikes_alone_raise_no_alarm(name: str) -> None:
    durations = spiked(recorded(name))
    assert max(durations) / statistics.median(durations) > 15  # the spikes are there, and large
    assert feed(durations) == []


@pytest.mark.parametrize("ratio", [0.10, 0.30])
@pytest.mark.parametrize("name", SERIES)
def test_a_shift_of_10_percent_or_more_is_found_within_50_steps(name: str, ratio: float) -> None:
    base = spiked(recorded(name))
    for at in POSITIONS:
        alarms = feed(shifted(base, ratio, at))
        assert [a for a in alarms if a[0] < at] == [], f"false alarm before the shift at {at}"
        assert alarms, f"the shift at {at} was never found"
        index, direction = alarms[0]
        assert direction == +1
        assert index - at <= 50, f"the shift at {at} was found {index - at} steps late"


@pytest.mark.parametrize("name", SERIES)
def test_a_speed_up_is_a_downward_shift(name: str) -> None:
    base = spiked(recorded(name))
    alarms = feed(shifted(base, -0.30, 1200))
    assert alarms and alarms[0][1] == -1 and 1200 <= alarms[0][0] <= 1250
    assert all(direction == -1 for _, direction in alarms)


def test_the_baseline_follows_a_shift_and_a_second_one_is_found() -> None:
    base = spiked(recorded(SERIES[0]))
    durations = shifted(shifted(base, 0.30, 800), 0.30, 1800)  # 1.3x from 800, 1.69x from 1800
    detector = StepTimeDetector()
    now, alarms, baselines = START, [], {}
    for i, duration in enumerate(durations):
        now += duration
        if detector.observe(duration, now):
            alarms.append(i)
        baselines[i] = detector.baseline
    assert len(alarms) == 2 and 800 <= alarms[0] <= 850 and 1800 <= alarms[1] <= 1850
    level = statistics.median(base[:800])
    assert baselines[700] == pytest.approx(level, rel=0.05)
    assert baselines[alarms[0]] == pytest.approx(level * 1.3, rel=0.05)  # the new level, at once
    assert baselines[1700] == pytest.approx(level * 1.3, rel=0.05)
    assert baselines[2900] == pytest.approx(level * 1.69, rel=0.05)


def test_with_a_long_warmup_the_new_level_shows_while_it_warms_up() -> None:
    base = spiked(recorded(SERIES[0]))
    detector = StepTimeDetector(warmup=200)
    now, alarms, baselines = START, [], {}
    for i, duration in enumerate(shifted(base, 0.30, 1200)):
        now += duration
        if detector.observe(duration, now):
            alarms.append(i)
        baselines[i] = detector.baseline
    assert all(baselines[i] is None for i in range(199)) and baselines[199] is not None
    assert len(alarms) == 1 and 1200 <= alarms[0] <= 1250
    level = statistics.median(base[:1200])
    for i in (alarms[0], alarms[0] + 100, 2900):  # at once, while warming up again, and after
        assert baselines[i] == pytest.approx(level * 1.3, rel=0.05)


def test_a_shift_smaller_than_min_ratio_is_not_reported() -> None:
    durations = shifted(spiked(recorded(SERIES[0])), 0.30, 1200)
    assert feed(durations, StepTimeDetector(min_ratio=0.5)) == []
    assert feed(durations, StepTimeDetector(min_ratio=0.2))[0][1] == +1


def test_the_warmup_sets_the_first_baseline_and_raises_nothing() -> None:
    detector = StepTimeDetector(warmup=DEFAULT_WARMUP)
    durations = [0.5] * 3 + [0.010] * (DEFAULT_WARMUP - 3)  # slow first steps: compilation, warm caches
    for i, duration in enumerate(durations[:-1]):
        assert detector.observe(duration, START + i) == 0
        assert detector.baseline is None
    detector.observe(durations[-1], START + DEFAULT_WARMUP)
    assert detector.baseline == pytest.approx(0.010)
    # from there on, a doubling is found quickly
    alarms = feed([0.010] * 100 + [0.020] * 100, detector)
    assert alarms and alarms[0][1] == +1 and 100 <= alarms[0][0] <= 150


def test_steps_with_no_usable_duration_are_ignored() -> None:
    detector = StepTimeDetector(warmup=5)
    for bad in (0.0, -1.0, math.nan, math.inf):
        assert detector.observe(bad, START) == 0
    assert detector.summaries(START) == {}
    for _ in range(5):
        detector.observe(0.2, START)
    assert detector.baseline == pytest.approx(0.2)


def test_memory_is_bounded_whatever_the_step_rate() -> None:
    detector = StepTimeDetector()
    for i in range(100_000):  # 100,000 steps in one minute
        detector.observe(0.0004 + (i % 7) * 1e-5, START + i * 0.0005)
    # the bounds the daemon relies on: about a thousand steps for the minute, a few hundred for the detector
    assert len(detector._minute) <= 1024
    assert len(detector._recent) <= 512
    assert len(detector._smooth) <= 5
    assert len(detector._warming) <= detector.warmup
    for minute in range(180):  # then three hours, a step a second
        for second in range(60):
            detector.observe(0.4, START + 60 + minute * 60 + second)
    assert len(detector._minutes) <= 60
    assert len(detector._minute) <= 61


def test_summaries_at_three_scales() -> None:
    detector = StepTimeDetector()
    start = 1_760_000_000.0 - 1_760_000_000.0 % 60  # on a minute boundary
    steps = []  # (time, duration)
    for minute in range(90):  # minute m: 12 steps of (m + 1) ms and a little more, one every 5 s
        for j in range(12):
            steps.append((start + minute * 60 + j * 5 + 2, (minute + 1) / 1000 + j * 1e-5))
    for t, d in steps:
        detector.observe(d, t)
    now = start + 89 * 60 + 58
    summaries = detector.summaries(now)
    assert summaries["last"] == steps[-1][1]
    assert summaries["1m"] == pytest.approx(statistics.median(d for t, d in steps if t > now - 60))
    # the last hour's minutes, 30..89, the open minute 89 with its steps so far
    per_minute = [statistics.median(d for t, d in steps if int((t - start) // 60) == m) for m in range(30, 90)]
    assert summaries["1h"] == pytest.approx(statistics.median(per_minute))
    assert summaries["1h"] < summaries["1m"]  # the trend shows: the hour was faster than the last minute

    # a step-time change shows at once in "last", within a minute in "1m", and barely in "1h" (one step more in
    # one of its 60 minutes)
    detector.observe(1.0, now + 1)
    changed = detector.summaries(now + 1)
    assert changed["last"] == 1.0 and changed["1m"] < 0.1
    assert summaries["1h"] <= changed["1h"] < summaries["1h"] * 1.02

    # no step for two minutes: no "1m"; the hour keeps the minutes it has
    later = detector.summaries(now + 125)
    assert "1m" not in later and later["last"] == 1.0 and "1h" in later
    # two hours on: only the last step is known
    assert detector.summaries(now + 7200) == {"last": 1.0}


def test_summaries_before_a_minute_has_closed() -> None:
    detector = StepTimeDetector()
    start = 1_760_000_000.0 - 1_760_000_000.0 % 60
    for i in range(10):
        detector.observe(0.1 + i / 100, start + i)
    # the hour so far is this minute: "1h" is there from the first step, so a young job's panel is not empty
    assert detector.summaries(start + 10) == {"last": pytest.approx(0.19), "1m": pytest.approx(0.145),
                                              "1h": pytest.approx(0.145)}


@pytest.mark.parametrize("settings", [{"threshold": 0}, {"threshold": -1}, {"min_ratio": -0.1},
                                      {"warmup": 2}, {"warmup": 10**6}])
def test_settings_out_of_range_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StepTimeDetector(**settings)  # type: ignore[arg-type]
