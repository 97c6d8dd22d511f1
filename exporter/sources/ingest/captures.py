"""Captures: the daemon asks a workload's ranks for a flight-recorder dump and a profiler trace of their next steps
when a signal points at them (a step-time shift, a hang, a missing rank), and keeps what they wrote in check.

A trigger starts a capture only for a workload that opted in (`ingest.capture_workloads`), at most once per
`capture_interval` per workload and `capture_max_per_hour` per node, and never asks a rank that said within
`capture_interval` that it cannot. The capture gets its own directory, `<capture_dir>/<workload>/<id>`, and one
request per rank, handed out once in the response to that rank's next POST /v1/events. Each rank answers with a
`capture` event per kind; a rank that has not answered within `capture_timeout` is counted expired. Finished
captures are deleted whole, oldest first, while the directory holds more than `capture_max_bytes`.

Permissions. The daemon runs as its own (non-root) user; the ranks write as whatever user the job runs as. The
daemon creates `capture_dir` and each `<workload>` directory 0755 (only it adds to them), and each capture's
directory 1777 (world-writable and sticky, like /tmp): any rank can write its files there, no rank can delete or
replace another's, and the daemon, which owns the directory, can still delete them all when it prunes. When every
rank has answered (or expired) the directory is sealed to 0755, so that nothing lands in it afterwards. Nothing is
followed through a symbolic link: a written file must be a regular file that lies inside its capture's directory.

The index, `<capture_dir>/index.json`, lists the captures with every rank's answers; it is replaced atomically at
each change, read back at start (so that a restarted daemon keeps its rate limits, refusals, unanswered requests
and disk accounting), and set aside as `index.json.corrupt` when it cannot be parsed (logged; the daemon starts
fresh). `goodput-exporter captures` prints it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goodput_client.contract import CAPTURE_ID_PATTERN, CAPTURE_KINDS, MAX_CAPTURE_MESSAGE, workload_folder

from ...core.exposition import Batch
from . import metrics as c
from .files import remove_partials, set_aside, write_whole

if TYPE_CHECKING:
    from .models import CaptureEvent
    from .settings import IngestConfig

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"
VERSION = 1
TRIGGERS = ("step_time_shift", "hang", "rank_missing")
RESULTS = ("written", "failed", "refused", "expired")  # a rank's outcome (goodput_captures_total's result)
SKIP_REASONS = ("rate_limited", "refused_recently", "budget")
REFUSALS = ("disabled", "unsupported")  # a rank's answers that say it cannot capture
HOUR = 3600.0
MAX_PRUNED_KEPT = 64  # pruned captures remembered (id, dir), so that a late answer for one is known as such
MAX_CAPTURES_KEPT = 1000  # beyond it the oldest finished are pruned too, however small: the index stays small
WAITING = ("requested", "delivered")  # a rank's status before its outcome
OPEN_DIR_MODE = 0o1777
INDEX_ERRORS = ("corrupt", "unreadable", "unwritable")  # goodput_capture_index_errors_total's reasons
MAX_LOGGED = 1024  # once-only log lines remembered (past it they start over)
PARTIAL_SUFFIXES = (".partial", ".partial.tmp")  # what a rank leaves of a file it could not finish writing
SEALED_DIR_MODE = 0o755


class IndexProblem(Exception):
    """The index file cannot be read (`corrupt` False) or is not one this version wrote (`corrupt` True)."""

    def __init__(self, message: str, corrupt: bool) -> None:
        super().__init__(message)
        self.corrupt = corrupt


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 62, rank)


def outcome(kinds: dict[str, dict[str, Any]]) -> str:
    """A rank's outcome from its kinds' results: written if anything was, else failed, refused, expired."""
    results = {k["result"] for k in kinds.values()}
    if "written" in results:
        return "written"
    if "failed" in results:
        return "failed"
    if results & set(REFUSALS):
        return "refused"
    return "expired"


@dataclass
class Capture:
    id: str
    workload: str
    trigger: str
    detail: str
    requested_at: float
    dir: str
    ranks: dict[str, dict[str, Any]]  # rank -> {status, kinds: {kind: {result, path, bytes, message}}}
    skipped_ranks: list[str] = field(default_factory=list)  # not asked: they said they cannot, recently
    bytes: int = 0
    finished_at: float | None = None
    sealed: bool = False  # finished, its directory sealed and measured for the last time

    @property
    def finished(self) -> bool:
        return all(r["status"] not in WAITING for r in self.ranks.values())

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "workload": self.workload, "trigger": self.trigger, "detail": self.detail,
                "requested_at": self.requested_at, "dir": self.dir, "ranks": self.ranks,
                "skipped_ranks": self.skipped_ranks, "bytes": self.bytes, "finished_at": self.finished_at,
                "sealed": self.sealed}

    @classmethod
    def from_dict(cls, item: dict[str, Any], directory: str) -> Capture:
        """One entry of the index, checked: its directory must be the one this daemon would have made for it
        (the daemon deletes it when pruning)."""
        capture = cls(str(item["id"]), str(item["workload"]), str(item["trigger"]), str(item["detail"]),
                      float(item["requested_at"]), str(item["dir"]), dict(item["ranks"]),
                      [str(r) for r in item.get("skipped_ranks", [])], int(item.get("bytes", 0)),
                      None if item.get("finished_at") is None else float(item["finished_at"]),
                      bool(item.get("sealed", False)))
        if not re.fullmatch(CAPTURE_ID_PATTERN, capture.id):
            raise ValueError(f"id {capture.id!r} is not a capture id")
        expected = os.path.join(directory, workload_folder(capture.workload), capture.id)
        if capture.dir != expected:
            raise ValueError(f"capture {capture.id}: dir {capture.dir!r} is not {expected!r}")
        for rank, entry in capture.ranks.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("kinds"), dict) or \
                    entry.get("status") not in (*WAITING, *RESULTS):
                raise ValueError(f"capture {capture.id}: rank {rank!r} is malformed")
        return capture


def read_index(path: Path) -> dict[str, Any]:
    """The index file's content, checked at the top level; {} when there is none. Raises IndexProblem (unreadable,
    not JSON, not this version's)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise IndexProblem(f"cannot read {path}: {exc.strerror or exc}", corrupt=False) from None
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise IndexProblem(f"{path} is not JSON ({exc.__class__.__name__}: {exc})", corrupt=True) from None
    if not isinstance(payload, dict) or payload.get("version") != VERSION or \
            not isinstance(payload.get("captures"), list):
        raise IndexProblem(f"{path} is not a version {VERSION} capture index", corrupt=True)
    return payload


def dir_bytes(path: str) -> int:
    """Bytes of the regular files under `path`, symbolic links not followed; 0 when it is gone."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    total += dir_bytes(entry.path)
                else:
                    with contextlib.suppress(OSError):  # gone meanwhile
                        total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


class Captures:
    """Triggers, requests, answers, expiry and the disk budget of one node's captures; thread-safe (the events
    server's loop, the sources' threads)."""

    def __init__(self, directory: str, workloads: Sequence[str], *, steps: int = 10, interval: float = 1800.0,
                 max_per_hour: int = 6, max_bytes: int = 2 * 2**30, timeout: float = 600.0,
                 triggers: Sequence[str] = TRIGGERS, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.workloads = tuple(workloads)
        self.steps = steps
        self.interval = interval
        self.max_per_hour = max_per_hour
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.triggers = tuple(triggers)
        self._clock = clock
        self._lock = threading.Lock()
        self.index_path = Path(directory) / INDEX_NAME
        self._captures: dict[str, Capture] = {}  # by id, oldest first
        self._pruned: dict[str, str] = {}  # id -> dir of the last MAX_PRUNED_KEPT pruned
        self._queue: dict[tuple[str, str], list[str]] = {}  # (workload, rank) -> ids of requests not handed out
        self._refused: dict[tuple[str, str], float] = {}  # (workload, rank) -> when it said it cannot
        self._last: dict[str, float] = {}  # workload -> its last capture's start
        self._hour: deque[float] = deque()  # starts of this node's captures within the last hour
        self.results: Counter[tuple[str, str]] = Counter()  # (trigger, result)
        self.skipped: Counter[tuple[str, str]] = Counter()  # (trigger, reason)
        self.pruned = 0
        self._undeletable: set[str] = set()  # prune failed: skipped by later prunes, logged once
        self._logged: set[tuple[str, ...]] = set()  # once-only log lines
        self._write_failing = False  # the index could not be written: written again at the next collect
        self.index_errors: Counter[str] = Counter()
        try:
            os.makedirs(directory, mode=SEALED_DIR_MODE, exist_ok=True)
        except OSError as exc:
            log.error("ingest: cannot create the capture directory %s (%s); captures will fail until it exists",
                      directory, exc.strerror or exc)
        self._load()

    @classmethod
    def from_settings(cls, settings: IngestConfig) -> Captures:
        return cls(settings.capture_dir, settings.capture_workloads, steps=settings.capture_steps,
                   interval=settings.capture_interval, max_per_hour=settings.capture_max_per_hour,
                   max_bytes=settings.capture_max_bytes, timeout=settings.capture_timeout,
                   triggers=settings.capture_triggers)

    # --- the index ---

    def _load(self) -> None:
        remove_partials(self.index_path)  # left by a daemon killed mid-write
        try:
            payload = read_index(self.index_path)
        except IndexProblem as exc:
            if exc.corrupt:
                self._set_aside(str(exc), partly=False)
            else:
                self.index_errors["unreadable"] += 1
                log.error("ingest: %s; the capture index starts fresh", exc)
            return
        if not payload:
            return
        problems = []
        now = self._clock()
        for item in payload["captures"]:
            try:
                capture = Capture.from_dict(item, self.directory)
                self._captures[capture.id] = capture
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                problems.append(f"{exc.__class__.__name__}: {exc}")
        try:
            for capture_id, directory in payload.get("pruned", [])[-MAX_PRUNED_KEPT:]:
                if os.path.dirname(os.path.dirname(directory)) != self.directory or \
                        os.path.basename(directory) != capture_id:
                    raise ValueError(f"pruned capture {capture_id!r}: {directory!r} is not its directory")
                self._pruned[str(capture_id)] = str(directory)
            rate = payload.get("rate", {})
            self._last = {str(w): float(t) for w, t in rate.get("last", {}).items() if now - float(t) < self.interval}
            self._hour = deque(sorted(float(t) for t in rate.get("hour", []) if now - float(t) < HOUR))
            self._refused = {(str(w), str(r)): float(t) for w, r, t in payload.get("refused", [])
                             if now - float(t) < self.interval}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"{exc.__class__.__name__}: {exc}")
        for capture in self._captures.values():  # requests not handed out before the restart: handed out now
            for rank, entry in sorted(capture.ranks.items()):
                if entry["status"] == "requested":
                    self._queue.setdefault((capture.workload, rank), []).append(capture.id)
        if problems:
            self._set_aside(f"{len(problems)} malformed part(s), the first: {problems[0]}", partly=True)
        log.info("ingest: %d captures in %s", len(self._captures), self.index_path)

    def _set_aside(self, problem: str, partly: bool) -> None:
        self.index_errors["corrupt"] += 1
        aside = set_aside(self.index_path, partly)
        log.error("ingest: the capture index %s is corrupt (%s), kept as %s; %s", self.index_path, problem, aside,
                  "the rest of it is used" if partly else "it starts fresh")

    def _write(self) -> None:
        """Replace the index atomically (caller holds the lock); a failure is logged and retried at the next
        change."""
        now = self._clock()
        self._last = {w: t for w, t in self._last.items() if now - t < self.interval}  # what still matters
        self._refused = {k: t for k, t in self._refused.items() if now - t < self.interval}
        payload = {
            "version": VERSION,
            "captures": [capture.to_dict() for capture in self._captures.values()],
            "pruned": [[capture_id, directory] for capture_id, directory in self._pruned.items()],
            "rate": {"last": self._last, "hour": [t for t in self._hour if now - t < HOUR]},
            "refused": [[w, r, t] for (w, r), t in self._refused.items()],
        }
        data = json.dumps(payload, indent=1, allow_nan=False)
        try:
            write_whole(self.index_path, data, mode=0o644, sync=True)  # anyone on the node may list the captures
        except OSError as exc:
            self.index_errors["unwritable"] += 1
            (log.debug if self._write_failing else log.error)(
                "ingest: cannot write the capture index %s (%s); written again at the next collect until it is",
                self.index_path, exc)
            self._write_failing = True
            return
        if self._write_failing:
            log.info("ingest: the capture index %s is written again", self.index_path)
            self._write_failing = False

    def _once(self, key: tuple[str, ...], level: int, message: str, *args: object) -> None:
        if key not in self._logged:
            if len(self._logged) >= MAX_LOGGED:
                self._logged.clear()
            self._logged.add(key)
            log.log(level, message, *args)

    # --- triggers and requests ---

    def opted_in(self, workload: str) -> bool:
        return any(fnmatch.fnmatchcase(workload, pattern) for pattern in self.workloads)

    def trigger(self, workload: str, ranks: Iterable[str], trigger: str, detail: str) -> str | None:
        """Ask `ranks` of `workload` for a capture: its id, or None when none was started (not opted in, trigger
        off, rate-limited, every rank refused recently, over the budget; counted or logged, never silent)."""
        now = self._clock()
        with self._lock:
            if trigger not in self.triggers:
                self._once(("trigger", trigger), logging.INFO, "ingest: %s does not start captures "
                           "(ingest.capture_triggers: %s)", trigger, ", ".join(self.triggers) or "none")
                return None
            if not self.opted_in(workload):
                self._once(("workload", workload), logging.INFO, "ingest: %s of workload %s starts no capture: it "
                           "did not opt in (ingest.capture_workloads)", trigger, workload)
                return None
            named = {str(r) for r in ranks}
            bad = sorted(r for r in named if not (r.isascii() and r.isdigit()))
            if bad:
                log.warning("ingest: %s of %s names ranks that are not numbers (%s); they are not asked", trigger,
                            workload, ", ".join(bad))
            wanted = sorted({str(int(r)) for r in named if r not in bad}, key=_rank_order)  # "07" is rank 7
            if not wanted:
                log.info("ingest: %s of %s (%s) names no rank on this node to ask", trigger, workload, detail)
                return None
            asked = [r for r in wanted if now - self._refused.get((workload, r), -1e18) >= self.interval]
            if not asked:
                self.skipped[(trigger, "refused_recently")] += 1
                return None
            while self._hour and now - self._hour[0] >= HOUR:
                self._hour.popleft()
            if now - self._last.get(workload, -1e18) < self.interval or len(self._hour) >= self.max_per_hour:
                self.skipped[(trigger, "rate_limited")] += 1
                return None
            if sum(cap.bytes for cap in self._captures.values() if not cap.finished) >= self.max_bytes:
                self.skipped[(trigger, "budget")] += 1
                return None
            self._last[workload] = now
            self._hour.append(now)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
            capture_id = f"{stamp}-{trigger}-{secrets.token_hex(3)}"
            directory = os.path.join(self.directory, workload_folder(workload), capture_id)
            try:
                os.makedirs(os.path.dirname(directory), mode=SEALED_DIR_MODE, exist_ok=True)
                os.mkdir(directory)
                os.chmod(directory, OPEN_DIR_MODE)  # not through mkdir's mode: the umask would take from it
            except OSError as exc:
                log.error("ingest: cannot create the capture directory %s (%s); %s of %s captures nothing",
                          directory, exc.strerror or exc, trigger, workload)
                why = f"the daemon cannot create the capture directory: {exc.strerror or exc}"[:MAX_CAPTURE_MESSAGE]
                failed = {"result": "failed", "path": "", "bytes": 0, "message": why}
                self._captures[capture_id] = Capture(
                    capture_id, workload, trigger, detail, now, directory,
                    {r: {"status": "failed", "kinds": {k: dict(failed) for k in CAPTURE_KINDS}} for r in asked},
                    skipped_ranks=[r for r in wanted if r not in asked], finished_at=now, sealed=True)
                self.results[(trigger, "failed")] += len(asked)
                self._write()  # listed as failed, with the rate limits it used
                return None
            capture = Capture(capture_id, workload, trigger, detail, now, directory,
                              {r: {"status": "requested", "kinds": {}} for r in asked},
                              skipped_ranks=[r for r in wanted if r not in asked])
            self._captures[capture_id] = capture
            for rank in asked:
                self._queue.setdefault((workload, rank), []).append(capture_id)
            self._write()
        log.info("ingest: capture %s of %s ranks %s (%s: %s) in %s", capture_id, workload, ",".join(asked), trigger,
                 detail, directory)
        return capture_id

    def has_pending(self) -> bool:
        return bool(self._queue)  # a dict's truth is read atomically: the events server's fast path

    def pending(self, keys: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
        """Hand out (once) the requests waiting for these (workload, rank) keys."""
        if not self._queue:
            return []
        now = self._clock()
        out = []
        with self._lock:
            for workload, rank in sorted(set(keys)):
                for capture_id in self._queue.pop((workload, rank), []):
                    capture = self._captures.get(capture_id)
                    if capture is None or capture.ranks[rank]["status"] != "requested":
                        continue  # expired or pruned meanwhile
                    if now - capture.requested_at >= self.timeout:
                        continue  # too late to ask: the next expire() counts it
                    capture.ranks[rank]["status"] = "delivered"
                    capture.ranks[rank]["delivered_at"] = now
                    out.append({"id": capture_id, "workload": workload, "rank": int(rank), "kinds": list(CAPTURE_KINDS),
                                "steps": self.steps, "dir": capture.dir})
            if out:
                self._write()
        return out

    # --- answers ---

    def answer(self, event: CaptureEvent) -> None:
        """Record a rank's answer for one kind; an answer for a capture this daemon does not know, or from a rank
        it did not ask, is logged and changes nothing."""
        now = self._clock()
        rank = str(event.rank)
        with self._lock:
            capture = self._captures.get(event.id)
            if capture is None:
                self._unknown(event)
                return
            entry = capture.ranks.get(rank)
            if entry is None or event.workload != capture.workload:
                self._once(("stranger", event.id, event.workload, rank), logging.WARNING,
                           "ingest: capture answer from %s rank %s for %s, which asked %s ranks %s; ignored",
                           event.workload, rank, event.id, capture.workload, ",".join(capture.ranks))
                return
            if event.kind in entry["kinds"] and entry["kinds"][event.kind]["result"] != "expired":
                log.info("ingest: capture %s: rank %s answered %s twice; the first answer (%s) is kept", event.id,
                         rank, event.kind, entry["kinds"][event.kind]["result"])
                return
            record = self._record(capture, event)
            entry["kinds"][event.kind] = record
            if record["result"] == "disabled":  # the whole client said no: not asked again for a while
                self._refused[(capture.workload, rank)] = now
            if entry["status"] in WAITING:
                if entry["status"] == "requested":  # answered before it was handed out: a restarted client's
                    self._unqueue(capture, rank)
                    entry["status"] = "delivered"
                if all(kind in entry["kinds"] for kind in CAPTURE_KINDS):
                    self._decide(capture, rank, now)
            else:
                log.info("ingest: capture %s: rank %s answered %s (%s) after its outcome (%s) was counted; indexed "
                         "only", event.id, rank, event.kind, record["result"], entry["status"])
                capture.sealed = False  # measured again: it may have written after all
            self._write()

    def _unknown(self, event: CaptureEvent) -> None:
        pruned = self._pruned.get(event.id)  # its directory
        if pruned is None:
            self._once(("unknown", event.id), logging.WARNING,
                       "ingest: %s rank %s answered capture %s (%s: %s), which this daemon never asked for; ignored",
                       event.workload, event.rank, event.id, event.kind, event.result)
            return
        again = os.path.lexists(pruned)  # a rank running as root may have made it again
        log.info("ingest: %s rank %s answered capture %s (%s: %s) after it was pruned%s", event.workload, event.rank,
                 event.id, event.kind, event.result, "; what it wrote is deleted" if again else "")
        if again:
            shutil.rmtree(pruned, ignore_errors=True)

    def _record(self, capture: Capture, event: CaptureEvent) -> dict[str, Any]:
        record: dict[str, Any] = {"result": event.result, "path": event.path, "bytes": 0, "message": event.message}
        if event.result != "written":
            return record
        problem = self._check_file(capture.dir, event.path)
        if problem is None:
            record["bytes"] = os.lstat(event.path).st_size
            if record["bytes"] != event.bytes:
                log.debug("ingest: capture %s: %s holds %d bytes, the rank said %d", capture.id, event.path,
                          record["bytes"], event.bytes)
            return record
        log.warning("ingest: capture %s: rank %s's %s is not counted as written: %s", capture.id, event.rank,
                    event.kind, problem)
        said = f"{problem} (the rank said: {event.message})" if event.message else problem
        record.update(result="failed", message=said[:MAX_CAPTURE_MESSAGE])
        return record

    @staticmethod
    def _check_file(directory: str, path: str) -> str | None:
        """Why `path` is not a file written into the capture's `directory`, or None."""
        if not path:
            return "no path given"
        if not os.path.isabs(path):
            return f"path {path!r} is not absolute"
        try:
            real = os.path.realpath(path)
            inside = os.path.realpath(directory)
            if os.path.commonpath([real, inside]) != inside or real == inside:
                return f"path {path!r} lies outside the capture's directory {directory}"
            info = os.lstat(path)
        except FileNotFoundError:
            return f"no file at {path!r}"
        except (OSError, ValueError) as exc:
            return f"cannot check {path!r}: {exc}"
        if not stat.S_ISREG(info.st_mode):
            return f"{path!r} is not a regular file"
        return None

    def _unqueue(self, capture: Capture, rank: str) -> None:
        queued = self._queue.get((capture.workload, rank))
        if queued and capture.id in queued:
            queued.remove(capture.id)
            if not queued:
                del self._queue[(capture.workload, rank)]

    def _decide(self, capture: Capture, rank: str, now: float) -> None:
        """Count the rank's outcome; seal the capture when it was the last (caller holds the lock)."""
        entry = capture.ranks[rank]
        entry["status"] = result = outcome(entry["kinds"])
        self.results[(capture.trigger, result)] += 1
        if result == "refused":
            self._refused[(capture.workload, rank)] = now
            log.info("ingest: %s rank %s cannot capture (%s); not asked again for %gs", capture.workload, rank,
                     "; ".join(f"{k}: {v['message'] or v['result']}" for k, v in sorted(entry["kinds"].items())),
                     self.interval)
        if capture.finished:
            capture.finished_at = now
            self._remove_partials(capture)
            try:
                os.chmod(capture.dir, SEALED_DIR_MODE)
            except OSError as exc:
                log.warning("ingest: cannot seal the capture directory %s: %s", capture.dir, exc.strerror or exc)
            log.info("ingest: capture %s finished: %s", capture.id,
                     ", ".join(f"rank {r} {e['status']}" for r, e in sorted(capture.ranks.items(),
                                                                          key=lambda i: _rank_order(i[0]))))

    @staticmethod
    def _remove_partials(capture: Capture) -> None:
        """Delete what ranks left of files they could not finish (a full disk, a rank killed mid-write): the daemon
        owns the capture's directory, so it may, sticky bit or not."""
        try:
            with os.scandir(capture.dir) as entries:
                stale = [e.path for e in entries
                         if e.name.endswith(PARTIAL_SUFFIXES) and e.is_file(follow_symlinks=False)]
        except OSError:
            return
        for path in stale:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if stale:
            log.info("ingest: capture %s: removed %d unfinished file(s) the ranks left", capture.id, len(stale))

    # --- expiry, the disk budget, metrics ---

    def expire(self, now: float | None = None) -> None:
        """Ranks that have not answered within capture_timeout of the request: their missing kinds expired."""
        now = self._clock() if now is None else now
        with self._lock:
            changed = False
            for capture in self._captures.values():
                if capture.finished or now - capture.requested_at < self.timeout:
                    continue
                for rank, entry in sorted(capture.ranks.items()):
                    if entry["status"] not in WAITING:
                        continue
                    self._unqueue(capture, rank)
                    for kind in CAPTURE_KINDS:
                        entry["kinds"].setdefault(kind, {"result": "expired", "path": "", "bytes": 0,
                                                         "message": f"no answer within {self.timeout:g}s"})
                    self._decide(capture, rank, now)
                    changed = True
            self._last = {w: t for w, t in self._last.items() if now - t < self.interval}  # what still matters
            self._refused = {k: t for k, t in self._refused.items() if now - t < self.interval}
            if changed or self._write_failing:  # a write that failed (a full disk) is tried again until it is done
                self._write()

    def close(self) -> None:
        """At shutdown: the index written, if its last write failed."""
        with self._lock:
            if self._write_failing:
                self._write()

    def prune(self) -> None:
        """Measure the captures on disk, then delete the oldest finished ones (whole) while they hold more than
        capture_max_bytes (or are more than MAX_CAPTURES_KEPT). Disk work runs outside the lock."""
        with self._lock:
            measure = [(cap.id, cap.dir, cap.finished) for cap in self._captures.values() if not cap.sealed]
        sizes = {capture_id: (dir_bytes(directory), finished) for capture_id, directory, finished in measure}
        changed = False
        with self._lock:
            for capture_id, (size, finished) in sizes.items():
                capture = self._captures.get(capture_id)
                if capture is not None:
                    changed |= capture.bytes != size or finished
                    capture.bytes = size
                    capture.sealed = finished  # a finished capture's size no longer changes
            total = sum(cap.bytes for cap in self._captures.values())
            kept = len(self._captures)
            victims = []
            for capture in self._captures.values():  # oldest first
                if total <= self.max_bytes and kept <= MAX_CAPTURES_KEPT:
                    break
                if capture.finished and capture.id not in self._undeletable:
                    victims.append(capture)
                    total -= capture.bytes
                    kept -= 1
        if not victims:
            if changed:
                with self._lock:
                    self._write()
            return
        gone = []
        for capture in victims:
            try:
                shutil.rmtree(capture.dir)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("ingest: cannot delete the capture %s (%s): %s; it is left, newer ones are pruned instead",
                          capture.id, capture.dir, exc)
                with self._lock:
                    self._undeletable.add(capture.id)
                    capture.sealed = False  # measured again: part of it may be gone
                continue
            gone.append(capture)
        with self._lock:
            for capture in gone:
                self._captures.pop(capture.id, None)
                self._pruned[capture.id] = capture.dir
                self.pruned += 1
            while len(self._pruned) > MAX_PRUNED_KEPT:
                del self._pruned[next(iter(self._pruned))]
            self._write()
        if gone:
            log.info("ingest: pruned %d capture(s) to stay within ingest.capture_max_bytes=%d: %s", len(gone),
                     self.max_bytes, ", ".join(cap.id for cap in gone))

    @property
    def running(self) -> bool:
        """Whether a capture waits for answers (sources may sample faster meanwhile)."""
        with self._lock:
            return any(not cap.finished for cap in self._captures.values())

    def render(self, batch: Batch) -> None:
        with self._lock:
            for trigger in TRIGGERS:
                for result in RESULTS:
                    batch.add(c.CAPTURES, (trigger, result), self.results[(trigger, result)])
                for reason in SKIP_REASONS:
                    batch.add(c.CAPTURE_SKIPPED, (trigger, reason), self.skipped[(trigger, reason)])
            batch.add(c.CAPTURE_BYTES, (), sum(cap.bytes for cap in self._captures.values()))
            batch.add(c.CAPTURES_PRUNED, (), self.pruned)
            for reason in INDEX_ERRORS:
                batch.add(c.CAPTURE_INDEX_ERRORS, (reason,), self.index_errors[reason])
