"""SourceRunner: a source that raises or hangs is counted, logged, marked down; others keep going."""

from __future__ import annotations

import logging
import threading

from conftest import wait_for

from exporter.core.exposition import Batch
from exporter.core.runner import SourceRunner
from exporter.core.source import SourceError
from exporter.core.store import Store
from exporter.sources.host import metrics as c


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
