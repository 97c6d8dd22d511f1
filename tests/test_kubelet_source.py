"""The kubelet source against a real gRPC server speaking pod-resources v1 on a Unix socket."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import ManualClock, live_server, quick_config, series, value, wait_for
from kubelet_server import KubeletServer, Pod, gpu_pod

from exporter.config import ConfigError, load
from exporter.core.exposition import TEXT, Renderer
from exporter.core.gpus import GpuIdentity
from exporter.core.source import SourceError
from exporter.sources.kubelet.devices import GpuMatcher
from exporter.sources.kubelet.source import KubeletSource
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

POD_INFO = "goodput_gpu_pod_info"
Row = tuple[str, str, str, str, str, str]


def pods_of(text: str) -> set[Row]:
    return {(s["gpu"], s["uuid"], s["mig_uuid"], s["namespace"], s["pod"], s["container"])
            for s in series(text, POD_INFO)}


@contextmanager
def sources(sim: SimulatedGpus, socket_path: str, **kubelet: str) -> Iterator[tuple[NvmlSource, KubeletSource]]:
    clock = ManualClock()
    nvml = NvmlSource(sim, clock=clock)
    config = load(None, {"kubelet": {"socket_path": socket_path, "timeout": "1s", **kubelet}}, environ={}).kubelet
    source = KubeletSource(config, nvml.table)
    try:
        yield nvml, source
    finally:
        source.close()
        nvml.close()


def collect(source: KubeletSource) -> str:
    return Renderer().render(source.collect(), TEXT).decode()


def uuids(sim: SimulatedGpus) -> list[str]:
    return [sim.device_uuid(sim.device_handle(i)) for i in range(sim.count)]


def test_every_device_id_style_maps_to_its_gpu() -> None:
    sim = SimulatedGpus(8)
    sim.set_minor_numbers([0, 1, 2, 3, 6, 5, 4, 7])  # probe order differs from PCI order for 4 and 6
    sim.enable_mig(2, ["3g.40gb", "3g.40gb"])
    u = uuids(sim)
    migs = [m.uuid for m in sim.device_mig_handles(sim.device_handle(2))]
    bus5 = sim.device_pci_bus_id(sim.device_handle(5))
    with KubeletServer() as kubelet:
        kubelet.set_pods([
            gpu_pod("by-uuid", "team-a", u[0]),
            gpu_pod("by-index", "team-a", "1"),
            gpu_pod("by-mig", "team-b", migs[1], resource="nvidia.com/mig-3g.40gb"),
            gpu_pod("by-mig-index", "team-b", "2:0", resource="nvidia.com/mig-3g.40gb"),
            gpu_pod("shared-0", "team-c", f"{u[3]}::0", resource="nvidia.com/gpu.shared"),
            gpu_pod("shared-1", "team-c", f"{u[3]}::1", resource="nvidia.com/gpu.shared"),
            gpu_pod("gke-style", "team-d", "nvidia4"),  # /dev/nvidia4 is the GPU at index 6
            gpu_pod("by-bus-id", "team-d", bus5.lower()),
            gpu_pod("two-gpus", "team-e", u[6].upper().replace("GPU-", "GPU-"), "7", container="main"),
            gpu_pod("a-nic", "team-f", "6", resource="example.com/nic"),  # not a GPU resource: ignored
            # the Network Operator's SR-IOV / RDMA resources under nvidia.com/: not GPUs, not counted
            gpu_pod("sriov", "team-f", bus5.lower(), "0", resource="nvidia.com/sriov_rdma_vf"),
            gpu_pod("elsewhere", "team-f", "GPU-00000000-0000-4000-8000-000000000000"),  # no such GPU here
            gpu_pod("other-domain", "team-f", "0001" + bus5[8:]),  # same bus, other PCI domain: not ours
            gpu_pod("Not_A_Pod_Name", "team-f", u[1], u[2]),  # impossible name: its 2 devices counted
            Pod("no-gpu", "team-f", {"web": []}),
            Pod("Bad_Name_No_Gpu", "team-f", {"web": [("example.com/nic", ["1", "2"])]}),  # not counted
        ])
        with sources(sim, kubelet.path) as (nvml, source):
            nvml.collect()
            text = collect(source)
    assert pods_of(text) == {
        ("0", u[0], "", "team-a", "by-uuid", "trainer"),
        ("1", u[1], "", "team-a", "by-index", "trainer"),
        ("2", u[2], migs[1], "team-b", "by-mig", "trainer"),
        ("2", u[2], migs[0], "team-b", "by-mig-index", "trainer"),
        ("3", u[3], "", "team-c", "shared-0", "trainer"),
        ("3", u[3], "", "team-c", "shared-1", "trainer"),
        ("6", u[6], "", "team-d", "gke-style", "trainer"),
        ("5", u[5], "", "team-d", "by-bus-id", "trainer"),
        ("6", u[6], "", "team-e", "two-gpus", "main"),
        ("7", u[7], "", "team-e", "two-gpus", "main"),
    }
    assert value(text, "goodput_kubelet_skipped_devices", reason="unmatched") == 2
    assert value(text, "goodput_kubelet_skipped_devices", reason="invalid") == 2


def test_pci_bus_ids_compare_domain_bus_device_and_function() -> None:
    gpus = [GpuIdentity("0", "GPU-a", "00000000:18:00.0"), GpuIdentity("1", "GPU-b", "00000001:18:00.0")]
    matcher = GpuMatcher(gpus)
    for text, gpu in [("0000:18:00.0", "0"), ("00000000:18:00.0", "0"), ("0001:18:00.0", "1"),
                      ("00000001:18:00.0", "1"), ("0001:18:00.0".upper(), "1")]:
        found = matcher.match(text)
        assert found is not None and found.gpu.gpu == gpu, text
    for text in ("0002:18:00.0", "0000:18:00.1", "0000:19:00.0"):
        assert matcher.match(text) is None, text


def test_nvidia_n_names_the_minor_number_and_a_bare_n_the_index() -> None:
    gpus = [GpuIdentity("0", "GPU-a", "", minor=1), GpuIdentity("1", "GPU-b", "", minor=0)]
    matcher = GpuMatcher(gpus)
    assert matcher.match("nvidia0").gpu.uuid == "GPU-b"  # type: ignore[union-attr]
    assert matcher.match("nvidia1").gpu.uuid == "GPU-a"  # type: ignore[union-attr]
    assert matcher.match("0").gpu.uuid == "GPU-a"  # type: ignore[union-attr]
    assert GpuMatcher([GpuIdentity("0", "GPU-a", "")]).match("nvidia0") is None  # minor unknown: no guess


def test_dra_devices_are_matched_by_driver_and_device_or_counted() -> None:
    from kubelet_server import DraDevice

    sim = SimulatedGpus(4)
    sim.set_minor_numbers([0, 1, 3, 2])
    u = uuids(sim)
    claim = "k8s.gpu.nvidia.com/claim=5f7c2e-gpu"
    with KubeletServer() as kubelet:
        kubelet.set_pods([
            Pod("dra-0", "ml", dra={"trainer": [DraDevice("gpu.nvidia.com", "gpu-0", (f"{claim}-0",))]}),
            Pod("dra-1", "ml", dra={"trainer": [DraDevice("gpu.nvidia.com", "gpu-1", (f"{claim}-1",))]}),
            # index 2 is minor 3: the driver's gpu-2 is ambiguous between releases -> counted, not guessed
            Pod("dra-2", "ml", dra={"trainer": [DraDevice("gpu.nvidia.com", "gpu-2", (f"{claim}-2",))]}),
            Pod("dra-mig", "ml", dra={"trainer": [DraDevice("gpu.nvidia.com", "gpu-1-mig-9-0-1", (f"{claim}-m",))]}),
            Pod("dra-uuid", "ml", dra={"trainer": [DraDevice(cdi_names=(f"nvidia.com/gpu={u[3]}",))]}),
            Pod("dra-all", "ml", dra={"trainer": [DraDevice(cdi_names=("nvidia.com/gpu=all",))]}),
            Pod("dra-nic", "net", dra={"app": [DraDevice("dra.net", "eth1", ("dra.net/nic=eth1",))]}),
        ])
        with sources(sim, kubelet.path) as (nvml, source):
            nvml.collect()
            text = collect(source)
    assert pods_of(text) == {
        ("0", u[0], "", "ml", "dra-0", "trainer"),
        ("1", u[1], "", "ml", "dra-1", "trainer"),
        ("3", u[3], "", "ml", "dra-uuid", "trainer"),
    }
    # gpu-2 (ambiguous), the MIG device, nvidia.com/gpu=all; the NIC of another driver is not a GPU
    assert value(text, "goodput_kubelet_skipped_devices", reason="unmatched") == 3
    assert value(text, "goodput_kubelet_skipped_devices", reason="invalid") == 0


def test_gpu_resources_setting() -> None:
    sim = SimulatedGpus(2)
    with KubeletServer() as kubelet:
        kubelet.set_pods([gpu_pod("a", "ns", "0", resource="example.com/gpu"), gpu_pod("b", "ns", "1")])
        with sources(sim, kubelet.path, gpu_resources="example.com/gpu") as (nvml, source):
            nvml.collect()
            assert {row[4] for row in pods_of(collect(source))} == {"a"}
    for bad in ("", " , ", "no-slash", "nvidia.com/gpu,bad pattern/x"):
        with pytest.raises(ConfigError):
            load(None, {"kubelet": {"gpu_resources": bad}}, environ={})


def test_missing_socket_and_undecodable_answer_are_errors_with_reasons(caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedGpus(2)
    kubelet = KubeletServer()
    with sources(sim, kubelet.path) as (nvml, source):
        nvml.collect()
        with pytest.raises(SourceError) as missing:
            source.collect()
        assert missing.value.reason == "socket_missing"
        assert "kubelet.enabled=false" in str(missing.value)
        with kubelet:
            kubelet.set_pods([gpu_pod("p", "ns", "0")])
            assert len(series(collect(source), POD_INFO)) == 1
            kubelet.malformed = True
            with caplog.at_level(logging.DEBUG), pytest.raises(SourceError) as malformed:
                source.collect()
            assert malformed.value.reason == "malformed", malformed.value.reason
            # detected by type, not by logging grpc's traceback (and grpc's loggers left alone)
            assert not [r for r in caplog.records if r.name.startswith("grpc")], caplog.records
            assert logging.getLogger("grpc._common").level == logging.NOTSET
        with pytest.raises(SourceError) as stopped:
            source.collect()  # the server is gone; its socket file too
        assert stopped.value.reason == "socket_missing"


def kubelet_config(path: str, **kubelet: str) -> object:
    return quick_config(kubelet={"enabled": True, "socket_path": path, "interval": "100ms", "timeout": "1s",
                                 **kubelet})


def test_pod_churn_while_serving_leaves_no_ghosts() -> None:
    sim = SimulatedGpus(8, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, live_server(kubelet_config(kubelet.path), backend=sim) as live:
        kubelet.set_pods([gpu_pod(f"train-{i}", "ml", u[i]) for i in range(4)])
        wait_for(lambda: len(series(live.metrics(), POD_INFO)) == 4)
        # a pod ends, another starts on its GPU, two more arrive
        kubelet.set_pods([gpu_pod("train-0", "ml", u[0]), gpu_pod("train-1", "ml", u[1]),
                          gpu_pod("eval-0", "research", u[2]), gpu_pod("train-3", "ml", u[3]),
                          gpu_pod("new-4", "ml", u[4]), gpu_pod("new-5", "ml", u[5])])
        wait_for(lambda: ("2", u[2], "", "research", "eval-0", "trainer") in pods_of(live.metrics()))
        text = live.metrics()
        assert len(pods_of(text)) == 6
        assert not any(row[4] == "train-2" for row in pods_of(text))
        kubelet.set_pods([])  # every pod gone
        wait_for(lambda: series(live.metrics(), POD_INFO) == [])
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="kubelet") == 1


def test_slow_then_dead_then_missing_kubelet_never_slows_a_scrape() -> None:
    sim = SimulatedGpus(4, seed=3)
    u = uuids(sim)
    kubelet = KubeletServer().start()
    try:
        with live_server(kubelet_config(kubelet.path, timeout="500ms"), backend=sim) as live:
            kubelet.set_pods([gpu_pod("train-0", "ml", u[0])])
            live.metrics_when("goodput_exporter_source_up", 1, source="kubelet")
            wait_for(lambda: len(series(live.metrics(), POD_INFO)) == 1)

            hang = 5.0
            kubelet.delay = hang  # far slower than the 400 ms the call is given
            text = live.metrics_when("goodput_exporter_source_up", 0, source="kubelet")
            assert value(text, "goodput_exporter_source_errors_total", source="kubelet",
                         reason="deadline_exceeded") >= 1
            assert series(text, POD_INFO) == []  # never an old mapping passed off as current
            durations = []
            for _ in range(20):  # while List calls hang in the server, scrapes do not wait for them
                started = time.monotonic()
                text = live.metrics()
                durations.append(time.monotonic() - started)
            # a scrape that waited on a List would take the call's 400 ms at least; the median is far
            # below it even on a loaded machine, and no scrape waits anywhere near the server's hang
            assert statistics.median(durations) < 0.4, durations
            assert max(durations) < hang / 2, durations
            assert value(text, "goodput_exporter_source_up", source="nvml") == 1

            kubelet.delay = 0.0
            kubelet.set_pods([gpu_pod("train-1", "ml", u[1])])
            wait_for(lambda: pods_of(live.metrics()) == {("1", u[1], "", "ml", "train-1", "trainer")})

            kubelet.malformed = True
            text = live.metrics_when("goodput_exporter_source_up", 0, source="kubelet")
            assert value(text, "goodput_exporter_source_errors_total", source="kubelet", reason="malformed") >= 1
            assert series(text, POD_INFO) == []
            kubelet.malformed = False
            live.metrics_when("goodput_exporter_source_up", 1, source="kubelet")

            kubelet.stop()  # the kubelet goes away, and its socket with it
            wait_for(lambda: value(live.metrics(), "goodput_exporter_source_errors_total", source="kubelet",
                                   reason="socket_missing"))
            text = live.metrics()
            assert value(text, "goodput_exporter_source_up", source="kubelet") == 0
            assert series(text, POD_INFO) == []
            assert live.client.get("/readyz").status_code == 200

            kubelet.restart()  # the kubelet restarts on the same socket
            kubelet.set_pods([gpu_pod("train-2", "ml", u[2])])
            wait_for(lambda: pods_of(live.metrics()) == {("2", u[2], "", "ml", "train-2", "trainer")})
    finally:
        kubelet.stop()


def test_a_restarted_kubelet_is_reached_within_two_intervals() -> None:
    """grpc's default reconnect backoff grows to 2 minutes while the kubelet is down, so without a bound
    on it the source stayed failing long after the kubelet was back."""
    sim = SimulatedGpus(2)
    interval = 0.5
    with KubeletServer() as kubelet:
        kubelet.set_pods([gpu_pod("p", "ns", "0")])
        with sources(sim, kubelet.path, interval=f"{int(interval * 1000)}ms") as (nvml, source):
            nvml.collect()
            assert len(series(collect(source), POD_INFO)) == 1
            kubelet.stop(leave_socket=True)  # dead kubelet, stale socket: connections refused
            down_until = time.monotonic() + 12.0  # long enough for grpc's default backoff to pass 5 s
            while time.monotonic() < down_until:
                with pytest.raises(SourceError) as down:
                    source.collect()
                assert down.value.reason == "unavailable", down.value.reason
                time.sleep(interval)
            kubelet.restart()
            back = time.monotonic()
            while True:
                try:
                    if len(series(collect(source), POD_INFO)) == 1:
                        break
                except SourceError:
                    pass
                assert time.monotonic() - back < 4 * interval + 1.0, "the kubelet came back but is not reached"
                time.sleep(interval)
            assert time.monotonic() - back < 4 * interval + 1.0

