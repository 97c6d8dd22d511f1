"""The host source with real child processes standing in for training ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ManualClock, series, value

from exporter.core.exposition import TEXT, Renderer
from exporter.core.gpus import NodeGpus
from exporter.sources.host.source import HostSource, parse_pressure
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: pass\n"


@pytest.fixture
def busy_child():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    yield proc
    proc.kill()
    proc.wait()


def render(source) -> str:  # type: ignore[no-untyped-def]
    return Renderer().render(source.collect(), TEXT).decode()


def test_gpu_process_cpu_memory_and_numa(busy_child) -> None:  # type: ignore[no-untyped-def]
    cpus = sorted(os.sched_getaffinity(0))
    clock = ManualClock()
    sim = SimulatedGpus(8, clock=clock)
    nvml = NvmlSource(sim, clock=clock)
    host = HostSource(nvml.table)
    os.sched_setaffinity(busy_child.pid, {cpus[0]})  # pinned to the first NUMA half
    sim.attach_process(0, busy_child.pid)
    sim.attach_process(7, busy_child.pid)
    clock.advance(1)
    nvml.collect()
    pid = str(busy_child.pid)
    child = psutil.Process(busy_child.pid)
    first = render(host)
    cpu0 = value(first, "goodput_host_process_cpu_seconds_total", pid=pid, mode="user")
    # the spinning child burns a CPU second per second on a quiet machine, less on a loaded one: wait for 0.6
    deadline = time.monotonic() + 30
    while child.cpu_times().user < cpu0 + 0.6 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = render(host)
    own = child.cpu_times().user
    cpu1 = value(second, "goodput_host_process_cpu_seconds_total", pid=pid, mode="user")
    assert cpu1 - cpu0 > 0.5
    assert own - 0.1 <= cpu1 <= own  # the process's own user time, read a moment before psutil's
    assert value(second, "goodput_host_process_resident_memory_bytes", pid=pid) > 1_000_000
    assert value(second, "goodput_host_process_threads", pid=pid) >= 1
    assert value(second, "goodput_host_process_context_switches_total", pid=pid, kind="voluntary") >= 0
    assert series(second, "goodput_host_process_cpu_seconds_total")[0]["command"].startswith("python")
    assert value(second, "goodput_gpu_numa_mismatch", gpu="0", pid=pid) == 0
    expected_far = 0 if len(cpus) == 1 else 1
    assert value(second, "goodput_gpu_numa_mismatch", gpu="7", pid=pid) == expected_far
    assert value(second, "goodput_host_unreadable_gpu_processes") == 0


def test_gone_and_invisible_processes_are_counted_not_fatal(busy_child) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClock()
    sim = SimulatedGpus(2, clock=clock)
    nvml = NvmlSource(sim, clock=clock)
    host = HostSource(nvml.table)
    sim.attach_process(0, busy_child.pid)
    sim.attach_process(1, 2**22 + 12345)  # beyond pid_max: a PID from another PID namespace
    clock.advance(1)
    nvml.collect()
    text = render(host)
    assert value(text, "goodput_host_unreadable_gpu_processes") == 1
    busy_child.kill()
    busy_child.wait()
    text = render(host)
    assert value(text, "goodput_host_unreadable_gpu_processes") == 2
    assert series(text, "goodput_host_process_cpu_seconds_total") == []


def test_pressure_from_a_procfs(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "io").write_text(
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n")
    text = render(HostSource(NodeGpus(), proc_path=str(tmp_path)))
    assert value(text, "goodput_host_pressure_stalled_seconds_total", resource="io", kind="some") == 2.5
    assert value(text, "goodput_host_pressure_stalled_seconds_total", resource="io", kind="full") == 0.001
    assert [s for s in series(text, "goodput_host_pressure_stalled_seconds_total") if s["resource"] == "cpu"] == []


@pytest.mark.skipif(not Path("/proc/pressure/cpu").exists(), reason="kernel without PSI")
def test_pressure_from_this_kernel() -> None:
    parsed = parse_pressure(Path("/proc/pressure/cpu").read_text())
    assert "some" in parsed and parsed["some"] >= 0
