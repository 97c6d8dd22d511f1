"""The dcgm source reading a dcgm-exporter: a real HTTP server on loopback serving dcgm-exporter's
text format, and the real daemon with its uvicorn server scraping both."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import live_server, quick_config, series, value, wait_for
from dcgm_exporter_server import ExporterGpu, dcgm_exporter

from exporter.sources.dcgm import fetch, scrape
from exporter.sources.dcgm.api import FI_PROF_DRAM_ACTIVE, FI_PROF_SM_ACTIVE, FI_PROF_SM_OCCUPANCY
from exporter.sources.nvml.simulated import SimulatedGpus

PROF = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9, "DCGM_FI_PROF_SM_ACTIVE": 0.8, "DCGM_FI_PROF_SM_OCCUPANCY": 0.4,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.6, "DCGM_FI_PROF_DRAM_ACTIVE": 0.3, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0,
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.125, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0625,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 123456789, "DCGM_FI_PROF_PCIE_RX_BYTES": 223456789,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 3.5e10, "DCGM_FI_PROF_NVLINK_RX_BYTES": 3.25e10,
    "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_DEV_XID_ERRORS": 0,
}
OURS = {
    "goodput_gpu_sm_active_ratio": "DCGM_FI_PROF_SM_ACTIVE",
    "goodput_gpu_sm_occupancy_ratio": "DCGM_FI_PROF_SM_OCCUPANCY",
    "goodput_gpu_tensor_active_ratio": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "goodput_gpu_dram_active_ratio": "DCGM_FI_PROF_DRAM_ACTIVE",
    "goodput_gpu_fp64_active_ratio": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "goodput_gpu_fp32_active_ratio": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "goodput_gpu_fp16_active_ratio": "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "goodput_gpu_pcie_transmit_bytes_per_second": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "goodput_gpu_pcie_receive_bytes_per_second": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "goodput_gpu_nvlink_transmit_bytes_per_second": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "goodput_gpu_nvlink_receive_bytes_per_second": "DCGM_FI_PROF_NVLINK_RX_BYTES",
}


def config(url: str, **dcgm: object):  # type: ignore[no-untyped-def]
    return quick_config(dcgm={"enabled": True, "mode": "exporter", "exporter_url": url, "interval": "100ms",
                              "timeout": "1s", **dcgm})


def errors(text: str, reason: str) -> float:
    return value(text, "goodput_exporter_source_errors_total", source="dcgm", reason=reason) or 0


def gpus_of(sim: SimulatedGpus, values: list[dict[str, float | str]]) -> list[ExporterGpu]:
    """dcgm-exporter's view of the simulated GPUs, numbered in the opposite order to NVML's, so only
    the UUID can match them."""
    n = sim.count
    return [ExporterGpu(str(n - 1 - i), sim.uuid(i), values[i]) for i in range(n)]


def test_profiling_series_are_taken_matched_by_uuid_and_renamed() -> None:
    sim = SimulatedGpus(2)
    second = {**PROF, "DCGM_FI_PROF_SM_ACTIVE": 0.25, "DCGM_FI_PROF_DRAM_ACTIVE": 0.95}
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF, second]))
        with live_server(config(exporter.url), backend=sim) as live:
            text = live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
            wait_for(lambda: value(live.metrics(), "goodput_gpu_sm_active_ratio", gpu="1") is not None)
            text = live.metrics()
            for i, served in enumerate((PROF, second)):
                uuid = sim.uuid(i)
                for ours, theirs in OURS.items():
                    assert value(text, ours, gpu=str(i), uuid=uuid) == served[theirs], (ours, i)
            # nothing else from dcgm-exporter leaks out under its own names or labels
            body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
            assert "DCGM_FI" not in body and "modelName" not in body and "Hostname" not in body
            assert len(series(text, "goodput_gpu_sm_active_ratio")) == 2
            assert errors(text, "dcgm_unknown_gpu") == 0


def test_gpu_disappearing_withdraws_only_its_series() -> None:
    sim = SimulatedGpus(2)
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF, PROF]))
        with live_server(config(exporter.url), backend=sim) as live:
            wait_for(lambda: len(series(live.metrics(), "goodput_gpu_tensor_active_ratio")) == 2)
            exporter.serve(gpus_of(sim, [PROF, PROF])[1:])  # GPU 0 (exporter gpu="1") is gone
            wait_for(lambda: len(series(live.metrics(), "goodput_gpu_tensor_active_ratio")) == 1)
            text = live.metrics()
            assert [s["uuid"] for s in series(text, "goodput_gpu_tensor_active_ratio")] == [sim.uuid(1)]
            assert value(text, "goodput_exporter_source_up", source="dcgm") == 1
            exporter.serve(gpus_of(sim, [PROF, PROF]))  # and back
            wait_for(lambda: len(series(live.metrics(), "goodput_gpu_tensor_active_ratio")) == 2)


def test_garbage_lines_are_counted_and_the_rest_is_used() -> None:
    sim = SimulatedGpus(2)
    bad = {**PROF, "DCGM_FI_PROF_SM_ACTIVE": "abc", "DCGM_FI_PROF_DRAM_ACTIVE": 1.7,
           "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "NaN", "DCGM_FI_PROF_PCIE_TX_BYTES": -5}
    uuid0 = sim.uuid(0)
    garbage = "\n".join([
        f'DCGM_FI_PROF_SM_OCCUPANCY{{gpu="1",UUID="{uuid0}"}} 0.5',  # a second series for one GPU
        'DCGM_FI_PROF_SM_ACTIVE{gpu="9"} 0.5',  # no UUID
        'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-x" 0.5',  # cut off
        "DCGM_FI_PROF_SM_ACTIVE \x00\xff\xfe",
        "\x00\x01 binary noise",
        'DCGM_FI_PROF_SM_ACTIVE{gpu="7",UUID="GPU-deadbeef-0000-1111-2222-333333333333"} 0.5',  # not ours
        'DCGM_FI_PROF_SM_ACTIVE{gpu="7",UUID="GPU-not-on-this-node"} 0.5',  # not a UUID at all
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="x\\n1",UUID="{uuid0}"}} 0.5',  # a `gpu` that is no GPU id
    ]) + "\n"
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF, bad]), extra=garbage)
        with live_server(config(exporter.url), backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), "dcgm_unknown_gpu") >= 2)
            text = live.metrics()
            assert value(text, "goodput_exporter_source_up", source="dcgm") == 1
            # GPU 1's bad fields are absent, its good ones present; GPU 0 is whole
            assert value(text, "goodput_gpu_sm_active_ratio", gpu="1") is None
            assert value(text, "goodput_gpu_dram_active_ratio", gpu="1") is None
            assert value(text, "goodput_gpu_tensor_active_ratio", gpu="1") is None
            assert value(text, "goodput_gpu_pcie_transmit_bytes_per_second", gpu="1") is None
            assert value(text, "goodput_gpu_fp32_active_ratio", gpu="1") == 0.125
            assert value(text, "goodput_gpu_sm_active_ratio", gpu="0") == 0.8
            assert value(text, "goodput_gpu_sm_occupancy_ratio", gpu="0") == 0.4  # the first one wins
            assert [s["gpu"] for s in series(text, "goodput_gpu_sm_active_ratio")] == ["0"]
            for reason in ("dcgm_exporter_unparsable", "dcgm_exporter_bad_value", "dcgm_exporter_no_uuid",
                           "dcgm_exporter_duplicate", "dcgm_unknown_gpu", "dcgm_exporter_bad_uuid",
                           "dcgm_exporter_bad_gpu"):
                assert errors(text, reason) >= 1, reason
            # counted per series per collection: 3 unparsable lines (the binary noise is not a field).
            # Errors and the collection count are published at slightly different moments, so a
            # scrape may see this collection's errors and not yet its count: a bound, not equality.
            collections = value(text, "goodput_exporter_source_collections_total", source="dcgm") or 0
            for reason in ("dcgm_exporter_unparsable", "dcgm_exporter_bad_value"):
                counted = errors(text, reason)
                assert counted % 3 == 0 and 3 * (collections - 1) <= counted <= 3 * (collections + 1), reason


def test_hanging_exporter_times_out_daemon_keeps_serving_and_recovers() -> None:
    sim = SimulatedGpus(1)
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF]))
        with live_server(config(exporter.url), backend=sim) as live:
            live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
            exporter.hang.set()
            text = live.metrics_when("goodput_exporter_source_up", 0, source="dcgm")
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_timeout") >= 2)
            text = live.metrics()
            assert series(text, "goodput_gpu_sm_active_ratio") == []  # withdrawn, not stale
            assert value(text, "goodput_gpu_up", gpu="0") == 1  # the other sources go on
            started = time.monotonic()
            live.metrics()
            # the hung request holds on for 30 s; a scrape answered from the store is far quicker,
            # even on a loaded machine
            assert time.monotonic() - started < 10.0
            exporter.hang.clear()
            exporter.release.set()
            live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
            assert value(live.metrics(), "goodput_gpu_sm_active_ratio", gpu="0") == 0.8


def test_unreachable_error_status_and_no_profiling_fields_are_clear() -> None:
    sim = SimulatedGpus(1)
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF]))
        closed = exporter.url
    with live_server(config(closed), backend=sim) as live:
        wait_for(lambda: errors(live.metrics(), "dcgm_exporter_unreachable") >= 1)
        assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF]))
        exporter.status = 500
        with live_server(config(exporter.url), backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_http_error") >= 1)
            assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0
            exporter.status = 200
            exporter.serve(gpus_of(sim, [{"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_UTIL": 97}]))
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_no_fields") >= 1)
            assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0


def test_mig_instance_series_come_out_per_gpu_instance_beside_the_whole_gpu() -> None:
    sim = SimulatedGpus(2)
    whole = gpus_of(sim, [PROF, PROF])[1:]  # GPU 1 (dcgm-exporter's 0) whole
    # GPU 0 (dcgm-exporter's 1) in MIG mode: only its GPU instances, as dcgm-exporter's default reports them
    mig = [ExporterGpu("1", sim.uuid(0), {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": share, "DCGM_FI_PROF_SM_ACTIVE": share / 2},
                       {"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": gi})
           for gi, share in (("1", 0.5), ("2", 0.25))]
    with dcgm_exporter() as exporter:
        exporter.serve([*whole, *mig])
        with live_server(config(exporter.url), backend=sim) as live:
            live.metrics_when("goodput_gpu_gr_engine_active_ratio", 0.25, gpu="0", gpu_instance_id="2")
            text = live.metrics()
            assert {(s["gpu"], s["gpu_instance_id"]): value(text, "goodput_gpu_sm_active_ratio", **s)
                    for s in series(text, "goodput_gpu_sm_active_ratio")} == {
                ("0", "1"): 0.25, ("0", "2"): 0.125, ("1", ""): 0.8}
            assert value(text, "goodput_exporter_source_up", source="dcgm") == 1
            assert errors(text, "dcgm_exporter_duplicate") == 0


def test_only_gr_engine_is_enough_and_old_namespace_labels_are_understood() -> None:
    sim = SimulatedGpus(1)
    # dcgm-exporter --use-old-namespace: the UUID label is `uuid`; its 1.x counters file, lower-case names
    body = (f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0", uuid="{sim.uuid(0)}", hostname="n1"}} 0.625\n'
            f'dcgm_fi_prof_dram_active{{gpu="0",uuid="{sim.uuid(0)}"}} 0.5\n')
    with dcgm_exporter() as exporter:
        exporter.body = body
        with live_server(config(exporter.url), backend=sim) as live:
            text = live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
            wait_for(lambda: value(live.metrics(), "goodput_gpu_dram_active_ratio", gpu="0") == 0.5)
            assert value(live.metrics(), "goodput_gpu_gr_engine_active_ratio", gpu="0") == 0.625
            assert errors(text, "dcgm_exporter_no_uuid") == 0


@pytest.mark.parametrize(("body", "reason", "words"), [
    ('DCGM_FI_PROF_SM_ACTIVE{{gpu="0",device_uuid="{uuid}"}} 0.5\n', "dcgm_exporter_unknown_labels",
     ["UUID", "device_uuid"]),
    ('DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="0",UUID="{uuid}"}} 9223372036854775794\n', "dcgm_exporter_blank",
     ["blank"]),
    ('DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{uuid}"}} 50\n', "dcgm_exporter_no_fields", ["-f", "counters"]),
])
def test_nothing_usable_is_the_source_down_with_its_own_reason(body: str, reason: str, words: list[str],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedGpus(1)
    with dcgm_exporter() as exporter:
        exporter.body = body.format(uuid=sim.uuid(0))
        with live_server(config(exporter.url), backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), reason) >= 1)
            text = live.metrics()
            assert value(text, "goodput_exporter_source_up", source="dcgm") == 0
            assert series(text, "goodput_gpu_pcie_transmit_bytes_per_second") == []
    message = next(r.getMessage() for r in caplog.records if reason in r.getMessage())
    for word in words:
        assert word in message


def test_dcgm_blank_markers_are_counted_never_numbers() -> None:
    uuid = "GPU-00000000-1111-2222-3333-444444444444"
    # DCGM_INT64_BLANK (0x7ffffffffffffff0) and its NOT_SUPPORTED neighbour, DCGM_FP64_BLANK (2**47)
    lines = [f'DCGM_FI_PROF_PCIE_RX_BYTES{{gpu="0",UUID="{uuid}"}} 9223372036854775794',
             f'DCGM_FI_PROF_NVLINK_TX_BYTES{{gpu="0",UUID="{uuid}"}} 9223372036854775792',
             f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="{uuid}"}} 140737488355328.000000',
             f'DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="0",UUID="{uuid}"}} 61234567']
    lines += [f'DCGM_FI_PROF_DRAM_ACTIVE{{gpu="0",UUID="{uuid}"}} +Inf',  # not a blank: a bad value
              f'DCGM_FI_PROF_PCIE_RX_BYTES{{gpu="1",UUID="{uuid}"}} 1_0',  # Python reads 10; the format does not
              f'DCGM_FI_PROF_NVDEC0_ACTIVE{{gpu="0",UUID="{uuid}"}} 0.5']  # a field not mapped
    reading = scrape.parse("\n".join(lines))
    assert reading.values == {(uuid, ""): {1009: 61234567.0}}
    assert reading.rejected == {"dcgm_exporter_blank": 3, "dcgm_exporter_bad_value": 1,
                                "dcgm_exporter_unparsable": 1}
    assert reading.unmapped == 1


def test_kubernetes_per_pod_series_of_one_gpu_are_one_reading_not_duplicates() -> None:
    sim = SimulatedGpus(2)
    pods = [ExporterGpu(g.gpu, g.uuid, g.values, {"pod": pod, "namespace": "train", "container": "main"})
            for g in gpus_of(sim, [PROF, PROF]) for pod in ("job-a-0", "job-b-0", "job-c-0")]
    with dcgm_exporter() as exporter:
        exporter.serve(pods)  # three pods time-sharing each GPU: three identical series per field
        with live_server(config(exporter.url), backend=sim) as live:
            live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="1")
            text = live.metrics()
            assert len(series(text, "goodput_gpu_sm_active_ratio")) == 2
            assert errors(text, "dcgm_exporter_duplicate") == 0
            assert "pod=" not in "\n".join(line for line in text.splitlines() if line.startswith("goodput_gpu_sm"))


def test_parse_validates_what_it_takes_from_the_other_program() -> None:
    uuid = "GPU-8f3e2a10-7b4c-4d2e-9a1b-0c1d2e3f4a5b"
    other = "GPU-12345678-abcd-ef01-2345-6789abcdef01"
    text = "\n".join([
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="{uuid}",pod="a"}} 0.5',
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="{uuid}",pod="b"}} 0.5',  # the same GPU seen by another pod
        f'DCGM_FI_PROF_DRAM_ACTIVE{{gpu="0",UUID="{uuid}",pod="a"}} 1.0000001',  # rounding: taken as 1
        f'DCGM_FI_PROF_DRAM_ACTIVE{{gpu="0",UUID="{uuid}",pod="b"}} 1',
        f'DCGM_FI_PROF_PIPE_FP16_ACTIVE{{gpu="0",UUID="{uuid}"}} 1.01',  # really out of range
        f'DCGM_FI_PROF_SM_OCCUPANCY{{gpu="0",UUID="{uuid}",pod="a"}} 0.25',
        f'DCGM_FI_PROF_SM_OCCUPANCY{{gpu="0",UUID="{uuid}",pod="b"}} 0.75',  # disagrees: a real conflict
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="1",UUID="{other}"}} 0.125',
        'DCGM_FI_PROF_SM_ACTIVE{gpu="2",UUID="GPU-<script>"} 0.5',
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{"9" * 40}",UUID="GPU-aaaaaaaa-0000-0000-0000-000000000000"}} 0.5',
        'DCGM_FI_PROF_SM_ACTIVE{gpu="3",UUID="GPU-' + "a" * 500 + '"} 0.5',
    ]) + "\n"
    reading = scrape.parse(text)
    assert reading.values == {(uuid, ""): {FI_PROF_SM_ACTIVE: 0.5, FI_PROF_DRAM_ACTIVE: 1.0,
                                           FI_PROF_SM_OCCUPANCY: 0.25},
                              (other, ""): {FI_PROF_SM_ACTIVE: 0.125}}
    assert reading.gpu_ids == {uuid: "0", other: "1"}
    assert reading.rejected == {"dcgm_exporter_bad_value": 1, "dcgm_exporter_duplicate": 1,
                                "dcgm_exporter_bad_uuid": 2, "dcgm_exporter_bad_gpu": 1}


def test_parse_takes_at_most_max_gpus_per_scrape() -> None:
    lines = [f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{i}",UUID="GPU-{i:08x}-0000-0000-0000-000000000000"}} 0.5'
             for i in range(scrape.MAX_GPUS + 500)]
    reading = scrape.parse("\n".join(lines) + "\n")
    assert len(reading.values) == scrape.MAX_GPUS
    assert reading.rejected == {"dcgm_exporter_too_many_gpus": 500}


def test_a_server_trickling_bytes_is_cut_off_at_the_overall_deadline() -> None:
    with dcgm_exporter() as exporter:
        exporter.trickle.set()  # a byte every 50 ms: no single read ever times out
        fetcher = fetch.Fetcher(exporter.url)
        started = time.monotonic()
        with pytest.raises(fetch.ScrapeError) as info:
            fetcher.fetch(0.5)
        elapsed = time.monotonic() - started
        assert info.value.reason == "dcgm_exporter_timeout"
        assert elapsed < 10.0  # the server would go on for its 30 s and more; 10 s is slack for load


def test_trickling_exporter_is_a_timeout_of_the_source_and_the_daemon_keeps_serving() -> None:
    sim = SimulatedGpus(1)
    with dcgm_exporter() as exporter:
        exporter.serve(gpus_of(sim, [PROF]))
        exporter.trickle.set()
        with live_server(config(exporter.url), backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_timeout") >= 2)
            text = live.metrics()
            assert value(text, "goodput_exporter_source_up", source="dcgm") == 0
            # the collection itself ended at the deadline: the runner's own timeout never fired
            assert errors(text, "timeout") == 0
            assert value(text, "goodput_gpu_up", gpu="0") == 1


def test_close_aborts_a_request_in_flight() -> None:
    with dcgm_exporter() as exporter:
        exporter.hang.set()
        fetcher = fetch.Fetcher(exporter.url)
        outcome: list[BaseException] = []

        def read() -> None:
            try:
                fetcher.fetch(60.0)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=read)
        worker.start()
        wait_for(lambda: exporter.requests >= 1)
        started = time.monotonic()
        fetcher.close()  # the daemon stopping while the collection hangs
        worker.join(30)
        assert not worker.is_alive() and time.monotonic() - started < 10.0
        assert len(outcome) == 1 and isinstance(outcome[0], fetch.ScrapeError)
        with pytest.raises(fetch.ScrapeError):
            fetcher.fetch(5.0)  # a closed fetcher does not connect again
