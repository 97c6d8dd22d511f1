"""The dcgm source's bindings path against the simulated DCGM (the same DcgmBackend interface the real
bindings implement), on a manual clock, and the real bindings' loader without DCGM installed."""

from __future__ import annotations

import sys

import pytest
from conftest import ManualClock, live_server, quick_config, series, value, wait_for

from exporter.config import load
from exporter.core.exposition import TEXT, Renderer
from exporter.core.gpus import NodeGpus
from exporter.core.source import SourceError
from exporter.sources.dcgm.api import PROFILING_NOT_SUPPORTED, REQUIRES_ROOT
from exporter.sources.dcgm.bindings import DcgmBindings
from exporter.sources.dcgm.simulated import SimulatedDcgm
from exporter.sources.dcgm.source import CONNECT_RETRY_FIRST, HIERARCHY_EVERY, PROFILING_RETRY_AFTER, DcgmSource
from exporter.sources.nvml.simulated import Pattern, SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

RATIOS = {
    "goodput_gpu_sm_active_ratio": "sm_active", "goodput_gpu_sm_occupancy_ratio": "sm_occupancy",
    "goodput_gpu_tensor_active_ratio": "tensor_active", "goodput_gpu_dram_active_ratio": "dram_active",
    "goodput_gpu_fp16_active_ratio": "fp16_active", "goodput_gpu_fp32_active_ratio": "fp32_active",
    "goodput_gpu_fp64_active_ratio": "fp64_active", "goodput_gpu_gr_engine_active_ratio": "gr_engine_active",
    "goodput_gpu_tensor_hmma_active_ratio": "tensor_hmma_active",
    "goodput_gpu_tensor_imma_active_ratio": "tensor_imma_active",
    "goodput_gpu_tensor_dfma_active_ratio": "tensor_dfma_active", "goodput_gpu_int_active_ratio": "int_active",
}
RATES = {
    "goodput_gpu_pcie_transmit_bytes_per_second": "pcie_tx", "goodput_gpu_pcie_receive_bytes_per_second": "pcie_rx",
    "goodput_gpu_nvlink_transmit_bytes_per_second": "nvlink_tx",
    "goodput_gpu_nvlink_receive_bytes_per_second": "nvlink_rx",
}


def dcgm_config(**keys: object):  # type: ignore[no-untyped-def]
    return load(None, {"dcgm": {"enabled": True, "interval": "1s", **keys}}, environ={}).dcgm


def start(source: DcgmSource) -> None:
    """The first collection: DCGM starts watching, and has values at once (as after UpdateAllFields)."""
    source.collect()


class Rig:
    """Simulated GPUs seen by both sources, the nvml one filling the UUID table the dcgm one reads."""

    def __init__(self, count: int = 2, **sim_args: object) -> None:
        self.clock = ManualClock()
        self.sim = SimulatedGpus(count, clock=self.clock, **sim_args)  # type: ignore[arg-type]
        self.dcgm = SimulatedDcgm(self.sim)
        self.nvml = NvmlSource(self.sim, clock=self.clock)
        self.source = DcgmSource(dcgm_config(), self.dcgm, self.nvml.table, clock=self.clock)
        self.nvml.collect()  # NVML identifies the GPUs first, as in the daemon
        self.renderer = Renderer()

    def scrape(self, seconds: float = 1.0) -> str:
        self.clock.advance(seconds)
        batch = self.nvml.collect()
        self.down: str | None = None
        try:
            dcgm = self.source.collect()
        except SourceError as exc:  # the source is down (the runner would count the reason)
            self.down, self.last_errors = exc.reason, []
            return self.renderer.render(batch, TEXT).decode()
        for metric, rows in dcgm.series.items():
            for labels, v in rows:
                batch.add(metric, labels, v)
        batch.errors += dcgm.errors
        self.last_errors = dcgm.errors
        return self.renderer.render(batch, TEXT).decode()


def test_every_field_matches_the_simulators_truth_over_dcgms_last_period() -> None:
    rig = Rig(2)
    rig.scrape()  # watch starts
    assert rig.down is None
    for _ in range(30):
        text = rig.scrape(1.7)
        t0, t1 = rig.dcgm.latest_period()
        for gpu in range(2):
            truth = rig.sim.truth_activity(gpu, t0, t1)
            uuid = rig.sim.uuid(gpu)
            for name, key in {**RATIOS, **RATES}.items():
                assert value(text, name, gpu=str(gpu), uuid=uuid) == pytest.approx(truth[key], rel=1e-9, abs=1e-12)
            for name in RATIOS:
                assert 0.0 <= value(text, name, gpu=str(gpu)) <= 1.0
    assert rig.last_errors == []


def test_stall_lowers_everything_memory_phase_is_dram_high_tensor_low() -> None:
    rig = Rig(1)
    rig.sim.set_pattern(0, Pattern([(10.0, 1, "compute"), (10.0, 1, "memory"), (10.0, 0)]))
    rig.scrape(0.5)
    compute = rig.scrape(5.0)  # DCGM's last period: seconds 4-5, compute
    memory = rig.scrape(10.0)  # 14-15, memory-bound
    stall = rig.scrape(10.0)  # 24-25, nothing runs

    def get(text: str, name: str) -> float:
        return value(text, name, gpu="0")  # type: ignore[return-value]

    assert get(compute, "goodput_gpu_tensor_active_ratio") > 0.5 > get(compute, "goodput_gpu_dram_active_ratio")
    assert get(memory, "goodput_gpu_dram_active_ratio") > 0.8
    assert get(memory, "goodput_gpu_tensor_active_ratio") < 0.05
    for name in RATIOS:
        assert get(stall, name) == 0.0, name
    assert get(stall, "goodput_gpu_pcie_transmit_bytes_per_second") < get(
        memory, "goodput_gpu_pcie_transmit_bytes_per_second")
    assert get(stall, "goodput_gpu_utilization_ratio") == 0.0  # NVML agrees: nothing ran
    assert get(memory, "goodput_gpu_utilization_ratio") == 1.0
    assert get(compute, "goodput_gpu_utilization_ratio") == 1.0


def test_training_pattern_stalls_and_optimizer_phases_show_up() -> None:
    rig = Rig(1)
    rig.scrape()
    tensor, dram = [], []
    for _ in range(320):  # past the checkpoint pause at 300 s
        text = rig.scrape(1.0)
        tensor.append(value(text, "goodput_gpu_tensor_active_ratio", gpu="0"))
        dram.append(value(text, "goodput_gpu_dram_active_ratio", gpu="0"))
    assert min(t for t in tensor if t is not None) == 0.0  # the checkpoint pause
    assert max(t for t in tensor if t is not None) > 0.4
    # what the source exported over the last 300 s shows the 80/20 compute/memory steps
    recent_tensor = [t for t in tensor[-300:] if t is not None]
    recent_dram = [d for d in dram[-300:] if d is not None]
    assert len(recent_tensor) == len(recent_dram) == 300
    assert sum(recent_dram) / 300 > 0.3 and sum(recent_tensor) / 300 > 0.4


def test_gpus_are_labelled_with_nvmls_index_by_uuid_and_foreign_ones_counted() -> None:
    rig = Rig(3)
    rig.scrape()
    # NVML numbers the GPUs differently from DCGM (e.g. another enumeration order) and lacks one
    inventory = NodeGpus()
    inventory.record(rig.sim.uuid(0), "2")
    inventory.record(rig.sim.uuid(1), "0")
    source = DcgmSource(dcgm_config(), rig.dcgm, inventory, clock=rig.clock)
    start(source)
    rig.clock.advance(2)
    batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    assert {(x["gpu"], x["uuid"]) for x in series(text, "goodput_gpu_tensor_active_ratio")} == {
        ("2", rig.sim.uuid(0)), ("0", rig.sim.uuid(1))}
    assert batch.errors.count("dcgm_unknown_gpu") == 1


def test_without_nvml_dcgms_own_ids_label_the_gpus() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(2, clock=clock)
    source = DcgmSource(dcgm_config(), SimulatedDcgm(sim), clock=clock)
    start(source)
    clock.advance(2)
    text = Renderer().render(source.collect(), TEXT).decode()
    assert {(s["gpu"], s["uuid"]) for s in series(text, "goodput_gpu_dram_active_ratio")} == {
        ("0", sim.uuid(0)), ("1", sim.uuid(1))}


def test_lost_gpu_has_no_dcgm_values_the_others_do() -> None:
    rig = Rig(2)
    rig.scrape()
    rig.sim.lose(1)
    text = rig.scrape()
    assert value(text, "goodput_gpu_sm_active_ratio", gpu="1") is None
    assert value(text, "goodput_gpu_sm_active_ratio", gpu="0") is not None
    assert value(text, "goodput_gpu_up", gpu="1") == 0


def test_dead_host_engine_is_a_clear_error_then_reconnects() -> None:
    rig = Rig(1)
    rig.dcgm.stop_hostengine()
    with pytest.raises(SourceError) as info:
        rig.source.collect()
    assert info.value.reason == "dcgm_connection_not_valid"
    assert "nv-hostengine" in str(info.value) and "localhost" in str(info.value)
    assert "next try in 5s" in str(info.value)
    rig.dcgm.start_hostengine()
    connects = rig.dcgm.connects
    rig.scrape(CONNECT_RETRY_FIRST - 1)
    assert rig.down == "dcgm_connection_not_valid" and rig.dcgm.connects == connects  # no busy retry
    rig.scrape(1)
    text = rig.scrape()
    assert value(text, "goodput_gpu_sm_active_ratio", gpu="0") is not None
    assert rig.source.library_calls()["dcgmConnect_v2"] == 2  # the try that failed, then one after the wait
    rig.dcgm.stop_hostengine()  # dies mid-run: the next read fails, the one after reconnects
    with pytest.raises(SourceError) as info:
        rig.source.collect()
    assert info.value.reason == "dcgm_connection_not_valid" and "lost the connection" in str(info.value)
    rig.dcgm.start_hostengine()
    connects = rig.dcgm.connects
    rig.scrape()
    assert rig.dcgm.connects == connects + 1
    assert value(rig.scrape(), "goodput_gpu_sm_active_ratio", gpu="0") is not None


@pytest.mark.parametrize("code", [PROFILING_NOT_SUPPORTED, REQUIRES_ROOT])
def test_profiling_not_supported_is_clear_and_not_asked_every_interval(code: int) -> None:
    rig = Rig(1)
    rig.dcgm.set_profiling_unsupported(code)
    with pytest.raises(SourceError) as info:
        rig.source.collect()
    assert info.value.reason in ("dcgm_profiling_not_supported", "dcgm_requires_root")
    assert "profiling fields" in str(info.value)
    connects = rig.dcgm.connects
    rig.clock.advance(PROFILING_RETRY_AFTER - 1)
    with pytest.raises(SourceError):
        rig.source.collect()
    assert rig.dcgm.connects == connects  # not asked again yet
    rig.dcgm.set_profiling_unsupported(None)  # e.g. the other profiler went away
    rig.clock.advance(2)
    start(rig.source)
    assert rig.dcgm.connects == connects + 1
    assert value(rig.scrape(), "goodput_gpu_tensor_active_ratio", gpu="0") is not None


def test_missing_bindings_path_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "no-dcgm-here"
    source = DcgmSource(dcgm_config(), DcgmBindings(str(missing), "localhost"))
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "dcgm_bindings_not_found"
    assert str(missing) in str(info.value) and "dcgm.bindings_path" in str(info.value)


def test_broken_bindings_directory_is_a_clear_error(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pydcgm.py").write_text("raise RuntimeError('half an installation')\n")
    source = DcgmSource(dcgm_config(), DcgmBindings(str(tmp_path), "localhost"))
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "dcgm_bindings_broken"
    assert "dcgm_structs" in str(info.value)  # the module that could not be imported
    assert "dcgm_structs" not in sys.modules


def test_daemon_reports_each_failure_as_source_down_with_its_reason_and_keeps_serving(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = quick_config(dcgm={"enabled": True, "interval": "100ms", "timeout": "1s",
                                "bindings_path": str(tmp_path / "absent")})
    with live_server(config) as live:  # the real bindings backend, with no DCGM on the path
        text = live.metrics_when("goodput_exporter_source_up", 0, source="dcgm")
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_errors_total", source="dcgm",
                               reason="dcgm_bindings_not_found"))
        assert live.client.get("/healthz").status_code == 200
    sim = SimulatedGpus(2)
    dcgm = SimulatedDcgm(sim)
    dcgm.stop_hostengine()
    config = quick_config(dcgm={"enabled": True, "interval": "100ms", "timeout": "1s"})
    with live_server(config, backend=sim, dcgm_backend=dcgm) as live:
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_errors_total", source="dcgm",
                               reason="dcgm_connection_not_valid"))
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="dcgm") == 0
        assert value(text, "goodput_gpu_up", gpu="0") == 1
        dcgm.start_hostengine()
        text = live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
        wait_for(lambda: value(live.metrics(), "goodput_gpu_sm_occupancy_ratio", gpu="1") is not None)
        dcgm.set_profiling_unsupported(PROFILING_NOT_SUPPORTED)
        dcgm.stop_hostengine()
        dcgm.start_hostengine()
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_errors_total", source="dcgm",
                               reason="dcgm_profiling_not_supported"))
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="dcgm") == 0
        assert series(text, "goodput_gpu_sm_occupancy_ratio") == []


def test_until_nvml_has_identified_the_gpus_the_source_waits_rather_than_guess_labels() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(2, clock=clock)
    inventory = NodeGpus()  # the nvml source runs but has not identified any GPU yet
    source = DcgmSource(dcgm_config(), SimulatedDcgm(sim), inventory, clock=clock)
    clock.advance(2)
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "dcgm_waiting_for_nvml" and "nvml" in str(info.value)
    # NVML numbers them the other way round from DCGM; only its numbering may reach the `gpu` label
    inventory.record(sim.uuid(0), "1")
    inventory.record(sim.uuid(1), "0")
    clock.advance(2)
    text = Renderer().render(source.collect(), TEXT).decode()
    assert {(s["gpu"], s["uuid"]) for s in series(text, "goodput_gpu_sm_active_ratio")} == {
        ("1", sim.uuid(0)), ("0", sim.uuid(1))}


def test_a_uuid_nvml_no_longer_lists_at_its_index_is_forgotten() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(2, clock=clock)
    inventory = NodeGpus()
    inventory.record(sim.uuid(0), "0")
    inventory.record(sim.uuid(1), "1")
    inventory.record("GPU-99999999-0000-0000-0000-000000000000", "0")  # index 0 now holds another GPU
    assert inventory.index_by_uuid() == {sim.uuid(1): "1", "GPU-99999999-0000-0000-0000-000000000000": "0"}
    source = DcgmSource(dcgm_config(), SimulatedDcgm(sim), inventory, clock=clock)
    start(source)
    clock.advance(2)
    batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    assert [(s["gpu"], s["uuid"]) for s in series(text, "goodput_gpu_sm_active_ratio")] == [("1", sim.uuid(1))]
    assert batch.errors.count("dcgm_unknown_gpu") == 1  # the old UUID is not put on gpu="0"


def test_a_gpu_in_mig_mode_is_measured_per_gpu_instance_joining_nvmls_mig_info() -> None:
    rig = Rig(2)
    start(rig.source)
    assert {s.get("gpu_instance_id", "") for s in series(rig.scrape(2.0), "goodput_gpu_sm_active_ratio")} == {""}
    rig.sim.enable_mig(1, ["3g.40gb", "3g.40gb"])  # MIG turned on while the daemon runs
    rig.scrape(HIERARCHY_EVERY)  # the layout is checked again: DCGM is asked to watch the new one
    text = rig.scrape(2.0)
    uuid1 = rig.sim.uuid(1)
    got = {(s["gpu"], s.get("gpu_instance_id", "")) for s in series(text, "goodput_gpu_tensor_active_ratio")}
    mig = {s["gpu_instance_id"] for s in series(text, "goodput_gpu_mig_info") if s["uuid"] == uuid1}
    assert len(mig) == 2
    assert got == {("0", ""), *(("1", gi) for gi in mig)}  # GPU 1 only per instance, never whole as well
    t0, t1 = rig.dcgm.latest_period()
    truth = rig.sim.truth_activity(1, t0, t1)
    for gi in mig:
        assert value(text, "goodput_gpu_gr_engine_active_ratio", gpu="1", gpu_instance_id=gi) == pytest.approx(
            truth["gr_engine_active"])


def test_an_older_gpu_that_refuses_the_newer_fields_gets_the_base_twelve() -> None:
    from exporter.sources.dcgm.api import BASE_FIELDS

    rig = Rig(1)
    rig.dcgm.support_only(frozenset(BASE_FIELDS))
    start(rig.source)
    text = rig.scrape(2.0)
    assert rig.down is None
    assert value(text, "goodput_gpu_sm_active_ratio", gpu="0") is not None
    assert value(text, "goodput_gpu_gr_engine_active_ratio", gpu="0") is not None
    assert series(text, "goodput_gpu_tensor_hmma_active_ratio") == []


def test_only_lost_or_unknown_gpus_with_values_is_the_source_down_not_up_with_nothing() -> None:
    rig = Rig(2)
    inventory = NodeGpus()
    inventory.record(rig.sim.uuid(0), "0")  # NVML knows GPU 0 only, and GPU 0 is lost: nothing usable
    source = DcgmSource(dcgm_config(), rig.dcgm, inventory, clock=rig.clock)
    start(source)
    rig.sim.lose(0)
    rig.clock.advance(2)
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "dcgm_no_values"
