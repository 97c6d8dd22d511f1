"""The real NVML backend. Without a GPU: its failure path, and its queries through pynvml's own wrappers over a fake
libnvidia-ml; with one, the smoke test."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pynvml
import pytest
from conftest import ROOT, ManualClock, series, value

from exporter.core.exposition import TEXT, Batch, Renderer
from exporter.sources.nvml import api
from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.api import (
    ARGUMENT_VERSION_MISMATCH,
    DRIVER_NOT_LOADED,
    FI_MEMORY_TEMP,
    LIBRARY_NOT_FOUND,
    NVLINK_ERRORS,
    RETIREMENT_CAUSES,
    GpuError,
)
from exporter.sources.nvml.library import NvmlLibrary
from exporter.sources.nvml.source import NvmlSource


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_every_pynvml_name_used_exists_in_the_installed_binding() -> None:
    source = Path(__file__).resolve().parent.parent / "exporter" / "sources" / "nvml" / "library.py"
    names = {node.attr for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml"}
    assert len(names) > 30
    assert sorted(name for name in names if not hasattr(pynvml, name)) == []


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present")
def test_without_a_driver_init_raises_a_translated_error() -> None:
    with pytest.raises(GpuError) as info:
        NvmlLibrary().init()
    assert info.value.code in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED)


@pytest.mark.skipif(not _driver_present(), reason="no NVIDIA driver on this machine")
def test_real_gpus_smoke() -> None:
    source = NvmlSource(NvmlLibrary())
    first = source.collect()
    second = source.collect()
    assert first.values(c.GPU_UP)
    assert not [e for e in second.errors if e != "nvml_not_supported"]
    source.close()


# --- the real backend over a fake libnvidia-ml -------------------------------------------------------------------
# pynvml's own wrappers run unchanged (their argument lists, ctypes structures and return shapes); only the C
# functions they look up are Python stand-ins that write their answers through the pointers pynvml passes, and
# return NVML codes. A symbol the fake lacks is missing as in an older driver (pynvml: FUNCTION_NOT_FOUND).

def _out(*values: object):  # type: ignore[no-untyped-def]
    """A C function answering through its last len(values) pointer arguments."""
    def fn(*args: object) -> int:
        for pointer, answer in zip(args[len(args) - len(values):], values, strict=True):
            pointer._obj.value = answer  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS
    return fn


def _text(answer: bytes):  # type: ignore[no-untyped-def]
    def fn(*args: object) -> int:
        next(a for a in args if hasattr(a, "raw")).value = answer  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS
    return fn


def _struct(**fields: object):  # type: ignore[no-untyped-def]
    def fn(*args: object) -> int:
        for name, answer in fields.items():
            setattr(args[-1]._obj, name, answer)  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS
    return fn


def _fails(code: int):  # type: ignore[no-untyped-def]
    return lambda *args: code


class FakeLibNvml:
    """One H100 (driver 550) with NVLink link 0 active and link 1 not."""

    # an H100 remaps rows and retires no pages: no retired-page fields (NVML_ERROR_NOT_SUPPORTED)
    FIELDS: ClassVar[dict[int, int]] = {
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: 2, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 10**9,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: 2 * 10**9, pynvml.NVML_FI_DEV_MEMORY_TEMP: 48,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 10**9, pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 0,
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 9,
        pynvml.NVML_FI_DEV_REMAPPED_COR: 3, pynvml.NVML_FI_DEV_REMAPPED_UNC: 1, pynvml.NVML_FI_DEV_REMAPPED_PENDING: 1,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 0,
        # the violation counters in ns, as an idle H200 (driver 580.159.04) answered them: held back for low
        # utilisation only
        pynvml.NVML_FI_DEV_PERF_POLICY_POWER: 0, pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: 0,
        pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: 0, pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: 0,
        pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: 86_978_581_952, pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: 0}

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.fields = dict(self.FIELDS)
        self.field_errors: dict[int, int] = {}  # field id -> the NVML error its read answers
        self.symbols: dict[str, object] = {
            "nvmlInitWithFlags": _out(), "nvmlShutdown": _out(),
            "nvmlSystemGetDriverVersion": _text(b"550.54.15"), "nvmlDeviceGetCount_v2": _out(1),
            "nvmlDeviceGetHandleByIndex_v2": _out(), "nvmlDeviceGetUUID": _text(b"GPU-fake-0"),
            "nvmlDeviceGetName": _text(b"NVIDIA H100 80GB HBM3"),
            "nvmlDeviceGetPciInfo_v3": _struct(busId=b"00000000:18:00.0"),
            "nvmlDeviceGetMinorNumber": _out(0), "nvmlDeviceGetCpuAffinity": self._affinity,
            "nvmlEventSetCreate": _out(), "nvmlDeviceRegisterEvents": _out(), "nvmlEventSetFree": _out(),
            "nvmlEventSetWait_v2": _fails(pynvml.NVML_ERROR_TIMEOUT),
            "nvmlDeviceGetFieldValues": self._field_values, "nvmlDeviceGetNvLinkState": self._nvlink_state,
            "nvmlDeviceGetSamples": _fails(pynvml.NVML_ERROR_NOT_SUPPORTED),
            "nvmlDeviceGetUtilizationRates": _struct(gpu=87),
            "nvmlDeviceGetMemoryInfo": _struct(used=5 * 2**30, total=80 * 2**30),
            "nvmlDeviceGetMemoryInfo_v2": self._memory_v2,
            "nvmlDeviceGetPowerUsage": _out(350_000), "nvmlDeviceGetEnforcedPowerLimit": _out(700_000),
            "nvmlDeviceGetTemperature": _out(55),
            "nvmlDeviceGetClockInfo": self._clock, "nvmlDeviceGetViolationStatus": _struct(violationTime=0),
            "nvmlDeviceGetComputeRunningProcesses_v3": _out(),
            "nvmlDeviceGetMigMode": _fails(pynvml.NVML_ERROR_NOT_SUPPORTED),
            "nvmlDeviceGetEncoderUtilization": _out(37, 167_000), "nvmlDeviceGetDecoderUtilization": _out(12, 167_000),
            "nvmlDeviceGetCurrPcieLinkGeneration": _out(4),
            "nvmlDeviceGetMaxPcieLinkGeneration": _out(5), "nvmlDeviceGetCurrPcieLinkWidth": _out(8),
            "nvmlDeviceGetMaxPcieLinkWidth": _out(16),
            "nvmlDeviceGetNvLinkErrorCounter": self._nvlink_errors,
        }

    def lookup(self, name: str) -> object:
        if name not in self.symbols:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        fn = self.symbols[name]

        def recorded(*args: object) -> object:
            self.calls.append((name, args))
            return fn(*args)  # type: ignore[operator]
        return recorded

    def called(self, name: str) -> list[tuple[object, ...]]:
        return [args for called, args in self.calls if called == name]

    @staticmethod
    def _affinity(handle: object, size: int, mask: object) -> int:
        mask._obj[0] = 0b11  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    def _field_values(self, handle: object, count: object, values: object) -> int:
        for field in values._obj:  # type: ignore[attr-defined]
            if field.fieldId in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                 pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                answer: int | None = 1000 + field.scopeId
            else:
                answer = self.fields.get(field.fieldId)
            if answer is None or field.fieldId in self.field_errors:
                field.nvmlReturn = self.field_errors.get(field.fieldId, pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            field.nvmlReturn = pynvml.NVML_SUCCESS
            field.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            field.value.ullVal = answer
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _nvlink_state(handle: object, link: int, active: object) -> int:
        active._obj.value = 1 if link == 0 else 0  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _memory_v2(handle: object, memory: object) -> int:
        if memory._obj.version != pynvml.nvmlMemory_v2:  # type: ignore[attr-defined]
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        memory._obj.reserved = 551 * 2**20  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _clock(handle: object, clock: object, mhz: object) -> int:
        mhz._obj.value = {  # type: ignore[attr-defined]
            pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock.value]  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _nvlink_errors(handle: object, link: int, counter: int, count: object) -> int:
        count._obj.value = {0: 5, 1: 1, 2: 40, 3: 2}[counter]  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS


@pytest.fixture
def libnvml(monkeypatch: pytest.MonkeyPatch) -> FakeLibNvml:
    fake = FakeLibNvml()
    monkeypatch.setattr(pynvml, "_LoadNvmlLibrary", lambda: None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fake.lookup)
    return fake


def _collect(times: int = 2, slow_interval: float = 30.0) -> tuple[Batch, str]:
    source = NvmlSource(NvmlLibrary(), slow_interval=slow_interval)
    for _ in range(times):
        batch = source.collect()
    source.close()
    return batch, Renderer().render(batch, TEXT).decode()


def test_the_ids_we_pass_are_nvmls() -> None:
    assert FI_MEMORY_TEMP == pynvml.NVML_FI_DEV_MEMORY_TEMP
    ours = {name: getattr(api, name) for name in dir(api) if name.startswith("FI_") and name != "FI_PERF_POLICY"}
    theirs = {"FI_ECC_SBE_VOL_TOTAL": "ECC_SBE_VOL_TOTAL", "FI_ECC_DBE_VOL_TOTAL": "ECC_DBE_VOL_TOTAL",
              "FI_RETIRED_SBE": "RETIRED_SBE", "FI_RETIRED_DBE": "RETIRED_DBE", "FI_RETIRED_PENDING": "RETIRED_PENDING",
              "FI_MEMORY_TEMP": "MEMORY_TEMP", "FI_TOTAL_ENERGY": "TOTAL_ENERGY_CONSUMPTION",
              "FI_NVLINK_LINK_COUNT": "NVLINK_LINK_COUNT", "FI_PCIE_REPLAY_COUNTER": "PCIE_REPLAY_COUNTER",
              "FI_NVLINK_DATA_TX_KIB": "NVLINK_THROUGHPUT_DATA_TX",
              "FI_NVLINK_DATA_RX_KIB": "NVLINK_THROUGHPUT_DATA_RX",
              "FI_REMAPPED_COR": "REMAPPED_COR", "FI_REMAPPED_UNC": "REMAPPED_UNC",
              "FI_REMAPPED_PENDING": "REMAPPED_PENDING", "FI_REMAPPED_FAILURE": "REMAPPED_FAILURE",
              "FI_PCIE_TX_BYTES": "PCIE_COUNT_TX_BYTES", "FI_PCIE_RX_BYTES": "PCIE_COUNT_RX_BYTES",
              "FI_GPU_RECOVERY_ACTION": "GET_GPU_RECOVERY_ACTION"}
    assert ours == {name: getattr(pynvml, f"NVML_FI_DEV_{theirs[name]}") for name in ours}
    # the codes goodput_gpu_recovery_action's help names (nvmlDeviceGpuRecoveryAction_t)
    assert [getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}") for name in
            ("NONE", "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET")] == [0, 1, 2, 3, 4]
    policies = ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION", "RELIABILITY")
    nvml = {getattr(pynvml, f"NVML_PERF_POLICY_{name}"): getattr(pynvml, f"NVML_FI_DEV_PERF_POLICY_{name}")
            for name in policies}
    assert nvml == api.FI_PERF_POLICY
    assert ARGUMENT_VERSION_MISMATCH == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert NVLINK_ERRORS == {
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
    assert RETIREMENT_CAUSES == {pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "single_bit",
                                 pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "double_bit"}


def test_health_series_through_pynvml_in_base_units(libnvml: FakeLibNvml) -> None:
    batch, text = _collect()
    assert batch.errors == []
    gpu = {"gpu": "0", "uuid": "GPU-fake-0"}
    assert value(text, "goodput_gpu_memory_clock_hertz", **gpu) == 2619e6
    assert value(text, "goodput_gpu_sm_clock_hertz", **gpu) == 1980e6
    assert value(text, "goodput_gpu_memory_temperature_celsius", **gpu) == 48
    assert value(text, "goodput_gpu_memory_reserved_bytes", **gpu) == 551 * 2**20
    assert value(text, "goodput_gpu_encoder_utilization_ratio", **gpu) == 0.37
    assert value(text, "goodput_gpu_decoder_utilization_ratio", **gpu) == 0.12
    assert value(text, "goodput_gpu_pcie_replays_total", **gpu) == 9
    assert value(text, "goodput_gpu_pcie_link_generation", **gpu) == 4
    assert value(text, "goodput_gpu_pcie_link_max_generation", **gpu) == 5
    assert value(text, "goodput_gpu_pcie_link_width", **gpu) == 8
    assert value(text, "goodput_gpu_pcie_link_max_width", **gpu) == 16
    assert value(text, "goodput_gpu_remapped_rows_total", error_type="corrected", **gpu) == 3
    assert value(text, "goodput_gpu_remapped_rows_total", error_type="uncorrected", **gpu) == 1
    assert value(text, "goodput_gpu_row_remap_pending", **gpu) == 1
    assert value(text, "goodput_gpu_row_remap_failure", **gpu) == 0
    # not supported on this GPU: absent, never 0
    assert series(text, "goodput_gpu_retired_pages_total") == []
    assert series(text, "goodput_gpu_retired_pages_pending") == []
    # every field of a collection in one call: the link count at start-up, then one per collection; the health
    # counters (ECC, pages, rows, replays) in the first only (the next is within slow_interval)
    asked = [[(f.fieldId, f.scopeId) for f in args[2]._obj]  # type: ignore[attr-defined]
             for args in libnvml.called("nvmlDeviceGetFieldValues")]
    assert len(asked) == 3
    assert (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0) in asked[1] and (pynvml.NVML_FI_DEV_RETIRED_SBE, 0) in asked[1]
    assert (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0) not in asked[2]
    assert {(pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0), (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
            (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0)} <= set(asked[2])
    assert value(text, "goodput_gpu_energy_joules_total", **gpu) == 10**6
    assert (pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL, 0) in asked[2]  # the violation counters: fields, every time
    throttled = {s["reason"]: value(text, "goodput_gpu_clock_throttle_seconds_total", **s)
                 for s in series(text, "goodput_gpu_clock_throttle_seconds_total")}
    assert throttled == {"power": 0, "thermal": 0, "sync_boost": 0, "board_limit": 0,
                         "low_utilization": 86.978581952, "reliability": 0}
    assert libnvml.called("nvmlDeviceGetViolationStatus") == []
    # the active link only (link 1 is not), each counter by NVML's own id, summed per GPU
    errors = {s["error_type"]: value(text, "goodput_gpu_nvlink_errors_total", **s)
              for s in series(text, "goodput_gpu_nvlink_errors_total")}
    assert errors == {"replay": 5, "recovery": 1, "crc_flit": 40, "crc_data": 2}
    assert series(text, "goodput_gpu_nvlink_transmit_bytes_total") == [gpu]
    assert value(text, "goodput_gpu_nvlink_transmit_bytes_total", **gpu) == 1000 * 1024  # link 0's KiB counter
    assert value(text, "goodput_gpu_nvlink_receive_bytes_total", **gpu) == 1000 * 1024
    assert {(args[1], args[2]) for args in libnvml.called("nvmlDeviceGetNvLinkErrorCounter")} == {
        (0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY), (0, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
        (0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), (0, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)}
    assert {args[1].value for args in libnvml.called("nvmlDeviceGetClockInfo")} == {  # type: ignore[attr-defined]
        pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM}


def test_an_older_gpu_and_driver_leave_out_what_they_lack(libnvml: FakeLibNvml) -> None:
    """A V100-era GPU on an older driver: pages retired instead of rows remapped, no memory temperature, no data
    CRC counter, no nvmlDeviceGetMemoryInfo_v2."""
    del libnvml.symbols["nvmlDeviceGetMemoryInfo_v2"]
    del libnvml.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP]
    for field in (pynvml.NVML_FI_DEV_REMAPPED_COR, pynvml.NVML_FI_DEV_REMAPPED_UNC, pynvml.NVML_FI_DEV_REMAPPED_PENDING,
                  pynvml.NVML_FI_DEV_REMAPPED_FAILURE):
        del libnvml.fields[field]
    libnvml.fields.update({pynvml.NVML_FI_DEV_RETIRED_SBE: 2, pynvml.NVML_FI_DEV_RETIRED_DBE: 1,
                           pynvml.NVML_FI_DEV_RETIRED_PENDING: 1})

    def errors(handle: object, link: int, counter: int, count: object) -> int:
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        count._obj.value = 0  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    libnvml.symbols["nvmlDeviceGetNvLinkErrorCounter"] = errors
    batch, text = _collect(3, slow_interval=1e-9)  # the slow readings at every collection
    assert batch.errors == []
    for name in ("goodput_gpu_memory_reserved_bytes", "goodput_gpu_memory_temperature_celsius",
                 "goodput_gpu_remapped_rows_total", "goodput_gpu_row_remap_pending", "goodput_gpu_row_remap_failure"):
        assert series(text, name) == [], name
    assert value(text, "goodput_gpu_memory_used_bytes") == 5 * 2**30  # the v1 call still answers
    assert value(text, "goodput_gpu_retired_pages_total", cause="single_bit") == 2
    assert value(text, "goodput_gpu_retired_pages_total", cause="double_bit") == 1
    assert value(text, "goodput_gpu_retired_pages_pending") == 1
    assert {s["error_type"] for s in series(text, "goodput_gpu_nvlink_errors_total")} == {"replay", "recovery",
                                                                                         "crc_flit"}
    data_crc = [a for a in libnvml.called("nvmlDeviceGetNvLinkErrorCounter")
                if a[2] == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA]
    assert len(data_crc) == 1


def test_a_driver_without_the_v2_memory_version_reads_as_unsupported(libnvml: FakeLibNvml) -> None:
    libnvml.symbols["nvmlDeviceGetMemoryInfo_v2"] = _fails(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    with pytest.raises(GpuError) as info:
        NvmlLibrary().device_memory_reserved_bytes(None)
    assert info.value.code == ARGUMENT_VERSION_MISMATCH
    batch, text = _collect()
    assert batch.errors == []
    assert series(text, "goodput_gpu_memory_reserved_bytes") == []
    assert len(libnvml.called("nvmlDeviceGetMemoryInfo_v2")) == 2  # one in the test above, one by the source


def test_a_failing_health_query_is_counted_not_zero(libnvml: FakeLibNvml) -> None:
    libnvml.field_errors[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = pynvml.NVML_ERROR_UNKNOWN
    batch, text = _collect(1)
    assert batch.errors == ["nvml_unknown"]
    assert series(text, "goodput_gpu_pcie_replays_total") == []
    assert value(text, "goodput_gpu_pcie_link_width") == 8


# --- bench/nvml_real.py, as the GPU run uses it: over the fake libnvidia-ml here ---------------------------------

def _nvml_real():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import nvml_real
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return nvml_real


def test_the_real_gpu_bench_counts_calls_and_cpu_per_collection(libnvml: FakeLibNvml) -> None:
    nvml_real = _nvml_real()
    clock = ManualClock(0.0)
    result = nvml_real.run(60.0, sleep=clock.advance, clock=clock, wall_clock=lambda: 1.76e9 + clock())
    assert (result["gpus"], result["model"], result["driver"]) == (1, "NVIDIA H100 80GB HBM3", "550.54.15")
    assert result["collections"] == 12 and result["elapsed_s"] == 60.0  # every 5 s (the default interval)
    calls, c_calls = result["calls"], result["c_calls"]
    assert calls["nvmlDeviceGetFieldValues"] == 12 == c_calls["nvmlDeviceGetFieldValues"]
    # slow rounds at 30 s and 60 s (the first collection's, at 0, is start-up's): the power limit read twice
    assert calls["nvmlDeviceGetEnforcedPowerLimit"] == 2
    # pynvml asks nvmlDeviceGetComputeRunningProcesses twice when the first answer is not empty; here it is
    assert c_calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 12
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == 12
    assert sum(c_calls.values()) >= sum(calls.values())  # the C calls under the source's
    assert len(result["cpu_s"]) == 12 and all(cpu >= 0 for cpu in result["cpu_s"])
    text = "\n".join(nvml_real.markdown(result))
    per_gpu_second = sum(calls.values()) / 60
    assert f"| {per_gpu_second:.2f} |" in text and "`nvmlDeviceGetFieldValues`" in text
    assert per_gpu_second <= 10
    # the probe: the fake has violation fields but no NVLink-total ones (None), and the calls' answers beside them
    (probe,) = result["probe"]
    assert probe["calls"]["violation_ns_1"] == 0 and probe["calls"]["nvlink_errors_2"] == 40  # link 0's CRC flit
    assert probe["fields"]["78"] == 86_978_581_952 and probe["fields"]["38"] is None


def test_the_real_gpu_bench_imports_no_third_party_package_but_pynvml() -> None:
    code = ("import sys; sys.path.insert(0, 'bench'); import nvml_real; nvml_real.load_source_modules(); "
            "import exporter.sources.nvml.source, exporter.sources.nvml.library; "
            "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)))")
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert [m for m in ast.literal_eval(found.stdout) if not m.startswith("_")] == [
        "exporter", "goodput_client", "nvml_real", "pynvml"]
