"""A simulated multi-rank training job, for the demo and the end-to-end tests.

Each rank is a thread that runs synchronous training steps: wait for data, compute, then meet the
other ranks in an all-reduce (a barrier), the way DDP does. It reports through the real training
client (`goodput_client.Telemetry`): numbered steps with their model FLOPs, a `compile` phase as each
of its processes starts, a `checkpoint_save` phase every CHECKPOINT_EVERY steps; and writes its
flight-recorder dump in PyTorch's schema (NCCL style, with process-group membership) into the flight
folder. Faults are switched on and off while it runs: a straggler rank, a data stall on every rank, a
rank that skips a collective, collectives slowed by the network; and, once per injection, a crash:
every rank's process dies (its Telemetry closed, as Python's atexit does on a crash), stays down
DOWN_SECONDS, and is started again as torchrun's restart would start it, resuming from the last
checkpoint, so that the steps since then are done again.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from goodput_client import Telemetry
from goodput_client.contract import FLIGHT_DUMP_PREFIX

from exporter.sources.nvml.peak_flops import peak_flops
from exporter.sources.nvml.simulated import MODEL

TOKENS_PER_STEP = 4096
GRADIENT_FLOATS = 1 << 20
# The simulated GPUs' bf16 dense tensor peak, from the daemon's datasheet table (an H100 SXM: 989.5 TFLOPS)
PEAK_BF16_FLOPS = peak_flops(MODEL)["bf16"]
# Model FLOPs per step: a healthy rank's MFU is about 40% of that peak. A healthy step takes about 0.7 x
# step_seconds (data_wait 0.1 and compute 0.6 of it; the all-reduce adds next to nothing), so each step declares
# 0.4 x 989.5e12 x 0.7 x step_seconds FLOPs (the checkpoints and the sleeps' overhead bring the MFU a little below 40%).
HEALTHY_MFU = 0.4
HEALTHY_STEP_SHARE = 0.7
CHECKPOINT_EVERY = 50  # steps between checkpoints: step 50, 100, ...; a checkpoint holds the state after its step
CRASH_AFTER = 40  # a crash lands this many steps after a checkpoint: each crash redoes CRASH_AFTER steps (about 3 s)
DOWN_SECONDS = 3.0  # a crashed rank's process stays down this long before its restart
TARGET_STEPS = 100_000  # the job's last step: far beyond what a demo runs, so it is always forecast
COMPILE_STEPS = 3.0  # each process compiles its model for this many step_seconds before its first step
CHECKPOINT_SAVE_STEPS = 2.0  # a checkpoint_save phase lasts this many step_seconds
CHECKPOINT_RESTORE_STEPS = 3.0  # so does a restarted process's checkpoint_restore


@dataclass
class Faults:
    straggler: int | None = None  # this rank computes `slowdown` times longer
    slowdown: float = 3.0
    data_stall: bool = False  # every rank waits 10x longer for data
    skipping: int | None = None  # this rank does not enqueue the next collective
    slow_network: bool = False  # every collective takes a step's worth longer (a congested fabric)
    crash_at: list[int | None] = field(default_factory=list)  # per rank: its process dies after this step, once


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
    """`socket_path` and `flight_dir`: one for every rank, or a list of each rank's (ranks on several nodes)."""

    def __init__(self, workload: str, ranks: int, socket_path: str | Sequence[str],
                 flight_dir: str | Path | Sequence[str | Path], step_seconds: float = 0.1,
                 dump_interval: float = 1.0) -> None:
        self.workload = workload
        self.ranks = ranks
        self.sockets = [socket_path] * ranks if isinstance(socket_path, str) else list(socket_path)
        dirs = [flight_dir] * ranks if isinstance(flight_dir, str | Path) else list(flight_dir)
        self.flight_dirs = [Path(d) / workload for d in dirs]
        self.step_seconds = step_seconds
        self.dump_interval = dump_interval
        self.faults = Faults()
        self._barrier = threading.Barrier(ranks)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._states = [_RankState() for _ in range(ranks)]
        self._threads: list[threading.Thread] = []
        self.faults.crash_at = [None] * ranks
        self.flops_per_step = HEALTHY_MFU * PEAK_BF16_FLOPS * HEALTHY_STEP_SHARE * step_seconds
        self.steps = [0] * ranks  # steps each rank completed, redone ones included
        self.highest = [0] * ranks  # the highest step number each rank completed
        self.checkpoint = [0] * ranks  # the step each rank's last checkpoint holds the state after (0: none yet)
        self.crashes = [0] * ranks  # its processes that died
        self.redone = [0] * ranks  # steps it completed again after restarts: what the daemon counts as wasted
        self.wasted_seconds = [0.0] * ranks  # the durations those steps had the first time
        self._first: list[dict[int, float]] = [{} for _ in range(ranks)]  # step -> first duration, since the checkpoint
        self._down = [False] * ranks  # its process is dead: no flight-recorder dumps

    # --- faults ----------------------------------------------------------------------------------

    def set_straggler(self, rank: int | None, slowdown: float = 3.0) -> None:
        self.faults.straggler, self.faults.slowdown = rank, slowdown

    def set_data_stall(self, on: bool) -> None:
        self.faults.data_stall = on

    def set_skipping(self, rank: int | None) -> None:
        self.faults.skipping = rank

    def set_slow_network(self, on: bool) -> None:
        self.faults.slow_network = on

    def crash(self) -> int:
        """Every rank's process dies after completing the same step: the first at least two steps ahead of every
        rank that lies CRASH_AFTER steps past a checkpoint. Each is down DOWN_SECONDS, then restarts from its
        last checkpoint and redoes CRASH_AFTER steps. Once per call (there is nothing to clear). Returns that
        step's number."""
        with self._lock:
            ahead = max(self.highest) + 2
            at = ahead + (CRASH_AFTER - ahead) % CHECKPOINT_EVERY
            self.faults.crash_at = [at] * self.ranks
        return at

    # --- running -----------------------------------------------------------------------------------

    def start(self) -> SimulatedJob:
        for folder in set(self.flight_dirs):
            folder.mkdir(parents=True, exist_ok=True)
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
        resumed: int | None = None  # the first process starts from scratch; a restarted one from a checkpoint
        while self._process(rank, resumed):  # the process crashed: down a while, then a new one
            self._down[rank] = True
            self.crashes[rank] += 1
            if not self._sleep(DOWN_SECONDS):
                break
            self._down[rank] = False
            resumed = self.checkpoint[rank]

    def _process(self, rank: int, resumed: int | None) -> bool:
        """One process of the rank, from its start to its crash (True) or the job's stop (False)."""
        telemetry = Telemetry(self.workload, rank, socket_path=self.sockets[rank], flush_interval=0.2,
                              resumed_from_step=resumed, flops_per_step=self.flops_per_step, dtype="bf16")
        telemetry.target(TARGET_STEPS)  # where the job ends, for the forecast of its finish
        state = self._states[rank]
        try:
            with telemetry.phase("compile"):
                if not self._sleep(self.step_seconds * COMPILE_STEPS):
                    return False
            number = 0
            if resumed is not None:
                with telemetry.phase("checkpoint_restore"):
                    if not self._sleep(self.step_seconds * CHECKPOINT_RESTORE_STEPS):
                        return False
                number = resumed
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
                number += 1
                duration = time.perf_counter() - started
                telemetry.record_step(duration, tokens=TOKENS_PER_STEP, samples=8, step=number)
                self.steps[rank] += 1
                if number <= self.highest[rank]:  # done before, by a process that crashed
                    self.redone[rank] += 1
                    self.wasted_seconds[rank] += self._first[rank].get(number, 0.0)
                else:
                    self._first[rank][number] = duration
                self.highest[rank] = max(self.highest[rank], number)
                if number % CHECKPOINT_EVERY == 0:
                    with telemetry.phase("checkpoint_save"):
                        if not self._sleep(self.step_seconds * CHECKPOINT_SAVE_STEPS):
                            break
                    self.checkpoint[rank] = number
                    self._first[rank] = {n: d for n, d in self._first[rank].items() if n > number}  # never redone
                if self.faults.crash_at[rank] == number:
                    self.faults.crash_at[rank] = None
                    return True
            return False
        finally:
            telemetry.close(timeout=1.0)  # a crashing Python process does it too: the client's atexit hook

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
        target = self.flight_dirs[rank] / f"{FLIGHT_DUMP_PREFIX}{rank}"
        while self._sleep(self.dump_interval):
            if self._down[rank]:  # a dead process writes no dumps
                continue
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(pickle.dumps(self.dump(rank), protocol=2))
            os.replace(partial, target)
