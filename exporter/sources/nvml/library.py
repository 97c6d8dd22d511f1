"""The real GPU backend: nvidia-ml-py (`pynvml`) against the driver's libnvidia-ml.so.1."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from .api import FUNCTION_NOT_FOUND, NOT_FOUND, TIMEOUT, GpuError, Handle, Process, XidEvent

T = TypeVar("T")


def _translated(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except pynvml.NVMLError as exc:
            raise GpuError(int(exc.value), str(exc)) from None
        except pynvml.NVMLLibraryMismatchError as exc:  # a versioned call this driver does not have
            raise GpuError(FUNCTION_NOT_FOUND, str(exc)) from None

    return wrapper


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# a field this GPU or driver does not have: None, as a call that is not supported
_FIELD_ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                           pynvml.NVML_ERROR_INVALID_ARGUMENT})


def _field_int(field: Any) -> int | GpuError | None:
    status = field.nvmlReturn
    if status != pynvml.NVML_SUCCESS:
        return None if status in _FIELD_ABSENT else GpuError(int(status))
    value_type = field.valueType
    if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return int(field.value.dVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(field.value.uiVal)
    if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(field.value.ulVal)
    if value_type == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(field.value.sllVal)
    if value_type == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(field.value.siVal)
    return int(field.value.ullVal)


class NvmlLibrary:
    name = "nvml"

    def __init__(self) -> None:
        self._event_set: Any = None

    @_translated
    def init(self) -> None:
        pynvml.nvmlInit()

    @_translated
    def shutdown(self) -> None:
        if self._event_set is not None:
            pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        pynvml.nvmlShutdown()

    @_translated
    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    @_translated
    def device_count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    @_translated
    def device_handle(self, index: int) -> Handle:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    @_translated
    def device_name(self, handle: Handle) -> str:
        return _text(pynvml.nvmlDeviceGetName(handle))

    @_translated
    def device_uuid(self, handle: Handle) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(handle))

    @_translated
    def device_pci_bus_id(self, handle: Handle) -> str:
        return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)

    @_translated
    def device_minor_number(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))

    @_translated
    def device_utilization_percent(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    @_translated
    def device_utilization_samples(self, handle: Handle, since_us: int) -> list[tuple[int, float]]:
        try:
            value_type, samples = pynvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:  # no sample newer than since_us
                return []
            raise
        if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
            return [(int(s.timeStamp), float(s.sampleValue.dVal)) for s in samples]
        return [(int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples]

    @_translated
    def device_memory(self, handle: Handle) -> tuple[int, int]:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.used), int(info.total)

    @_translated
    def device_power_milliwatts(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    @_translated
    def device_power_limit_milliwatts(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))

    @_translated
    def device_temperature_celsius(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))

    @_translated
    def device_sm_clock_mhz(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))

    @_translated
    def device_memory_clock_mhz(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))

    @_translated
    def device_memory_reserved_bytes(self, handle: Handle) -> int:
        # the v2 structure (driver 510+); an older driver lacks the call (FUNCTION_NOT_FOUND) or the version
        # (ARGUMENT_VERSION_MISMATCH): both read as unsupported
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved)

    @_translated
    def device_encoder_utilization_percent(self, handle: Handle) -> int:
        utilization, _sampling_period_us = pynvml.nvmlDeviceGetEncoderUtilization(handle)
        return int(utilization)

    @_translated
    def device_decoder_utilization_percent(self, handle: Handle) -> int:
        utilization, _sampling_period_us = pynvml.nvmlDeviceGetDecoderUtilization(handle)
        return int(utilization)

    @_translated
    def device_pcie_link_generation(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))

    @_translated
    def device_pcie_link_max_generation(self, handle: Handle) -> int:
        # the device's and the system's maximum (a gen 5 GPU in a gen 4 slot says 4), not
        # nvmlDeviceGetGpuMaxPcieLinkGeneration (the GPU's alone): only a link below what the slot allows is degraded
        return int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))

    @_translated
    def device_pcie_link_width(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))

    @_translated
    def device_pcie_link_max_width(self, handle: Handle) -> int:
        return int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))

    @_translated
    def device_field_values(self, handle: Handle, fields: list[tuple[int, int]]) -> list[int | GpuError | None]:
        return [_field_int(f) for f in pynvml.nvmlDeviceGetFieldValues(handle, fields)]

    @_translated
    def device_nvlink_active(self, handle: Handle, link: int) -> bool:
        return bool(pynvml.nvmlDeviceGetNvLinkState(handle, link))

    @_translated
    def device_nvlink_error_count(self, handle: Handle, link: int, counter: int) -> int:
        return int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))

    @_translated
    def device_compute_processes(self, handle: Handle) -> list[Process]:
        out = []
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = proc.usedGpuMemory
            out.append(Process(int(proc.pid), None if used is None else int(used)))
        return out

    @_translated
    def device_cpu_affinity(self, handle: Handle) -> frozenset[int]:
        words = 64
        mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
        bits = 8 * 8  # c_ulong on the 64-bit Linux platforms NVML supports
        return frozenset(
            word_index * bits + bit
            for word_index, word in enumerate(mask)
            for bit in range(bits)
            if word >> bit & 1
        )

    @_translated
    def device_mig_enabled(self, handle: Handle) -> bool:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    @_translated
    def device_mig_handles(self, handle: Handle) -> list[Handle]:
        out = []
        for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                out.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
            except pynvml.NVMLError as exc:
                if exc.value != NOT_FOUND:  # an empty slot
                    raise
        return out

    @_translated
    def mig_instance_ids(self, handle: Handle) -> tuple[int, int]:
        return (int(pynvml.nvmlDeviceGetGpuInstanceId(handle)),
                int(pynvml.nvmlDeviceGetComputeInstanceId(handle)))

    @_translated
    def xid_events_register(self, handle: Handle) -> None:
        if self._event_set is None:
            self._event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)

    @_translated
    def xid_events_poll(self) -> list[XidEvent]:
        """Drain pending XID events. Events read before an error are returned, not lost."""
        events: list[XidEvent] = []
        if self._event_set is None:
            return events
        for _ in range(10_000):
            try:
                data = pynvml.nvmlEventSetWait(self._event_set, 0)
                if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                    continue
                events.append(XidEvent(int(pynvml.nvmlDeviceGetIndex(data.device)), int(data.eventData)))
            except pynvml.NVMLError as exc:
                if exc.value == TIMEOUT or events:  # no more events, or keep what was read
                    break
                raise
        return events
