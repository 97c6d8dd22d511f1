"""A simulated multi-rank training job, for the demo and the end-to-end tests.

Each rank is a thread that runs synchronous training steps: wait for data, compute, then meet the
other ranks in an all-reduce (a barrier), the way DDP does. It reports through the real training
client (`goodput_client.Telemetry`) and writes its flight-recorder dump in PyTorch's schema (NCCL
style, with process-group membership) into the flight folder. Faults are switched on and off while
it runs: a straggler rank, a data stall on every rank, and a rank that skips a collective.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from goodput_client import Telemetry
from goodput_client.contract import FLIGHT_DUMP_PREFIX

TOKENS_PER_STEP = 4096
GRADIENT_FLOATS = 1 << 20


@dataclass
class Faults:
    straggler: int | None = None  # this rank computes `slowdown` times longer
    slowdown: float = 3.0
    data_stall: bool = False  # every rank waits 10x longer for data
    skipping: int | None = None  # this rank does not enqueue the next collective
    slow_network: bool = False  # every collective takes a step's worth longer (a congested fabric)


@dataclass
class _Collective:
    seq: int
    created_ns: int
    completed: bool = False
    duration_ms: float | None = None  # as NCCL times a completed op with TORCH_NCCL_ENABLE_TIMING=1


@dataclass
class _RankState:
    collectives: list[_Collective] = field(default_factory=list)
    enqueued: int = 0
    completed: int = 0


class SimulatedJob:
    def __init__(self, workload: str, ranks: int, socket_path: str, flight_dir: str | Path,
                 step_seconds: float = 0.1, dump_interval: float = 1.0) -> None:
        self.workload = workload
        self.ranks = ranks
        self.socket_path = socket_path
        self.flight_dir = Path(flight_dir) / workload
        self.step_seconds = step_seconds
        self.dump_interval = dump_interval
        self.faults = Faults()
        self._barrier = threading.Barrier(ranks)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._states = [_RankState() for _ in range(ranks)]
        self._threads: list[threading.Thread] = []
        self.steps = [0] * ranks

    # --- faults ----------------------------------------------------------------------------------

    def set_straggler(self, rank: int | None, slowdown: float = 3.0) -> None:
        self.faults.straggler, self.faults.slowdown = rank, slowdown

    def set_data_stall(self, on: bool) -> None:
        self.faults.data_stall = on

    def set_skipping(self, rank: int | None) -> None:
        self.faults.skipping = rank

    def set_slow_network(self, on: bool) -> None:
        self.faults.slow_network = on

    # --- running -----------------------------------------------------------------------------------

    def start(self) -> SimulatedJob:
        self.flight_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.ranks):
            for target, name in ((self._train, "train"), (self._dump_loop, "dump")):
                thread = threading.Thread(target=target, args=(rank,), name=f"simjob-{name}-{rank}", daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._barrier.abort()
        for thread in self._threads:
            thread.join(5)

    def _sleep(self, seconds: float) -> bool:
        return not self._stop.wait(seconds)

    def _train(self, rank: int) -> None:
        telemetry = Telemetry(self.workload, rank, socket_path=self.socket_path, flush_interval=0.2)
        state = self._states[rank]
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                wait = self.step_seconds * (1.0 if self.faults.data_stall else 0.1)
                if not self._sleep(wait):
                    break
                telemetry.record_phase("data_wait", wait)
                compute = self.step_seconds * 0.6 * (self.faults.slowdown if self.faults.straggler == rank else 1)
                if not self._sleep(compute):
                    break
                telemetry.record_phase("compute", compute)
                while self.faults.skipping == rank and not self._stop.is_set():
                    self._sleep(0.05)  # never enqueues the collective the others wait in
                with self._lock:
                    state.enqueued += 1
                    collective = _Collective(state.enqueued, time.time_ns())
                    state.collectives = [*state.collectives[-49:], collective]
                entered = time.perf_counter()
                try:
                    self._barrier.wait()
                except threading.BrokenBarrierError:
                    break
                if self.faults.slow_network and not self._sleep(self.step_seconds):
                    break
                with self._lock:
                    collective.completed = True
                    collective.duration_ms = (time.perf_counter() - entered) * 1000
                    state.completed = collective.seq
                telemetry.record_phase("comm_wait", time.perf_counter() - entered)
                telemetry.record_step(time.perf_counter() - started, tokens=TOKENS_PER_STEP, samples=8)
                self.steps[rank] += 1
        finally:
            telemetry.close(timeout=1.0)

    # --- flight-recorder dumps, as ProcessGroupNCCL writes them (dump version 2.10) -----------------

    def dump(self, rank: int) -> dict[str, object]:
        with self._lock:
            state = self._states[rank]
            entries = [{
                "record_id": c.seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"),
                "collective_seq_id": c.seq, "p2p_seq_id": 0, "op_id": c.seq, "profiling_name": "nccl:all_reduce",
                "time_created_ns": c.created_ns, "input_sizes": [[GRADIENT_FLOATS]], "input_dtypes": ["Float"],
                "output_sizes": [[GRADIENT_FLOATS]], "output_dtypes": ["Float"],
                "state": "completed" if c.completed else "started",
                "time_discovered_started_ns": c.created_ns, "time_discovered_completed_ns": None,
                "retired": c.completed, "timeout_ms": 600_000, "is_p2p": False, "duration_ms": c.duration_ms,
                "thread_id": str(rank), "thread_name": "pt_main_thread",
            } for c in state.collectives]
            enqueued, completed = state.enqueued, state.completed
        return {
            "version": "2.10", "comm_lib_version": "simulated",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(self.ranks)))}},
            "pg_status": {"0": {"last_enqueued_collective": enqueued, "last_started_collective": enqueued,
                                "last_completed_collective": completed}},
            "entries": entries,
        }

    def _dump_loop(self, rank: int) -> None:
        target = self.flight_dir / f"{FLIGHT_DUMP_PREFIX}{rank}"
        while self._sleep(self.dump_interval):
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(pickle.dumps(self.dump(rank), protocol=2))
            os.replace(partial, target)
