"""Simulated GPUs: a peer of the NVML backend for tests, the demo and benchmarks.

Each GPU runs a busy/idle pattern (exact segments, repeated) from which everything is derived in
closed form: NVML-style utilization samples, energy, temperature, NVLink/PCIe traffic. That keeps the
simulator cheap at 64 GPUs and gives tests the ground truth (exact idle seconds) to measure our
numbers against. Faults are injected through methods (tests) or a schedule (config).

The simulator runs inside the daemon, so its cost counts in the daemon's CPU and memory figures
(bench/cpu_split.py tells them apart): GPUs with the same pattern share one `Pattern` (a training
pattern is thousands of segments), consecutive utilization samples share their common end, and the
newest sample (a pure function of its end time, asked for by several queries a poll) is kept.

Only ever used when asked for (`--simulate N`).
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_GPU_RECOVERY_ACTION,
    FI_MEMORY_TEMP,
    FI_NVLINK_DATA_RX_KIB,
    FI_NVLINK_DATA_TX_KIB,
    FI_NVLINK_LINK_COUNT,
    FI_PCIE_REPLAY_COUNTER,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_PERF_POLICY,
    FI_REMAPPED_COR,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
    FI_TOTAL_ENERGY,
    GPU_IS_LOST,
    NOT_FOUND,
    NOT_SUPPORTED,
    NVLINK_ERRORS,
    GpuError,
    Process,
    XidEvent,
)
from .settings import FABRIC_FAULTS

log = logging.getLogger(__name__)

MODEL = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "550.54.15"
MEMORY_TOTAL = 81_559 * 2**20
MEMORY_BASELINE = 560 * 2**20  # driver context, as NVML shows on an idle GPU
NVLINKS = 18
IDLE_WATTS = 70.0
MAX_WATTS = 700.0
SAMPLE_PERIOD_US = 166_667  # NVML refreshes GPU utilization about six times a second on recent GPUs
SAMPLE_BUFFER = 120  # samples NVML keeps; a poller slower than 20 s loses some, as with the driver
SAMPLE_CACHE = 8  # samples the simulator keeps computed per GPU (the newest is asked for several times a poll)
THROTTLE_POLICY = {"power": 0, "thermal": 1}
MEMORY_CLOCK_MHZ = 2619  # HBM3 of an H100 SXM
MEMORY_RESERVED = 512 * 2**20  # set aside by the driver and firmware (part of the used memory NVML's v1 call reports)
PCIE_GENERATION = 5  # an H100 SXM in a PCIe 5 host: gen 5 x16
PCIE_WIDTH = 16
PCIE_IDLE_GENERATION = 1  # the link drops to gen 1 once the GPU has idled a second, as boards do to save power
PCIE_IDLE_SECONDS = 1.0
# A burst of NVLink errors (`nvlink_errors`): errors per second on the link, by NVLINK_ERRORS counter
NVLINK_ERROR_RATES = {"replay": 2.0, "recovery": 0.0, "crc_flit": 200.0, "crc_data": 20.0}
MIG_PROFILES = {"1g.10gb": 10, "2g.20gb": 20, "3g.40gb": 40, "4g.40gb": 40, "7g.80gb": 80}


# What the kernels do in each kind of segment, as DCGM's profiling fields would show it (0-1 ratios of
# cycles; bytes per second for PCIe and NVLink). "compute": matmul-heavy forward/backward on tensor
# cores; "memory": a memory-bound phase (optimizer update, elementwise kernels): DRAM busy, tensor
# pipes nearly idle; "idle": nothing runs (data stall, checkpoint, gaps between steps).
ACTIVITY: dict[str, dict[str, float]] = {
    "compute": {"gr_engine_active": 1.0, "sm_active": 0.95, "sm_occupancy": 0.45, "tensor_active": 0.70,
                "dram_active": 0.35, "fp16_active": 0.05, "fp32_active": 0.15, "fp64_active": 0.0,
                "tensor_hmma_active": 0.70, "tensor_imma_active": 0.0, "tensor_dfma_active": 0.0,
                "int_active": 0.10},
    "memory": {"gr_engine_active": 1.0, "sm_active": 0.85, "sm_occupancy": 0.60, "tensor_active": 0.02,
               "dram_active": 0.90, "fp16_active": 0.02, "fp32_active": 0.20, "fp64_active": 0.0,
               "tensor_hmma_active": 0.02, "tensor_imma_active": 0.0, "tensor_dfma_active": 0.0,
               "int_active": 0.05},
    "idle": dict.fromkeys(("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
                           "fp16_active", "fp32_active", "fp64_active", "tensor_hmma_active",
                           "tensor_imma_active", "tensor_dfma_active", "int_active"), 0.0),
}
ACTIVITY_FIELDS = tuple(ACTIVITY["idle"])
# Traffic: a baseline plus a share proportional to busy time, the same as the NVML byte counters.
PCIE_IDLE_BYTES_PER_SECOND = 2e6
PCIE_TX_BUSY_BYTES_PER_SECOND = 1.5e9
PCIE_RX_BUSY_BYTES_PER_SECOND = 3e9
NVLINK_BUSY_BYTES_PER_SECOND_PER_LINK = 10 * 2**30
MEMORY_PHASE_SHARE = 0.2  # of each training step's compute: the optimizer update, memory-bound
FIELD_PLANS = 8  # field lists whose plans a GPU keeps (the nvml source asks for two: every collection's, the slow one)


def _energy(gpu: _Gpu, busy: float, elapsed: float) -> int:
    joules = IDLE_WATTS * elapsed + (MAX_WATTS - IDLE_WATTS) * busy
    return 3_600_000_000 + int(joules * 1000)  # mJ; the driver has been up for a while


# The fields a GPU answers from its state: (GPU, busy seconds since start, seconds since start) -> the value. NVLink
# data counters and the memory temperature are SimulatedGpus._field_plan's.
_POLICY_OF_FIELD = {field_id: policy for policy, field_id in FI_PERF_POLICY.items()}  # violation counter -> policy
_FIELDS: dict[int, Callable[[_Gpu, float, float], int]] = {
    FI_NVLINK_LINK_COUNT: lambda gpu, busy, elapsed: NVLINKS,
    FI_PCIE_TX_BYTES: lambda gpu, busy, elapsed: int(busy * PCIE_TX_BUSY_BYTES_PER_SECOND
                                                     + elapsed * PCIE_IDLE_BYTES_PER_SECOND),
    FI_PCIE_RX_BYTES: lambda gpu, busy, elapsed: int(busy * PCIE_RX_BUSY_BYTES_PER_SECOND
                                                     + elapsed * PCIE_IDLE_BYTES_PER_SECOND),
    FI_TOTAL_ENERGY: _energy,
    FI_ECC_SBE_VOL_TOTAL: lambda gpu, busy, elapsed: gpu.ecc[0],
    FI_ECC_DBE_VOL_TOTAL: lambda gpu, busy, elapsed: gpu.ecc[1],
    FI_RETIRED_SBE: lambda gpu, busy, elapsed: gpu.retired_pages[0],
    FI_RETIRED_DBE: lambda gpu, busy, elapsed: gpu.retired_pages[1],
    FI_RETIRED_PENDING: lambda gpu, busy, elapsed: gpu.retired_pages_pending,
    FI_REMAPPED_COR: lambda gpu, busy, elapsed: gpu.remapped_rows[0],
    FI_REMAPPED_UNC: lambda gpu, busy, elapsed: gpu.remapped_rows[1],
    FI_REMAPPED_PENDING: lambda gpu, busy, elapsed: gpu.row_remap_pending,
    FI_REMAPPED_FAILURE: lambda gpu, busy, elapsed: gpu.row_remap_failure,
    FI_PCIE_REPLAY_COUNTER: lambda gpu, busy, elapsed: gpu.pcie_replays,
    FI_GPU_RECOVERY_ACTION: lambda gpu, busy, elapsed: gpu.recovery_action,
}


class Pattern:
    """A repeating sequence of segments (duration seconds, busy 0/1[, kind]) with exact integrals.

    `kind` names the segment's activity profile (ACTIVITY); busy segments default to "compute", idle
    ones are always "idle".
    """

    def __init__(self, segments: list[tuple[float, int]] | list[tuple[float, int, str]]) -> None:
        if not segments or any(d <= 0 for d, *_ in segments):
            raise ValueError("a pattern needs segments of positive duration")
        self.ends: list[float] = []
        self.kinds: list[str] = []
        self._at_end: dict[str, list[float]] = {kind: [] for kind in ACTIVITY}
        totals = dict.fromkeys(ACTIVITY, 0.0)
        t = 0.0
        for duration, busy, *rest in segments:
            kind = (rest[0] if rest else "compute") if busy else "idle"
            if kind not in ACTIVITY:
                raise ValueError(f"unknown segment kind {kind!r}")
            t += duration
            totals[kind] += duration
            self.ends.append(t)
            self.kinds.append(kind)
            for name, running in self._at_end.items():
                running.append(totals[name])
        self.period = t
        self._per_period = totals
        self.flags = [0 if kind == "idle" else 1 for kind in self.kinds]
        self.busy_per_period = t - totals["idle"]
        self._idle_at_end = self._at_end["idle"]
        self._idle_per_period = totals["idle"]

    @classmethod
    def square(cls, busy: float, idle: float, kind: str = "compute") -> Pattern:
        return cls([(busy, 1, kind), (idle, 0)])

    @classmethod
    def training(cls, rng: random.Random, length: float = 600.0) -> Pattern:
        """Steps of compute (the last MEMORY_PHASE_SHARE of each memory-bound) with short gaps,
        periodic data stalls, a checkpoint pause."""
        segments: list[tuple[float, int, str]] = []
        t = 0.0
        step = 0
        checkpoint_at = length * 0.5
        checkpointed = False
        while t < length:
            compute = rng.uniform(0.25, 0.35)
            gap = rng.uniform(0.01, 0.03)
            segments += [(compute * (1 - MEMORY_PHASE_SHARE), 1, "compute"),
                         (compute * MEMORY_PHASE_SHARE, 1, "memory"), (gap, 0, "idle")]
            t += compute + gap
            step += 1
            if step % 25 == 0:
                stall = rng.uniform(0.3, 1.2)  # data loader could not keep up
                segments.append((stall, 0, "idle"))
                t += stall
            if not checkpointed and t >= checkpoint_at:
                segments.append((8.0, 0, "idle"))  # checkpoint save: GPU waits on storage
                t += 8.0
                checkpointed = True
        return cls(segments)

    def seconds_until(self, t: float, kind: str) -> float:
        """Seconds spent in segments of `kind` in [0, t]."""
        if t <= 0:
            return 0.0
        cycles, rest = divmod(t, self.period)
        i = bisect.bisect_right(self.ends, rest)
        at_end = self._at_end[kind]
        seconds = cycles * self._per_period[kind]
        if i > 0:
            seconds += at_end[i - 1]
        if i < len(self.ends) and self.kinds[i] == kind:
            seconds += rest - (self.ends[i - 1] if i > 0 else 0.0)
        return seconds

    def busy_until(self, t: float) -> float:
        """Busy seconds in [0, t]: `t - seconds_until(t, "idle")`, inlined (the simulator's hottest call),
        with the same operations in the same order, so the same floats."""
        if t <= 0:
            return 0.0
        cycles, rest = divmod(t, self.period)
        ends = self.ends
        i = bisect.bisect_right(ends, rest)
        idle = cycles * self._idle_per_period
        if i > 0:
            idle += self._idle_at_end[i - 1]
        if i < len(ends) and not self.flags[i]:
            idle += rest - (ends[i - 1] if i > 0 else 0.0)
        return t - idle

    def busy_between(self, t0: float, t1: float) -> float:
        return self.busy_until(t1) - self.busy_until(t0)

    def seconds_between(self, t0: float, t1: float, kind: str) -> float:
        return self.seconds_until(t1, kind) - self.seconds_until(t0, kind)


@dataclass
class _Mig:
    parent: _Gpu
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    total: int
    used: int = MEMORY_BASELINE // 4


@dataclass
class _Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    minor: int  # /dev/nvidia<minor>
    pattern: Pattern
    offset: float  # pattern time = sim time - start + offset
    cpus: frozenset[int]
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    processes: dict[int, int] = field(default_factory=dict)
    ecc: list[int] = field(default_factory=lambda: [0, 0])
    remapped_rows: list[int] = field(default_factory=lambda: [0, 0])  # corrected, uncorrected
    row_remap_pending: int = 0
    row_remap_failure: int = 0
    recovery_action: int = 0  # NVML's GPU recovery action: 0 none, 1 GPU reset, 2 node reboot, ...
    # H100s remap rows and retire no pages (NVML says not supported there); the simulator has both, at 0 until a
    # fault, so that every series shows (set_unsupported takes them away)
    retired_pages: list[int] = field(default_factory=lambda: [0, 0])  # single bit, double bit
    retired_pages_pending: int = 0
    pcie_replays: int = 0
    pcie_degraded: tuple[int, int] | None = None  # the (generation, width) the link trained at, below the maximum
    nvlink_bursts: list[tuple[int, float, float]] = field(default_factory=list)  # link, start, end
    throttles: list[tuple[int, float, float]] = field(default_factory=list)  # policy, start, end
    registered: bool = False
    mig: list[_Mig] = field(default_factory=list)
    # the last utilization samples computed, by end time (µs) -> whole percent: pure functions of the pattern
    samples: dict[int, float] = field(default_factory=dict)
    busy_at_start: float | None = None  # pattern's busy seconds at the simulator's start
    # fields asked -> what answers each: a field's function of (GPU, busy seconds, elapsed seconds), None for no
    # answer, or a link's number for its NVLink data counter
    field_plans: dict[tuple[tuple[int, int], ...], list[Callable[[_Gpu, float, float], int] | int | None]] = field(
        default_factory=dict)


@dataclass
class _Fault:
    method: str
    gpu: int | None
    code: int | None  # raise this NVML code
    hang_seconds: float | None
    remaining: int  # calls left to affect; -1 = until cleared


class SimulatedGpus:
    """Same surface as `NvmlLibrary`; see `api.GpuBackend`."""

    name = "simulated"

    def __init__(
        self,
        count: int,
        seed: int = 1,
        pattern: str = "training",
        busy: float = 0.1,
        idle: float = 0.1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._events: list[XidEvent] = []
        self._release = threading.Event()
        self.initialized = False
        cpus = sorted(os.sched_getaffinity(0))
        half = max(1, len(cpus) // 2)
        numa = [frozenset(cpus[:half]), frozenset(cpus[half:] or cpus[:half])]
        self._gpus: list[_Gpu] = []
        # Patterns never change once built: one for every GPU (a training one is thousands of segments).
        shared = Pattern.square(busy, idle) if pattern == "square" else Pattern.training(random.Random(seed))
        for i in range(count):
            rng = random.Random(seed * 1_000_003 + i)
            pat = shared  # "training": one job, GPUs in lock-step...
            offset = 0.0 if pattern == "square" else rng.uniform(0.0, 0.02)  # ...with a little skew per rank
            self._gpus.append(_Gpu(
                index=i,
                uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                pci_bus_id=f"00000000:{0x18 + 0x10 * i % 0xE0:02X}:00.0",
                minor=i,
                pattern=pat,
                offset=offset,
                cpus=numa[0] if i < max(1, count // 2) else numa[1],
            ))

    # --- ground truth and fault injection (not part of the NVML surface) --------------------------

    def set_minor_numbers(self, minors: list[int]) -> None:
        """Give the GPUs these device minor numbers (/dev/nvidiaN), in index order: on real nodes the
        driver's probe order can differ from NVML's PCI-ordered index."""
        if sorted(minors) != sorted(set(minors)) or len(minors) != len(self._gpus):
            raise ValueError(f"need {len(self._gpus)} distinct minor numbers, got {minors}")
        for gpu, minor in zip(self._gpus, minors, strict=True):
            gpu.minor = minor

    def _pattern_time(self, gpu: _Gpu, t: float) -> float:
        return t - self._start + gpu.offset

    @property
    def count(self) -> int:
        return len(self._gpus)

    def pci_bus_ids(self) -> list[str]:
        """The GPUs' PCI addresses as NVML gives them, in index order (the simulated fabric's PCI tree holds
        them)."""
        return [gpu.pci_bus_id for gpu in self._gpus]

    def truth_idle_seconds(self, index: int, t0: float, t1: float) -> float:
        """Exact idle seconds of GPU `index` between two sim-clock times."""
        gpu = self._gpus[index]
        busy = gpu.pattern.busy_between(self._pattern_time(gpu, t0), self._pattern_time(gpu, t1))
        return (t1 - t0) - busy

    def truth_busy_fraction(self, index: int, t0: float, t1: float) -> float:
        return 1.0 - self.truth_idle_seconds(index, t0, t1) / (t1 - t0)

    def now(self) -> float:
        """The simulator's clock (a manual one in tests)."""
        return self._clock()

    def truth_activity(self, index: int, t0: float, t1: float) -> dict[str, float]:
        """Exact DCGM-style profiling ratios of GPU `index` averaged over [t0, t1] (sim-clock times),
        plus pcie_tx/pcie_rx/nvlink_tx/nvlink_rx in bytes per second."""
        gpu = self._gpus[index]
        p0, p1 = self._pattern_time(gpu, t0), self._pattern_time(gpu, t1)
        span = t1 - t0
        shares = {kind: gpu.pattern.seconds_between(p0, p1, kind) / span for kind in ACTIVITY}
        out = {name: sum(shares[kind] * ACTIVITY[kind][name] for kind in ACTIVITY) for name in ACTIVITY_FIELDS}
        busy = 1.0 - shares["idle"]
        out["pcie_tx"] = PCIE_IDLE_BYTES_PER_SECOND + PCIE_TX_BUSY_BYTES_PER_SECOND * busy
        out["pcie_rx"] = PCIE_IDLE_BYTES_PER_SECOND + PCIE_RX_BUSY_BYTES_PER_SECOND * busy
        out["nvlink_tx"] = out["nvlink_rx"] = NVLINK_BUSY_BYTES_PER_SECOND_PER_LINK * NVLINKS * busy
        return out

    def uuid(self, index: int) -> str:
        return self._gpus[index].uuid

    def mig_gpu_instances(self, index: int) -> list[int]:
        """The GPU instance ids of GPU `index`'s MIG instances (empty when MIG is off)."""
        return [mig.gpu_instance_id for mig in self._gpus[index].mig]

    def is_lost(self, index: int) -> bool:
        return self._gpus[index].lost

    def last_sample_time(self, now: float | None = None) -> float:
        """Sim-clock time of the newest utilization sample at `now`."""
        now_us = int((self._clock() if now is None else now) * 1e6)
        return now_us // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US / 1e6

    def set_pattern(self, index: int, pattern: Pattern, offset: float = 0.0) -> None:
        gpu = self._gpus[index]
        gpu.pattern = pattern
        gpu.offset = offset
        gpu.samples.clear()
        gpu.busy_at_start = None

    def lose(self, index: int) -> None:
        self._gpus[index].lost = True

    def set_unsupported(self, index: int, *what: str) -> None:
        """Make methods (e.g. "device_power_milliwatts") or fields ("field:197") unsupported."""
        self._gpus[index].unsupported.update(what)
        self._gpus[index].field_plans.clear()

    def inject_xid(self, index: int, xid: int, count: int = 1) -> None:
        with self._lock:
            if self._gpus[index].registered:
                self._events.extend(XidEvent(index, xid) for _ in range(count))

    def inject_ecc(self, index: int, count: int = 1, uncorrected: bool = False) -> None:
        self._gpus[index].ecc[1 if uncorrected else 0] += count

    def throttle(self, index: int, reason: str, seconds: float) -> None:
        now = self._clock()
        self._gpus[index].throttles.append((THROTTLE_POLICY[reason], now, now + seconds))

    def remap_row(self, index: int, uncorrected: bool = True) -> None:
        """A row remapped after an ECC error; after an uncorrectable one it waits for a GPU reset (pending)."""
        gpu = self._gpus[index]
        gpu.remapped_rows[1 if uncorrected else 0] += 1
        if uncorrected:
            gpu.row_remap_pending = 1

    def set_recovery_action(self, index: int, action: int) -> None:
        """The driver's recovery action for the GPU (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and
        reset): what it reports with an XID 154, and answers NVML_FI_DEV_GET_GPU_RECOVERY_ACTION with after."""
        self._gpus[index].recovery_action = action

    def fail_row_remap(self, index: int) -> None:
        """A row that could not be remapped: no spare row left."""
        self._gpus[index].row_remap_failure = 1

    def retire_page(self, index: int, double_bit: bool = True) -> None:
        """A page retired (pre-Ampere GPUs), pending until the GPU is reset."""
        gpu = self._gpus[index]
        gpu.retired_pages[1 if double_bit else 0] += 1
        gpu.retired_pages_pending = 1

    def reset(self, index: int) -> None:
        """A GPU reset: pending row remaps and page retirements take effect, the volatile ECC counts start again
        from 0 and the driver asks for nothing more."""
        gpu = self._gpus[index]
        gpu.row_remap_pending = gpu.retired_pages_pending = gpu.recovery_action = 0
        gpu.ecc = [0, 0]

    def degrade_pcie(self, index: int, generation: int = 3, width: int = 8) -> None:
        """The PCIe link trained below its maximum (a marginal riser, slot or cable)."""
        if not (1 <= generation <= PCIE_GENERATION and 1 <= width <= PCIE_WIDTH):
            raise ValueError(f"gen {generation} x{width} is beyond the link's gen {PCIE_GENERATION} x{PCIE_WIDTH}")
        self._gpus[index].pcie_degraded = (generation, width)

    def restore_pcie(self, index: int) -> None:
        self._gpus[index].pcie_degraded = None

    def inject_pcie_replays(self, index: int, count: int = 1) -> None:
        self._gpus[index].pcie_replays += count

    def nvlink_errors(self, index: int, link: int = 0, seconds: float = 30.0) -> None:
        """NVLink CRC and replay errors rising on `link` for `seconds` (NVLINK_ERROR_RATES)."""
        if not 0 <= link < NVLINKS:
            raise ValueError(f"no NVLink link {link} (links 0-{NVLINKS - 1})")
        now = self._clock()
        self._gpus[index].nvlink_bursts.append((link, now, now + seconds))

    def stop_nvlink_errors(self, index: int) -> None:
        """End the bursts of NVLink errors now (the counters keep what they counted)."""
        now = self._clock()
        gpu = self._gpus[index]
        gpu.nvlink_bursts = [(link, start, min(end, now)) for link, start, end in gpu.nvlink_bursts]

    def attach_process(self, index: int, pid: int, used_memory_bytes: int = 60 * 2**30) -> None:
        self._gpus[index].processes[pid] = used_memory_bytes

    def detach_process(self, index: int, pid: int) -> None:
        self._gpus[index].processes.pop(pid, None)

    def enable_mig(self, index: int, profiles: list[str]) -> None:
        gpu = self._gpus[index]
        rng = random.Random(hash((gpu.uuid, len(profiles))))
        gpu.mig = [
            _Mig(gpu, f"MIG-{uuid.UUID(int=rng.getrandbits(128), version=4)}", gi + 1, 0, profile,
                 MIG_PROFILES[profile] * 2**30)
            for gi, profile in enumerate(profiles)
        ]

    def fail(self, method: str, code: int, gpu: int | None = None, calls: int = -1) -> None:
        """Make `method` (or "*") raise NVML error `code` for `calls` calls (-1: until cleared)."""
        with self._lock:
            self._faults.append(_Fault(method, gpu, code, None, calls))

    def hang(self, method: str, seconds: float, gpu: int | None = None, calls: int = 1) -> None:
        """Make `method` block for `seconds` (real time) or until `release_hangs()`."""
        self._release.clear()
        with self._lock:
            self._faults.append(_Fault(method, gpu, None, seconds, calls))

    def release_hangs(self) -> None:
        self._release.set()

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
        self._release.set()

    # --- the NVML surface -------------------------------------------------------------------------

    def _check(self, method: str, gpu: _Gpu | None = None) -> None:
        if self._faults:
            self._apply_faults(method, gpu)
        if gpu is not None:
            if gpu.lost:
                raise GpuError(GPU_IS_LOST, "GPU is lost")
            if method in gpu.unsupported:
                raise GpuError(NOT_SUPPORTED, f"{method} not supported")

    def _apply_faults(self, method: str, gpu: _Gpu | None) -> None:
        hit: _Fault | None = None
        with self._lock:
            for fault in self._faults:
                if fault.method in (method, "*") and fault.gpu in (None, gpu.index if gpu else None):
                    hit = fault
                    if fault.remaining > 0:
                        fault.remaining -= 1
                        if fault.remaining == 0:
                            self._faults.remove(fault)
                    break
        if hit is None:
            return
        if hit.hang_seconds is not None:
            log.debug("simulated hang in %s for %.1fs", method, hit.hang_seconds)
            self._release.wait(hit.hang_seconds)
        if hit.code is not None:
            raise GpuError(hit.code, f"simulated failure in {method}")

    def init(self) -> None:
        self._check("init")
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def driver_version(self) -> str:
        self._check("driver_version")
        return DRIVER_VERSION

    def device_count(self) -> int:
        self._check("device_count")
        return len(self._gpus)

    def device_handle(self, index: int) -> _Gpu:
        self._check("device_handle")
        if not 0 <= index < len(self._gpus):
            raise GpuError(NOT_FOUND, f"no GPU {index}")
        return self._gpus[index]

    def device_name(self, handle: _Gpu | _Mig) -> str:
        if isinstance(handle, _Mig):
            return f"{MODEL} MIG {handle.profile}"
        self._check("device_name", handle)
        return MODEL

    def device_uuid(self, handle: _Gpu | _Mig) -> str:
        if isinstance(handle, _Mig):
            return handle.uuid
        self._check("device_uuid", handle)
        return handle.uuid

    def device_pci_bus_id(self, handle: _Gpu) -> str:
        self._check("device_pci_bus_id", handle)
        return handle.pci_bus_id

    def device_minor_number(self, handle: _Gpu) -> int:
        self._check("device_minor_number", handle)
        return handle.minor

    def _sample_value(self, gpu: _Gpu, end_us: int) -> float:
        value = gpu.samples.get(end_us)
        if value is None:
            t1 = end_us / 1e6
            t0 = (end_us - SAMPLE_PERIOD_US) / 1e6
            busy = gpu.pattern.busy_between(self._pattern_time(gpu, t0), self._pattern_time(gpu, t1))
            value = float(round(100.0 * busy / (t1 - t0)))  # NVML reports whole percent
            self._keep(gpu, end_us, value)
        return value

    def _keep(self, gpu: _Gpu, end_us: int, value: float) -> None:
        if len(gpu.samples) >= SAMPLE_CACHE:
            gpu.samples.clear()
        gpu.samples[end_us] = value

    def device_utilization_percent(self, handle: _Gpu) -> int:
        self._check("device_utilization_percent", handle)
        last = int(self.last_sample_time() * 1e6)
        return int(self._sample_value(handle, last))

    def device_utilization_samples(self, handle: _Gpu, since_us: int) -> list[tuple[int, float]]:
        self._check("device_utilization_samples", handle)
        now_us = int(self._clock() * 1e6)
        newest = now_us // SAMPLE_PERIOD_US
        first = max(since_us // SAMPLE_PERIOD_US + 1, newest - SAMPLE_BUFFER + 1,
                    int(self._start * 1e6) // SAMPLE_PERIOD_US + 1)
        out = []
        cached, busy_until, start, offset = handle.samples, handle.pattern.busy_until, self._start, handle.offset
        busy: float | None = None  # at the previous sample's end, which is this one's start
        for k in range(first, newest + 1):
            end_us = k * SAMPLE_PERIOD_US
            value = cached.get(end_us)
            if value is None:  # `_sample_value`'s, each end's busy seconds computed once: the same floats
                t1 = end_us / 1e6
                t0 = (end_us - SAMPLE_PERIOD_US) / 1e6
                if busy is None:
                    busy = busy_until(t0 - start + offset)
                after = busy_until(t1 - start + offset)
                value = float(round(100.0 * (after - busy) / (t1 - t0)))
                busy = after
            else:
                busy = None
            out.append((end_us, value))
        if out:
            self._keep(handle, *out[-1])  # the newest is asked for again (utilization, power, clocks)
        return out

    def device_memory(self, handle: _Gpu | _Mig) -> tuple[int, int]:
        if isinstance(handle, _Mig):
            return handle.used, handle.total
        self._check("device_memory", handle)
        used = MEMORY_BASELINE + sum(handle.processes.values())
        return min(used, MEMORY_TOTAL), MEMORY_TOTAL

    def _busy(self, gpu: _Gpu, seconds_back: float | None = None) -> float:
        now = self._clock()
        t0 = self._start if seconds_back is None else max(self._start, now - seconds_back)
        pattern = gpu.pattern
        if t0 == self._start:
            if gpu.busy_at_start is None:
                gpu.busy_at_start = pattern.busy_until(self._pattern_time(gpu, t0))
            before = gpu.busy_at_start
        else:
            before = pattern.busy_until(self._pattern_time(gpu, t0))
        return pattern.busy_until(self._pattern_time(gpu, now)) - before

    def _throttled(self, gpu: _Gpu, policy: int) -> bool:
        if not gpu.throttles:
            return False
        now = self._clock()
        return any(p == policy and start <= now < end for p, start, end in gpu.throttles)

    def device_power_milliwatts(self, handle: _Gpu) -> int:
        self._check("device_power_milliwatts", handle)
        util = self.device_utilization_percent(handle) / 100.0
        watts = IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * util
        if self._throttled(handle, THROTTLE_POLICY["power"]):
            watts = min(watts, 0.7 * MAX_WATTS)
        return int(watts * 1000)

    def device_power_limit_milliwatts(self, handle: _Gpu) -> int:
        self._check("device_power_limit_milliwatts", handle)
        return int(MAX_WATTS * 1000)

    def energy_millijoules(self, index: int) -> int:
        """GPU `index`'s energy counter now (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)."""
        gpu = self._gpus[index]
        return _energy(gpu, self._busy(gpu), self._clock() - self._start)

    def device_temperature_celsius(self, handle: _Gpu) -> int:
        self._check("device_temperature_celsius", handle)
        window = min(60.0, max(self._clock() - self._start, 1e-9))
        recent = self._busy(handle, 60.0) / window
        hot = 20 if self._throttled(handle, THROTTLE_POLICY["thermal"]) else 0
        return int(32 + 40 * recent + hot)

    def device_sm_clock_mhz(self, handle: _Gpu) -> int:
        self._check("device_sm_clock_mhz", handle)
        if self.device_utilization_percent(handle) == 0:
            return 345
        if handle.throttles and any(self._throttled(handle, p) for p in THROTTLE_POLICY.values()):
            return 1275
        return 1980

    def device_memory_clock_mhz(self, handle: _Gpu) -> int:
        self._check("device_memory_clock_mhz", handle)
        return MEMORY_CLOCK_MHZ  # HBM stays at its clock, busy or idle

    def device_memory_reserved_bytes(self, handle: _Gpu) -> int:
        self._check("device_memory_reserved_bytes", handle)
        return MEMORY_RESERVED

    def device_encoder_utilization_percent(self, handle: _Gpu) -> int:
        self._check("device_encoder_utilization_percent", handle)
        return 0  # a training job does not touch the video engines

    def device_decoder_utilization_percent(self, handle: _Gpu) -> int:
        self._check("device_decoder_utilization_percent", handle)
        return 0

    def device_pcie_link_generation(self, handle: _Gpu) -> int:
        self._check("device_pcie_link_generation", handle)
        if self._busy(handle, PCIE_IDLE_SECONDS) < 1e-9 and self._clock() - self._start >= PCIE_IDLE_SECONDS:
            return PCIE_IDLE_GENERATION
        return handle.pcie_degraded[0] if handle.pcie_degraded else PCIE_GENERATION

    def device_pcie_link_max_generation(self, handle: _Gpu) -> int:
        self._check("device_pcie_link_max_generation", handle)
        return PCIE_GENERATION

    def device_pcie_link_width(self, handle: _Gpu) -> int:
        self._check("device_pcie_link_width", handle)
        return handle.pcie_degraded[1] if handle.pcie_degraded else PCIE_WIDTH

    def device_pcie_link_max_width(self, handle: _Gpu) -> int:
        self._check("device_pcie_link_max_width", handle)
        return PCIE_WIDTH

    def _violation_nanoseconds(self, handle: _Gpu, policy: int) -> int:
        """A violation counter (NVML_FI_DEV_PERF_POLICY_*): nanoseconds the GPU was held back for `policy`."""
        if not handle.throttles:
            return 0
        now = self._clock()
        seconds = sum(max(0.0, min(now, end) - start)
                      for p, start, end in handle.throttles if p == policy and start <= now)
        return int(seconds * 1e9)

    def device_field_values(self, handle: _Gpu, fields: list[tuple[int, int]]) -> list[int | GpuError | None]:
        self._check("device_field_values", handle)
        key = tuple(fields)
        plan = handle.field_plans.get(key)
        if plan is None:
            if len(handle.field_plans) >= FIELD_PLANS:
                handle.field_plans.clear()
            plan = handle.field_plans[key] = self._field_plan(handle, fields)
        busy = self._busy(handle)
        elapsed = self._clock() - self._start
        nvlink_kib = busy * NVLINK_BUSY_BYTES_PER_SECOND_PER_LINK / 1024
        return [answer(handle, busy, elapsed) if callable(answer) else  # type: ignore[misc]
                None if answer is None else int(nvlink_kib + answer) for answer in plan]

    def _memory_temperature(self, handle: _Gpu) -> int:
        """HBM runs a little cooler than the core, and follows the same recent load."""
        window = min(60.0, max(self._clock() - self._start, 1e-9))
        recent = self._busy(handle, 60.0) / window
        hot = 15 if self._throttled(handle, THROTTLE_POLICY["thermal"]) else 0
        return int(30 + 30 * recent + hot)

    def _field_plan(self, handle: _Gpu, fields: list[tuple[int, int]]) -> list[Callable[[_Gpu, float, float], int]
                                                                               | int | None]:
        """What answers each field (see `_Gpu.field_plans`); a field made unsupported answers None."""
        plan: list[Callable[[_Gpu, float, float], int] | int | None] = []
        for field_id, scope in fields:
            if f"field:{field_id}" in handle.unsupported:
                plan.append(None)
            elif field_id in (FI_NVLINK_DATA_TX_KIB, FI_NVLINK_DATA_RX_KIB):
                plan.append(scope if scope < NVLINKS else None)  # KiB, per link
            elif field_id == FI_MEMORY_TEMP:
                plan.append(lambda gpu, busy, elapsed: self._memory_temperature(gpu))
            elif field_id in _POLICY_OF_FIELD:
                plan.append(lambda gpu, busy, elapsed, policy=_POLICY_OF_FIELD[field_id]:
                            self._violation_nanoseconds(gpu, policy))
            else:
                plan.append(_FIELDS.get(field_id))
        return plan

    def device_nvlink_active(self, handle: _Gpu, link: int) -> bool:
        self._check("device_nvlink_active", handle)
        return link < NVLINKS

    def device_nvlink_error_count(self, handle: _Gpu, link: int, counter: int) -> int:
        self._check("device_nvlink_error_count", handle)
        if not 0 <= link < NVLINKS:
            raise GpuError(NOT_SUPPORTED, f"no NVLink link {link}")
        if not handle.nvlink_bursts:
            return 0
        rate = NVLINK_ERROR_RATES[NVLINK_ERRORS[counter]]
        now = self._clock()
        return int(sum(rate * max(0.0, min(now, end) - start)
                       for burst_link, start, end in handle.nvlink_bursts if burst_link == link))

    def device_compute_processes(self, handle: _Gpu) -> list[Process]:
        self._check("device_compute_processes", handle)
        return [Process(pid, used) for pid, used in handle.processes.items()]

    def device_cpu_affinity(self, handle: _Gpu) -> frozenset[int]:
        self._check("device_cpu_affinity", handle)
        return handle.cpus

    def device_mig_enabled(self, handle: _Gpu) -> bool:
        self._check("device_mig_enabled", handle)
        return bool(handle.mig)

    def device_mig_handles(self, handle: _Gpu) -> list[_Mig]:
        self._check("device_mig_handles", handle)
        return list(handle.mig)

    def mig_instance_ids(self, handle: _Mig) -> tuple[int, int]:
        self._check("mig_instance_ids", handle.parent)
        return handle.gpu_instance_id, handle.compute_instance_id

    def xid_events_register(self, handle: _Gpu) -> None:
        self._check("xid_events_register", handle)
        handle.registered = True

    def xid_events_poll(self) -> list[XidEvent]:
        self._check("xid_events_poll")
        with self._lock:
            events, self._events = self._events, []
        return events


def schedule_faults(sim: SimulatedGpus, faults: list, stop: threading.Event, fabric: Any = None) -> threading.Thread:
    """Inject config-scheduled faults (`simulate.faults`) at their offsets from now; the fabric kinds into
    `fabric` (a sources.fabric.simulated.SimulatedFabric), when there is one."""

    def run() -> None:
        start = time.monotonic()
        for fault in sorted(faults, key=lambda f: f.at):
            if stop.wait(max(0.0, start + fault.at - time.monotonic())):
                return
            if fault.kind in FABRIC_FAULTS:
                if fabric is None:
                    log.error("simulate: no simulated fabric for fault %s", fault.kind)
                    continue
                if fault.nic >= len(fabric.nics):
                    log.error("simulate: fault names NIC %d, only %d simulated", fault.nic, len(fabric.nics))
                    continue
                log.warning("simulate: injecting %s on NIC %d", fault.kind, fault.nic)
                fabric.inject(fault.kind, fault.nic)
                continue
            if fault.gpu >= sim.count:
                log.error("simulate: fault names GPU %d, only %d simulated", fault.gpu, sim.count)
                continue
            log.warning("simulate: injecting %s on GPU %d", fault.kind, fault.gpu)
            match fault.kind:
                case "lost":
                    sim.lose(fault.gpu)
                case "xid":
                    sim.inject_xid(fault.gpu, fault.xid, fault.count)
                case "ecc":
                    sim.inject_ecc(fault.gpu, fault.count, fault.uncorrected)
                case "throttle":
                    sim.throttle(fault.gpu, fault.reason, fault.duration)
                case "hang":
                    sim.hang("*", fault.duration, gpu=fault.gpu)
                case "raise":
                    sim.fail("*", 999, gpu=fault.gpu, calls=fault.count)
                case "row_remap_pending":
                    sim.remap_row(fault.gpu, uncorrected=True)
                case "pcie_degraded":
                    sim.degrade_pcie(fault.gpu)
                case "nvlink_errors":
                    sim.nvlink_errors(fault.gpu, fault.link, fault.duration)

    thread = threading.Thread(target=run, name="simulate-faults", daemon=True)
    thread.start()
    return thread
