"""The kubelet source against a real gRPC server speaking pod-resources v1 on a Unix socket."""

from __future__ import annotations

import time

from conftest import ManualClock, live_server, quick_config, series, value, wait_for
from kubelet_server import KubeletServer, Pod, gpu_pod

from exporter.config import load
from exporter.exposition import TEXT, Renderer
from exporter.gpu.simulated import SimulatedGpus
from exporter.sources.base import SourceError
from exporter.sources.kubelet import KubeletSource
from exporter.sources.nvml import NvmlSource

POD_INFO = "goodput_gpu_pod_info"


def pods_of(text: str) -> set[tuple[str, str, str, str, str]]:
    return {(s["gpu"], s["uuid"], s["namespace"], s["pod"], s["container"]) for s in series(text, POD_INFO)}


def sources(sim: SimulatedGpus, socket_path: str) -> tuple[NvmlSource, KubeletSource]:
    clock = ManualClock()
    nvml = NvmlSource(sim, clock=clock)
    config = load(None, {"kubelet": {"socket_path": socket_path, "timeout": "1s"}}, environ={}).kubelet
    return nvml, KubeletSource(config, nvml.processes)


def uuids(sim: SimulatedGpus) -> list[str]:
    return [sim.device_uuid(sim.device_handle(i)) for i in range(sim.count)]


def test_every_device_id_style_maps_to_its_gpu() -> None:
    sim = SimulatedGpus(8)
    sim.enable_mig(2, ["3g.40gb", "3g.40gb"])
    u = uuids(sim)
    mig = sim.device_mig_handles(sim.device_handle(2))[1].uuid
    bus5 = sim.device_pci_bus_id(sim.device_handle(5))
    with KubeletServer() as kubelet:
        kubelet.set_pods([
            gpu_pod("by-uuid", "team-a", u[0]),
            gpu_pod("by-index", "team-a", "1"),
            gpu_pod("by-mig", "team-b", mig, resource="nvidia.com/mig-3g.40gb"),
            gpu_pod("shared-0", "team-c", f"{u[3]}::0", resource="nvidia.com/gpu.shared"),
            gpu_pod("shared-1", "team-c", f"{u[3]}::1", resource="nvidia.com/gpu.shared"),
            gpu_pod("gke-style", "team-d", "nvidia4"),
            gpu_pod("by-bus-id", "team-d", bus5.lower()),
            gpu_pod("two-gpus", "team-e", u[6].upper().replace("GPU-", "GPU-"), "7", container="main"),
            gpu_pod("a-nic", "team-f", "6", resource="example.com/nic"),  # not a GPU resource: ignored
            gpu_pod("elsewhere", "team-f", "GPU-00000000-0000-4000-8000-000000000000"),  # no such GPU here
            gpu_pod("Not_A_Pod_Name", "team-f", u[1]),  # impossible name: skipped, counted
            Pod("no-gpu", "team-f", {"web": []}),
        ])
        nvml, source = sources(sim, kubelet.path)
        nvml.collect()
        text = Renderer().render(source.collect(), TEXT).decode()
    assert pods_of(text) == {
        ("0", u[0], "team-a", "by-uuid", "trainer"),
        ("1", u[1], "team-a", "by-index", "trainer"),
        ("2", u[2], "team-b", "by-mig", "trainer"),
        ("3", u[3], "team-c", "shared-0", "trainer"),
        ("3", u[3], "team-c", "shared-1", "trainer"),
        ("4", u[4], "team-d", "gke-style", "trainer"),
        ("5", u[5], "team-d", "by-bus-id", "trainer"),
        ("6", u[6], "team-e", "two-gpus", "main"),
        ("7", u[7], "team-e", "two-gpus", "main"),
    }
    assert value(text, "goodput_kubelet_skipped_devices", reason="unmatched") == 1
    assert value(text, "goodput_kubelet_skipped_devices", reason="invalid") == 1


def test_missing_socket_and_undecodable_answer_are_errors_with_reasons() -> None:
    sim = SimulatedGpus(2)
    kubelet = KubeletServer()
    nvml, source = sources(sim, kubelet.path)
    nvml.collect()
    try:
        source.collect()
        raise AssertionError("a missing socket must fail the collection")
    except SourceError as exc:
        assert exc.reason == "socket_missing"
        assert "kubelet.enabled=false" in str(exc)
    with kubelet:
        kubelet.set_pods([gpu_pod("p", "ns", "0")])
        assert len(series(Renderer().render(source.collect(), TEXT).decode(), POD_INFO)) == 1
        kubelet.malformed = True
        try:
            source.collect()
            raise AssertionError("an answer that does not decode must fail the collection")
        except SourceError as exc:
            assert exc.reason == "malformed", exc.reason
    try:
        source.collect()  # the server is gone; its socket file too
        raise AssertionError("a stopped kubelet must fail the collection")
    except SourceError as exc:
        assert exc.reason == "socket_missing", exc.reason


def kubelet_config(path: str, **kubelet: str) -> object:
    return quick_config(kubelet={"enabled": True, "socket_path": path, "interval": "100ms", "timeout": "1s", **kubelet})


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
        wait_for(lambda: ("2", u[2], "research", "eval-0", "trainer") in pods_of(live.metrics()))
        text = live.metrics()
        assert len(pods_of(text)) == 6
        assert not any(pod == "train-2" for _, _, _, pod, _ in pods_of(text))
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

            kubelet.delay = 2.0  # slower than the 400 ms the call is given
            text = live.metrics_when("goodput_exporter_source_up", 0, source="kubelet")
            assert value(text, "goodput_exporter_source_errors_total", source="kubelet",
                         reason="deadline_exceeded") >= 1
            assert series(text, POD_INFO) == []  # never an old mapping passed off as current
            for _ in range(20):  # while List calls hang in the server, scrapes stay fast
                started = time.monotonic()
                text = live.metrics()
                assert time.monotonic() - started < 0.5
            assert value(text, "goodput_exporter_source_up", source="nvml") == 1

            kubelet.delay = 0.0
            kubelet.set_pods([gpu_pod("train-1", "ml", u[1])])
            wait_for(lambda: pods_of(live.metrics()) == {("1", u[1], "ml", "train-1", "trainer")})

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

            kubelet = KubeletServer(kubelet.path).start()  # the kubelet restarts on the same socket
            kubelet.set_pods([gpu_pod("train-2", "ml", u[2])])
            wait_for(lambda: pods_of(live.metrics()) == {("2", u[2], "ml", "train-2", "trainer")})
    finally:
        kubelet.stop()
