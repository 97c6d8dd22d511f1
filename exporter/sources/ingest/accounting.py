"""Where each second of a rank went: its elapsed time (phases plus the untracked rest), the downtime between its
process sessions, and the progress redone after a restart (wasted steps, their seconds, their compute).

A rank's events arrive in sessions, one per process (the client's "start" or "restart" event, which carries the
wall time of the process's elapsed 0). Within a session the client reports its elapsed time with its events;
across sessions the counters go on:

    elapsed     = every phase + untracked, where untracked grows to (earlier sessions' elapsed + this
                  session's elapsed - the phases), never down (so a step reported inside a phase block cannot
                  make it shrink), and elapsed is always the sum, exactly
    downtime    += the gap between the previous session's last event and a "restart" session's start
    wasted      on a restart from step R, the steps numbered R+1 .. the last step seen: their number, and the
                  duration and compute seconds each had the first time it was seen

A "start" session is a new run under the same name (a job launched again, not restarted): its steps count from
scratch and the gap is not downtime. Everything here is plain data, so that the daemon's state file can keep it
across a daemon restart (`to_dict`, `from_dict`).
"""

from __future__ import annotations

import base64
import bisect
import itertools
import logging
import math
import sys
from array import array
from typing import Any, NamedTuple

from goodput_client.contract import DEPRECATED_PHASES, PHASES

from .metrics import STEP_BUCKETS

log = logging.getLogger(__name__)

NEW_SESSION_SLACK = 1.0  # seconds: a reported elapsed this far below the session's means a new process
CLOCK_SLACK = 5.0  # seconds the events' wall times may run ahead of the daemon's clock
RUNS_KEPT = 16  # launches of a job remembered per rank (its lineage's series)


class History:
    """The first duration and compute seconds of each of the last `size` step numbers seen (contiguous from
    `first`; NaN for a number never seen), in two flat arrays: 16 bytes a step."""

    __slots__ = ("computes", "dirty", "durations", "first", "fresh", "size", "unsaved", "unsaved_fresh")

    def __init__(self, size: int, first: int = 0) -> None:
        self.size = size
        self.first = first
        self.durations = array("d")
        self.computes = array("d")
        # for the state journal: the first step number changed since the last `delta` (None: none) and whether the
        # history began anew since then; the same of the deltas taken but not yet known written
        self.dirty: int | None = None
        self.fresh = True
        self.unsaved: int | None = None
        self.unsaved_fresh = False

    def __len__(self) -> int:
        return len(self.durations)

    def add(self, step: int, duration: float, compute: float) -> None:
        """Remember step `step` unless it was seen before (or is older than what is kept)."""
        if not self.durations:
            self.first = step
        end = self.first + len(self.durations)
        if step < end:
            index = step - self.first
            if index >= 0 and math.isnan(self.durations[index]):
                self.durations[index], self.computes[index] = duration, compute
                self._changed(step)
            return
        self._changed(step)
        gap = step - end
        if gap >= self.size:  # a jump past everything kept
            self.first, self.durations, self.computes = step, array("d"), array("d")
            self.fresh = True
        else:
            self.durations.extend([math.nan] * gap)
            self.computes.extend([math.nan] * gap)
        self.durations.append(duration)
        self.computes.append(compute)
        excess = len(self.durations) - self.size
        if excess > max(64, self.size // 8):  # trim in chunks: a deletion at the front moves the whole array
            del self.durations[:excess]
            del self.computes[:excess]
            self.first += excess

    def _changed(self, step: int) -> None:
        self.dirty = step if self.dirty is None else min(self.dirty, step)

    def delta(self) -> dict[str, Any]:
        """What changed since the last delta known written (`written`): the steps from the first changed one on (all
        of them when the history began anew). Applied by `apply` to the history as it was after that delta."""
        new = self.fresh or self.unsaved_fresh
        marks = [m for m in (self.dirty, self.unsaved) if m is not None]
        end = self.first + len(self.durations)
        at = self.first if new else max(self.first, min(marks)) if marks else end
        self.unsaved, self.unsaved_fresh = (at if at < end else None), new
        self.dirty, self.fresh = None, False
        index = at - self.first
        return {"first": self.first, "at": at, "new": new, "durations": _packed(self.durations[index:]),
                "computes": _packed(self.computes[index:])}

    def written(self) -> None:
        """The deltas taken (or a snapshot of the whole history) are on disk; what changed since is still to write."""
        self.unsaved = None
        self.unsaved_fresh = False

    def apply(self, data: dict[str, Any]) -> None:
        """Bring this history to what a `delta` of it said (ValueError: not a delta this module wrote)."""
        first, at = _whole(data["first"]), _whole(data["at"])
        durations, computes = _unpacked(data["durations"]), _unpacked(data["computes"])
        if at < first or len(durations) != len(computes):
            raise ValueError("a history delta out of shape")
        end = self.first + len(self.durations)
        if data["new"] or first < self.first or first > end:  # begun anew (a new run, a jump past what was kept)
            self.first, self.durations, self.computes = first, array("d"), array("d")
        elif first > self.first:  # trimmed at the front
            del self.durations[:first - self.first]
            del self.computes[:first - self.first]
            self.first = first
        index = at - self.first
        gap = index - len(self.durations)
        if gap > 0:
            self.durations.extend([math.nan] * gap)
            self.computes.extend([math.nan] * gap)
        self.durations[index:] = durations
        self.computes[index:] = computes
        excess = len(self.durations) - self.size
        if excess > max(64, self.size // 8):  # as `add` trims (never, for a delta this module wrote)
            del self.durations[:excess]
            del self.computes[:excess]
            self.first += excess

    def redone(self, after: int, last: int) -> tuple[int, float, float]:
        """Steps after+1 .. last: (how many of them the history lacks, their durations, their compute). Only the
        kept part is read: a step number sent as a token count costs nothing."""
        lo, hi = max(after + 1, self.first), min(last, self.first + len(self.durations) - 1)
        seconds = compute = 0.0
        kept = 0
        for index in range(lo - self.first, hi - self.first + 1):
            if not math.isnan(self.durations[index]):
                seconds += self.durations[index]
                compute += self.computes[index]
                kept += 1
        return (last - after) - kept, seconds, compute

    def to_dict(self) -> dict[str, Any]:
        """The arrays as base64 of their bytes (little-endian doubles, NaN for a step never seen): cheap to write
        every collect."""
        return {"first": self.first, "durations": _packed(self.durations), "computes": _packed(self.computes)}

    @classmethod
    def from_dict(cls, size: int, data: dict[str, Any]) -> History:
        history = cls(size, _whole(data["first"]))
        durations, computes = _unpacked(data["durations"]), _unpacked(data["computes"])
        if len(durations) != len(computes):
            raise ValueError("history arrays of different lengths")
        drop = max(0, len(durations) - size)
        history.first += drop
        history.durations, history.computes = durations[drop:], computes[drop:]
        return history


def _packed(values: array[float]) -> str:
    data = values if sys.byteorder == "little" else array("d", values)
    if sys.byteorder != "little":
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode("ascii")


def _unpacked(text: object) -> array[float]:
    if not isinstance(text, str):
        raise ValueError("history is not base64 text")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 8:
        raise ValueError("history is not a whole number of doubles")
    values = array("d")
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _phase(name: str) -> str:
    return DEPRECATED_PHASES.get(name, name)


class Account:
    """One rank's accounting on this node, over all its sessions."""

    __slots__ = ("base", "downtime", "first_wall", "flops", "history", "last_step", "last_wall", "offset",
                 "pending_compute", "phases", "restarted", "restarts", "run", "runs", "samples", "session_elapsed",
                 "shifts", "started_at", "step_counts", "step_seconds", "steps", "tokens", "untracked",
                 "wasted_compute", "wasted_seconds", "wasted_steps", "where")

    def __init__(self, step_history: int, where: str = "") -> None:
        self.where = where  # "workload/rank", for the log
        self.phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.untracked = 0.0
        self.base = 0.0  # the elapsed of the sessions before this one
        self.session_elapsed = 0.0  # the most this session reported
        self.offset = 0.0  # elapsed of this session before the daemon first heard of it (not accounted)
        self.started_at: float | None = None  # wall time of this session's elapsed 0
        self.first_wall: float | None = None  # wall time the accounting begins at
        self.last_wall: float | None = None  # wall time of the last event
        self.downtime = 0.0
        self.last_step: int | None = None
        self.restarted = False  # this session is a restart that named no step to resume from (yet)
        self.pending_compute = 0.0  # compute seconds since the last step
        self.history = History(step_history)
        self.wasted_steps = 0
        self.wasted_seconds = 0.0
        self.wasted_compute = 0.0
        self.flops: dict[str, float] = {}
        # the step events' totals: kept here, with the rest, so that a restart continues every counter or none
        self.steps = 0
        self.tokens = 0
        self.samples = 0
        self.step_counts = [0] * (len(STEP_BUCKETS) + 1)  # step durations by bucket, not cumulative (+Inf last)
        self.step_seconds = 0.0
        self.shifts = {"up": 0, "down": 0}  # lasting step-time shifts, by direction
        self.restarts = 0  # "restart" sessions
        self.run: str | None = None  # the launch of the job the last session belonged to, where the client named one
        self.runs: dict[str, float] = {}  # its launches (the last RUNS_KEPT): wall time of each one's first session

    # --- what the counters show -----------------------------------------------------------------------

    @property
    def tracked(self) -> float:
        return math.fsum(self.phases.values())

    @property
    def elapsed(self) -> float:
        return self.tracked + self.untracked

    def _settle(self, now: float) -> None:
        """Untracked grows to what the session's elapsed time says, but no further than the wall clock allows: a
        rank's elapsed time and downtime fit in the time since its accounting began. (Two processes reporting as
        one rank would otherwise add each other's elapsed time at every turn.)"""
        tracked = self.tracked
        target = self.base + self.session_elapsed - self.offset - tracked
        if self.first_wall is not None:
            target = min(target, now + CLOCK_SLACK - self.first_wall - self.downtime - tracked)
        self.untracked = max(self.untracked, target)

    # --- events --------------------------------------------------------------------------------------

    def _enter(self, now: float, elapsed: float | None, span: float) -> None:
        """Before an event that ends at `elapsed` into its process (None: not reported) after `span` seconds: the
        first the daemon hears of the rank, or a new process whose own start it did not hear of."""
        if elapsed is None:
            if self.first_wall is None:
                self.first_wall = now - span
            return
        if self.last_wall is None:  # mid-run: count from this event's span on
            self.offset = max(0.0, elapsed - span)
            self.session_elapsed = self.offset
            self.started_at = now - elapsed
            self.first_wall = self.started_at + self.offset
            self.last_wall = self.first_wall
        elif elapsed < self.session_elapsed - NEW_SESSION_SLACK:
            self._begin(now, now - elapsed, max(0.0, elapsed - span), restart=True)

    def _leave(self, now: float, elapsed: float | None) -> None:
        """After the event: the session's elapsed time, the wall time of the last event, untracked."""
        if elapsed is not None:
            self.session_elapsed = max(self.session_elapsed, elapsed)
        wall = now if elapsed is None or self.started_at is None else self.started_at + elapsed
        self.last_wall = max(wall, self.last_wall or 0.0)
        self._settle(now)

    def resubmitted(self, run: str | None) -> bool:
        """Whether a "start" of `run` is a resubmission of the job: a launch other than the one the rank's last
        session belonged to (the workload names the job across its launches: GOODPUT_JOB)."""
        return run is not None and self.run is not None and run != self.run and self.last_wall is not None

    def session(self, now: float, restart: bool, elapsed: float | None, started_at: float | None,
                resumed_from_step: int | None, run: str | None = None) -> None:
        """A "start" or "restart" lifecycle event. One carrying `started_at` begins a process session (of the launch
        `run`, where named); a restart without it (an older client, or a restart inside one process) only says where
        it resumed from."""
        if started_at is not None:
            if run is not None:
                self.run = run
                self.runs.setdefault(run, started_at)
                while len(self.runs) > RUNS_KEPT:  # the oldest launch goes
                    del self.runs[min(self.runs, key=self.runs.__getitem__)]
            self._begin(now, started_at, elapsed or 0.0, restart)
        else:
            self._enter(now, elapsed, 0.0)
        self._leave(now, elapsed)
        if resumed_from_step is not None:
            self.resume(resumed_from_step)

    def _begin(self, now: float, start: float, elapsed: float, restart: bool) -> None:
        """A new process session that started at wall time `start` and has run `elapsed` seconds so far."""
        first = self.last_wall is None
        if first:
            self.first_wall = start
        elif restart:
            self.downtime += max(0.0, start - self.last_wall)  # type: ignore[operator]
        self._settle(now)
        # every phase and untracked second so far is in `base`; this session's elapsed counts from its start
        self.base = self.elapsed
        self.session_elapsed = elapsed
        self.offset = 0.0
        self.started_at = start
        self.pending_compute = 0.0
        self.restarted = restart and not first
        if not restart:  # a new run of the same name: its steps are not redone ones
            self.last_step = None
            self.history = History(self.history.size)
        self.last_wall = max(start + elapsed, self.last_wall or 0.0)

    def touch(self, now: float, elapsed: float | None) -> None:
        """An event that covers no span (the end of the process)."""
        self._enter(now, elapsed, 0.0)
        self._leave(now, elapsed)

    def phase(self, now: float, name: str, seconds: float, elapsed: float | None) -> None:
        self._enter(now, elapsed, seconds)
        name = _phase(name)
        self.phases[name] += seconds
        if name == "compute":
            self.pending_compute += seconds
        self._leave(now, elapsed)

    def step(self, now: float, duration: float, number: int | None, flops: float | None, dtype: str,
             elapsed: float | None, tokens: int = 0, samples: int = 0) -> None:
        self._enter(now, elapsed, duration)
        self.steps += 1
        self.tokens += tokens
        self.samples += samples
        self.step_counts[bisect.bisect_left(STEP_BUCKETS, duration)] += 1  # le: duration <= bound
        self.step_seconds += duration
        if number is not None:
            if self.restarted and self.last_step is not None and number <= self.last_step:
                self.resume(number - 1)  # a restart that named no step: its first step says where it went back to
            self.restarted = False
            self.history.add(number, duration, self.pending_compute)
            self.last_step = number
        self.pending_compute = 0.0
        if flops is not None:
            self.flops[dtype] = self.flops.get(dtype, 0.0) + flops
        self._leave(now, elapsed)

    def resume(self, step: int) -> None:
        """The rank went back to the state after step `step`: every later step it had completed is redone."""
        self.restarted = False
        last = self.last_step
        self.last_step = step
        if last is None or last <= step:
            return
        missing, seconds, compute = self.history.redone(step, last)
        self.wasted_steps += last - step
        self.wasted_seconds += seconds
        self.wasted_compute += compute
        if missing:
            log.warning("ingest: %s resumed from step %d after step %d; %d of the redone steps are older than the "
                        "%d remembered (ingest.step_history): their seconds are not counted", self.where, step,
                        last, missing, self.history.size)

    # --- the state file -------------------------------------------------------------------------------

    def _scalars(self) -> dict[str, Any]:
        return {"phases": dict(self.phases), "untracked": self.untracked, "base": self.base,
                "session_elapsed": self.session_elapsed, "offset": self.offset, "started_at": self.started_at,
                "first_wall": self.first_wall, "last_wall": self.last_wall, "downtime": self.downtime,
                "last_step": self.last_step, "restarted": self.restarted, "pending_compute": self.pending_compute,
                "wasted_steps": self.wasted_steps, "wasted_seconds": self.wasted_seconds,
                "wasted_compute": self.wasted_compute, "flops": dict(self.flops), "steps": self.steps,
                "tokens": self.tokens, "samples": self.samples, "step_counts": list(self.step_counts),
                "step_seconds": self.step_seconds, "shifts": dict(self.shifts), "restarts": self.restarts,
                "run": self.run, "runs": dict(self.runs)}

    def to_dict(self) -> dict[str, Any]:
        """A copy, for the state file's snapshot (JSON-ready). Once it is written, `history.written()`: the next delta
        may repeat some of it (harmless), never leave a step out."""
        data = self._scalars()
        data["history"] = self.history.to_dict()
        return data

    def delta_dict(self) -> dict[str, Any]:
        """What the state journal keeps of a change: every figure, and the step history added since the last delta
        (`history.written()` once it is on disk)."""
        data = self._scalars()
        data["history_delta"] = self.history.delta()
        return data

    def figures(self) -> Figures:
        """What the metrics show of this account."""
        return Figures(tuple(self.phases[p] for p in PHASES), self.untracked, self.elapsed, self.downtime,
                       self.wasted_steps, self.wasted_seconds, self.wasted_compute, self.last_step,
                       tuple(sorted(self.flops.items())), self.steps, self.tokens, self.samples,
                       (list(itertools.accumulate(self.step_counts)), self.step_seconds), self.shifts["up"],
                       self.shifts["down"], self.restarts)

    @classmethod
    def from_dict(cls, step_history: int, where: str, data: dict[str, Any]) -> Account:
        """Raises KeyError, TypeError, ValueError or ArithmeticError for data that is not an account this module
        wrote."""
        account = cls(step_history, where)
        account.load(data)
        account.history = History.from_dict(step_history, data["history"])
        account.history.fresh = False  # as on disk
        return account

    def load(self, data: dict[str, Any]) -> None:
        """Take the figures of `data` (a snapshot's account or a journal's delta); errors as `from_dict`'s."""
        phases = dict.fromkeys(PHASES, 0.0)
        for name, seconds in data["phases"].items():
            phase = _phase(str(name))
            if phase not in phases:
                raise ValueError(f"unknown phase {name!r}")
            phases[phase] += _number(seconds)
        self.phases = phases
        self.untracked = _number(data["untracked"])
        self.base = _number(data["base"])
        self.session_elapsed = _number(data["session_elapsed"])
        self.offset = _number(data["offset"])
        self.started_at = _optional(data["started_at"])
        self.first_wall = _optional(data["first_wall"])
        self.last_wall = _optional(data["last_wall"])
        self.downtime = _number(data["downtime"])
        self.last_step = None if data["last_step"] is None else _whole(data["last_step"])
        self.restarted = bool(data["restarted"])
        self.pending_compute = _number(data["pending_compute"])
        self.wasted_steps = _whole(data["wasted_steps"])
        self.wasted_seconds = _number(data["wasted_seconds"])
        self.wasted_compute = _number(data["wasted_compute"])
        self.flops = {str(k): _number(v) for k, v in data["flops"].items()}
        # version 1 files (earlier releases) kept no step totals: they start at 0 there, as they did
        self.steps = _whole(data.get("steps", 0))
        self.tokens = _whole(data.get("tokens", 0))
        self.samples = _whole(data.get("samples", 0))
        counts = [_whole(n) for n in data.get("step_counts", [0] * (len(STEP_BUCKETS) + 1))]
        if len(counts) != len(STEP_BUCKETS) + 1:
            raise ValueError(f"{len(counts)} step duration buckets, not {len(STEP_BUCKETS) + 1}")
        self.step_counts = counts
        self.step_seconds = _number(data.get("step_seconds", 0.0))
        shifts = data.get("shifts", {})
        self.shifts = {"up": _whole(shifts.get("up", 0)), "down": _whole(shifts.get("down", 0))}
        self.restarts = _whole(data.get("restarts", 0))
        # files of earlier releases kept no launches
        run = data.get("run")
        if run is not None and not isinstance(run, str):
            raise ValueError(f"run {run!r} is not a name")
        self.run = run
        self.runs = {str(name): _number(start) for name, start in data.get("runs", {}).items()}
        if "history_delta" in data:
            self.history.apply(data["history_delta"])


class Figures(NamedTuple):
    """An account's published figures, as of one moment (the last save, with a state file)."""

    phases: tuple[float, ...]  # in PHASES' order
    untracked: float
    elapsed: float
    downtime: float
    wasted_steps: int
    wasted_seconds: float
    wasted_compute: float
    last_step: int | None
    flops: tuple[tuple[str, float], ...]
    steps: int
    tokens: int
    samples: int
    durations: tuple[list[int], float]  # the step duration histogram: cumulative bucket counts, sum
    shifts_up: int
    shifts_down: int
    restarts: int


def _optional(value: object) -> float | None:
    return None if value is None else _number(value)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole number >= 0")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not a finite number >= 0")
    return float(value)
