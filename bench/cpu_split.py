"""Where a running daemon's CPU goes: the simulated GPU backend vs the exporter itself.

The simulated backends (`exporter/sources/nvml/simulated.py`, `exporter/sources/dcgm/simulated.py`) run inside
the daemon's process, so the daemon's CPU figure includes them. This launcher runs the daemon's own command line
(`python bench/cpu_split.py OUT.json serve --simulate 64 ...`) with the boundaries between the parts timed on the
calling thread's own CPU clock (`time.thread_time`), each call's CPU charged to the innermost timed part:

* `simulator`: every public method of `SimulatedGpus` and `SimulatedDcgm` (what the sources call);
* `sources`: each source's `collect()`, less the simulator calls inside it: reading, integrating, converting,
  building the batch;
* `core`: `exporter/core/`'s side of a collection and a scrape: `SourceRunner.run_once` (rendering the batch
  through `Store.publish`, the self-metrics) and `Store.exposition` (joining and compressing for a scrape,
  prometheus-client's process metrics);
* `http`: the rest of the main thread, where the /metrics server runs (uvicorn, starlette, fastapi, asyncio);
* `other`: the rest of the process (the runners' timing loops, executor threads, the events socket's server).

A timed call costs two reads of the thread's CPU clock and a Python wrapper. That cost is calibrated at start-up
(on a call that does nothing, then scaled to what timing adds to real NVML collections of simulated GPUs) and
taken off the parts it fell on (the callee's share and the caller's), so that the split is the daemon's and not
the timing's: checked against the simulator's cost found by difference (the same collections against a backend
replaying recorded answers), they agree within a few percent.

SIGUSR1 starts the window (counters taken as they are), SIGUSR2 writes OUT.json: CPU seconds per part over the
window (and per source), the process' CPU, the calls timed and the timing's cost.
"""

from __future__ import annotations

import functools
import json
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CATEGORIES = ("simulator", "sources", "core", "http", "other")
_TIMED = ("simulator", "sources", "core")


class _Counters:
    """One thread's: self time per part, timed calls, the timed calls open on its stack."""

    __slots__ = ("calls", "detail", "spent", "stack")

    def __init__(self) -> None:
        self.spent = dict.fromkeys(_TIMED, 0.0)
        self.detail: dict[str, float] = {}  # self time per source (`sources` split by name)
        self.calls = 0
        self.stack: list[list[float]] = []  # per open call: [start CPU, CPU of timed calls inside it]


class _Thread(threading.local):
    def __init__(self) -> None:
        self.counters = _Counters()
        with _registry_lock:
            _registry.append((threading.get_ident(), self.counters))


_registry: list[tuple[int, _Counters]] = []
_registry_lock = threading.Lock()
_local: _Thread
# What timing one call costs, calibrated: inside the two clock reads (charged to the callee, taken off it) and
# outside them (charged to the caller, taken off it; for a call with no timed caller, off the thread's rest).
_inner = 0.0
_outer = 0.0


def _timed(category: str, func: Callable[..., Any], detail: str | None = None) -> Callable[..., Any]:
    clock = time.thread_time

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = _local.counters
        stack = state.stack
        frame = [clock(), 0.0]
        stack.append(frame)
        try:
            return func(*args, **kwargs)
        finally:
            elapsed = clock() - frame[0]
            stack.pop()
            spent = elapsed - frame[1] - _inner
            state.spent[category] += spent
            state.calls += 1
            if detail is not None:
                state.detail[detail] = state.detail.get(detail, 0.0) + spent
            if stack:
                stack[-1][1] += elapsed + _outer

    return wrapper


def _wrap_methods(cls: type, category: str) -> None:
    for name, value in list(vars(cls).items()):
        if not name.startswith("_") and callable(value) and not isinstance(value, (type, staticmethod, classmethod)):
            setattr(cls, name, _timed(category, value))


class _Probe:
    def query(self, handle: object) -> None:
        return None


def _calibrate(calls: int = 20_000) -> tuple[float, float]:
    """(inner, outer) cost of timing a call, on a method that does nothing called as the sources call the
    backend's (`backend.method(handle)`), the least of 7 rounds. The method's own call is left in the inner part
    and the loop's turn in the outer one: tens of nanoseconds each."""
    probe = _Probe()
    probe.query = _timed("core", _Probe.query).__get__(probe)  # type: ignore[method-assign]
    clock = time.thread_time
    inner = outer = float("inf")
    counters = _local.counters
    for _ in range(7):
        parent = [0.0, 0.0]
        counters.stack.append(parent)
        spent = counters.spent["core"]
        started = clock()
        for _ in range(calls):
            probe.query(parent)
        total = clock() - started
        counters.stack.pop()
        inner = min(inner, (counters.spent["core"] - spent) / calls)
        outer = min(outer, (total - parent[1]) / calls)
    return max(inner, 0.0), max(outer, 0.0)


class _ManualClock:
    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        return self.now


def _collections(gpus: int = 8, count: int = 40) -> tuple[float, int]:
    """CPU and timed calls of `count` one-second NVML collections of simulated GPUs on a manual clock, the
    least of 5 rounds."""
    from exporter.sources.nvml.simulated import SimulatedGpus
    from exporter.sources.nvml.source import NvmlSource

    best, calls = float("inf"), 0
    for _ in range(5):
        clock = _ManualClock()
        source = NvmlSource(SimulatedGpus(gpus, clock=clock), clock=clock)
        clock.now += 1
        source.collect()
        before = _local.counters.calls
        started = time.thread_time()
        for _ in range(count):
            clock.now += 1
            source.collect()
        best = min(best, time.thread_time() - started)
        calls = _local.counters.calls - before
    return best, calls


def install() -> None:
    """Time the parts' boundaries; before the daemon is built."""
    global _local, _inner, _outer
    from exporter.core import runner, store
    from exporter.core.daemon import Daemon
    from exporter.sources.dcgm.simulated import SimulatedDcgm
    from exporter.sources.nvml.simulated import SimulatedGpus

    _local = _Thread()
    _inner, _outer = _calibrate()
    # A noop's timing costs less than a real call's (a clock read is a system call, and it leaves the caches
    # colder for the code after it): scale both parts to what timing adds to real NVML collections.
    plain, _ = _collections()
    for cls in (SimulatedGpus, SimulatedDcgm):
        _wrap_methods(cls, "simulator")
    timed, calls = _collections()
    if calls:
        scale = max(1.0, (timed - plain) / calls / (_inner + _outer))
        _inner, _outer = _inner * scale, _outer * scale
    _local.counters.spent = dict.fromkeys(_TIMED, 0.0)  # forget the calibration's calls
    _local.counters.calls = 0
    original_init = runner.SourceRunner.__init__

    def init(self: runner.SourceRunner, source: Any, *args: Any, **kwargs: Any) -> None:
        source.collect = _timed("sources", source.collect, detail=source.name)
        original_init(self, source, *args, **kwargs)

    runner.SourceRunner.__init__ = init  # type: ignore[method-assign]
    runner.SourceRunner.run_once = _timed("core", runner.SourceRunner.run_once)  # type: ignore[method-assign]
    store.Store.exposition = _timed("core", store.Store.exposition)  # type: ignore[method-assign]
    Daemon.publish_self_metrics = _timed("core", Daemon.publish_self_metrics)  # type: ignore[method-assign]


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Window:
    def __init__(self) -> None:
        self.main = threading.main_thread().ident or 0
        self._main_clock = time.pthread_getcpuclockid(self.main)
        self.start()

    def _totals(self) -> tuple[dict[str, float], float, int, int]:
        """Self time per part (and per source, as `source:NAME`), over every thread; the main thread's part of
        it; timed calls, the main thread's and all."""
        with _registry_lock:
            entries = list(_registry)
        totals = dict.fromkeys(_TIMED, 0.0)
        main_spent = 0.0
        main_calls = calls = 0
        for ident, state in entries:
            spent = sum(state.spent.values())
            for name, value in state.spent.items():
                totals[name] += value
            for name, value in state.detail.items():
                totals[f"source:{name}"] = totals.get(f"source:{name}", 0.0) + value
            if ident == self.main:
                main_spent += spent
                main_calls += state.calls
            calls += state.calls
        return totals, main_spent, main_calls, calls

    def start(self) -> None:
        self.began = time.monotonic()
        self.process = _process_cpu()
        self.main_cpu = time.clock_gettime(self._main_clock)
        self.totals, self.main_spent, self.main_calls, self.calls = self._totals()

    def result(self) -> dict[str, object]:
        totals, main_spent, main_calls, calls = self._totals()
        spent = {name: totals[name] - self.totals[name] for name in _TIMED}
        by_source = {name.removeprefix("source:"): value - self.totals.get(name, 0.0)
                     for name, value in totals.items() if name.startswith("source:")}
        process = _process_cpu() - self.process
        main = time.clock_gettime(self._main_clock) - self.main_cpu
        per_call = _inner + _outer
        calls -= self.calls
        main_calls -= self.main_calls
        spent["http"] = max(0.0, main - (main_spent - self.main_spent) - main_calls * per_call)
        spent["other"] = max(0.0, process - sum(spent.values()) - calls * per_call)
        return {
            "window_s": time.monotonic() - self.began,
            "process_cpu_s": process,
            "timing_overhead_s": calls * per_call,
            "categories": {name: spent[name] for name in CATEGORIES},
            "sources": by_source,
            "timed_calls": calls,
            "overhead_per_call_us": {"inner": _inner * 1e6, "outer": _outer * 1e6},
        }


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    install()
    window = Window()

    def start_window(signum: int, frame: object) -> None:
        window.start()

    def write(signum: int, frame: object) -> None:
        out.write_text(json.dumps(window.result(), indent=1))

    signal.signal(signal.SIGUSR1, start_window)
    signal.signal(signal.SIGUSR2, write)
    from exporter.cli import main as cli_main

    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
