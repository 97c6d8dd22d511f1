"""The NVML source against the simulated backend, on a manual clock, through the real renderer."""

from __future__ import annotations

import itertools

import pytest
from conftest import ManualClock, samples, series, value

from exporter.core.exposition import TEXT, Renderer
from exporter.core.source import SourceError
from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.api import FUNCTION_NOT_FOUND, GPU_IS_LOST, NO_PERMISSION, UNKNOWN, GpuError
from exporter.sources.nvml.simulated import Pattern, SimulatedGpus
from exporter.sources.nvml.source import NvmlSource


def setup(count: int = 2, **sim_args: object) -> tuple[ManualClock, SimulatedGpus, NvmlSource]:
    clock = ManualClock()
    sim = SimulatedGpus(count, clock=clock, **sim_args)  # type: ignore[arg-type]
    return clock, sim, NvmlSource(sim, clock=clock)


def scrape(source: NvmlSource, renderer: Renderer | None = None) -> str:
    return (renderer or Renderer()).render(source.collect(), TEXT).decode()


def test_every_gpu_reports_identity_and_core_series() -> None:
    clock, _sim, source = setup(3)
    clock.advance(2)
    text = scrape(source)
    assert {s["gpu"] for s in series(text, "goodput_gpu_info")} == {"0", "1", "2"}
    info = series(text, "goodput_gpu_info")[0]
    assert info["model"] == "NVIDIA H100 80GB HBM3"
    assert info["uuid"].startswith("GPU-") and info["driver_version"] and info["pci_bus_id"]
    uuid = series(text, "goodput_gpu_up")[0]["uuid"]
    for name in ("goodput_gpu_up", "goodput_gpu_utilization_ratio", "goodput_gpu_memory_used_bytes",
                 "goodput_gpu_memory_total_bytes", "goodput_gpu_power_watts", "goodput_gpu_power_limit_watts",
                 "goodput_gpu_energy_joules_total", "goodput_gpu_temperature_celsius",
                 "goodput_gpu_sm_clock_hertz", "goodput_gpu_idle_seconds_total", "goodput_gpu_allocated",
                 "goodput_gpu_pcie_transmit_bytes_total", "goodput_gpu_pcie_receive_bytes_total"):
        assert value(text, name, gpu="0", uuid=uuid) is not None, name
    assert len(series(text, "goodput_gpu_clock_throttle_seconds_total")) == 3 * 6
    assert {s["error_type"] for s in series(text, "goodput_gpu_ecc_errors_total")} == {"corrected", "uncorrected"}
    assert len([s for s in series(text, "goodput_gpu_nvlink_transmit_bytes_total") if s["gpu"] == "0"]) == 18
    # per-GPU series all carry gpu and uuid
    for _name, labels in samples(text):
        assert {"gpu", "uuid"} <= {k for k, _ in labels}


def test_energy_counter_tracks_power() -> None:
    clock, _sim, source = setup(1, pattern="square", busy=1.0, idle=1.0)
    clock.advance(1)
    first = value(scrape(source), "goodput_gpu_energy_joules_total", gpu="0")
    clock.advance(100)
    second = value(scrape(source), "goodput_gpu_energy_joules_total", gpu="0")
    # 50 s at 700 W and 50 s at 70 W
    assert second - first == pytest.approx(50 * 700 + 50 * 70, rel=0.01)
    text = scrape(source)
    assert value(text, "goodput_gpu_power_limit_watts", gpu="0") == 700  # the simulated board's limit
    assert value(text, "goodput_gpu_power_watts", gpu="0") <= 700


@pytest.mark.parametrize(("pattern", "kwargs"), [
    ("square", {"busy": 0.1, "idle": 0.1}),
    ("square", {"busy": 0.05, "idle": 0.25}),
    ("training", {}),
])
def test_idle_seconds_within_one_percent_of_truth_at_15s_scrapes(pattern: str, kwargs: dict) -> None:
    """Poll every 1 s, scrape every 15 s for 10 minutes; each scrape-to-scrape increase is compared
    with the simulator's exact idle time over the same span."""
    clock, sim, source = setup(2, pattern=pattern, **kwargs)
    renderer = Renderer()
    scrapes: list[tuple[float, float]] = []
    for second in range(1, 601):
        clock.advance(1.0)
        batch = source.collect()
        if second % 15 == 0:
            text = renderer.render(batch, TEXT).decode()
            scrapes.append((sim.last_sample_time(), value(text, "goodput_gpu_idle_seconds_total", gpu="1")))
    worst = 0.0
    for (t0, idle0), (t1, idle1) in itertools.pairwise(scrapes):
        truth = sim.truth_idle_seconds(1, t0, t1)
        measured = idle1 - idle0
        if truth > 1.0:
            worst = max(worst, abs(measured - truth) / truth)
        else:  # a fully busy window: compare against the window length instead
            worst = max(worst, abs(measured - truth) / (t1 - t0))
    assert worst < 0.01, f"worst 15 s window off by {worst:.2%}"
    total_truth = sim.truth_idle_seconds(1, scrapes[0][0], scrapes[-1][0])
    assert scrapes[-1][1] - scrapes[0][1] == pytest.approx(total_truth, rel=0.005)


def test_samples_lost_to_a_slow_poller_are_not_invented() -> None:
    clock, _sim, source = setup(1, pattern="square", busy=0.1, idle=0.1)
    clock.advance(1)
    text = scrape(source)
    sampled0 = value(text, "goodput_gpu_sampled_seconds_total", gpu="0")
    clock.advance(60)  # NVML keeps 120 samples (20 s); 40 s of samples are gone
    text = scrape(source)
    sampled = value(text, "goodput_gpu_sampled_seconds_total", gpu="0") - sampled0
    assert 19.5 < sampled < 20.5
    idle = value(text, "goodput_gpu_idle_seconds_total", gpu="0")
    assert idle / value(text, "goodput_gpu_sampled_seconds_total", gpu="0") == pytest.approx(0.5, abs=0.02)


def test_gpu_lost_mid_run_reports_down_and_others_continue() -> None:
    clock, sim, source = setup(3)
    clock.advance(1)
    scrape(source)
    sim.lose(1)
    clock.advance(1)
    batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    assert value(text, "goodput_gpu_up", gpu="1") == 0
    assert value(text, "goodput_gpu_up", gpu="0") == 1 and value(text, "goodput_gpu_up", gpu="2") == 1
    assert value(text, "goodput_gpu_power_watts", gpu="1") is None  # no stale readings for a lost GPU
    assert value(text, "goodput_gpu_power_watts", gpu="2") is not None
    assert value(text, "goodput_gpu_info", gpu="1") == 1
    assert batch.errors == ["nvml_gpu_is_lost"]
    clock.advance(1)
    assert source.collect().errors == []  # counted once, not on every poll


def test_xid_events_are_counted_never_sticky() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    text = scrape(source)
    assert series(text, "goodput_gpu_xid_errors_total") == []
    assert series(text, "goodput_gpu_last_xid_timestamp_seconds") == []
    for xid in (79, 48, 63, 48):
        sim.inject_xid(1, xid)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_xid_errors_total", gpu="1", xid="48") == 2
    assert value(text, "goodput_gpu_xid_errors_total", gpu="1", xid="79") == 1
    assert value(text, "goodput_gpu_xid_errors_total", gpu="1", xid="63") == 1
    assert value(text, "goodput_gpu_last_xid_timestamp_seconds", gpu="1") == clock.now
    assert value(text, "goodput_gpu_xid_errors_total", gpu="0", xid="79") is None
    clock.advance(30)
    text = scrape(source)
    assert value(text, "goodput_gpu_xid_errors_total", gpu="1", xid="48") == 2  # a counter: stays, no reset
    assert value(text, "goodput_gpu_last_xid_timestamp_seconds", gpu="1") == clock.now - 30


def test_xid_79_with_lost_gpu_still_exports_the_xid() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    scrape(source)
    sim.inject_xid(0, 79)
    sim.lose(0)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_up", gpu="0") == 0
    assert value(text, "goodput_gpu_xid_errors_total", gpu="0", xid="79") == 1


def test_ecc_and_throttle_counters() -> None:
    clock, sim, source = setup(1)
    clock.advance(1)
    scrape(source)
    sim.inject_ecc(0, 3)
    sim.inject_ecc(0, 1, uncorrected=True)
    sim.throttle(0, "thermal", seconds=10)
    clock.advance(4)
    text = scrape(source)
    assert value(text, "goodput_gpu_ecc_errors_total", gpu="0", error_type="corrected") == 3
    assert value(text, "goodput_gpu_ecc_errors_total", gpu="0", error_type="uncorrected") == 1
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="thermal") == pytest.approx(4)
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="power") == 0
    clock.advance(20)
    text = scrape(source)
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="thermal") == pytest.approx(10)


def test_unsupported_fields_are_absent_and_asked_once() -> None:
    clock, sim, source = setup(2)
    sim.set_unsupported(0, "device_power_milliwatts", "device_ecc_errors", "field:197", "field:91")
    calls = {"n": 0}
    original = sim.device_power_milliwatts

    def counting(handle):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return original(handle)

    sim.device_power_milliwatts = counting  # type: ignore[method-assign]
    for _ in range(5):
        clock.advance(1)
        batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    assert batch.errors == []
    assert value(text, "goodput_gpu_power_watts", gpu="0") is None
    assert value(text, "goodput_gpu_power_watts", gpu="1") is not None
    assert [s for s in series(text, "goodput_gpu_ecc_errors_total") if s["gpu"] == "0"] == []
    assert value(text, "goodput_gpu_pcie_transmit_bytes_total", gpu="0") is None
    assert value(text, "goodput_gpu_pcie_receive_bytes_total", gpu="0") is not None
    assert [s for s in series(text, "goodput_gpu_nvlink_transmit_bytes_total") if s["gpu"] == "0"] == []
    assert calls["n"] == 5 + 1  # GPU 0 asked once, GPU 1 every time


def test_raising_call_on_one_gpu_is_counted_and_the_rest_reported() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    sim.fail("device_memory", UNKNOWN, gpu=1)
    for _ in range(3):
        clock.advance(1)
        batch = source.collect()
        text = Renderer().render(batch, TEXT).decode()
        assert batch.errors == ["nvml_unknown"]
        assert value(text, "goodput_gpu_up", gpu="1") == 1
        assert value(text, "goodput_gpu_memory_used_bytes", gpu="1") is None
        assert value(text, "goodput_gpu_power_watts", gpu="1") is not None  # the rest of GPU 1 is there
        assert value(text, "goodput_gpu_idle_seconds_total", gpu="1") is not None
        assert value(text, "goodput_gpu_memory_used_bytes", gpu="0") is not None
    sim.clear_faults()
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_memory_used_bytes", gpu="1") is not None


def test_driver_without_a_call_counts_as_unsupported() -> None:
    clock, sim, source = setup(1)
    sim.fail("device_compute_processes", FUNCTION_NOT_FOUND)
    clock.advance(1)
    batch = source.collect()
    assert batch.errors == []
    text = Renderer().render(batch, TEXT).decode()
    assert value(text, "goodput_gpu_allocated", gpu="0") is None
    assert value(text, "goodput_gpu_power_watts", gpu="0") is not None


def test_failed_discovery_fails_the_collection_and_clears_processes() -> None:
    clock, sim, source = setup(2)
    sim.attach_process(0, 4242)
    clock.advance(1)
    scrape(source)
    assert 4242 in source.table.holders()
    source._gpus = None  # force discovery again, now against a failing driver
    sim.fail("device_count", UNKNOWN)
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "nvml_unknown"
    assert source.table.holders() == {}
    sim.clear_faults()
    assert value(scrape(source), "goodput_gpu_up", gpu="0") == 1


def test_xid_poll_failure_is_counted_and_gpus_still_reported() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    scrape(source)
    sim.fail("xid_events_poll", GPU_IS_LOST, calls=1)
    clock.advance(1)
    batch = source.collect()
    assert batch.errors == ["nvml_gpu_is_lost"]
    assert len(batch.values(c.GPU_UP)) == 2


def test_gpu_lost_at_start_is_reported_down_then_identified() -> None:
    clock, sim, source = setup(2)
    sim.lose(1)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_up", gpu="1", uuid="unknown") == 0
    assert value(text, "goodput_gpu_info", gpu="1", uuid="unknown") == 1
    assert value(text, "goodput_gpu_up", gpu="0") == 1
    sampled_before = value(text, "goodput_gpu_sampled_seconds_total", gpu="0")
    sim._gpus[1].lost = False  # reset by an operator
    clock.advance(1)
    text = scrape(source)
    uuid = sim.device_uuid(sim.device_handle(1))
    assert value(text, "goodput_gpu_up", gpu="1", uuid=uuid) == 1
    assert value(text, "goodput_gpu_info", gpu="1", uuid=uuid) == 1
    assert value(text, "goodput_gpu_sampled_seconds_total", gpu="0") > sampled_before  # GPU 0 kept counting


def test_unreadable_handle_at_start_does_not_stop_discovery() -> None:
    clock, sim, source = setup(3)
    original = sim.device_handle

    def handle(index):  # type: ignore[no-untyped-def]
        if index == 2:
            raise GpuError(NO_PERMISSION, "no permission")
        return original(index)

    sim.device_handle = handle  # type: ignore[method-assign]
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_up", gpu="2") == 0
    assert value(text, "goodput_gpu_up", gpu="0") == 1 and value(text, "goodput_gpu_up", gpu="1") == 1


def test_lost_gpu_with_unsupported_utilization_does_not_flap() -> None:
    clock, sim, source = setup(1)
    sim.set_unsupported(0, "device_utilization_percent")
    clock.advance(1)
    scrape(source)
    sim.lose(0)
    errors = []
    for _ in range(4):
        clock.advance(1)
        batch = source.collect()
        errors += batch.errors
        assert batch.values(c.GPU_UP) == {("0", sim._gpus[0].uuid): 0}
    assert errors == ["nvml_gpu_is_lost"]


def test_irregular_sample_periods_are_fully_credited() -> None:
    """Real NVML sampling periods jitter; a short gap must not cap the credit of later ones."""

    class Jittery(SimulatedGpus):
        def device_utilization_samples(self, handle, since_us):  # type: ignore[no-untyped-def]
            out = []
            for ts, pct in super().device_utilization_samples(handle, since_us):
                out.append((ts - 40_000 if (ts // 166_667) % 7 == 0 else ts, pct))
            return [sample for sample in out if sample[0] > since_us]

    clock = ManualClock()
    sim = Jittery(1, clock=clock, pattern="square", busy=0.1, idle=0.1)
    source = NvmlSource(sim, clock=clock)
    clock.advance(1)
    first = source.collect().values(c.GPU_SAMPLED_SECONDS)
    for _ in range(20):
        clock.advance(1)
        last = source.collect().values(c.GPU_SAMPLED_SECONDS)
    (key,) = last
    assert last[key] - first[key] == pytest.approx(20, abs=0.5)


def test_a_pid_listed_twice_is_one_series() -> None:
    clock, sim, source = setup(1)
    original = sim.device_compute_processes
    sim.device_compute_processes = lambda handle: original(handle) * 2  # type: ignore[method-assign]
    sim.attach_process(0, 4242, 2**30)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_process_memory_used_bytes", gpu="0", pid="4242") == 2 * 2**30
    assert len(series(text, "goodput_gpu_process_memory_used_bytes")) == 1
    assert len(source.table.holders()[4242]) == 1


def test_allocation_and_process_memory() -> None:
    clock, sim, source = setup(2)
    sim.attach_process(0, 4242, 30 * 2**30)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_allocated", gpu="0") == 1
    assert value(text, "goodput_gpu_allocated", gpu="1") == 0
    assert value(text, "goodput_gpu_process_memory_used_bytes", gpu="0", pid="4242") == 30 * 2**30
    assert value(text, "goodput_gpu_memory_used_bytes", gpu="0") > 30 * 2**30
    holders = source.table.holders()
    assert [h.gpu for h in holders[4242]] == ["0"]
    sim.detach_process(0, 4242)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_allocated", gpu="0") == 0
    assert series(text, "goodput_gpu_process_memory_used_bytes") == []
    assert source.table.holders() == {}


def test_mig_instances_are_reported() -> None:
    clock, sim, source = setup(2)
    sim.enable_mig(1, ["3g.40gb", "2g.20gb", "2g.20gb"])
    clock.advance(1)
    text = scrape(source)
    migs = series(text, "goodput_gpu_mig_info")
    assert sorted(m["profile"] for m in migs) == ["2g.20gb", "2g.20gb", "3g.40gb"]
    assert {m["gpu"] for m in migs} == {"1"}
    assert sorted(m["gpu_instance_id"] for m in migs) == ["1", "2", "3"]
    mig_uuid = next(m["mig_uuid"] for m in migs if m["profile"] == "3g.40gb")
    assert value(text, "goodput_gpu_mig_memory_total_bytes", mig_uuid=mig_uuid) == 40 * 2**30


def test_simulator_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> str:
        clock, _sim, source = setup(2, seed=seed)
        clock.advance(30)
        return scrape(source)

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_pattern_integrals_are_exact() -> None:
    pattern = Pattern.square(0.1, 0.3)
    assert pattern.busy_between(0.0, 4.0) == pytest.approx(1.0)
    assert pattern.busy_between(0.05, 0.15) == pytest.approx(0.05)
    assert pattern.busy_between(0.35, 0.45) == pytest.approx(0.05)
    assert pattern.busy_between(123.4, 123.4) == 0


def test_an_unreadable_mig_instance_is_counted_and_the_gpu_stays_up() -> None:
    clock, sim, source = setup(1)
    sim.enable_mig(0, ["3g.40gb", "2g.20gb", "2g.20gb"])
    sim.fail("mig_instance_ids", UNKNOWN, calls=1)
    clock.advance(1)
    batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    assert batch.errors == ["nvml_unknown"]
    assert len(series(text, "goodput_gpu_mig_info")) == 2
    assert value(text, "goodput_gpu_up", gpu="0") == 1
