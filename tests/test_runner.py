"""SourceRunner: a source that raises or hangs is counted, logged, marked down; others keep going. Adaptive
intervals: fixed when off, grown while steady, shortened by a load change or a boost, within their bounds."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest
from conftest import ManualClock, live_server, quick_config, series, value, wait_for

from exporter.config import ConfigError, load
from exporter.core.adaptive import STEADY_RUNS
from exporter.core.daemon import Daemon, Scheduled
from exporter.core.exposition import Batch
from exporter.core.runner import SourceRunner
from exporter.core.source import SourceError
from exporter.core.store import Store
from exporter.sources.host import metrics as c
from exporter.sources.nvml.simulated import Pattern, SimulatedGpus
from exporter.sources.nvml.source import NvmlSource


class Scripted:
    """A source whose next behaviour a test sets: "ok", "raise", "fail", or "hang"."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> Batch:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "fail":
            raise SourceError("nvml_unknown", "NVML said no")
        if self.mode == "hang":
            self.release.wait(30)
        batch = Batch()
        batch.add(c.HOST_UNREADABLE, (), self.calls)
        return batch

    def close(self) -> None:
        self.release.set()


def test_a_batch_is_published_after_the_health_that_says_it_succeeded() -> None:
    """The self-metrics are marked stale (and the runner up) before the batch is published, so a scrape that
    finds a collection's series never finds its source down beside them."""
    seen: list[tuple[str, bool, int]] = []
    stale = [0]

    def publish(name: str, batch: Batch | None) -> None:
        seen.append((name, runner.up, stale[0]))

    source = Scripted("host")
    runner = SourceRunner(source, interval=1, timeout=1, publish=publish,
                          on_done=lambda: stale.__setitem__(0, stale[0] + 1))
    runner.run_once()
    assert seen == [("host", True, 1)]
    source.mode = "fail"
    runner.run_once()  # a failure withdraws the series and marks the source down
    assert len(seen) == 2 and not runner.up and stale[0] == 3


def test_raising_source_is_counted_logged_withdrawn_and_recovers(caplog) -> None:  # type: ignore[no-untyped-def]
    store = Store()
    source = Scripted("host")
    runner = SourceRunner(source, interval=1, timeout=1, publish=store.publish)
    runner.run_once()
    assert runner.up and b"goodput_host_unreadable_gpu_processes" in store.exposition()
    source.mode = "raise"
    with caplog.at_level(logging.WARNING):
        runner.run_once()
        runner.run_once()
    assert not runner.up
    assert runner.errors["exception"] == 2
    assert b"goodput_host_unreadable_gpu_processes" not in store.exposition()
    assert len([r for r in caplog.records if "is down" in r.getMessage()]) == 1  # logged once, counted twice
    source.mode = "fail"
    runner.run_once()
    assert runner.errors["nvml_unknown"] == 1
    source.mode = "ok"
    runner.run_once()
    assert runner.up and runner.collections == 5 and runner.last_success is not None


def test_hanging_source_times_out_and_no_calls_pile_up() -> None:
    store = Store()
    source = Scripted("nvml")
    runner = SourceRunner(source, interval=1, timeout=0.2, publish=store.publish)
    source.mode = "hang"
    runner.run_once()
    assert not runner.up and runner.errors["timeout"] == 1
    assert runner.completed.is_set()
    runner.run_once()
    runner.run_once()
    assert source.calls == 1  # still stuck: nothing new was started
    assert runner.errors["timeout"] == 1
    source.mode = "ok"
    source.release.set()
    wait_for(lambda: runner._hung is not None and runner._hung.done())
    runner.run_once()
    assert runner.up and source.calls == 2


def test_a_hung_source_does_not_stop_the_others() -> None:
    store = Store()
    stuck, healthy = Scripted("nvml"), Scripted("host")
    stuck.mode = "hang"
    runners = [SourceRunner(s, interval=0.05, timeout=0.2, publish=store.publish) for s in (stuck, healthy)]
    for runner in runners:
        runner.start()
    try:
        wait_for(lambda: healthy.calls >= 20, timeout=10)
        assert not runners[0].up and runners[1].up
        assert stuck.calls == 1
    finally:
        for runner in runners:
            runner.stop()


def test_a_batch_that_cannot_be_published_is_counted_and_the_loop_goes_on() -> None:
    published: list[object] = []

    def publish(name: str, batch: Batch | None) -> None:
        if batch is not None and len(published) == 0:
            published.append("refused")
            raise ValueError("cannot render")
        published.append(batch)

    runner = SourceRunner(Scripted("host"), interval=1, timeout=1, publish=publish)
    runner.run_once()
    assert not runner.up and runner.errors["publish"] == 1
    runner.run_once()
    assert runner.up and isinstance(published[-1], Batch)


# --- adaptive intervals ------------------------------------------------------------------------------------------

class SimulatedNode:
    """Real NVML collections of simulated GPUs, on a manual clock that the runner's collections advance: each
    `collect()` moves the clock on by the runner's interval, as the runner's loop would wait."""

    def __init__(self, adaptive: bool = True, pattern: str = "busy", gpus: int = 4, **bounds: float) -> None:
        """`pattern`: "busy" or "idle" (every GPU always busy, or idle: nothing moves but counters, at constant
        rates), or the simulator's "training" job."""
        self.clock = ManualClock()
        self.sim = SimulatedGpus(gpus, clock=self.clock, pattern="training" if pattern == "training" else "square")
        if pattern != "training":
            self.load(1.0 if pattern == "busy" else 0.0)
        self.source = NvmlSource(self.sim, clock=self.clock)
        self.store = Store()
        self.runner = SourceRunner(self.source, interval=1.0, timeout=5, publish=self.store.publish,
                                   clock=self.clock, monotonic=self.clock, adaptive=adaptive,
                                   min_interval=bounds.get("min_interval", 0.25),
                                   max_interval=bounds.get("max_interval", 4.0))

    def collect(self, times: int = 1) -> list[float]:
        """The interval after each of `times` collections."""
        intervals = []
        for _ in range(times):
            self.clock.advance(self.runner.interval)
            self.runner.run_once()
            assert self.runner.up
            intervals.append(self.runner.interval)
        return intervals

    def load(self, share: float) -> None:
        """Every GPU switches to being busy `share` of the time (in 20 ms cycles): a job-wide load change."""
        cycle = 0.02
        pattern = Pattern([(1.0, round(share))]) if share in (0.0, 1.0) else Pattern.square(share * cycle,
                                                                                             (1 - share) * cycle)
        for gpu in range(self.sim.count):
            self.sim.set_pattern(gpu, pattern)


def test_adaptive_off_keeps_the_interval_exactly_whatever_the_batches_do() -> None:
    node = SimulatedNode(adaptive=False)
    assert node.collect(12) == [1.0] * 12  # steady
    intervals = []
    for share in (0.0, 0.3, 0.6, 1.0):
        node.load(share)
        intervals += node.collect(1)
    assert intervals == [1.0] * 4  # fast change
    assert not node.runner.boost(60) and node.runner.interval == 1.0


def test_a_steady_source_grows_to_max_interval_and_no_further() -> None:
    node = SimulatedNode()
    intervals = node.collect(60)
    assert intervals[0] == 1.0  # the first batch has nothing to be compared with
    grown = sorted(set(intervals))
    assert grown == [1.0, 1.5, 2.25, 3.375, 4.0], grown  # x1.5 per STEADY_RUNS steady collections, capped at max
    assert intervals.index(1.5) == STEADY_RUNS  # the first batch, then STEADY_RUNS steady ones
    assert intervals[-30:] == [4.0] * 30


def test_a_training_jobs_data_stalls_are_not_read_as_fast_change() -> None:
    """The simulated training job stalls on its data loader every 25 steps (7-8 s): at 1 s some windows are
    empty. Once seen, a stall is inside its metrics' recent range, and the interval still grows."""
    node = SimulatedNode(pattern="training", gpus=8)
    began = node.clock()
    at_most: list[tuple[float, float]] = []  # (interval, seconds spent at it)
    while node.clock() - began < 300:  # five minutes of the job
        interval = node.runner.interval
        node.collect(1)
        at_most.append((interval, interval))
    spent = sum(seconds for interval, seconds in at_most if interval >= 3.375) / sum(s for _, s in at_most)
    assert max(interval for interval, _ in at_most) == 4.0
    assert spent > 0.6, spent


def test_a_load_ramp_shortens_the_interval_down_to_min_interval() -> None:
    node = SimulatedNode(pattern="idle")
    node.collect(40)
    assert node.runner.interval == 4.0
    intervals = []
    for share in (0.2, 0.4, 0.6, 0.8, 1.0):  # a job starts and ramps up: each level beyond the recent range
        node.load(share)
        intervals += node.collect(1)
    assert intervals == [2.0, 1.0, 0.5, 0.25, 0.25]  # halved each time, not below min_interval
    assert max(node.collect(20)) > 0.25  # steady again: it grows back


def test_levels_within_the_recent_range_are_not_fast_change() -> None:
    """A drop to a level seen a minute ago (the job's own texture) is news once, not every time."""
    node = SimulatedNode()
    node.collect(40)
    node.load(0.0)  # the job stops
    assert node.collect(1) == [2.0]
    node.load(0.5)  # halfway between the two levels just seen
    assert node.collect(1) == [2.0]


def test_a_boost_holds_min_interval_then_releases_it() -> None:
    node = SimulatedNode()
    node.collect(40)
    assert node.runner.interval == 4.0
    assert node.runner.boost(10.0)
    intervals = node.collect(39)  # 9.75 s at min_interval: the boost still holds
    assert intervals == [0.25] * 39
    node.clock.advance(0.3)
    assert node.runner.interval == 4.0  # over: back to the interval the batches asked for
    assert node.runner.boost(1.0) and node.runner.boost(0.5)  # a shorter boost does not cut a longer one short
    node.clock.advance(0.75)
    assert node.runner.interval == 0.25


def test_a_boost_wakes_a_runner_waiting_out_a_long_interval() -> None:
    source = Scripted("host")
    runner = SourceRunner(source, interval=30, timeout=1, publish=Store().publish, adaptive=True,
                          min_interval=0.05, max_interval=60)
    runner.start()
    try:
        wait_for(lambda: source.calls == 1)
        assert runner.boost(5.0)
        wait_for(lambda: source.calls >= 5, timeout=3)  # without the wake-up, the next call is 30 s away
    finally:
        runner.stop()


def test_bounds_default_from_the_interval_and_errors_name_the_keys() -> None:
    nvml = load(None, {"nvml": {"interval": "2s", "adaptive": "true"}}, environ={}).nvml
    assert (nvml.adaptive, nvml.min_interval, nvml.max_interval) == (True, 0.5, 8.0)
    host = load(None, {}, environ={}).host  # a source whose own default interval is 5 s
    assert (host.adaptive, host.interval, host.min_interval, host.max_interval) == (False, 5.0, 1.25, 20.0)
    kubelet = load(None, {"kubelet": {"interval": "10h"}}, environ={}).kubelet
    assert kubelet.max_interval == 86_400.0  # interval x 4, at most the longest duration
    flags = load(None, {"nvml": {"min_interval": "100ms", "max_interval": "1m"}},
                 environ={"GOODPUT_NVML_INTERVAL": "3s"}).nvml
    assert (flags.min_interval, flags.interval, flags.max_interval) == (0.1, 3.0, 60.0)
    with pytest.raises(ConfigError, match=r"nvml: min_interval 6s is longer than interval 5s"):
        load(None, {"nvml": {"min_interval": "6s"}}, environ={})
    with pytest.raises(ConfigError, match=r"host: max_interval 2s is shorter than interval 5s"):
        load(None, {"host": {"max_interval": "2s"}}, environ={})
    with pytest.raises(ConfigError, match=r"nvml.interval: invalid duration") as error:
        load(None, {"nvml": {"interval": "soon"}}, environ={})
    assert "min_interval" not in str(error.value)  # the interval's own error, not one about the bounds


def test_the_interval_gauge_is_published_fixed_or_adapted() -> None:
    daemon = Daemon([Scheduled(Scripted("host"), 5.0, 1.0),
                     Scheduled(Scripted("ingest"), 1.0, 1.0, adaptive=True, min_interval=0.2, max_interval=4.0)],
                    "simulated")
    text = daemon.store.exposition().decode()
    assert value(text, "goodput_exporter_source_interval_seconds", source="host") == 5.0
    assert value(text, "goodput_exporter_source_interval_seconds", source="ingest") == 1.0
    assert daemon.boost("ingest", 60) and not daemon.boost("host", 60) and not daemon.boost("nope", 60)
    daemon.runners["ingest"].run_once()
    text = daemon.store.exposition().decode()
    assert value(text, "goodput_exporter_source_interval_seconds", source="ingest") == 0.2
    assert value(text, "goodput_exporter_source_interval_seconds", source="host") == 5.0


def test_the_library_calls_of_a_source_are_published_by_function() -> None:
    daemon = Daemon([Scheduled(NvmlSource(SimulatedGpus(2)), 5.0, 5.0), Scheduled(Scripted("host"), 5.0, 1.0)],
                    "simulated")
    for _ in range(2):
        daemon.runners["nvml"].run_once()
    text = daemon.store.exposition().decode()
    calls = {s["call"]: value(text, "goodput_exporter_library_calls_total", **s)
             for s in series(text, "goodput_exporter_library_calls_total")}
    assert {s["source"] for s in series(text, "goodput_exporter_library_calls_total")} == {"nvml"}
    assert calls["nvmlInit"] == 1
    assert calls["nvmlDeviceGetFieldValues"] == 2 * 3  # per GPU: the link count at start-up, then one a collection
    assert calls["nvmlDeviceGetPowerUsage"] == 2 * 2


def test_live_daemon_publishes_the_adapted_interval_and_a_boost() -> None:
    config = quick_config(nvml={"interval": "200ms", "adaptive": "true", "max_interval": "400ms"},
                          host={"enabled": False}, ingest={"enabled": False}, flight={"enabled": False})
    gpus = SimulatedGpus(2)
    for gpu in range(2):
        gpus.set_pattern(gpu, Pattern([(1.0, 1)]))  # always busy: steady
    with live_server(config, backend=gpus) as live:
        live.metrics_when("goodput_exporter_source_interval_seconds", 0.4, source="nvml")  # steady: grown to max
        assert live.daemon.boost("nvml", 30)
        live.metrics_when("goodput_exporter_source_interval_seconds", 0.05, source="nvml")  # 200ms / 4


@pytest.mark.parametrize("pattern", ["training", "square"])
def test_idle_seconds_stay_within_one_percent_of_truth_with_adaptive_polling(pattern: str) -> None:
    """tests/test_nvml_source.py's accuracy check with the poll at the adapted interval (it moves between 250 ms
    and 4 s here) instead of every second: every 15 s scrape-to-scrape increase of the idle counter is within 1%
    of the simulator's exact idle time. NVML keeps 20 s of samples: any interval up to that loses none."""
    node = SimulatedNode(pattern="training", gpus=2)
    if pattern == "square":
        node.load(0.5)
    began = node.clock()
    scrapes: list[tuple[float, float]] = []
    intervals = set()
    next_scrape = began + 15
    while node.clock() - began < 600:
        if node.clock() + node.runner.interval > next_scrape:  # a scrape before the next poll reads the last batch
            text = node.store.exposition().decode()
            scrapes.append((node.sim.last_sample_time(), value(text, "goodput_gpu_idle_seconds_total", gpu="1")))
            next_scrape += 15
        intervals.update(node.collect(1))
    assert len(intervals) > 2  # the interval did move
    for (t0, idle0), (t1, idle1) in itertools.pairwise(scrapes[1:]):
        truth = node.sim.truth_idle_seconds(1, t0, t1)
        scale = truth if truth > 1.0 else t1 - t0  # a fully busy window: against the window's length
        assert abs(idle1 - idle0 - truth) / scale < 0.01
