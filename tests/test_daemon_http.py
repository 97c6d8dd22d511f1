"""The daemon behind a real uvicorn server: endpoints, formats, promtool, faults while serving."""

from __future__ import annotations

import gzip
import os
import subprocess
import time

from conftest import live_server, promtool, quick_config, series, value, wait_for
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

from exporter.sources.nvml.api import UNKNOWN
from exporter.sources.nvml.simulated import SimulatedGpus


def sim8() -> SimulatedGpus:
    return SimulatedGpus(8, seed=3)


def test_endpoints_and_landing_page() -> None:
    with live_server(quick_config(), backend=sim8()) as live:
        assert live.client.get("/healthz").text == "ok\n"
        ready = wait_for(lambda: live.client.get("/readyz").status_code == 200)
        assert ready
        body = live.client.get("/readyz").json()
        assert body == {"ready": True, "sources": {"nvml": True, "fabric": True, "host": True, "ingest": True,
                                                   "flight": True, "process": True, "health": True}}
        landing = live.client.get("/").text
        for link in ('href="metrics"', 'href="healthz"', 'href="readyz"'):
            assert link in landing
        assert "simulated" in landing
        assert live.client.get("/nope").status_code == 404


def test_readyz_is_503_until_every_source_collected() -> None:
    backend = sim8()
    backend.hang("init", 5.0)
    with live_server(quick_config(nvml={"timeout": "3s"}), backend=backend) as live:
        response = live.client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["sources"]["nvml"] is False
        backend.release_hangs()
        wait_for(lambda: live.client.get("/readyz").status_code == 200)


def test_metrics_formats_and_gzip() -> None:
    with live_server(quick_config(), backend=sim8()) as live:
        wait_for(lambda: live.client.get("/readyz").status_code == 200)
        plain = live.client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "content-encoding" not in plain.headers
        assert len(series(plain.text, "goodput_gpu_up")) == 8
        assert len(series(plain.text, "goodput_gpu_nvlink_errors_total")) == 8 * 4  # per GPU, by error_type
        assert series(plain.text, "goodput_gpu_nvlink_link_errors_total") == []  # nvml.nvlink_per_link is off
        assert "process_cpu_seconds_total" in plain.text
        assert value(plain.text, "goodput_exporter_build_info", gpu_backend="simulated") == 1

        zipped = live.client.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        raw = live.client.build_request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        stream = live.client.send(raw, stream=True)
        compressed = b"".join(stream.iter_raw())
        stream.close()
        assert gzip.decompress(compressed).startswith(b"# HELP goodput_gpu_info")

        om = live.client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.endswith("# EOF\n")
        families = {f.name: f for f in om_parse(om.text)}  # the strict OpenMetrics parser accepts it
        assert families["goodput_gpu_idle_seconds"].type == "counter"
        assert families["goodput_gpu"].type == "info"  # samples goodput_gpu_info{...}
        assert families["goodput_gpu_power_watts"].unit == "watts"


def test_promtool_check_metrics_has_no_findings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    backend = sim8()
    with live_server(quick_config(nvml={"nvlink_per_link": True}), backend=backend) as live:
        backend.inject_xid(2, 79)
        backend.inject_ecc(3, 2, uncorrected=True)
        backend.enable_mig(4, ["3g.40gb", "3g.40gb"])
        backend.attach_process(5, os.getpid())
        backend.throttle(6, "power", 5)
        wait_for(lambda: value(live.metrics(), "goodput_gpu_xid_errors_total", gpu="2", xid="79") == 1)
        wait_for(lambda: series(live.metrics(), "goodput_host_process_threads"))
        text = live.metrics()
    for family in ("goodput_gpu_mig_info", "goodput_gpu_process_memory_used_bytes",
                   "goodput_gpu_numa_mismatch", "goodput_host_process_cpu_seconds_total",
                   "goodput_gpu_nvlink_receive_bytes_total", "goodput_gpu_nvlink_link_errors_total",
                   "goodput_exporter_source_up"):
        assert series(text, family), family
    # nvml.nvlink_per_link: each simulated H100's 18 links, besides its totals
    assert len([s for s in series(text, "goodput_gpu_nvlink_link_transmit_bytes_total") if s["gpu"] == "0"]) == 18
    assert len([s for s in series(text, "goodput_gpu_nvlink_transmit_bytes_total") if s["gpu"] == "0"]) == 1
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_gpu_lost_mid_run_while_serving() -> None:
    backend = sim8()
    with live_server(quick_config(), backend=backend) as live:
        wait_for(lambda: value(live.metrics(), "goodput_gpu_up", gpu="5") == 1)
        backend.lose(5)
        wait_for(lambda: value(live.metrics(), "goodput_gpu_up", gpu="5") == 0)
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="nvml") == 1
        assert value(text, "goodput_exporter_source_errors_total", source="nvml", reason="nvml_gpu_is_lost") == 1
        assert sum(value(text, "goodput_gpu_up", gpu=str(i)) for i in range(8)) == 7


def test_hanging_nvml_call_marks_source_down_and_daemon_keeps_serving() -> None:
    backend = sim8()
    config = quick_config(nvml={"timeout": "300ms"})
    with live_server(config, backend=backend) as live:
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 1)
        backend.hang("device_utilization_samples", 60.0, gpu=2)
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 0)
        started = time.monotonic()
        text = live.metrics()
        assert time.monotonic() - started < 0.5  # the scrape never waits on NVML
        assert value(text, "goodput_exporter_source_errors_total", source="nvml", reason="timeout") == 1
        assert series(text, "goodput_gpu_up") == []  # no stale GPU numbers while NVML is stuck
        assert value(text, "goodput_exporter_source_up", source="host") == 1
        collections = value(text, "goodput_exporter_source_collections_total", source="host")
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_collections_total",
                               source="host") > collections + 3)
        backend.release_hangs()
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 1)
        assert len(series(live.metrics(), "goodput_gpu_up")) == 8


def test_raising_nvml_call_marks_source_down_and_recovers() -> None:
    backend = sim8()
    with live_server(quick_config(), backend=backend) as live:
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 1)
        backend.fail("*", UNKNOWN)
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 0)
        text = live.metrics()
        assert value(text, "goodput_exporter_source_errors_total", source="nvml", reason="nvml_unknown") >= 1
        assert value(text, "goodput_exporter_source_up", source="host") == 1
        assert live.client.get("/healthz").status_code == 200
        backend.clear_faults()
        wait_for(lambda: value(live.metrics(), "goodput_exporter_source_up", source="nvml") == 1)
        assert value(live.metrics(), "goodput_exporter_source_last_success_timestamp_seconds",
                     source="nvml") > time.time() - 5


def test_disabled_source_is_not_run_or_reported() -> None:
    with live_server(quick_config(host={"enabled": False}), backend=sim8()) as live:
        wait_for(lambda: live.client.get("/readyz").status_code == 200)
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="host") is None
        assert live.client.get("/readyz").json()["sources"] == {
            "nvml": True, "fabric": True, "ingest": True, "flight": True, "process": True, "health": True}
