"""Per (workload, rank) accumulators, and per (workload, model) ones for inference requests, with caps and
expiry; the `ingest` source renders them. Each workload belongs to the sender of its first event (its uid, and its
pod, Slurm job or container where known) for as long as it has live ranks: others are refused, and each owner's
live workloads, ranks and models are capped below the node's caps."""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from goodput_client.contract import DEPRECATED_PHASES, EVENT_TYPES, FINISH_REASONS, PHASES, UNTRACKED_PHASE

from ...core.exposition import Batch
from . import metrics as c
from .accounting import Account, Figures
from .changepoint import StepTimeDetector
from .models import LifecycleEvent, PhaseEvent, RequestEvent, RoleEvent, StepEvent, TargetEvent
from .peer import ROOT_UID, Sender, start_time
from .settings import IngestConfig
from .statefile import ERROR_REASONS, StateFile
from .variation import OwnVariation

log = logging.getLogger(__name__)

ENDED_GRACE = 60.0  # an ended rank's series stay this long, so the last scrape sees its final counts
ENDS_KEPT = 3600.0  # how long the end of a rank's process is remembered (rank_ends), unless it starts again
_PER_UID = {name: IngestConfig.model_fields[name].default
            for name in ("max_workloads_per_uid", "max_ranks_per_uid", "max_models_per_uid")}


class Rejected(Exception):
    """The whole batch was refused; `reason` labels goodput_ingest_events_rejected_total."""

    def __init__(self, reason: str, message: str, status: int) -> None:
        self.reason = reason
        self.status = status
        super().__init__(message)


class _Histogram:
    """Non-cumulative bucket counts (the last past the last bound) and the sum of the observations."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value

    def rendered(self) -> tuple[list[int], float]:
        return list(itertools.accumulate(self.counts)), self.total


@dataclass
class _Rank:
    account: Account  # its time accounting: kept (dormant) after its series go, for a restart to continue
    detector: StepTimeDetector  # its step time's normal level and lasting shifts (their count: in the account)
    last_event: float = 0.0
    ended_at: float | None = None
    role: tuple[str, str] | None = None  # (pipeline stage, data-parallel rank), as the rank last reported them
    target: tuple[int | None, float | None] = (None, None)  # (last step, deadline), as the rank last declared them
    last_save: float | None = None  # when its last checkpoint_save phase arrived (ended), wall-clock seconds
    save_interval: float | None = None  # seconds between its last two saves
    variation: OwnVariation = field(default_factory=OwnVariation)  # its own time's spread from step to step


SHIFT_DIRECTIONS = {1: "up", -1: "down"}
STEP_TIME_WINDOWS = ("last", "1m", "1h")
SLO_OBJECTIVES = ("ttft", "tpot", "both")
REJECT_REASONS = ("invalid", "truncated", "oversize", "unauthorized", "not_owner", "uid_cap", "workload_cap",
                  "rank_cap", "model_cap")
MAX_LOGGED_REFUSALS = 1024  # (sender, workload) pairs whose refusal was logged: each is logged once


@dataclass
class _Model:
    """What one workload's servers reported about one model's requests."""

    ttft: _Histogram = field(default_factory=lambda: _Histogram(c.TTFT.buckets))
    tpot: _Histogram = field(default_factory=lambda: _Histogram(c.TPOT.buckets))
    itl: _Histogram = field(default_factory=lambda: _Histogram(c.ITL.buckets))
    e2e: _Histogram = field(default_factory=lambda: _Histogram(c.E2E.buckets))
    queue: _Histogram = field(default_factory=lambda: _Histogram(c.QUEUE.buckets))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    met: Counter[str] = field(default_factory=Counter)
    objectives: tuple[float, float] = (0.0, 0.0)  # (ttft, tpot) of the last request
    last_event: float = 0.0

    def add(self, event: RequestEvent) -> None:
        ttft, tpot = event.ttft_seconds, event.tpot_seconds
        ttft_met = tpot_met = False
        if ttft is not None:
            self.ttft.observe(ttft)
            ttft_met = ttft <= event.ttft_objective_seconds
        if tpot is not None:
            self.tpot.observe(tpot)
            tpot_met = tpot <= event.tpot_objective_seconds
        self.met["ttft"] += ttft_met
        self.met["tpot"] += tpot_met
        self.met["both"] += ttft_met and (tpot_met or tpot is None)
        for i, count in enumerate(event.itl_counts):
            self.itl.counts[i] += count
        self.itl.total += event.itl_sum
        self.e2e.observe(event.e2e_seconds)
        if event.queue_seconds is not None:
            self.queue.observe(event.queue_seconds)
        self.prompt_tokens += event.prompt_tokens
        self.generation_tokens += event.output_tokens
        self.reasons[event.finish_reason] += 1
        self.objectives = (event.ttft_objective_seconds, event.tpot_objective_seconds)


@dataclass(frozen=True, slots=True)
class Declaration:
    start_time: int  # of the declaring process: a PID reused by another process does not inherit it
    workload: str
    rank: str


@dataclass(frozen=True)
class Declarations:
    """PID -> what its process declared, for live processes and ranks; and declarations not kept, by
    reason (mixed_identity: one batch named several workloads/ranks; pid_reused: the PID now belongs to
    another process)."""

    claims: dict[int, tuple[str, str]]
    ignored: dict[str, int]


IGNORED_REASONS = ("mixed_identity", "pid_reused")


class IngestState:
    def __init__(self, max_workloads: int, max_ranks: int, idle_timeout: float,
                 clock: Callable[[], float] = time.time, proc_path: str = "/proc", *, max_models: int = 64,
                 step_history: int = 2000, restart_window: float = 21_600.0,
                 state_file: StateFile | None = None,
                 detector: Callable[[], StepTimeDetector] = StepTimeDetector,
                 trusted_uids: Collection[int] = (), owner_by_cgroup: bool = True,
                 max_workloads_per_uid: int = _PER_UID["max_workloads_per_uid"],
                 max_ranks_per_uid: int = _PER_UID["max_ranks_per_uid"],
                 max_models_per_uid: int = _PER_UID["max_models_per_uid"]) -> None:
        """`detector` makes each new rank's step-time change detector (ingest.shift_* settings). The rest say who
        may write which workload (the ingest settings of the same names, with their defaults): `trusted_uids` (and
        root) may write any; other senders only those they own, within the per-uid caps."""
        self.max_workloads = max_workloads
        self.max_ranks = max_ranks
        self.max_models = max_models
        self.trusted_uids = frozenset(trusted_uids) | {ROOT_UID}
        self.owner_by_cgroup = owner_by_cgroup
        self.max_workloads_per_uid = max_workloads_per_uid
        self.max_ranks_per_uid = max_ranks_per_uid
        self.max_models_per_uid = max_models_per_uid
        self.idle_timeout = idle_timeout
        self.step_history = step_history
        self.restart_window = restart_window
        self._detector = detector
        # called (outside the lock) with (workload, rank, direction, the workload's live ranks here) when a rank's
        # step time shifts lastingly: the captures' trigger, when they are on
        self.on_shift: Callable[[str, str, int, list[str]], object] | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, str], _Rank] = {}
        # the accounts of ranks whose other series are gone (idle, ended), until restart_window after their last
        # event: still published, so that a restart's downtime and redone steps, or a long untracked stretch, show
        # in rates as an increase rather than as a series that starts high
        self._dormant: dict[tuple[str, str], Account] = {}
        self.state_file = state_file
        self._save_lock = threading.Lock()  # one write at a time, the last with the newest accounts
        self._dirty: set[tuple[str, str]] = set()  # ranks whose account changed since the last save
        self._dropped: set[tuple[str, str]] = set()  # accounts forgotten since the last save
        # with a state file, what each account's series show: its figures as of its last save (one whose save failed
        # shows what is on disk, so that a restart can never show less); an account never saved shows no counter at
        # all (withheld: a restart would find nothing of it, and its counters would start again from zero)
        self._shown: dict[tuple[str, str], Figures] = {}
        # accounts never saved whose save was tried and failed: their counters withheld for want of a disk (those of
        # a rank that appeared since the last save are withheld too, until the next, but that is no problem)
        self._unsaved: set[tuple[str, str]] = set()
        self._withheld_logged = 0  # withheld ranks when last logged: the first and the last are logged
        if state_file is not None:
            self._restore(state_file)
        # (workload, model) -> its requests; apart from the ranks: a rank's end leaves them, idleness expires them
        self._models: dict[tuple[str, str], _Model] = {}
        # sender PID (in the daemon's PID namespace, so read in its own /proc) -> what it last reported
        self._declared: dict[int, Declaration] = {}
        # (workload, rank) -> (when its process was found ended: its `end` event, or its declaring PID gone; that
        # PID, None when unknown; whether by its `end` event): rank_ends(), for the flight source. Cleared by the
        # rank's start or restart, or by another process declaring the rank
        self._ends: dict[tuple[str, str], tuple[float, int | None, bool]] = {}
        self._proc = Path(proc_path)
        self.ignored: Counter[str] = Counter()
        self._mixed_logged: set[int] = set()
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        # workload -> the sender of its first event (without its PID), while the workload has live ranks; a
        # workload created without a sender (in-process callers) has none, and the next sender to write it owns it
        self._owners: dict[str, Sender] = {}
        self._refusals_logged: set[tuple[Sender, str]] = set()

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def trusted(self, sender: Sender) -> bool:
        """Whether `sender` may write any workload: root and ingest.trusted_uids (never a TCP sender)."""
        return sender.uid is not None and sender.uid in self.trusted_uids

    def authorize(self, sender: Sender, workloads: Iterable[str]) -> None:
        """Raise Rejected (not_owner, counted) if `sender` may not write one of `workloads`: for what a request
        touches besides its events (capture answers, a poll for capture requests), which claims nothing."""
        with self._lock:
            self._check_owners(sender, set(workloads))

    def _check_owners(self, sender: Sender, workloads: set[str]) -> None:
        """Refuse (403) a batch that names a workload another sender owns; the caller holds the lock."""
        if self.trusted(sender):
            return
        foreign = sorted(w for w in workloads
                         if (owner := self._owners.get(w)) is not None
                         and not owner.same_owner(sender, self.owner_by_cgroup))
        if not foreign:
            return
        self.rejected["not_owner"] += 1
        owner = self._owners[foreign[0]]
        key = (replace(sender, pid=None), foreign[0])
        if key not in self._refusals_logged:
            if len(self._refusals_logged) >= MAX_LOGGED_REFUSALS:
                self._refusals_logged.clear()
            self._refusals_logged.add(key)
            log.warning("ingest: %s%s sent events for workload %r, which belongs to %s; refused (403, not_owner; "
                        "logged once per sender and workload)", sender,
                        f" (PID {sender.pid})" if sender.pid else "", foreign[0], owner)
        more = f" (and {len(foreign) - 1} more of this batch's)" if len(foreign) > 1 else ""
        raise Rejected("not_owner", f"workload {foreign[0]!r}{more} belongs to {owner} on this node, not to you "
                       f"({sender}): a workload belongs to the sender of its first event while it has live ranks; "
                       "root and ingest.trusted_uids may write any", 403)

    def _check_uid_caps(self, sender: Sender, claims: set[str], new: set[tuple[str, str]],
                        new_models: set[tuple[str, str]]) -> None:
        """Refuse (429) what would take `sender`'s uid past its caps; the caller holds the lock."""
        if self.trusted(sender):
            return
        owned = {w for w, owner in self._owners.items() if owner.uid == sender.uid}
        ranks = sum(w in owned for w, _ in self._ranks) if new else 0
        models = sum(w in owned for w, _ in self._models) if new_models else 0
        problem = None
        if claims and len(owned) + len(claims) > self.max_workloads_per_uid:
            problem = f"{len(owned)} live workloads (ingest.max_workloads_per_uid={self.max_workloads_per_uid})"
        elif new and ranks + len(new) > self.max_ranks_per_uid:
            problem = f"{ranks} live ranks (ingest.max_ranks_per_uid={self.max_ranks_per_uid})"
        elif new_models and models + len(new_models) > self.max_models_per_uid:
            problem = f"{models} live workload and model pairs (ingest.max_models_per_uid={self.max_models_per_uid})"
        if problem is not None:
            self.rejected["uid_cap"] += 1
            who = "TCP senders (one owner together) already have" if sender.uid is None \
                else f"uid {sender.uid} already has"
            raise Rejected("uid_cap", f"{who} {problem} on this node", 429)

    def apply(self, events: Sequence[StepEvent | PhaseEvent | LifecycleEvent | RoleEvent | TargetEvent | RequestEvent],
              peer_pid: int | None = None, sender: Sender | None = None) -> None:
        """Apply every event or none (another's workload, over a cap: Rejected, and nothing changed). `peer_pid`,
        the sending process as the kernel names it, is remembered as declaring its events' identity (a
        request event is activity of its workload and rank too). `sender` (None: an in-process caller, which may
        write anything and owns nothing) must own the events' workloads, and owns those it is first to write."""
        keys = {(e.workload, str(e.rank)) for e in events}
        models = {(e.workload, e.model) for e in events if isinstance(e, RequestEvent)}
        now = self._clock()
        shifted: list[tuple[str, str, int, list[str]]] = []
        with self._lock:
            new = keys - self._ranks.keys()
            new_models = models - self._models.keys()
            claims: set[str] = set()
            if sender is not None:
                workloads = {w for w, _ in keys}
                self._check_owners(sender, workloads)
                claims = workloads - self._owners.keys()
                self._check_uid_caps(sender, claims, new, new_models)
            if new:
                workloads = {w for w, _ in self._ranks}
                new_workloads = {w for w, _ in new} - workloads
                if len(workloads) + len(new_workloads) > self.max_workloads:
                    self.rejected["workload_cap"] += 1
                    raise Rejected("workload_cap", f"this node already tracks {len(workloads)} workloads "
                                   f"(ingest.max_workloads={self.max_workloads})", 429)
                if len(self._ranks) + len(new) > self.max_ranks:
                    self.rejected["rank_cap"] += 1
                    raise Rejected("rank_cap", f"this node already tracks {len(self._ranks)} ranks "
                                   f"(ingest.max_ranks={self.max_ranks})", 429)
            if new_models and len(self._models) + len(new_models) > self.max_models:
                self.rejected["model_cap"] += 1
                raise Rejected("model_cap", f"this node already tracks {len(self._models)} workload and model "
                               f"pairs (ingest.max_models={self.max_models})", 429)
            if sender is not None and claims:
                owner = replace(sender, pid=None)  # the PID is the connection's, not the owner's
                for workload in claims:
                    self._owners[workload] = owner
            for key in new:
                self._ranks[key] = _Rank(self._account(key, now), self._detector())
            for key in new_models:
                self._models[key] = _Model()
            for event in events:
                rank = self._ranks[(event.workload, str(event.rank))]
                rank.last_event = now
                if isinstance(event, RequestEvent):
                    model = self._models[(event.workload, event.model)]
                    model.last_event = now
                    model.add(event)
                elif isinstance(event, StepEvent):
                    rank.account.step(now, event.duration_seconds, event.step, event.flops, event.dtype,
                                      event.elapsed_seconds, event.tokens, event.samples)
                    rank.variation.step()
                    direction = rank.detector.observe(event.duration_seconds, now)
                    if direction:
                        rank.account.shifts[SHIFT_DIRECTIONS[direction]] += 1
                        shifted.append((event.workload, str(event.rank), direction,
                                        [r for w, r in self._ranks if w == event.workload]))
                elif isinstance(event, PhaseEvent):
                    rank.account.phase(now, event.phase, event.seconds, event.elapsed_seconds)
                    rank.variation.phase(event.phase, event.seconds)
                    if DEPRECATED_PHASES.get(event.phase, event.phase) == "checkpoint_save":
                        if rank.last_save is not None:
                            rank.save_interval = now - rank.last_save
                        rank.last_save = now
                elif isinstance(event, RoleEvent):
                    rank.role = (str(event.pipeline_stage), str(event.data_parallel_rank))
                elif isinstance(event, TargetEvent):
                    rank.target = (event.target_steps, event.deadline)
                elif event.event == "end":
                    rank.ended_at = now
                    rank.account.touch(now, event.elapsed_seconds)
                    self._ends[(event.workload, str(event.rank))] = (now, peer_pid, True)
                else:  # start, restart
                    self._ends.pop((event.workload, str(event.rank)), None)
                    # a start of another launch of the same job (a resubmission) is a restart of the job
                    restart = event.event == "restart" or (
                        event.started_at is not None and rank.account.resubmitted(event.run))
                    rank.account.restarts += restart
                    rank.ended_at = None
                    rank.variation.restart()
                    rank.account.session(now, restart, event.elapsed_seconds, event.started_at,
                                         event.resumed_from_step, event.run)
                self.accepted[event.type] += 1
            self._dirty |= keys
        if peer_pid is not None and events:
            self._declare(peer_pid, keys)
        for workload, rank_name, direction, ranks in shifted:
            log.info("ingest: the step time of %s rank %s shifted %s", workload, rank_name,
                     SHIFT_DIRECTIONS[direction])
            if self.on_shift is not None:
                try:
                    self.on_shift(workload, rank_name, direction, ranks)
                except Exception:  # a capture that cannot be asked for never costs the events their place
                    log.exception("ingest: acting on the step-time shift of %s rank %s failed", workload, rank_name)

    def count_accepted(self, kind: str, n: int) -> None:
        """Events accepted outside `apply` (capture answers, which go to the captures, not to a rank)."""
        with self._lock:
            self.accepted[kind] += n

    def _account(self, key: tuple[str, str], now: float) -> Account:
        """The dormant account of a rank reporting again within restart_window, else a new one."""
        account = self._dormant.pop(key, None)
        if account is not None and (account.last_wall or 0.0) >= now - self.restart_window:
            return account
        return Account(self.step_history, "/".join(key))

    def _restore(self, state_file: StateFile) -> None:
        """The accounts of the state file (its snapshot, then its journal's changes), dormant until their ranks report
        again; a malformed one is skipped (the file counted as corrupt, a copy kept)."""
        items, changes = state_file.load()
        problems = []
        for item in items:
            try:
                key = (str(item["workload"]), str(item["rank"]))
                self._dormant[key] = Account.from_dict(self.step_history, "/".join(key), item["account"])  # type: ignore[arg-type]
            except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
                problems.append(f"{exc.__class__.__name__}: {exc}")
        for change in changes:
            try:
                key = (str(change["w"]), str(change["r"]))
                if change.get("drop"):
                    self._dormant.pop(key, None)
                    continue
                account = self._dormant.get(key) or Account(self.step_history, "/".join(key))
                account.load(change["a"])
                account.history.fresh = False  # as on disk
                self._dormant[key] = account
            except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
                problems.append(f"{exc.__class__.__name__}: {exc}")
        if problems:
            state_file.quarantine(f"{len(problems)} of its {len(items)} accounts and {len(changes)} changes are "
                                  f"malformed, the first: {problems[0]}", partly=True)
        self._shown = {key: account.figures() for key, account in self._dormant.items()}
        if items:
            log.info("ingest: restored the accounting of %d ranks from %s (%d changes after its snapshot)",
                     len(self._dormant), state_file.path, len(changes))

    def save(self, whole: bool = False) -> None:
        """Write what changed since the last save to the state file (the source does it before publishing what it
        collected, and once more at shutdown): the changed accounts into its journal, or a whole snapshot when the
        journal is used up. The accounts saved show their figures as of now; when the write fails they go on showing
        what was saved before, or no counter at all if nothing of them was ever saved (and the write is tried again
        at the next save). `whole`: a snapshot of everything (at shutdown), unless the disk has no room for one."""
        if self.state_file is None:
            return
        with self._save_lock:
            with self._lock:
                if not self._dirty and not self._dropped and not (whole and self.state_file.journaled):
                    return
                dirty, dropped = self._dirty, self._dropped
                self._dirty, self._dropped = set(), set()
                everything = {**self._dormant, **{k: r.account for k, r in self._ranks.items()}}
                snapshot = whole or self.state_file.wants_snapshot
                saved = everything if snapshot else {k: everything[k] for k in dirty if k in everything}
                if snapshot:
                    accounts = [{"workload": w, "rank": r, "account": a.to_dict()} for (w, r), a in saved.items()]
                else:
                    records = [{"w": w, "r": r, "a": a.delta_dict()} for (w, r), a in saved.items()]
                    records += [{"w": w, "r": r, "drop": 1} for w, r in dropped if (w, r) not in everything]
                figures = {key: account.figures() for key, account in saved.items()}
            ok = self.state_file.save(accounts) if snapshot else self.state_file.append(records)
            if not ok and whole and not self.state_file.wants_snapshot:  # no room for a snapshot: the journal's
                with self._lock:
                    self._dirty |= dirty | set(saved)
                    self._dropped |= dropped
                self.save()
                return
            with self._lock:
                if not ok:
                    self._dirty |= dirty | (set(saved) if snapshot else set())
                    self._dropped |= dropped
                    self._unsaved |= saved.keys() - self._shown.keys()
                    return
                self._unsaved -= saved.keys()
                for account in saved.values():
                    account.history.written()
                self._shown.update(figures)
                for key in dropped:
                    if key not in everything:
                        self._shown.pop(key, None)

    def _declare(self, pid: int, keys: set[tuple[str, str]]) -> None:
        started = start_time(self._proc, pid)
        with self._lock:
            if len(keys) != 1:  # e.g. a relay sending for several ranks: it is none of them
                self._declared.pop(pid, None)
                self.ignored["mixed_identity"] += 1
                if pid not in self._mixed_logged:
                    self._mixed_logged.add(pid)
                    log.info("ingest: PID %d sent events of %d workload/rank pairs in one batch; it declares "
                             "no identity", pid, len(keys))
                return
            if started is None:
                return  # gone already
            (workload, rank), = keys
            self._declared[pid] = Declaration(started, workload, rank)
            end = self._ends.get((workload, rank))
            if end is not None and end[1] is not None and end[1] != pid:
                del self._ends[(workload, rank)]  # another process is the rank now: its end is not this one's

    def declared(self) -> Declarations:
        """What live processes declared by reporting, each checked against its start time on the way."""
        claims = self._sweep()
        with self._lock:
            return Declarations(claims, dict(self.ignored))

    def rank_ends(self) -> dict[tuple[str, str], float]:
        """(workload, rank) -> when the rank's process was found ended (wall-clock seconds): the process that
        reported for it over the Unix socket exited (checked now, in /proc), or its `end` event arrived ENDED_GRACE
        ago (a rank that finished keeps its last dump's series as long as its other series, so that the last scrape
        sees its final counts; one that died has no more to say, and its collectives must stop accusing anyone). A
        rank that starts again, or that another process reports for, is not listed."""
        self._sweep()
        now = self._clock()
        with self._lock:
            for key in [k for k, (at, _, _) in self._ends.items() if at < now - ENDS_KEPT]:
                del self._ends[key]
            while len(self._ends) > self.max_ranks:  # the oldest go first
                del self._ends[min(self._ends, key=lambda k: self._ends[k][0])]
            return {key: at for key, (at, _, by_event) in self._ends.items()
                    if not by_event or now - at >= ENDED_GRACE}

    def _sweep(self) -> dict[int, tuple[str, str]]:
        """The declarations of live processes, each checked against its start time; those of processes gone or
        replaced are forgotten, and a rank whose declaring process exited, with no other live one declaring it, is
        noted as ended."""
        with self._lock:
            declared = dict(self._declared)
        claims: dict[int, tuple[str, str]] = {}
        stale: list[tuple[int, Declaration]] = []
        for pid, item in declared.items():
            now = start_time(self._proc, pid)
            if now == item.start_time:
                claims[pid] = (item.workload, item.rank)
            else:
                stale.append((pid, item))
                if now is not None:  # alive, but another process: the PID was reused
                    self.ignored["pid_reused"] += 1
        ended_at = self._clock()
        with self._lock:
            for pid, item in stale:  # gone or reused: forget it (unless it declared again meanwhile)
                if self._declared.get(pid) is item:
                    del self._declared[pid]
                    key = (item.workload, item.rank)
                    if key not in claims.values() and key not in self._ends:
                        self._ends[key] = (ended_at, pid, False)
            self._mixed_logged = {p for p in self._mixed_logged if (self._proc / str(p)).exists()}
            return claims

    def _figures(self, key: tuple[str, str], account: Account) -> Figures | None:
        """What the account's series show (the caller holds the lock): with a state file, its figures as of its last
        save, None when it was never saved (its counters withheld)."""
        if self.state_file is None:
            return account.figures()
        return self._shown.get(key)

    @staticmethod
    def _render(batch: Batch, key: tuple[str, str], figures: Figures) -> None:
        for phase, seconds in zip(PHASES, figures.phases, strict=True):
            batch.add(c.PHASE_SECONDS, (*key, phase), seconds)
        batch.add(c.PHASE_SECONDS, (*key, UNTRACKED_PHASE), figures.untracked)
        batch.add(c.ELAPSED, key, figures.elapsed)
        batch.add(c.DOWNTIME, key, figures.downtime)
        batch.add(c.WASTED_STEPS, key, figures.wasted_steps)
        batch.add(c.WASTED_SECONDS, key, figures.wasted_seconds)
        batch.add(c.WASTED_COMPUTE, key, figures.wasted_compute)
        if figures.last_step is not None:
            batch.add(c.STEP_NUMBER, key, figures.last_step)
        for dtype, flops in figures.flops:
            batch.add(c.MODEL_FLOPS, (*key, dtype), flops)

    def snapshot(self) -> Batch:
        """Render the accumulators; drop ranks idle past the timeout and ended ranks past the grace. With a state
        file, what changed is saved first: the accounts show what is saved (a counter seen is a counter kept)."""
        self.save()
        batch = Batch()
        now = self._clock()
        with self._lock:
            for key in [k for k, r in self._ranks.items()
                        if now - r.last_event > self.idle_timeout
                        or (r.ended_at is not None and now - r.ended_at > ENDED_GRACE)]:
                self._dormant[key] = self._ranks.pop(key).account
            for key in [k for k, a in self._dormant.items() if (a.last_wall or 0.0) < now - self.restart_window]:
                del self._dormant[key]
                self._dropped.add(key)
            while len(self._dormant) > self.max_ranks:  # the oldest go first
                key = min(self._dormant, key=lambda k: self._dormant[k].last_wall or 0.0)
                del self._dormant[key]
                self._dropped.add(key)
            for key in [k for k, m in self._models.items() if now - m.last_event > self.idle_timeout]:
                del self._models[key]
            for pid in [p for p, d in self._declared.items() if (d.workload, d.rank) not in self._ranks]:
                del self._declared[pid]  # its rank expired or ended: no ghost attribution
            live = {w for w, _ in self._ranks}
            for workload in [w for w in self._owners if w not in live]:
                del self._owners[workload]  # its last rank expired or ended: anyone may start it anew
            withheld = 0
            for key, rank in sorted(self._ranks.items()):
                figures = self._figures(key, rank.account)
                summaries = rank.detector.summaries(now)
                for window in STEP_TIME_WINDOWS:
                    if window in summaries:
                        batch.add(c.STEP_TIME, (*key, window), summaries[window])
                if rank.detector.baseline is not None:
                    batch.add(c.STEP_BASELINE, key, rank.detector.baseline)
                if (variation := rank.variation.value()) is not None:
                    batch.add(c.STEP_OWN_VARIATION, key, variation)
                batch.add(c.LAST_EVENT, key, rank.last_event)
                if rank.last_save is not None:
                    batch.add(c.CHECKPOINT_LAST_SAVE, key, rank.last_save)
                if rank.save_interval is not None:
                    batch.add(c.CHECKPOINT_INTERVAL, key, rank.save_interval)
                if rank.role is not None:
                    batch.add(c.RANK_ROLE, (*key, *rank.role), 1)
                if rank.target[0] is not None:
                    batch.add(c.TARGET_STEP, key, rank.target[0])
                if rank.target[1] is not None:
                    batch.add(c.DEADLINE, key, rank.target[1])
                if figures is None:  # never saved: its gauges only (they may go down), none of its counters
                    withheld += key in self._unsaved
                    if rank.account.last_step is not None:
                        batch.add(c.STEP_NUMBER, key, rank.account.last_step)
                    continue
                batch.add(c.STEP_DURATION, key, figures.durations)
                batch.add(c.STEP_SHIFTS, (*key, "up"), figures.shifts_up)
                batch.add(c.STEP_SHIFTS, (*key, "down"), figures.shifts_down)
                batch.add(c.STEPS, key, figures.steps)
                batch.add(c.TOKENS, key, figures.tokens)
                batch.add(c.SAMPLES, key, figures.samples)
                self._render(batch, key, figures)
                batch.add(c.RESTARTS, key, figures.restarts)
            for key, account in sorted(self._dormant.items()):  # a restart's jump stays within a rate's reach
                if (figures := self._figures(key, account)) is not None:
                    self._render(batch, key, figures)
                else:
                    withheld += key in self._unsaved
            runs: dict[tuple[str, str], float] = {}  # each launch of a workload: its earliest start here
            for (workload, _), account in [*((k, r.account) for k, r in self._ranks.items()), *self._dormant.items()]:
                for run, start in account.runs.items():
                    runs[(workload, run)] = min(start, runs.get((workload, run), start))
            for key, start in sorted(runs.items()):
                batch.add(c.RUN_START, key, start)
            for key, model in sorted(self._models.items()):
                batch.add(c.TTFT, key, model.ttft.rendered())
                batch.add(c.TPOT, key, model.tpot.rendered())
                batch.add(c.ITL, key, model.itl.rendered())
                batch.add(c.E2E, key, model.e2e.rendered())
                batch.add(c.QUEUE, key, model.queue.rendered())
                batch.add(c.PROMPT_TOKENS, key, model.prompt_tokens)
                batch.add(c.GENERATION_TOKENS, key, model.generation_tokens)
                for reason in FINISH_REASONS:
                    batch.add(c.REQUESTS, (*key, reason), model.reasons[reason])
                for objective in SLO_OBJECTIVES:
                    batch.add(c.SLO_MET, (*key, objective), model.met[objective])
                batch.add(c.SLO_OBJECTIVE, (*key, "ttft"), model.objectives[0])
                batch.add(c.SLO_OBJECTIVE, (*key, "tpot"), model.objectives[1])
            for kind in EVENT_TYPES:
                batch.add(c.INGEST_ACCEPTED, (kind,), self.accepted[kind])
            for reason in REJECT_REASONS:
                batch.add(c.INGEST_REJECTED, (reason,), self.rejected[reason])
            if self.state_file is not None:
                for reason in ERROR_REASONS:
                    batch.add(c.STATE_ERRORS, (reason,), self.state_file.errors[reason])
                batch.add(c.STATE_WITHHELD, (), withheld)
                self._unsaved &= self._ranks.keys() | self._dormant.keys()
                self._log_withheld(withheld)
        return batch

    def _log_withheld(self, withheld: int) -> None:
        """Log when ranks' counters start being withheld, and when none are any more (the caller holds the lock)."""
        assert self.state_file is not None
        if withheld and not self._withheld_logged:
            log.warning("ingest: the counters of %d ranks are withheld from /metrics: they were never saved to %s, "
                        "which cannot be written (goodput_ingest_state_errors_total{reason=\"unwritable\"}); each is "
                        "published from its first save on, so that a restart cannot show less than a scrape saw",
                        withheld, self.state_file.path.parent)
        elif not withheld and self._withheld_logged:
            log.info("ingest: no rank's counters are withheld any more (those of every rank shown are saved to %s)",
                     self.state_file.path.parent)
        self._withheld_logged = withheld



def saved_accounts(directory: str, step_history: int = 2000) -> dict[tuple[str, str], Account]:
    """The accounts a state directory holds (its snapshot and its journal's changes), as a restart restores them."""
    files = StateFile(directory)
    try:
        return dict(IngestState(1, 1, 1.0, state_file=files, step_history=step_history)._dormant)
    finally:
        files.close()
