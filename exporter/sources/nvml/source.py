"""The NVML source: per-GPU telemetry from a GPU backend (the driver, or the simulator)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...core.backoff import Backoff
from ...core.calls import CountedCalls
from ...core.catalog import Metric
from ...core.exposition import Batch
from ...core.gpus import GpuHolder, GpuIdentity, NodeGpus
from ...core.source import Source, SourceError
from . import metrics as c
from .api import (
    ARGUMENT_VERSION_MISMATCH,
    DRIVER_NOT_LOADED,
    FI_MEMORY_TEMP,
    FI_NVLINK_DATA_RX_KIB,
    FI_NVLINK_DATA_TX_KIB,
    FI_NVLINK_LINK_COUNT,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    NVLINK_ERRORS,
    NVML_FUNCTIONS,
    UNKNOWN,
    GpuBackend,
    GpuError,
)
from .cadence import SLOW_INTERVAL
from .peak_flops import peak_flops
from .readings import READINGS, Reading

log = logging.getLogger(__name__)

NVML_MISSING = (
    "NVML not found (libnvidia-ml.so.1 could not be loaded, or no NVIDIA driver): no GPU metrics. "
    "The other sources keep running. On a GPU node, mount the driver libraries into the container; "
    "without GPUs, use --simulate N for simulated GPUs or --nvml.enabled=false to turn this off."
)


UNKNOWN_UUID = "unknown"
# not supported by the GPU, or the driver lacks the call (or the version of its structure the binding passes)
UNSUPPORTED = (NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH)
# The readings by how they are read (as (index in READINGS, reading)): by a call of their own, every collection or
# every slow_interval; or by fields of the GPU's one nvmlDeviceGetFieldValues call a collection
_CALLS = [(i, r) for i, r in enumerate(READINGS) if r.call and not r.slow]
_SLOW_CALLS = [(i, r) for i, r in enumerate(READINGS) if r.call and r.slow]
_FIELD_READINGS = [(i, r) for i, r in enumerate(READINGS) if r.fields and not r.slow]
_SLOW_FIELD_READINGS = [(i, r) for i, r in enumerate(READINGS) if r.fields and r.slow]
# The fields every GPU is asked for each collection, in this order: PCIe traffic, memory temperature, the field
# readings'; then each active link's NVLink data counters (transmit, receive); then, every slow_interval, the slow
# field readings'
_FIELDS = [(FI_PCIE_TX_BYTES, 0), (FI_PCIE_RX_BYTES, 0), (FI_MEMORY_TEMP, 0),
           *((field_id, 0) for _, reading in _FIELD_READINGS for field_id in reading.fields)]
_LINK_FIELDS = len(_FIELDS)
_SLOW_FIELDS = [(field_id, 0) for _, reading in _SLOW_FIELD_READINGS for field_id in reading.fields]
# NVLink error counters cost one NVML call per link and counter (72 on an H100): read every slow_interval with the
# other health counters; they only feed rates over minutes. Each counter is published per GPU, summed over its active
# links (`_LinkTotal`); per link only with nvml.nvlink_per_link
UNANSWERED = -1  # internal: every query of a GPU failed (the failures are counted one by one)
# NVML's initialisation failed (no driver, no library): tried again after this, then twice as long each time up to
# INIT_RETRY_MOST, instead of at every collection
INIT_RETRY_FIRST = 10.0
INIT_RETRY_MOST = 300.0


class _Lost(Exception):
    pass


class _LinkTotal:
    """One NVLink counter of a GPU summed over its active links, kept a counter: a link whose read fails counts
    with its last known value, and a link whose counter went back (the driver reset it) keeps what it had counted
    as an offset. The first total waits for every link's first answer (up to FIRST_ROUNDS rounds): a total
    published without a link, then with it, would jump by all that link had counted since the driver was loaded
    (and a daemon restarting into such a round would publish a drop). A link first read after that counts only what
    it adds from then on. None until a total is published."""

    __slots__ = ("complete", "last", "offset", "published", "rounds")
    FIRST_ROUNDS = 3

    def __init__(self, links: int) -> None:
        self.last: list[int | None] = [None] * links  # per link, its last reading
        self.offset = 0  # what the links had counted before their counters went back, less what late links had
        self.complete = False  # every link read at least once
        self.published = False  # a total was returned
        self.rounds = 0  # rounds before the first total

    def total(self, values: list[int | None]) -> int | None:
        """The total after this round's readings (one per link, None where the read failed)."""
        last = self.last
        if self.complete and None not in values and all(map(operator.ge, values, last)):
            self.last = values  # the usual round: every link read, none went back
            return sum(values) + self.offset
        for i, value in enumerate(values):
            if value is not None:
                before = last[i]
                if before is None:
                    if self.published:  # first read after the total was published: only its growth counts
                        self.offset -= value
                elif value < before:
                    self.offset += before
                last[i] = value
        known = [value for value in last if value is not None]
        self.complete = 0 < len(known) == len(last)
        if not self.published:
            self.rounds += 1
            if not known or (not self.complete and self.rounds < self.FIRST_ROUNDS):
                return None
            self.published = True
        return sum(known) + self.offset


@dataclass
class _GpuState:
    index: int
    handle: Any
    labels: tuple[str, str]
    info: tuple[str, ...]
    cpus: frozenset[int] = frozenset()
    lost: bool = False
    losses: int = 0  # times it went from answering to lost (goodput_gpu_lost_total)
    unsupported: set[str] = field(default_factory=set)
    links: list[int] = field(default_factory=list)
    fields: list[tuple[int, int]] = field(default_factory=list)  # asked for every collection
    slow_fields: list[tuple[int, int]] = field(default_factory=list)  # `fields`, then the slow ones
    last_sample_us: int = 0
    sample_period_us: int = 0  # smallest gap between samples of the last answer: NVML's sampling period
    idle_seconds: float = 0.0
    sampled_seconds: float = 0.0
    xids: dict[int, int] = field(default_factory=dict)
    last_xid: float | None = None
    mig_uuids: tuple[str, ...] = ()
    minor: int | None = None  # /dev/nvidia<minor>; None when the driver does not say
    # goodput_gpu_peak_flops rows (one per data type of the model's datasheet), built once per identity
    peak_flops: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    # label tuples of its series, built once per identity (`labels`): per reading, per NVLink link, per PID
    series_labels: _SeriesLabels | None = None
    # its NVLink counters summed over its active links (with the series labels): transmit, receive, and per
    # NVLINK_ERRORS counter
    nvlink_tx: _LinkTotal = field(default_factory=lambda: _LinkTotal(0))
    nvlink_rx: _LinkTotal = field(default_factory=lambda: _LinkTotal(0))
    nvlink_errors: tuple[_LinkTotal, ...] = ()
    # what is read every slow_interval (the slow readings, the NVLink error counters): when it was last read, and
    # the rows it gave, published again until the next read (a counter's last answer stays true until then)
    slow_at: float | None = None
    slow_rows: list[tuple[Metric, tuple[str, ...], Any]] = field(default_factory=list)


class _SeriesLabels:
    """A GPU's label tuples, kept between collections and checked against their metrics once, when built: the
    collection appends its rows straight to the batch (`Batch.rows`), without building or checking a tuple per
    series, and the renderer finds a tuple it saw before faster."""

    __slots__ = ("errors", "link_count", "link_errors", "links", "of", "pids", "readings")

    def __init__(self, labels: tuple[str, str], links: list[int], per_link: bool) -> None:
        self.of = labels
        self.link_count = len(links)
        for metric in _GPU_LABELLED:
            Batch.check(metric, labels)
        readings = []
        for reading in READINGS:
            per_metric = reading.label_values(labels)
            for metric, metric_labels in zip(reading.metrics, per_metric, strict=True):
                Batch.check(metric, metric_labels)
            readings.append(per_metric)
        self.readings = tuple(readings)
        # per NVLINK_ERRORS counter: the per-GPU total's label tuple
        self.errors = tuple(Batch.check(c.GPU_NVLINK_ERRORS, (*labels, error_type))
                            for error_type in NVLINK_ERRORS.values())
        # per link (nvlink_per_link only): the label tuple of its byte counters
        self.links = tuple(
            Batch.check(c.GPU_NVLINK_LINK_TX, Batch.check(c.GPU_NVLINK_LINK_RX, (*labels, str(link))))
            for link in links) if per_link else ()
        # per link, per NVLINK_ERRORS counter: (its key when unsupported, its label tuple with nvlink_per_link)
        self.link_errors = tuple(
            (link, tuple((counter, f"nvlink_{error_type}_{link}",
                          Batch.check(c.GPU_NVLINK_LINK_ERRORS, (*labels, str(link), error_type)) if per_link else ())
                         for counter, error_type in NVLINK_ERRORS.items()))
            for link in links)
        self.pids: dict[int, tuple[str, ...]] = {}

    def pid(self, pid: int) -> tuple[str, ...]:
        labels = self.pids.get(pid)
        if labels is None:
            if len(self.pids) >= 1024:  # PIDs come and go: keep the cache to the recent ones
                self.pids.clear()
            labels = self.pids[pid] = Batch.check(c.GPU_PROCESS_MEMORY, (*self.of, str(pid)))
        return labels


# the metrics whose rows carry the GPU's own label tuple (gpu, uuid)
_GPU_LABELLED = (c.GPU_IDLE_SECONDS, c.GPU_SAMPLED_SECONDS, c.GPU_PCIE_TX, c.GPU_PCIE_RX, c.GPU_MEMORY_TEMPERATURE,
                 c.GPU_ALLOCATED, c.GPU_NVLINK_TX, c.GPU_NVLINK_RX)


class NvmlSource(Source):
    name = "nvml"

    def __init__(
        self,
        backend: GpuBackend,
        table: NodeGpus | None = None,
        clock: Callable[[], float] = time.time,
        nvlink_per_link: bool = False,
        slow_interval: float = SLOW_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`slow_interval`: seconds between reads of what only a fault or a reset changes (`readings`); `monotonic`:
        the clock NVML's initialisation is retried on."""
        # every call goes through the counter (goodput_exporter_library_calls_total)
        self._nvml = CountedCalls(backend, NVML_FUNCTIONS)
        self.backend: GpuBackend = self._nvml  # type: ignore[assignment]
        self._slow_interval = slow_interval
        self._init_retry = Backoff(INIT_RETRY_FIRST, INIT_RETRY_MOST, clock=monotonic)
        self._init_error: SourceError | None = None
        self._per_link = nvlink_per_link  # also each active NVLink link's counters (nvml.nvlink_per_link)
        self.table = table or NodeGpus()  # what this source learns of the node's GPUs, for the others
        self._clock = clock
        self._gpus: list[_GpuState] | None = None
        self._driver = ""
        self._errors: list[str] = []
        self._rows: dict[Metric, list[tuple[tuple[str, ...], Any]]] = {}  # the batch being collected's
        self._lists: list[list[tuple[tuple[str, ...], Any]]] = []
        self._answers = 0  # successful per-GPU queries, to tell a silent GPU from one with gaps

    # --- discovery --------------------------------------------------------------------------------

    def library_calls(self) -> dict[str, int]:
        return self._nvml.by_function()

    def _init(self) -> None:
        """nvmlInit, or the reason it failed last time while its retry is not due: on a node without a driver NVML's
        initialisation is tried INIT_RETRY_FIRST seconds after it failed, then twice as long each time, not at every
        collection (loading the library is the most expensive thing this source does)."""
        retry = self._init_retry
        if not retry.due():
            assert self._init_error is not None
            raise SourceError(self._init_error.reason, str(self._init_error))
        try:
            self.backend.init()
        except GpuError as exc:
            delay = retry.failed()
            when = f"next try in {delay:g}s; the wait doubles after each failure, up to {retry.most:g}s"
            if exc.code in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED):
                self._init_error = SourceError("nvml_not_found", f"{NVML_MISSING} ({when})")
            else:
                self._init_error = SourceError(exc.reason, f"nvmlInit failed: {exc} ({when})")
            log.debug("nvml: nvmlInit failed (%s); next try in %gs", exc, delay)
            raise SourceError(self._init_error.reason, str(self._init_error)) from None
        if retry.failures:
            log.info("nvml: NVML initialised after %d failed tries", retry.failures)
        retry.succeeded()
        self._init_error = None

    def _discover(self) -> list[_GpuState]:
        self._init()
        self._driver = self.backend.driver_version()
        gpus = []
        for index in range(self.backend.device_count()):
            state = _GpuState(index=index, handle=None, labels=(str(index), UNKNOWN_UUID),
                              info=(str(index), UNKNOWN_UUID, "unknown", "unknown", self._driver))
            try:
                state.handle = self.backend.device_handle(index)
                self._identify(state)
                cpus = self._optional(state, "cpu_affinity", self.backend.device_cpu_affinity)
                state.cpus = cpus or frozenset()
                self._optional(state, "xid_events", self.backend.xid_events_register)
                link_count = self._fields(state, [(FI_NVLINK_LINK_COUNT, 0)])[0] or 0
                state.links = [link for link in range(link_count) if self._optional(
                    state, f"nvlink_{link}", self.backend.device_nvlink_active, link)]
            except (_Lost, GpuError) as exc:
                reason = "gpu_is_lost" if isinstance(exc, _Lost) else exc.reason
                log.error("nvml: GPU %d cannot be read at start-up (%s); it is reported as down", index, reason)
                state.lost = True
                state.losses = 1
            state.fields = list(_FIELDS)
            for link in state.links:
                state.fields += [(FI_NVLINK_DATA_TX_KIB, link), (FI_NVLINK_DATA_RX_KIB, link)]
            state.slow_fields = state.fields + _SLOW_FIELDS
            gpus.append(state)
        log.info("nvml: %d GPU(s) found through the %s backend, driver %s",
                 len(gpus), self.backend.name, self._driver)
        return gpus

    def _identify(self, gpu: _GpuState) -> None:
        """Learn the GPU's identity (raises when it cannot be read); placeholders until then."""
        if gpu.handle is None:
            gpu.handle = self.backend.device_handle(gpu.index)
        try:
            uuid = self.backend.device_uuid(gpu.handle)
            model = self.backend.device_name(gpu.handle)
            bus_id = self.backend.device_pci_bus_id(gpu.handle)
        except GpuError as exc:
            if exc.code == GPU_IS_LOST:
                raise _Lost from None
            raise
        gpu.labels = (str(gpu.index), uuid)
        gpu.info = (str(gpu.index), uuid, model, bus_id, self._driver)
        gpu.minor = self._optional(gpu, "minor_number", self.backend.device_minor_number)
        gpu.peak_flops = [(Batch.check(c.PEAK_FLOPS, (*gpu.labels, dtype)), flops)
                          for dtype, flops in peak_flops(model).items()]
        self.table.record(uuid, str(gpu.index))

    def _optional(self, gpu: _GpuState, key: str, call: Callable[..., Any], *args: Any) -> Any:
        """Call a per-GPU query. Unsupported: remembered, never asked again. Lost: raises _Lost.
        Any other error: counted, and the value is absent this round."""
        if key in gpu.unsupported:
            return None
        try:
            result = call(gpu.handle, *args)
        except GpuError as exc:
            self._failed(gpu, key, exc)
            return None
        self._answers += 1
        return result

    def _failed(self, gpu: _GpuState, key: str, exc: GpuError) -> None:
        """A per-GPU query raised: see `_optional`."""
        if exc.code in UNSUPPORTED:
            gpu.unsupported.add(key)
            log.debug("nvml: GPU %d does not support %s", gpu.index, key)
            return
        if exc.code == GPU_IS_LOST:
            raise _Lost from None
        self._errors.append(exc.reason)
        log.debug("nvml: GPU %d: %s failed: %s", gpu.index, key, exc)

    def _fields(self, gpu: _GpuState, fields: list[tuple[int, int]]) -> list[int | GpuError | None]:
        """The fields' values in one call: None where the GPU has no value (or the call failed: counted once)."""
        values = self._optional(gpu, "field_values", self.backend.device_field_values, fields)
        return values if values is not None else [None] * len(fields)

    def _field_value(self, gpu: _GpuState, key: str, value: int | GpuError | None) -> int | None:
        """A field's value; a field whose read failed is counted as a query that failed (`_failed`: a lost GPU
        raises _Lost)."""
        if type(value) is int or value is None:
            return value
        if isinstance(value, GpuError):
            self._failed(gpu, key, value)
            return None
        return int(value)  # type: ignore[arg-type]

    # --- collection -------------------------------------------------------------------------------

    def collect(self) -> Batch:
        batch = Batch()
        self._errors = batch.errors
        # every metric's rows, for `_collect_gpu` to append to (and take back from)
        self._rows = {metric: batch.rows(metric) for metric in c.METRICS}
        self._lists = list(self._rows.values())
        holders: dict[int, dict[str, GpuHolder]] = {}
        try:
            if self._gpus is None:
                self._gpus = self._discover()
            self._drain_xids()
            silent = 0
            for gpu in self._gpus:
                try:
                    if gpu.labels[1] == UNKNOWN_UUID:  # not identified yet (unreadable since start-up)
                        self._identify(gpu)
                    self._collect_gpu(gpu, batch, holders)
                except (_Lost, GpuError) as exc:
                    if isinstance(exc, GpuError):
                        silent += 1
                        if exc.code != UNANSWERED:
                            batch.errors.append(exc.reason)
                    elif not gpu.lost:
                        log.error("nvml: GPU %d (%s) is lost: it fell off the bus or needs a reset",
                                  gpu.index, gpu.labels[1])
                        batch.errors.append("nvml_gpu_is_lost")
                    if not gpu.lost:
                        gpu.losses += 1
                    gpu.lost = True
                    batch.add(c.GPU_INFO, gpu.info, 1)
                    self._rows[c.PEAK_FLOPS] += gpu.peak_flops
                    batch.add(c.GPU_UP, gpu.labels, 0)
                    batch.add(c.GPU_LOST, gpu.labels, gpu.losses)
                self._add_xids(gpu, batch)
            if self._gpus and silent == len(self._gpus):
                raise GpuError(UNKNOWN, f"no GPU answered any NVML query ({', '.join(sorted(set(batch.errors)))})")
        except GpuError as exc:
            self.table.replace({})  # nothing known about GPU processes now
            raise SourceError(exc.reason, f"NVML call failed: {exc}") from None
        gpus = tuple(GpuIdentity(g.labels[0], g.labels[1], g.info[3], g.mig_uuids, g.minor)
                     for g in self._gpus if g.labels[1] != UNKNOWN_UUID)
        self.table.replace({pid: tuple(hs.values()) for pid, hs in holders.items()}, gpus)
        batch.prune()
        return batch

    def _collect_gpu(self, gpu: _GpuState, batch: Batch, holders: dict[int, dict[str, GpuHolder]]) -> None:
        """Appends the GPU's rows to the batch's lists; takes them back out when it raises (lost, or it answered
        no query), so that the caller reports the GPU as down with nothing else."""
        lists = self._lists
        sizes = [len(rows) for rows in lists]
        try:
            self._collect_gpu_rows(gpu, batch, holders)
        except BaseException:
            for rows, size in zip(lists, sizes, strict=True):
                del rows[size:]
            raise
        if gpu.lost:
            log.warning("nvml: GPU %d (%s) answers again", gpu.index, gpu.labels[1])
            gpu.lost = False
        batch.add(c.GPU_INFO, gpu.info, 1)
        self._rows[c.PEAK_FLOPS] += gpu.peak_flops
        batch.add(c.GPU_UP, gpu.labels, 1)
        batch.add(c.GPU_LOST, gpu.labels, gpu.losses)

    def _collect_gpu_rows(self, gpu: _GpuState, batch: Batch, holders: dict[int, dict[str, GpuHolder]]) -> None:
        read = self._optional
        labels = gpu.labels
        cached = gpu.series_labels
        if cached is None or cached.of is not labels or cached.link_count != len(gpu.links):
            cached = gpu.series_labels = _SeriesLabels(labels, gpu.links, self._per_link)
            links = len(gpu.links)  # new series: their totals start over
            gpu.nvlink_tx, gpu.nvlink_rx = _LinkTotal(links), _LinkTotal(links)
            gpu.nvlink_errors = tuple(_LinkTotal(links) for _ in NVLINK_ERRORS)
            gpu.slow_at = None
        rows = self._rows  # the label tuples below are cached's (checked) or `labels` (checked by cached)
        errors_before, answers_before = len(self._errors), self._answers
        now = self._clock()
        slow = gpu.slow_at is None or not 0 <= now - gpu.slow_at < self._slow_interval
        self._integrate_samples(gpu)
        if gpu.sampled_seconds or "samples" not in gpu.unsupported:
            rows[c.GPU_IDLE_SECONDS].append((labels, gpu.idle_seconds))
            rows[c.GPU_SAMPLED_SECONDS].append((labels, gpu.sampled_seconds))
        self._read_calls(gpu, _CALLS, cached.readings, None)
        values = self._fields(gpu, gpu.slow_fields if slow else gpu.fields)
        value = self._field_value
        for metric, position in ((c.GPU_PCIE_TX, 0), (c.GPU_PCIE_RX, 1), (c.GPU_MEMORY_TEMPERATURE, 2)):
            answer = value(gpu, f"field:{_FIELDS[position][0]}", values[position])
            if answer is not None:
                rows[metric].append((labels, answer))
        self._read_fields(gpu, _FIELD_READINGS, cached.readings, values, 3, None)
        if cached.link_count:  # per link: transmit then receive (KiB), summed per GPU
            end = _LINK_FIELDS + 2 * cached.link_count
            link_values = [value(gpu, "field:nvlink_data", answer) for answer in values[_LINK_FIELDS:end]]
            tx, rx = link_values[::2], link_values[1::2]
            total = gpu.nvlink_tx.total(tx)
            if total is not None:
                rows[c.GPU_NVLINK_TX].append((labels, total * 1024))
            total = gpu.nvlink_rx.total(rx)
            if total is not None:
                rows[c.GPU_NVLINK_RX].append((labels, total * 1024))
            if self._per_link:
                rows[c.GPU_NVLINK_LINK_TX] += [(link, kib * 1024)
                                               for link, kib in zip(cached.links, tx, strict=True) if kib is not None]
                rows[c.GPU_NVLINK_LINK_RX] += [(link, kib * 1024)
                                               for link, kib in zip(cached.links, rx, strict=True) if kib is not None]
        if slow:
            self._collect_slow(gpu, cached, values, now)
        else:  # counters and fixed properties: their last answers stay true until the next read
            for metric, metric_labels, answer in gpu.slow_rows:
                rows[metric].append((metric_labels, answer))
        processes = read(gpu, "processes", self.backend.device_compute_processes)
        if processes is not None:
            rows[c.GPU_ALLOCATED].append((labels, 1 if processes else 0))
            memory_by_pid: dict[int, int | None] = {}
            for proc in processes:  # NVML may list a PID once per MIG instance or context
                known = memory_by_pid.get(proc.pid)
                used = proc.used_memory_bytes
                memory_by_pid[proc.pid] = used if known is None else known + (used or 0)
                holders.setdefault(proc.pid, {})[labels[0]] = GpuHolder(labels[0], labels[1], gpu.cpus)
            for pid, used in memory_by_pid.items():
                if used is not None:
                    rows[c.GPU_PROCESS_MEMORY].append((cached.pid(pid), used))
        if read(gpu, "mig", self.backend.device_mig_enabled):
            self._collect_mig(gpu, batch)
        else:
            gpu.mig_uuids = ()
        if self._answers == answers_before and len(self._errors) > errors_before:
            raise GpuError(UNANSWERED, "the GPU answered no query")

    def _collect_slow(self, gpu: _GpuState, cached: _SeriesLabels, values: list[int | GpuError | None],
                      now: float) -> None:
        """What is read every slow_interval: the slow readings (their calls, and their fields at the end of this
        collection's `values`) and the NVLink error counters. Their rows are kept, to be published again until the
        next read (a read that failed leaves its series out until then)."""
        kept: list[tuple[Metric, tuple[str, ...], Any]] = []
        self._read_calls(gpu, _SLOW_CALLS, cached.readings, kept)
        self._read_fields(gpu, _SLOW_FIELD_READINGS, cached.readings, values, len(gpu.fields), kept)
        if cached.link_count:
            self._collect_link_errors(gpu, cached, kept)
        gpu.slow_rows = kept
        gpu.slow_at = now  # a read that failed waits too: a counter that always fails must not be asked every time

    def _read_calls(self, gpu: _GpuState, readings: list[tuple[int, Reading]],
                    labels: tuple[tuple[tuple[str, ...], ...], ...],
                    kept: list[tuple[Metric, tuple[str, ...], Any]] | None) -> None:
        """The readings answered by a call of their own, into the batch (and `kept`, when given): `_optional`
        inlined (it is most of a collection's calls)."""
        rows, unsupported, handle, backend, answers = self._rows, gpu.unsupported, gpu.handle, self.backend, 0
        for index, reading in readings:
            if reading.key in unsupported:
                continue
            try:
                raw = getattr(backend, reading.call)(handle, *reading.args)
            except GpuError as exc:
                self._failed(gpu, reading.key, exc)
                continue
            answers += 1
            reading_labels = labels[index]
            if reading.pair:
                for metric, metric_labels, answer in zip(reading.metrics, reading_labels, raw, strict=True):
                    row = (metric_labels, answer if reading.exact else reading.convert(answer))
                    rows[metric].append(row)
                    if kept is not None:
                        kept.append((metric, *row))
            else:
                row = (reading_labels[0], raw if reading.exact else reading.convert(raw))
                rows[reading.metrics[0]].append(row)
                if kept is not None:
                    kept.append((reading.metrics[0], *row))
        self._answers += answers

    def _read_fields(self, gpu: _GpuState, readings: list[tuple[int, Reading]],
                     labels: tuple[tuple[tuple[str, ...], ...], ...], values: list[int | GpuError | None],
                     position: int, kept: list[tuple[Metric, tuple[str, ...], Any]] | None) -> None:
        """The readings answered by fields, from `values` starting at `position` (one field per metric, in order),
        into the batch (and `kept`). A field without a value leaves its series out."""
        rows = self._rows
        for index, reading in readings:
            for metric, metric_labels in zip(reading.metrics, labels[index], strict=True):
                answer = self._field_value(gpu, reading.key, values[position])
                position += 1
                if answer is None:
                    continue
                row = (metric_labels, answer if reading.exact else reading.convert(answer))
                rows[metric].append(row)
                if kept is not None:
                    kept.append((metric, *row))

    def _collect_link_errors(self, gpu: _GpuState, cached: _SeriesLabels,
                             kept: list[tuple[Metric, tuple[str, ...], Any]]) -> None:
        """Each active link's data-link error counters (one NVML call each), summed per GPU and counter
        (`_LinkTotal`: a failed read counts with the link's last answer); each link's own with nvlink_per_link. An
        unsupported counter is remembered per link and counter; unsupported on every link, its series stay
        absent. Into the batch and `kept`."""
        rows, link_rows = self._rows[c.GPU_NVLINK_ERRORS], self._rows[c.GPU_NVLINK_LINK_ERRORS]
        per_link = self._per_link
        counts: list[list[int | None]] = [[None] * cached.link_count for _ in NVLINK_ERRORS]  # per counter, link
        unsupported, handle, call, answers = gpu.unsupported, gpu.handle, self.backend.device_nvlink_error_count, 0
        for slot, (link, counters) in enumerate(cached.link_errors):
            for per_counter, (counter, key, counter_labels) in zip(counts, counters, strict=True):
                if key in unsupported:
                    continue
                try:
                    count = call(handle, link, counter)
                except GpuError as exc:
                    self._failed(gpu, key, exc)
                    continue
                answers += 1
                per_counter[slot] = count
                if per_link:
                    link_rows.append((counter_labels, count))
                    kept.append((c.GPU_NVLINK_LINK_ERRORS, counter_labels, count))
        self._answers += answers
        for total_labels, total, per_counter in zip(cached.errors, gpu.nvlink_errors, counts, strict=True):
            value = total.total(per_counter)
            if value is not None:  # None: no link of the GPU ever answered for the counter
                rows.append((total_labels, value))
                kept.append((c.GPU_NVLINK_ERRORS, total_labels, value))

    def _integrate_samples(self, gpu: _GpuState) -> None:
        """Add every NVML utilization sample newer than the last one seen to the idle counter.

        Each sample is the busy percentage over the period since the previous sample. Samples within
        one answer are contiguous; only the gap back to the previous answer can hide samples NVML's
        buffer dropped (we were stuck longer than it holds). That gap is credited with one sampling
        period, so the counters never invent time nobody measured.
        """
        samples = self._optional(gpu, "samples", self.backend.device_utilization_samples, gpu.last_sample_us)
        if not samples:
            return
        last = gpu.last_sample_us
        fresh = sorted(sample for sample in samples if sample[0] > last)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(fresh)]
        if gaps:
            gpu.sample_period_us = min(gaps)
        period = gpu.sample_period_us
        idle = sampled = 0.0
        for ts, percent in fresh:
            if last:
                gap = ts - last
                if ts == fresh[0][0] and period and gap > 2 * period:
                    gap = period
                covered = gap / 1e6
                sampled += covered
                idle += covered * (1.0 - min(max(percent, 0.0), 100.0) / 100.0)
            last = ts
        gpu.last_sample_us = last
        gpu.idle_seconds += idle
        gpu.sampled_seconds += sampled

    def _collect_mig(self, gpu: _GpuState, batch: Batch) -> None:
        handles = self._optional(gpu, "mig_handles", self.backend.device_mig_handles) or []
        mig_uuids = []
        for mig in handles:
            try:
                mig_uuid = self.backend.device_uuid(mig)
                gi, ci = self.backend.mig_instance_ids(mig)
                name = self.backend.device_name(mig)
                used, total = self.backend.device_memory(mig)
            except GpuError as exc:  # one instance unreadable: count it, report the others
                self._errors.append(exc.reason)
                continue
            mig_uuids.append(mig_uuid)
            profile = name.rsplit(" MIG ", 1)[-1] if " MIG " in name else ""
            batch.add(c.MIG_INFO, (*gpu.labels, mig_uuid, str(gi), str(ci), profile), 1)
            batch.add(c.MIG_MEMORY_USED, (*gpu.labels, mig_uuid), used)
            batch.add(c.MIG_MEMORY_TOTAL, (*gpu.labels, mig_uuid), total)
        gpu.mig_uuids = tuple(mig_uuids)

    def _drain_xids(self) -> None:
        assert self._gpus is not None
        try:
            events = self.backend.xid_events_poll()
        except GpuError as exc:  # e.g. a lost GPU: the per-GPU series still say what is known
            self._errors.append(exc.reason)
            log.warning("nvml: reading XID events failed: %s", exc)
            return
        now = self._clock()
        for event in events:
            if not 0 <= event.gpu_index < len(self._gpus):
                continue
            gpu = self._gpus[event.gpu_index]
            gpu.xids[event.xid] = gpu.xids.get(event.xid, 0) + 1
            gpu.last_xid = now
            log.warning("nvml: XID %d on GPU %d (%s)", event.xid, gpu.index, gpu.labels[1])

    @staticmethod
    def _add_xids(gpu: _GpuState, batch: Batch) -> None:
        if gpu.last_xid is None:
            return
        for xid, count in sorted(gpu.xids.items()):
            batch.add(c.GPU_XID_ERRORS, (*gpu.labels, str(xid)), count)
        batch.add(c.GPU_LAST_XID, gpu.labels, gpu.last_xid)

    def close(self) -> None:
        if self._gpus is not None:
            with contextlib.suppress(GpuError):
                self.backend.shutdown()
