"""The dcgm source: what the kernels do (SM, tensor, DRAM, FP pipes, PCIe/NVLink rates) from DCGM.

Two ways in, chosen by `dcgm.mode`:

- bindings: DCGM's own Python bindings (a `DcgmBackend`: the real ones, or the simulator). The source
  connects to nv-hostengine (or starts the embedded engine), has DCGM watch the profiling fields at
  `dcgm.interval`, and each collection reads the latest values DCGM's background sampler holds.
- exporter: a dcgm-exporter already running on the node; each collection fetches its /metrics.

Either way, GPUs are matched to NVML's by UUID, so every series carries the same `gpu` (NVML index)
and `uuid` as the nvml source's. A GPU that NVML does not know is counted (reason
dcgm_unknown_gpu) and left out; while the nvml source runs but has identified no GPU yet, the source
is down with reason dcgm_waiting_for_nvml (DCGM's ids are not NVML's indexes). Only with the nvml
source disabled is DCGM's (or dcgm-exporter's) own GPU id used as `gpu`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from ...core.backoff import Backoff
from ...core.calls import CountedCalls
from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source, SourceError
from . import fetch, scrape
from . import metrics as c
from .api import (
    BASE_FIELDS,
    CONNECTION_NOT_VALID,
    DCGM_FUNCTIONS,
    FE_GPU,
    FE_GPU_I,
    FI_PROF_DRAM_ACTIVE,
    FI_PROF_GR_ENGINE_ACTIVE,
    FI_PROF_NVLINK_RX_BYTES,
    FI_PROF_NVLINK_TX_BYTES,
    FI_PROF_PCIE_RX_BYTES,
    FI_PROF_PCIE_TX_BYTES,
    FI_PROF_PIPE_FP16_ACTIVE,
    FI_PROF_PIPE_FP32_ACTIVE,
    FI_PROF_PIPE_FP64_ACTIVE,
    FI_PROF_PIPE_INT_ACTIVE,
    FI_PROF_PIPE_TENSOR_ACTIVE,
    FI_PROF_PIPE_TENSOR_DFMA_ACTIVE,
    FI_PROF_PIPE_TENSOR_HMMA_ACTIVE,
    FI_PROF_PIPE_TENSOR_IMMA_ACTIVE,
    FI_PROF_SM_ACTIVE,
    FI_PROF_SM_OCCUPANCY,
    PROFILING_FIELDS,
    PROFILING_UNAVAILABLE,
    STALE_AFTER_INTERVALS,
    DcgmBackend,
    DcgmError,
    Entity,
    is_blank,
)
from .settings import DcgmConfig

log = logging.getLogger(__name__)

METRICS: dict[int, c.Metric] = {
    FI_PROF_GR_ENGINE_ACTIVE: c.GPU_GR_ENGINE_ACTIVE,
    FI_PROF_SM_ACTIVE: c.GPU_SM_ACTIVE,
    FI_PROF_SM_OCCUPANCY: c.GPU_SM_OCCUPANCY,
    FI_PROF_PIPE_TENSOR_ACTIVE: c.GPU_TENSOR_ACTIVE,
    FI_PROF_PIPE_TENSOR_HMMA_ACTIVE: c.GPU_TENSOR_HMMA_ACTIVE,
    FI_PROF_PIPE_TENSOR_IMMA_ACTIVE: c.GPU_TENSOR_IMMA_ACTIVE,
    FI_PROF_PIPE_TENSOR_DFMA_ACTIVE: c.GPU_TENSOR_DFMA_ACTIVE,
    FI_PROF_DRAM_ACTIVE: c.GPU_DRAM_ACTIVE,
    FI_PROF_PIPE_FP16_ACTIVE: c.GPU_FP16_ACTIVE,
    FI_PROF_PIPE_FP32_ACTIVE: c.GPU_FP32_ACTIVE,
    FI_PROF_PIPE_FP64_ACTIVE: c.GPU_FP64_ACTIVE,
    FI_PROF_PIPE_INT_ACTIVE: c.GPU_INT_ACTIVE,
    FI_PROF_PCIE_TX_BYTES: c.GPU_DCGM_PCIE_TX,
    FI_PROF_PCIE_RX_BYTES: c.GPU_DCGM_PCIE_RX,
    FI_PROF_NVLINK_TX_BYTES: c.GPU_DCGM_NVLINK_TX,
    FI_PROF_NVLINK_RX_BYTES: c.GPU_DCGM_NVLINK_RX,
}
PROFILING_RETRY_AFTER = 300.0  # seconds before asking again for fields DCGM said it cannot give
# DCGM could not be reached (no nv-hostengine, no bindings): tried again after this, then twice as long each time up
# to CONNECT_RETRY_MOST, instead of at every collection
CONNECT_RETRY_FIRST = 5.0
CONNECT_RETRY_MOST = 300.0
HIERARCHY_EVERY = 30.0  # seconds between checks of the MIG layout, in bindings mode
EXPORTER_DEADLINE_SHARE = 0.8  # of dcgm.timeout: the source reports its own clear reason first
MAX_LOGGED_GPUS = 64  # unknown GPUs logged by UUID, at most (the input is another program's)

# What one reader returns: (GPU UUID, MIG GPU instance id or "") -> (the tool's own GPU id, {field: value})
Readings = dict[tuple[str, str], tuple[str, dict[int, float]]]


class _BindingsReader:
    """Keeps a connection to DCGM with the profiling fields watched; reconnects after a failure."""

    def __init__(self, backend: DcgmBackend, config: DcgmConfig, clock: Callable[[], float]) -> None:
        self.calls = CountedCalls(backend, DCGM_FUNCTIONS)  # every call counted (goodput_exporter_library_calls_total)
        self.backend: DcgmBackend = self.calls  # type: ignore[assignment]
        self._retry = Backoff(CONNECT_RETRY_FIRST, CONNECT_RETRY_MOST, clock=clock)
        self._retry_error: tuple[str, str] = ("", "")  # the last failure's reason and message
        self.interval = config.interval
        self.where = ("DCGM's embedded engine" if config.hostengine == "embedded"
                      else f"nv-hostengine at {config.hostengine}")
        self._clock = clock
        # DCGM entity -> (GPU UUID, DCGM GPU id, MIG GPU instance id or "") while connected and watching
        self._entities: dict[Entity, tuple[str, str, str]] | None = None
        self._instances: set[tuple[int, int, int]] = set()  # the MIG layout watched
        self._hierarchy_read = 0.0
        self._unavailable: tuple[float, str, str] | None = None  # since, reason, message
        self._stale_logged = False

    def read(self, batch: Batch) -> Readings:
        if self._entities is not None and self._clock() - self._hierarchy_read >= HIERARCHY_EVERY:
            self._check_hierarchy()
        if self._entities is None:
            self._start()
        assert self._entities is not None
        try:
            latest = self.backend.latest()
        except DcgmError as exc:
            self._drop()
            if exc.code == CONNECTION_NOT_VALID:
                raise SourceError(exc.reason, f"lost the connection to {self.where} ({exc}); reconnecting at "
                                  "the next collection") from None
            raise SourceError(exc.reason, f"reading DCGM's latest values failed: {exc}") from None
        except BaseException:  # whatever else: never keep a connection in an unknown state
            self._drop()
            raise
        if latest.stale:
            batch.errors.extend(["dcgm_stale_sample"] * latest.stale)
            if not self._stale_logged:
                self._stale_logged = True
                log.warning("dcgm: %d latest sample(s) are older than %g intervals and were left out: DCGM's "
                            "sampler is not updating them (is nv-hostengine overloaded?)",
                            latest.stale, STALE_AFTER_INTERVALS)
        out: Readings = {}
        for entity, values in latest.values.items():
            known = self._entities.get(entity)
            if known is None:
                batch.errors.append("dcgm_unknown_gpu")
                continue
            uuid, gpu_id, instance = known
            blank = [field_id for field_id, value in values.items() if is_blank(value)]
            for field_id in blank:  # the bindings mark blanks; a marker value unmarked is still one
                del values[field_id]
                batch.errors.append("dcgm_blank_value")
            out[uuid, instance] = (gpu_id, values)
        return out  # only blanks for every GPU: DcgmSource.collect says so, as for any reader

    def _start(self) -> None:
        if self._unavailable is not None:
            since, reason, message = self._unavailable
            if self._clock() - since < PROFILING_RETRY_AFTER:
                raise SourceError(reason, message)  # a fresh one each time: no shared traceback
            self._unavailable = None
        if not self._retry.due():
            raise SourceError(*self._retry_error)
        try:
            self._connect_and_watch()
        except SourceError as exc:
            self._drop()
            if self._unavailable is None:  # not the profiling fields' refusal, which waits on its own
                delay = self._retry.failed()
                self._retry_error = (exc.reason, f"{exc} (next try in {delay:g}s; the wait doubles after each "
                                     f"failure, up to {self._retry.most:g}s)")
                raise SourceError(*self._retry_error) from None
            raise
        except BaseException:  # DcgmError or not, the handle is closed: nothing leaks
            self._drop()
            raise
        self._retry.succeeded()

    def _connect_and_watch(self) -> None:
        try:
            self.backend.connect()
        except DcgmError as exc:
            if exc.code == CONNECTION_NOT_VALID:
                raise SourceError(exc.reason, f"cannot connect to {self.where} ({exc}): is nv-hostengine "
                                  "running (systemctl status nvidia-dcgm)? Or set dcgm.hostengine=embedded") from None
            raise SourceError(exc.reason, f"starting DCGM failed: {exc}") from None
        try:
            gpus = {gpu.gpu_id: gpu.uuid for gpu in self.backend.gpus()}
            instances = self.backend.gpu_instances()
        except DcgmError as exc:
            raise SourceError(exc.reason, f"listing DCGM's GPUs failed: {exc}") from None
        # as dcgm-exporter's default (--devices f): a GPU in MIG mode is watched per GPU instance
        entities: dict[Entity, tuple[str, str, str]] = {}
        in_mig = {instance.gpu_id for instance in instances if instance.gpu_id in gpus}
        for instance in instances:
            if instance.gpu_id in gpus:
                entities[FE_GPU_I, instance.entity_id] = (gpus[instance.gpu_id], str(instance.gpu_id),
                                                          str(instance.instance_id))
        for gpu_id, uuid in gpus.items():
            if gpu_id not in in_mig:
                entities[FE_GPU, gpu_id] = (uuid, str(gpu_id), "")
        self._instances = {(i.entity_id, i.gpu_id, i.instance_id) for i in instances}
        self._hierarchy_read = self._clock()
        fields = self._watch(list(entities))
        log.info("dcgm: watching %d profiling fields of %d GPU(s) (%d MIG GPU instance(s)) through %s, every %gs",
                 len(fields), len(gpus), len(instances), self.where, self.interval)
        self._entities = entities
        self._stale_logged = False

    def _check_hierarchy(self) -> None:
        """A MIG layout changed since DCGM was asked (instances made or destroyed): DCGM reuses entity ids, so
        the values would go to the wrong gpu_instance_id. Watch again from the new layout."""
        self._hierarchy_read = self._clock()
        try:
            now = {(i.entity_id, i.gpu_id, i.instance_id) for i in self.backend.gpu_instances()}
        except DcgmError:
            return  # the read that follows meets the same trouble and reports it
        if now != self._instances:
            log.info("dcgm: the MIG layout changed (%d GPU instance(s) now, %d before); watching again",
                     len(now), len(self._instances))
            self._drop()

    def _watch(self, entities: list[Entity]) -> tuple[int, ...]:
        """Watch every profiling field; where DCGM refuses them all (an older GPU lacks the tensor sub-pipes
        or the integer pipe), the twelve every data-center GPU since Volta has."""
        first: DcgmError | None = None
        for fields in (PROFILING_FIELDS, BASE_FIELDS):
            try:
                self.backend.watch(fields, self.interval, entities)
                if first is not None:
                    log.info("dcgm: DCGM refused the whole set of profiling fields (%s); watching its base "
                             "set of %d", first, len(fields))
                return fields
            except DcgmError as exc:
                if exc.code not in PROFILING_UNAVAILABLE:
                    raise SourceError(exc.reason, f"watching the profiling fields failed: {exc}") from None
                first = first or exc
        assert first is not None
        message = (f"DCGM cannot watch the profiling fields ({first}): they need a data-center GPU "
                   "(Volta or newer), a host engine running as root, and no other profiler (Nsight) "
                   f"holding the counters; asking again in {PROFILING_RETRY_AFTER:g}s")
        self._unavailable = (self._clock(), first.reason, message)
        raise SourceError(first.reason, message)

    def _drop(self) -> None:
        self._entities = None
        with contextlib.suppress(Exception):  # disconnecting is best effort; it must not hide the error
            self.backend.disconnect()

    def close(self) -> None:
        self._drop()


class _ExporterReader:
    """Fetches a dcgm-exporter's /metrics once per collection."""

    def __init__(self, config: DcgmConfig) -> None:
        self._fetcher = fetch.Fetcher(
            config.exporter_url, basic_auth_username=config.basic_auth_username,
            basic_auth_password_file=config.basic_auth_password_file, bearer_token_file=config.bearer_token_file,
            ca_file=config.ca_file, cert_file=config.cert_file, key_file=config.key_file,
            insecure_skip_verify=config.insecure_skip_verify)
        self.url = self._fetcher.display_url  # never the URL as configured: it may hold a password
        self.deadline = config.timeout * EXPORTER_DEADLINE_SHARE
        self._logged: set[str] = set()
        if self._fetcher.url_credentials:
            log.warning("dcgm: dcgm.exporter_url holds a user name and password; they are sent as basic auth, but a "
                        "URL is shown in process lists, config files and chart values: set dcgm.basic_auth_username "
                        "and dcgm.basic_auth_password_file (a mounted Secret) instead")

    def read(self, batch: Batch) -> Readings:
        try:
            text = self._fetcher.fetch(self.deadline)
        except fetch.ScrapeError as exc:
            raise SourceError(exc.reason, str(exc)) from None
        reading = scrape.parse(text)
        for reason, count in sorted(reading.rejected.items()):
            batch.errors.extend([reason] * count)
            self._once(reason, f"dcgm: rejected {count} series from {self.url} ({reason}), e.g.: "
                       f"{reading.examples[reason]}")
        if reading.mig_instances:
            self._once("mig", f"dcgm: {self.url} reports {reading.mig_instances} MIG GPU instance(s); their "
                       "series carry gpu_instance_id", level=logging.INFO)
        if reading.taken == 0:
            found = (f"{reading.unmapped} DCGM_FI_PROF_* series of no field this source maps (video engines, "
                     "C2C, ...) and none of the kernel ones" if reading.unmapped else "no DCGM_FI_PROF_* series")
            raise SourceError("dcgm_exporter_no_fields", f"{self.url} has {found}: its "
                              "counters file lists none. dcgm-exporter 4.x's default counters have "
                              "DCGM_FI_PROF_GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE and PCIE_*; "
                              "releases before 3.3.9 and custom files (-f, or the GPU Operator's "
                              "dcgmExporter.config) may have none. Add them to its counters file, or run it "
                              "with -f /etc/dcgm-exporter/dcp-metrics-included.csv")
        if not reading.values:
            raise self._nothing_usable(reading)
        return {entity: (reading.gpu_ids[entity[0]], values) for entity, values in reading.values.items()}

    def _nothing_usable(self, reading: scrape.Reading) -> SourceError:
        """Every profiling series was rejected: the source is down, with the commonest reason."""
        reason, count = reading.rejected.most_common(1)[0]
        if reason == "dcgm_exporter_no_uuid":
            seen = ", ".join(sorted(reading.labels_seen)[:20]) or "none"
            return SourceError("dcgm_exporter_unknown_labels", f"{self.url}: none of its {reading.taken} "
                               f"DCGM_FI_PROF_* series has a UUID (or uuid) label, so none can be matched to a "
                               f"GPU; labels seen: {seen}")
        if reason == "dcgm_exporter_blank":
            return SourceError("dcgm_exporter_blank", f"{self.url}: all {reading.taken} DCGM_FI_PROF_* series "
                               "hold DCGM's blank marker (no value): DCGM has not sampled them yet, or cannot "
                               "(profiling unsupported on these GPUs, or another profiler holds the counters)")
        return SourceError(reason, f"{self.url}: all {reading.taken} DCGM_FI_PROF_* series were rejected "
                           f"({count} as {reason}), e.g.: {reading.examples[reason]}")

    def _once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._logged:  # keys are our own reasons: a small, fixed set
            self._logged.add(key)
            log.log(level, "%s", message)

    def close(self) -> None:
        self._fetcher.close()


class DcgmSource(Source):
    name = "dcgm"

    def __init__(
        self,
        config: DcgmConfig,
        backend: DcgmBackend | None = None,
        table: NodeGpus | None = None,
        clock: Callable[[], float] = time.monotonic,
        nvml_enabled: bool | None = None,
    ) -> None:
        """`nvml_enabled`: whether the nvml source runs and fills `table` (default: whether a table was
        given). Only without it are GPUs labelled by DCGM's (or dcgm-exporter's) own ids."""
        self.mode = config.mode
        self.nvml_enabled = table is not None if nvml_enabled is None else nvml_enabled
        self.table = table or NodeGpus()
        self._reader: _BindingsReader | _ExporterReader
        if config.mode == "exporter":
            self._reader = _ExporterReader(config)
        else:
            if backend is None:
                raise ValueError("dcgm.mode=bindings needs a DCGM backend")
            self._reader = _BindingsReader(backend, config, clock)
        self._unknown_logged: set[str] = set()
        self._seen: set[str] = set()
        self._own_ids_logged = False

    def library_calls(self) -> dict[str, int]:
        reader = self._reader
        return reader.calls.by_function() if isinstance(reader, _BindingsReader) else {}

    def collect(self) -> Batch:
        batch = Batch()
        readings = self._reader.read(batch)
        known = self.table.index_by_uuid()
        if self.nvml_enabled and not known:
            # DCGM's ids are not NVML's: labelling by them now would put the values on the wrong `gpu`
            raise SourceError("dcgm_waiting_for_nvml", "the nvml source has not identified this node's GPUs "
                              "yet; DCGM's values are matched to them by UUID once it has")
        if not known and readings and not self._own_ids_logged:
            self._own_ids_logged = True
            log.info("dcgm: the nvml source is disabled; labelling GPUs by DCGM's own GPU ids")
        rows: list[tuple[str, str, str, dict[int, float]]] = []
        for (uuid, instance), (own_id, values) in readings.items():
            index = known.get(uuid) if self.nvml_enabled else (own_id or None)
            if index is None:
                batch.errors.append("dcgm_unknown_gpu")
                if uuid not in self._unknown_logged and len(self._unknown_logged) < MAX_LOGGED_GPUS:
                    self._unknown_logged.add(uuid)
                    log.warning("dcgm: GPU %s (DCGM id %s) is not one of this node's GPUs as NVML sees them; "
                                "its series are left out", uuid, own_id or "?")
                continue
            rows.append((index, uuid, instance, values))
        if readings and not rows:
            raise SourceError("dcgm_unknown_gpu", f"none of the {len({u for u, _ in readings})} GPU(s) DCGM "
                              "reports is one of this node's GPUs as NVML sees them (matched by UUID)")
        if not any(values for *_, values in rows):
            raise SourceError("dcgm_no_values", "DCGM has no value of any profiling field for this node's GPUs "
                              "(blank samples only): it may still be starting, or those GPUs are lost")
        # by index, numerically, then instance
        rows.sort(key=lambda row: (len(row[0]), row[0], len(row[2]), row[2]))
        for index, uuid, instance, values in rows:
            for field_id, value in sorted(values.items()):
                metric = METRICS.get(field_id)
                if metric is not None:
                    batch.add(metric, (index, uuid, instance), value)
        seen = {uuid for uuid, _ in readings}
        for uuid in sorted(self._seen - seen):
            log.warning("dcgm: GPU %s is no longer reported; its series are withdrawn", uuid)
        self._seen = seen
        return batch

    def close(self) -> None:
        self._reader.close()
