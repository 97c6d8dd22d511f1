"""The NVML source against the simulated backend, on a manual clock, through the real renderer."""

from __future__ import annotations

import itertools
import threading

import pytest
from conftest import ManualClock, samples, series, value

from exporter.core.exposition import TEXT, Renderer
from exporter.core.source import SourceError
from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.api import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    UNKNOWN,
    GpuError,
)
from exporter.sources.nvml.cadence import INTERVAL, SLOW_INTERVAL
from exporter.sources.nvml.settings import SimulateConfig
from exporter.sources.nvml.simulated import Pattern, SimulatedGpus, schedule_faults
from exporter.sources.nvml.source import _LINK_FIELDS, NvmlSource, _LinkTotal


def setup(count: int = 2, per_link: bool = False, **sim_args: object) -> tuple[ManualClock, SimulatedGpus, NvmlSource]:
    clock = ManualClock()
    sim = SimulatedGpus(count, clock=clock, **sim_args)  # type: ignore[arg-type]
    return clock, sim, NvmlSource(sim, clock=clock, nvlink_per_link=per_link)


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
    # NVLink: per GPU, summed over its 18 links (per link only with nvml.nvlink_per_link)
    assert [s for s in series(text, "goodput_gpu_nvlink_transmit_bytes_total") if s["gpu"] == "0"] == [
        {"gpu": "0", "uuid": uuid}]
    assert len([s for s in series(text, "goodput_gpu_nvlink_errors_total") if s["gpu"] == "0"]) == 4
    assert series(text, "goodput_gpu_nvlink_link_transmit_bytes_total") == []
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
    assert value(text, "goodput_gpu_lost_total", gpu="1") == 1
    assert value(text, "goodput_gpu_lost_total", gpu="0") == 0  # every GPU has the counter, from 0
    sim._gpus[1].lost = False  # reset by an operator: it answers again, the count kept
    clock.advance(1)
    assert value(scrape(source), "goodput_gpu_lost_total", gpu="1") == 1
    sim.lose(1)  # and lost again: the second loss (goodput_gpu_up went 1, 0, 1, 0)
    for _ in range(2):
        clock.advance(1)
        assert value(scrape(source), "goodput_gpu_lost_total", gpu="1") == 2


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
    # ECC counts are read every slow_interval (one nvmlDeviceGetFieldValues call with the other health counters),
    # the last answer published until then; throttling at every collection
    assert value(text, "goodput_gpu_ecc_errors_total", gpu="0", error_type="corrected") == 0
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="thermal") == pytest.approx(4)
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="power") == 0
    clock.advance(SLOW_INTERVAL - 4)
    text = scrape(source)
    assert value(text, "goodput_gpu_ecc_errors_total", gpu="0", error_type="corrected") == 3
    assert value(text, "goodput_gpu_ecc_errors_total", gpu="0", error_type="uncorrected") == 1
    assert value(text, "goodput_gpu_clock_throttle_seconds_total", gpu="0", reason="thermal") == pytest.approx(10)


def test_unsupported_fields_are_absent_and_asked_once() -> None:
    clock, sim, source = setup(2)
    sim.set_unsupported(0, "device_power_milliwatts", "field:3", "field:4", "field:197", "field:91")
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
    # no link count (field 91): no active link, no NVLink series at all
    for name in ("goodput_gpu_nvlink_transmit_bytes_total", "goodput_gpu_nvlink_receive_bytes_total",
                 "goodput_gpu_nvlink_errors_total"):
        assert [s for s in series(text, name) if s["gpu"] == "0"] == [], name
        assert [s for s in series(text, name) if s["gpu"] == "1"] != [], name
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
    assert value(text, "goodput_gpu_lost_total", gpu="1", uuid="unknown") == 1  # lost at start-up: once
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


# --- memory, PCIe and NVLink health (issue 16) -----------------------------------------------------------------

HEALTH_GAUGES = ("goodput_gpu_memory_clock_hertz", "goodput_gpu_memory_temperature_celsius",
                 "goodput_gpu_memory_reserved_bytes", "goodput_gpu_encoder_utilization_ratio",
                 "goodput_gpu_decoder_utilization_ratio", "goodput_gpu_pcie_link_generation",
                 "goodput_gpu_pcie_link_max_generation", "goodput_gpu_pcie_link_width",
                 "goodput_gpu_pcie_link_max_width", "goodput_gpu_row_remap_pending", "goodput_gpu_row_remap_failure",
                 "goodput_gpu_retired_pages_pending", "goodput_gpu_pcie_replays_total")


def test_a_healthy_h100_reports_memory_pcie_and_nvlink_health_in_base_units() -> None:
    clock, _sim, source = setup(2)
    clock.advance(2)
    batch = source.collect()
    assert batch.errors == []
    text = Renderer().render(batch, TEXT).decode()
    for name in HEALTH_GAUGES:
        assert value(text, name, gpu="1") is not None, name
    assert value(text, "goodput_gpu_memory_clock_hertz", gpu="0") == 2619e6
    assert 30 <= value(text, "goodput_gpu_memory_temperature_celsius", gpu="0") < 90
    assert value(text, "goodput_gpu_memory_reserved_bytes", gpu="0") == 512 * 2**20
    assert value(text, "goodput_gpu_encoder_utilization_ratio", gpu="0") == 0
    assert value(text, "goodput_gpu_decoder_utilization_ratio", gpu="0") == 0
    # gen 5 x16, busy, so at its maximum
    assert value(text, "goodput_gpu_pcie_link_generation", gpu="0") == 5
    assert value(text, "goodput_gpu_pcie_link_max_generation", gpu="0") == 5
    assert value(text, "goodput_gpu_pcie_link_width", gpu="0") == 16
    assert value(text, "goodput_gpu_pcie_link_max_width", gpu="0") == 16
    assert value(text, "goodput_gpu_pcie_replays_total", gpu="0") == 0
    rows = {s["error_type"]: value(text, "goodput_gpu_remapped_rows_total", gpu="0", error_type=s["error_type"])
            for s in series(text, "goodput_gpu_remapped_rows_total") if s["gpu"] == "0"}
    assert rows == {"corrected": 0, "uncorrected": 0}
    assert value(text, "goodput_gpu_row_remap_pending", gpu="0") == 0
    assert value(text, "goodput_gpu_row_remap_failure", gpu="0") == 0
    assert {s["cause"] for s in series(text, "goodput_gpu_retired_pages_total") if s["gpu"] == "0"} == \
        {"single_bit", "double_bit"}
    assert value(text, "goodput_gpu_retired_pages_pending", gpu="0") == 0
    # each of the four data-link counters, summed over the GPU's active links (18 on an H100)
    errors = [s for s in series(text, "goodput_gpu_nvlink_errors_total") if s["gpu"] == "0"]
    assert len(errors) == 4 and all("link" not in s for s in errors)
    assert {s["error_type"] for s in errors} == {"replay", "recovery", "crc_flit", "crc_data"}
    assert {value(text, "goodput_gpu_nvlink_errors_total", gpu="0", error_type=s["error_type"])
            for s in errors} == {0}


def test_an_idle_gpu_drops_its_pcie_generation_but_not_its_width() -> None:
    clock, sim, source = setup(2, pattern="square", busy=0.1, idle=0.1)
    sim.set_pattern(1, Pattern([(1.0, 0)]))  # never busy
    clock.advance(3)
    text = scrape(source)
    assert value(text, "goodput_gpu_pcie_link_generation", gpu="1") == 1
    assert value(text, "goodput_gpu_pcie_link_max_generation", gpu="1") == 5
    assert value(text, "goodput_gpu_pcie_link_width", gpu="1") == 16
    assert value(text, "goodput_gpu_pcie_link_generation", gpu="0") == 5  # busy half the time: at its maximum


def test_row_remap_pending_until_a_reset_and_the_row_counted_for_good() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    scrape(source)
    sim.remap_row(1)  # after an uncorrectable error
    clock.advance(SLOW_INTERVAL)  # row remapping is read every slow_interval
    text = scrape(source)
    assert value(text, "goodput_gpu_row_remap_pending", gpu="1") == 1
    assert value(text, "goodput_gpu_remapped_rows_total", gpu="1", error_type="uncorrected") == 1
    assert value(text, "goodput_gpu_remapped_rows_total", gpu="1", error_type="corrected") == 0
    assert value(text, "goodput_gpu_row_remap_pending", gpu="0") == 0
    sim.remap_row(1, uncorrected=False)
    sim.reset(1)
    clock.advance(SLOW_INTERVAL)
    text = scrape(source)
    assert value(text, "goodput_gpu_row_remap_pending", gpu="1") == 0
    assert value(text, "goodput_gpu_remapped_rows_total", gpu="1", error_type="uncorrected") == 1  # remapped for good
    assert value(text, "goodput_gpu_remapped_rows_total", gpu="1", error_type="corrected") == 1
    sim.fail_row_remap(1)
    sim.retire_page(0)
    clock.advance(SLOW_INTERVAL)
    text = scrape(source)
    assert value(text, "goodput_gpu_row_remap_failure", gpu="1") == 1
    assert value(text, "goodput_gpu_retired_pages_total", gpu="0", cause="double_bit") == 1
    assert value(text, "goodput_gpu_retired_pages_pending", gpu="0") == 1


def test_the_drivers_recovery_action_is_read_at_every_collection_and_absent_where_unknown() -> None:
    clock, sim, source = setup(3)
    sim.set_unsupported(2, "field:230")  # a driver before R570 does not know the field
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_recovery_action", gpu="0") == 0
    sim.set_recovery_action(1, 2)  # the driver's XID 154: "node reboot required"
    clock.advance(1)  # not a slow reading: the next collection has it
    text = scrape(source)
    assert value(text, "goodput_gpu_recovery_action", gpu="1") == 2
    assert value(text, "goodput_gpu_recovery_action", gpu="0") == 0
    assert 'goodput_gpu_recovery_action{gpu="2"' not in text
    sim.set_recovery_action(1, 0)  # reset: nothing needed any more
    clock.advance(1)
    assert value(scrape(source), "goodput_gpu_recovery_action", gpu="1") == 0


def test_a_degraded_pcie_link_trains_below_its_maximum() -> None:
    clock, sim, source = setup(2, pattern="square", busy=0.4, idle=0.1)
    sim.degrade_pcie(0)
    clock.advance(2)
    text = scrape(source)
    assert value(text, "goodput_gpu_pcie_link_generation", gpu="0") == 3
    assert value(text, "goodput_gpu_pcie_link_width", gpu="0") == 8
    assert value(text, "goodput_gpu_pcie_link_max_generation", gpu="0") == 5
    assert value(text, "goodput_gpu_pcie_link_max_width", gpu="0") == 16
    assert value(text, "goodput_gpu_pcie_link_width", gpu="1") == 16
    sim.inject_pcie_replays(0, 7)
    sim.restore_pcie(0)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_pcie_link_width", gpu="0") == 16  # read at every collection
    assert value(text, "goodput_gpu_pcie_replays_total", gpu="0") == 0  # every slow_interval: its last answer
    clock.advance(SLOW_INTERVAL)
    text = scrape(source)
    assert value(text, "goodput_gpu_pcie_replays_total", gpu="0") == 7
    with pytest.raises(ValueError, match="beyond"):
        sim.degrade_pcie(0, generation=6)


def test_nvlink_errors_on_one_link_rise_in_its_gpus_total_and_stay_counted() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    scrape(source)
    sim.nvlink_errors(1, link=3, seconds=10)
    clock.advance(5)
    text = scrape(source)  # read every SLOW_INTERVAL seconds: the last answer (0) until then
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="crc_flit") == 0
    clock.advance(SLOW_INTERVAL - 5)
    text = scrape(source)
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="crc_flit") == 2000
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="replay") == 20
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="recovery") == 0
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="0", error_type="crc_flit") == 0
    assert all("link" not in s for s in series(text, "goodput_gpu_nvlink_errors_total"))
    clock.advance(20)
    text = scrape(source)
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="crc_flit") == 2000
    sim.nvlink_errors(1, link=3, seconds=60)
    clock.advance(1)
    sim.stop_nvlink_errors(1)
    clock.advance(10)
    text = scrape(source)
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="1", error_type="crc_flit") == 2200


def test_unsupported_health_queries_are_absent_never_zero_and_asked_once() -> None:
    clock, sim, source = setup(2, per_link=True)
    # row remapping (fields 142-145), retired pages (29-31), PCIe replays (94), memory temperature (82)
    sim.set_unsupported(0, *(f"field:{field}" for field in (142, 143, 144, 145, 29, 30, 31, 94, 82)),
                        "device_memory_reserved_bytes", "device_encoder_utilization_percent",
                        "device_pcie_link_generation", "device_memory_clock_mhz")
    calls = {"n": 0}
    original = sim.device_nvlink_error_count

    def counting(handle, link, counter):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if handle.index == 0 and link == 5:
            raise GpuError(NOT_SUPPORTED, "not on this link")
        return original(handle, link, counter)

    sim.device_nvlink_error_count = counting  # type: ignore[method-assign]
    for _ in range(3):
        clock.advance(SLOW_INTERVAL)  # the link error counters are read this often
        batch = source.collect()
    assert batch.errors == []
    text = Renderer().render(batch, TEXT).decode()
    for name in ("goodput_gpu_row_remap_pending", "goodput_gpu_row_remap_failure", "goodput_gpu_retired_pages_pending",
                 "goodput_gpu_memory_reserved_bytes", "goodput_gpu_encoder_utilization_ratio",
                 "goodput_gpu_pcie_replays_total", "goodput_gpu_pcie_link_generation",
                 "goodput_gpu_memory_clock_hertz", "goodput_gpu_memory_temperature_celsius"):
        assert value(text, name, gpu="0") is None, name
        assert value(text, name, gpu="1") is not None, name
    for name in ("goodput_gpu_remapped_rows_total", "goodput_gpu_retired_pages_total"):
        assert [s for s in series(text, name) if s["gpu"] == "0"] == [], name
    assert value(text, "goodput_gpu_decoder_utilization_ratio", gpu="0") is not None  # only the encoder is missing
    assert value(text, "goodput_gpu_pcie_link_max_generation", gpu="0") is not None
    links = {s["link"] for s in series(text, "goodput_gpu_nvlink_link_errors_total") if s["gpu"] == "0"}
    assert "5" not in links and len(links) == 17
    # the GPU's totals: over the 17 links that have the counters
    assert {s["error_type"] for s in series(text, "goodput_gpu_nvlink_errors_total") if s["gpu"] == "0"} == {
        "replay", "recovery", "crc_flit", "crc_data"}
    assert calls["n"] == 3 * 2 * 18 * 4 - 2 * 4  # link 5 of GPU 0 asked once, not in the 2 rounds after


def test_a_driver_without_the_v2_memory_structure_has_no_reserved_memory() -> None:
    clock, sim, source = setup(1)
    sim.fail("device_memory_reserved_bytes", ARGUMENT_VERSION_MISMATCH)
    for _ in range(2):
        clock.advance(1)
        batch = source.collect()
        assert batch.errors == []
    text = Renderer().render(batch, TEXT).decode()
    assert value(text, "goodput_gpu_memory_reserved_bytes", gpu="0") is None
    assert value(text, "goodput_gpu_memory_used_bytes", gpu="0") is not None
    assert "memory_reserved" in source._gpus[0].unsupported


def test_a_failing_first_nvlink_read_is_counted_and_the_total_waits_for_every_link() -> None:
    clock, sim, source = setup(1, per_link=True)
    clock.advance(1)
    sim.fail("device_nvlink_error_count", UNKNOWN, calls=1)
    batch = source.collect()
    assert batch.errors == ["nvml_unknown"]
    # link 0's replay counter never read: the replay total waits for it (published without it, then with it, it
    # would jump by all the link had counted); the other three are whole
    assert {labels[2] for labels in batch.values(c.GPU_NVLINK_ERRORS)} == {"recovery", "crc_flit", "crc_data"}
    assert len(batch.values(c.GPU_NVLINK_LINK_ERRORS)) == 18 * 4 - 1  # its own series is absent that round only
    clock.advance(SLOW_INTERVAL)
    batch = source.collect()
    assert batch.errors == [] and len(batch.values(c.GPU_NVLINK_LINK_ERRORS)) == 18 * 4
    assert len(batch.values(c.GPU_NVLINK_ERRORS)) == 4


def test_a_link_first_read_after_the_total_is_published_adds_only_its_growth() -> None:
    """A link that never answered for FIRST_ROUNDS rounds, then does with a count from before: the total goes on from
    where it was, by what the link adds from then on (not by its lifetime count at once)."""
    clock, sim, source = setup(1)
    sim.nvlink_errors(0, link=5, seconds=3600)  # link 5 counts 200 CRC flit errors a second from now on
    clock.advance(100)  # it has counted 20,000 before the daemon first reads it
    failing = {"on": True}
    original = sim.device_nvlink_error_count

    def link5_down(handle, link, counter):  # type: ignore[no-untyped-def]
        if link == 5 and failing["on"]:
            raise GpuError(UNKNOWN, "link 5 does not answer")
        return original(handle, link, counter)

    sim.device_nvlink_error_count = link5_down  # type: ignore[method-assign]
    totals = []
    for _ in range(_LinkTotal.FIRST_ROUNDS):
        totals.append(_totals(source.collect()).get("crc_flit"))
        clock.advance(SLOW_INTERVAL)
    assert totals[:-1] == [None] * (_LinkTotal.FIRST_ROUNDS - 1)  # waiting for link 5's first answer
    assert totals[-1] == 0  # then published without it: the other links counted none
    failing["on"] = False
    answered = _totals(source.collect())["crc_flit"]
    assert answered == 0  # its 20,000 + 200 x 30 counted before are not an increase
    clock.advance(SLOW_INTERVAL)
    assert _totals(source.collect())["crc_flit"] == 200 * SLOW_INTERVAL  # what it adds from then on


def test_an_nvlink_counter_no_link_ever_answered_for_is_absent_not_zero() -> None:
    clock, sim, source = setup(1)
    clock.advance(1)
    sim.fail("device_nvlink_error_count", UNKNOWN, calls=18 * 4)  # the whole first round of reads
    batch = source.collect()
    assert batch.errors == ["nvml_unknown"] * 18 * 4  # each failed read counted
    assert batch.values(c.GPU_NVLINK_ERRORS) == {}
    assert batch.values(c.GPU_UP) == {("0", sim.uuid(0)): 1}  # the GPU answered everything else
    clock.advance(1)
    assert source.collect().values(c.GPU_NVLINK_ERRORS) == {}  # not read again before SLOW_INTERVAL
    clock.advance(SLOW_INTERVAL)
    batch = source.collect()
    assert batch.errors == [] and set(batch.values(c.GPU_NVLINK_ERRORS).values()) == {0}
    assert len(batch.values(c.GPU_NVLINK_ERRORS)) == 4


def _totals(batch: object, gpu: str = "0") -> dict[str, int]:
    """The GPU's NVLink totals of a batch: transmit, receive, and each error_type."""
    out = {}
    for metric, name in ((c.GPU_NVLINK_TX, "tx"), (c.GPU_NVLINK_RX, "rx"), (c.GPU_NVLINK_ERRORS, None)):
        for labels, total in batch.values(metric).items():  # type: ignore[attr-defined]
            if labels[0] == gpu:
                out[name or labels[2]] = total
    return out


def test_per_link_nvlink_series_are_opt_in_and_sum_to_the_gpus_totals() -> None:
    counts = {}
    for per_link in (False, True):
        clock, sim, source = setup(2, per_link=per_link, pattern="square", busy=0.4, idle=0.1)
        clock.advance(1)
        source.collect()
        sim.nvlink_errors(1, link=7, seconds=60)
        sim.nvlink_errors(1, link=11, seconds=3)
        clock.advance(SLOW_INTERVAL)
        batch = source.collect()
        assert batch.errors == []
        text = Renderer().render(batch, TEXT).decode()
        counts[per_link] = len([1 for _, labels in samples(text) if ("gpu", "1") in labels])
        totals = _totals(batch, "1")
        assert totals["tx"] > 0 and totals["crc_flit"] == 200 * (SLOW_INTERVAL + 3)
        links = {name: [s for s in series(text, name) if s["gpu"] == "1"] for name in (
            "goodput_gpu_nvlink_link_transmit_bytes_total", "goodput_gpu_nvlink_link_receive_bytes_total",
            "goodput_gpu_nvlink_link_errors_total")}
        if not per_link:
            assert all(found == [] for found in links.values())
            continue
        assert {s["link"] for s in links["goodput_gpu_nvlink_link_transmit_bytes_total"]} == {
            str(link) for link in range(18)}
        assert len(links["goodput_gpu_nvlink_link_receive_bytes_total"]) == 18
        assert len(links["goodput_gpu_nvlink_link_errors_total"]) == 18 * 4
        tx = sum(value(text, "goodput_gpu_nvlink_link_transmit_bytes_total", **s)
                 for s in links["goodput_gpu_nvlink_link_transmit_bytes_total"])
        rx = sum(value(text, "goodput_gpu_nvlink_link_receive_bytes_total", **s)
                 for s in links["goodput_gpu_nvlink_link_receive_bytes_total"])
        assert (tx, rx) == (totals["tx"], totals["rx"])
        for error_type in ("replay", "recovery", "crc_flit", "crc_data"):
            per_link_sum = sum(value(text, "goodput_gpu_nvlink_link_errors_total", **s)
                               for s in links["goodput_gpu_nvlink_link_errors_total"] if s["error_type"] == error_type)
            assert per_link_sum == totals[error_type], error_type
        assert value(text, "goodput_gpu_nvlink_link_errors_total", gpu="1", uuid=sim.uuid(1), link="7",
                     error_type="crc_flit") == 200 * SLOW_INTERVAL
    # per GPU: 18 transmit + 18 receive + 18 x 4 error series more with nvlink_per_link
    assert counts[True] - counts[False] == 18 + 18 + 18 * 4


def test_a_failed_nvlink_read_keeps_the_gpus_totals_from_going_down() -> None:
    """A link whose read fails counts with its last answer: the total never drops (rate() would see a reset)."""
    clock, sim, source = setup(1, pattern="square", busy=0.4, idle=0.1)
    original = sim.device_field_values
    answers: list[list[int | None]] = []  # the data counters of each field read that answered (KiB)
    missing: list[int] = []  # links whose transmit counter reads None

    def recorded(handle, fields):  # type: ignore[no-untyped-def]
        values = original(handle, fields)
        if len(fields) == 1:  # at start-up: the link count
            return values
        # after PCIe, memory temperature and energy: each link's transmit, receive (then, some rounds, the slow ones)
        answers.append(values[_LINK_FIELDS:_LINK_FIELDS + 2 * 18:2])
        for link in missing:
            values[_LINK_FIELDS + 2 * link] = None
        return values

    sim.device_field_values = recorded  # type: ignore[method-assign]
    sim.nvlink_errors(0, link=0, seconds=600)  # link 0 is the first read of each round
    clock.advance(1)
    first = _totals(source.collect())
    assert first["replay"] == 2 and first["crc_flit"] == 200
    # the error counters: link 0's replay counter fails (the round's first call); it keeps its last answer
    sim.fail("device_nvlink_error_count", UNKNOWN, calls=1)
    clock.advance(SLOW_INTERVAL)
    batch = source.collect()
    assert batch.errors == ["nvml_unknown"]
    second = _totals(batch)
    assert second["replay"] == first["replay"]  # not 0: the other 17 links counted none
    assert second["crc_flit"] == 200 * (1 + SLOW_INTERVAL)  # read this round
    assert second["tx"] == 1024 * sum(answers[-1])
    # the data counters: a whole field read fails; every link keeps its last answer
    sim.fail("device_field_values", UNKNOWN, calls=1)
    clock.advance(1)
    batch = source.collect()
    assert batch.errors == ["nvml_unknown"]
    assert batch.values(c.GPU_PCIE_TX) == {}  # a gauge-like single counter: absent that round, as before
    third = _totals(batch)
    assert (third["tx"], third["rx"]) == (second["tx"], second["rx"])
    # link 5's transmit counter reads None: the other links' new answers, and link 5's last one
    before = answers[-1]
    missing.append(5)
    clock.advance(1)
    fourth = _totals(source.collect())
    now = answers[-1]
    assert now[5] > before[5]  # it did count: the total has it at its last answer
    assert fourth["tx"] == 1024 * (sum(now) - now[5] + before[5])
    missing.clear()
    clock.advance(1)
    fifth = _totals(source.collect())
    assert fifth["tx"] == 1024 * sum(answers[-1])
    assert second["tx"] == third["tx"] < fourth["tx"] < fifth["tx"]


def test_an_nvlink_counter_that_goes_back_keeps_the_gpus_total_counting() -> None:
    """A link counter lower than its last answer (the driver reset it): what it had counted stays in the total."""
    clock, sim, source = setup(1, pattern="square", busy=0.4, idle=0.1)
    errors, fields = sim.device_nvlink_error_count, sim.device_field_values
    reset = {"errors": 0, "kib": 0}  # subtracted from link 2's counters: what they had when "reset"

    def link2_errors(handle, link, counter):  # type: ignore[no-untyped-def]
        count = errors(handle, link, counter)
        return count - reset["errors"] if link == 2 and counter == 2 else count  # crc_flit

    def link2_fields(handle, fields_asked):  # type: ignore[no-untyped-def]
        values = fields(handle, fields_asked)
        if len(fields_asked) > 1:  # not the link count, at start-up
            values[_LINK_FIELDS + 2 * 2] -= reset["kib"]  # link 2's transmit counter
        return values

    sim.device_nvlink_error_count = link2_errors  # type: ignore[method-assign]
    sim.device_field_values = link2_fields  # type: ignore[method-assign]
    sim.nvlink_errors(0, link=2, seconds=600)

    def tx_kib() -> list[int]:  # each link's transmit counter, as the simulator has it now (before any reset)
        return fields(sim.device_handle(0), source._gpus[0].fields)[_LINK_FIELDS::2]  # type: ignore[index]

    clock.advance(SLOW_INTERVAL)
    first = _totals(source.collect())
    assert first["crc_flit"] == 200 * SLOW_INTERVAL
    before = tx_kib()
    assert first["tx"] == 1024 * sum(before)
    # both of link 2's counters were reset 2.5 s after that read: they count from 0 since
    clock.advance(SLOW_INTERVAL)
    now = tx_kib()
    reset.update(errors=200 * (SLOW_INTERVAL + 2.5), kib=now[2] - 1000)  # link 2 reads 1000 KiB now
    batch = source.collect()
    assert batch.errors == []
    second = _totals(batch)
    # the total goes on from what link 2 had counted, never down
    assert second["crc_flit"] == 200 * SLOW_INTERVAL + 200 * (SLOW_INTERVAL - 2.5)
    assert second["tx"] == 1024 * (sum(now) - now[2] + before[2] + 1000) > first["tx"]
    clock.advance(SLOW_INTERVAL)
    later = tx_kib()
    third = _totals(source.collect())
    assert third["crc_flit"] == 200 * SLOW_INTERVAL + 200 * (2 * SLOW_INTERVAL - 2.5)
    assert third["tx"] == 1024 * (sum(later) - later[2] + before[2] + later[2] - reset["kib"]) > second["tx"]
    assert third["rx"] > second["rx"] > first["rx"]  # the receive counters, never reset, count as ever


def test_lost_gpu_withdraws_its_health_series() -> None:
    clock, sim, source = setup(2)
    clock.advance(1)
    scrape(source)
    sim.remap_row(1)
    sim.lose(1)
    clock.advance(1)
    text = scrape(source)
    assert value(text, "goodput_gpu_up", gpu="1") == 0
    assert value(text, "goodput_gpu_row_remap_pending", gpu="1") is None
    assert [s for s in series(text, "goodput_gpu_nvlink_errors_total") if s["gpu"] == "1"] == []


def test_scheduled_health_faults_reach_the_simulated_gpus() -> None:
    config = SimulateConfig.model_validate({"gpus": 3, "faults": [
        {"at": "1ms", "gpu": 0, "kind": "row_remap_pending"},
        {"at": "1ms", "gpu": 1, "kind": "pcie_degraded"},
        {"at": "1ms", "gpu": 2, "kind": "nvlink_errors", "link": 4, "duration": "1m"}]})
    clock = ManualClock()
    sim = SimulatedGpus(3, clock=clock, pattern="square", busy=0.4, idle=0.1)
    source = NvmlSource(sim, clock=clock)
    stop = threading.Event()
    schedule_faults(sim, config.faults, stop).join(5)
    clock.advance(10)
    text = scrape(source)
    assert value(text, "goodput_gpu_row_remap_pending", gpu="0") == 1
    assert value(text, "goodput_gpu_remapped_rows_total", gpu="0", error_type="uncorrected") == 1
    assert value(text, "goodput_gpu_pcie_link_width", gpu="1") == 8
    assert value(text, "goodput_gpu_pcie_link_generation", gpu="1") == 3
    assert value(text, "goodput_gpu_nvlink_errors_total", gpu="2", error_type="crc_flit") == 2000
    with pytest.raises(ValueError, match="link"):
        SimulateConfig.model_validate({"gpus": 1, "faults": [{"at": "1ms", "kind": "nvlink_errors", "link": 18}]})


def test_calls_are_counted_by_nvml_function_and_stay_within_the_budget() -> None:
    """At the default intervals: every field of a collection (the violation counters' included) in one
    nvmlDeviceGetFieldValues call per GPU, what only a fault changes every slow_interval, and at most 10 NVML calls
    per GPU per second (39 before batching and cadences), each counted under its NVML function's name."""
    clock, _sim, source = setup(2)
    seconds = 4 * SLOW_INTERVAL
    for _ in range(round(seconds / INTERVAL)):
        clock.advance(INTERVAL)
        source.collect()
    calls = source.library_calls()
    # start-up: init, driver version, count, and per GPU its handle, identity, affinity, events, links
    assert calls["nvmlInit"] == 1 and calls["nvmlDeviceGetHandleByIndex"] == 2
    collections = round(seconds / INTERVAL)
    assert calls["nvmlDeviceGetFieldValues"] == 2 * (collections + 1)  # + the link count at start-up
    assert calls["nvmlDeviceGetPowerUsage"] == 2 * collections
    assert "nvmlDeviceGetViolationStatus" not in calls  # the violation counters are fields of the one call
    assert calls["nvmlDeviceGetEnforcedPowerLimit"] == 2 * 4  # every slow_interval
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 4 * 18 * 4  # per link and counter, every slow_interval
    assert "nvmlDeviceGetTotalEccErrors" not in calls and "nvmlDeviceGetRemappedRows" not in calls  # fields now
    steady = sum(calls.values()) - calls["nvmlDeviceGetNvLinkState"] - calls["nvmlDeviceGetHandleByIndex"]
    assert steady / 2 / seconds <= 10


def test_nvml_initialisation_is_retried_with_backoff_and_recovers() -> None:
    clock = ManualClock()
    monotonic = ManualClock(0.0)
    sim = SimulatedGpus(1, clock=clock)
    source = NvmlSource(sim, clock=clock, monotonic=monotonic)
    sim.fail("init", LIBRARY_NOT_FOUND)
    tries = []
    for second in range(700):
        before = source.library_calls().get("nvmlInit", 0)
        with pytest.raises(SourceError) as info:
            source.collect()
        assert info.value.reason == "nvml_not_found"  # every collection says why, without trying again
        if source.library_calls()["nvmlInit"] > before:
            tries.append(second)
        monotonic.advance(1)
    assert tries == [0, 10, 30, 70, 150, 310, 610]  # 10 s, then twice as long each time, up to 300 s
    assert "next try in 300s" in str(info.value)
    sim.clear_faults()
    monotonic.advance(290)  # the next try is due
    clock.advance(1)
    assert value(scrape(source), "goodput_gpu_up", gpu="0") == 1
    assert source._init_retry.failures == 0  # a success starts the backoff over
