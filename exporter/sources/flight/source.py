"""The flight source: PyTorch flight-recorder dumps in a directory -> collective metrics.

Where dumps are looked for (`flight.dir`, `flight.prefixes`):

    DIR/<workload>/<prefix><rank>[.pkl|.json]    one folder per training job
    DIR/<prefix><rank>[.pkl|.json]               workload "default"

`<prefix>` is any of `flight.prefixes`, by default PyTorch's own `comm_lib_trace_rank_` and its earlier
`nccl_trace_rank_`; where several fit a name (one prefix begins another and ends in a digit), the
longest wins. Hidden files and names ending in .partial or .tmp are a writer's temporary files and are
skipped; any other file that does not follow the pattern is rejected as bad_name.

PyTorch writes its own dump (NCCL's dump on a timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1, or on a write
to the TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe) through c10d's DebugInfoWriter, to the file named by
TORCH_FR_DUMP_TEMP_FILE (formerly TORCH_NCCL_DEBUG_INFO_TEMP_FILE) followed by the global rank, with
no extension: a pickle. Unset, that prefix is `$XDG_CACHE_HOME/torch/comm_lib_trace_rank_` (else
`$HOME/.cache/torch/...`), where this source does not look. So set, in the job's environment before
it starts, for each workload:

    TORCH_FR_DUMP_TEMP_FILE=<flight.dir>/<workload>/comm_lib_trace_rank_

and create that folder (PyTorch creates only its default one). Rank 3 then writes
`<flight.dir>/<workload>/comm_lib_trace_rank_3`, the same file as the periodic dumps of
`goodput_client.Telemetry.dump_flight_recorder(<flight.dir>)` (its folder is the workload's name with
characters other than letters, digits and `-_.` as `_`), so a hang's dump replaces the last periodic
one, and each folder is also valid `torchfrtrace` input. Periodic dumps of your own belong there
too, at `${TORCH_FR_DUMP_TEMP_FILE}<rank>`: `_dump_nccl_trace()` and `_dump_fr_trace()` only return
the bytes, and the caller names the file. Do not set TORCH_FR_DUMP_DYNAMIC_FILE_NAME: with it PyTorch
writes to the variable's value itself, without the rank. A CPU-only PyTorch (gloo) writes no dump
file of its own at all.

A file is read again only when it changes (inode, size or mtime). A file not rewritten for flight.stale_after
is a rank gone: its series and state end (the file itself is left where it is) until it is written again. So does a
dump written before its rank's process ended, as the ingest source knows it (`Node.rank_ends`: at once when the
process that reported for the rank over the events socket exited, a minute after the rank's `end` event): the dump
of a rank that is gone, until a newer one is written (a rank started again). Dumps that keep changing keep their
rank.
A bad version of a file is counted once in goodput_flight_recorder_rejected_total and logged once; a file that
looks half-written (empty, or ending early) is first retried for PARTIAL_WRITE_GRACE seconds. Until a good version
replaces it, the rank keeps the series of its last good dump, and its dump timestamp ages.

Nothing below flight.dir is reached through a symbolic link (`tree`): a symbolic link there, to a
folder or a file, is rejected as `symlink`, and flight.dir itself is refused when it is one (source
error `dir_symlink`) unless flight.follow_dir_symlink is set.

A parser process that dies without replying (the OOM killer, which it volunteers for) tells nothing
about the file: the file is tried again PARSER_RETRY_AFTER seconds later, then twice as long after each
death, PARSER_TRIES times in all, before it is rejected as `parser_died`. NCCL writes its dump on a
timeout once; losing it to memory pressure elsewhere on the node would lose the hang's evidence.

All dumps together export at most flight.max_series series (the source's own included): the
missing-rank series first, then each rank's series, most recently written dump first; a rank whose
series do not fit in what is left is withheld (counted once per version as `too_many_series`, logged,
shown in goodput_flight_recorder_withheld_files) and keeps its counters for when it fits again.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from goodput_client.contract import workload_from_folder

from ...core.exposition import Batch
from ..base import Source, SourceError
from . import metrics as c
from .accounting import Prior, Summary
from .analysis import RankDump, missing_ranks
from .load import MAYBE_PARTIAL, REASONS, Rejected
from .schema import Dump
from .settings import FlightConfig
from .tree import DirRefused, DumpDir, Vanished, refusal
from .worker import ParserDied, ParseWorker

log = logging.getLogger(__name__)

DEFAULT_WORKLOAD = "default"
PARTIAL_WRITE_GRACE = 10.0
PARSER_TRIES = 4  # reads of one version of a file that the parser may die in before it is rejected
PARSER_RETRY_AFTER = 2.0  # seconds after the first death; doubled after each further one
LOG_LINES_PER_PASS = 10
_TEMPORARY = (".partial", ".tmp", "~")
_RANK = re.compile(r"(\d{1,9})(?:\.pkl|\.json)?")  # what follows the prefix in a dump file's name
_HISTOGRAM_SERIES = len(c.COLLECTIVE_BUCKETS) + 3  # its buckets, +Inf, _sum and _count
_OWN_SERIES = len(REASONS) + 4  # rejected by reason, files, series, withheld files, parser deaths

FileKey = tuple[int, int, int]  # inode, size, mtime_ns: a version of a file


def _key(st: os.stat_result) -> FileKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class _Found:
    path: str  # for logs and as the file's identity: flight.dir/[folder/]name
    folder: str | None  # the workload folder's name in flight.dir; None: flight.dir itself
    name: str
    workload: str
    rank: int
    st: os.stat_result  # as listed (lstat: never followed)

    @property
    def key(self) -> FileKey:
        return _key(self.st)


@dataclass(frozen=True, slots=True)
class _Retry:
    """A version of a file the parser died on: how many times, and when to try it again."""

    key: FileKey
    deaths: int
    at: float


class _RankState:
    """What one rank's dumps have shown so far: the last good dump's groups and in-flight ops, and
    the counters merged from every dump's summary."""

    def __init__(self, workload: str, rank: int) -> None:
        self.workload = workload
        self.rank = rank
        self.path = ""  # the file last read for this rank
        self.key: FileKey | None = None
        self.dump: Dump | None = None  # groups and in-flight entries of the last good dump
        self.waiting: dict[str, list[int]] = {}  # pg -> time_created_ns of its in-flight ops
        self.written = 0.0
        self.series = 0  # what render() adds, counted as Prometheus counts series
        self._reset()

    def _reset(self) -> None:
        self.prior = Prior()
        self.ops: Counter[tuple[str, str]] = Counter()
        self.bytes: Counter[tuple[str, str]] = Counter()
        self.durations: dict[tuple[str, str], list[int]] = {}
        self.duration_sums: Counter[tuple[str, str]] = Counter()
        self.lost = 0

    def absorb(self, summary: Summary, written: float, path: str, key: FileKey) -> None:
        if summary.restarted:
            log.info("flight: %s rank %d restarted (its record ids began again); counters restart",
                     self.workload, self.rank)
            self._reset()
        self.ops.update(summary.ops)
        self.bytes.update(summary.bytes)
        self.duration_sums.update(summary.duration_sums)
        for group, counts in summary.durations.items():
            mine = self.durations.setdefault(group, [0] * len(counts))
            for i, count in enumerate(counts):
                mine[i] += count
        self.lost += summary.lost
        self.prior = summary.prior
        self.waiting = {}
        for entry in summary.inflight:
            self.waiting.setdefault(entry.pg, []).append(entry.created_ns)
        self.dump = Dump(summary.version, summary.inflight, summary.groups)
        self.written, self.path, self.key = written, path, key
        self.series = self._count()

    def _count(self) -> int:
        """The series render() adds, without rendering them (a state left out by max_series costs nothing)."""
        count = 2  # dump timestamp, entries lost
        for group in self.dump.groups.values() if self.dump is not None else ():
            count += 5 + (group.started is not None and group.started >= 0)  # info, seqs, inflight, oldest
        return count + 2 * len(self.ops) + _HISTOGRAM_SERIES * len(self.durations)

    def oldest_inflight(self, pg: str) -> float:
        """Seconds the oldest collective of `pg` still in flight had waited when the dump was written; 0: none."""
        waiting = self.waiting.get(pg, ())
        return max(0.0, self.written - min(waiting) / 1e9) if waiting else 0.0

    def render(self, batch: Batch) -> None:
        labels = (self.workload, str(self.rank))
        batch.add(c.FR_DUMP_TIMESTAMP, labels, self.written)
        batch.add(c.FR_ENTRIES_LOST, labels, self.lost)
        dump = self.dump
        if dump is None:
            return
        for name, group in sorted(dump.groups.items()):
            pg = (*labels, name)
            batch.add(c.COLLECTIVE_GROUP_INFO, (*pg, group.desc), 1)
            batch.add(c.COLLECTIVE_LAST_SEQ, (*pg, "enqueued"), max(group.enqueued or 0, 0))
            if group.started is not None and group.started >= 0:
                batch.add(c.COLLECTIVE_LAST_SEQ, (*pg, "started"), group.started)
            batch.add(c.COLLECTIVE_LAST_SEQ, (*pg, "completed"), max(group.completed or 0, 0))
            batch.add(c.COLLECTIVE_INFLIGHT, pg, len(self.waiting.get(name, ())))
            batch.add(c.COLLECTIVE_OLDEST_INFLIGHT, pg, self.oldest_inflight(name))
        for (name, op), count in sorted(self.ops.items()):
            batch.add(c.COLLECTIVE_OPS, (*labels, name, op), count)
            batch.add(c.COLLECTIVE_BYTES, (*labels, name, op), self.bytes[(name, op)])
        for (name, op), counts in sorted(self.durations.items()):
            cumulative, running = [], 0
            for count in counts:
                running += count
                cumulative.append(running)
            batch.add(c.COLLECTIVE_DURATION, (*labels, name, op), (cumulative, self.duration_sums[(name, op)]))


class _Reporter:
    """Logs each rejection once, at most LOG_LINES_PER_PASS lines a pass, then one summary line."""

    def __init__(self) -> None:
        self.lines = 0
        self.suppressed = 0

    def reject(self, path: str, reason: str, message: str) -> None:
        if self.lines < LOG_LINES_PER_PASS:
            self.lines += 1
            log.warning("flight: rejected %s (%s): %s", path, reason, message)
        else:
            self.suppressed += 1

    def finish(self) -> None:
        if self.suppressed:
            log.warning("flight: %d more files rejected this pass (goodput_flight_recorder_rejected_total "
                        "counts them by reason)", self.suppressed)


class FlightSource(Source):
    name = "flight"

    def __init__(self, config: FlightConfig, clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(config.dir)
        self.follow_dir_symlink = config.follow_dir_symlink
        self.max_file_bytes = config.max_file_bytes
        self.max_files = config.max_files
        self.max_series = config.max_series
        self.grace = config.rank_missing_after
        self.hang_after = config.hang_after
        self.stale_after = config.stale_after
        # asks the workload's ranks for captures on a hang or a missing rank (Node.captures); None: off
        self.on_trouble: Callable[[str, list[str], str, str], object] | None = None
        self._troubles: set[tuple[object, ...]] = set()  # what was already acted on: once per dump or gap
        # (workload, rank) -> when its process was found ended (Node.rank_ends, ingest's); None: not known here
        self.rank_ends: Callable[[], dict[tuple[str, str], float]] | None = None
        self._ended: dict[str, FileKey] = {}  # versions of files written before their rank's process ended
        self._parser = ParseWorker(config.max_file_bytes, timeout=config.timeout)
        self._clock = clock
        self._prefixes = sorted(config.prefixes, key=len, reverse=True)  # the longest that fits wins
        self._pattern = " or ".join(f"{prefix}<rank>[.pkl|.json]" for prefix in config.prefixes)
        if config.prefix:
            log.warning("flight: flight.prefix (GOODPUT_FLIGHT_PREFIX, --flight.prefix) is deprecated and goes "
                        "away in the next release: set flight.prefixes instead; reading %s", self._pattern)
        self._states: dict[tuple[str, int], _RankState] = {}
        self._failed: dict[str, FileKey] = {}  # the version of a file already counted as rejected
        self._over: set[str] = set()  # files already counted as over max_files, or as bad names
        self._retries: dict[str, _Retry] = {}  # versions of files the parser died on, to read again
        self._withheld: dict[str, FileKey] = {}  # versions of files already counted as over max_series
        self._gaps_cut = 0  # missing-rank series left out by max_series, last pass
        self.rejected: Counter[str] = Counter()
        self.parser_deaths = 0
        self._dir_state: str | None = None  # logged once per change: "missing", "ok", or an error

    # --- finding the files ------------------------------------------------------------------------

    def _note_dir(self, state: str, message: str = "") -> None:
        if state != self._dir_state:
            if state == "missing":
                log.warning("flight: %s does not exist (yet); no flight-recorder dumps to read", self.dir)
            elif state == "ok" and self._dir_state is not None:
                log.info("flight: reading dumps in %s", self.dir)
            elif state != "ok":
                log.warning("flight: %s", message)
            self._dir_state = state

    def _open(self) -> DumpDir | None:
        """flight.dir, open for this pass; None when it does not exist. Raises SourceError when it is refused."""
        try:
            root = DumpDir.open(self.dir, self.follow_dir_symlink)
        except DirRefused as exc:
            self._note_dir(exc.reason, str(exc))
            raise SourceError(exc.reason, str(exc)) from None
        if root is None:
            self._note_dir("missing")
            return None
        self._note_dir("ok")
        return root

    def _scan(self, root: DumpDir, report: _Reporter, seen: set[str]) -> list[_Found]:
        """Candidate dump files; `seen` receives every path looked at, good or bad."""
        try:
            top = root.listing()
        except (Rejected, Vanished) as exc:
            self._note_dir("error", f"cannot list {self.dir}: {exc}")
            raise SourceError("dir_unreadable", f"cannot list {self.dir}: {exc}") from None
        found: list[_Found] = []
        for name, st in top:
            path = str(self.dir / name)
            seen.add(path)
            if stat.S_ISDIR(st.st_mode):
                try:
                    inner = root.listing(name)
                except Vanished:
                    continue
                except Rejected as exc:
                    self._reject_once(path, exc.reason, str(exc), report)
                    continue
                for item, item_st in inner:
                    item_path = f"{path}/{item}"
                    seen.add(item_path)
                    self._consider(item_path, name, item, item_st, found, report)
            elif stat.S_ISLNK(st.st_mode) and not name.endswith(_TEMPORARY):
                # a workload folder or a dump, either way never followed
                link = refusal(st.st_mode)
                self._reject_once(path, link.reason, str(link), report)
            else:
                self._consider(path, None, name, st, found, report)
        return found

    def _consider(self, path: str, folder: str | None, name: str, st: os.stat_result, found: list[_Found],
                  report: _Reporter) -> None:
        if name.endswith(_TEMPORARY):
            return
        rank = self._rank(name)
        if rank is None:
            if stat.S_ISLNK(st.st_mode):
                link = refusal(st.st_mode)
                self._reject_once(path, link.reason, str(link), report)
            elif not stat.S_ISDIR(st.st_mode):
                self._reject_once(path, "bad_name", f"not named {self._pattern} (flight.prefixes)", report)
            return
        # the folder as the client names it (goodput_client.workload_folder): read back as the workload's name
        found.append(_Found(path, folder, name, workload_from_folder(folder) if folder else DEFAULT_WORKLOAD, rank, st))

    def _rank(self, name: str) -> int | None:
        """The rank in a dump file's name, after the longest prefix the rest of the name fits; None if none."""
        for prefix in self._prefixes:
            if name.startswith(prefix):
                match = _RANK.fullmatch(name, len(prefix))
                if match is not None:
                    return int(match.group(1))
        return None

    def _reject_once(self, path: str, reason: str, message: str, report: _Reporter) -> None:
        """For rejections tied to a path rather than to a version of its content."""
        if path not in self._over:
            self._over.add(path)
            self.rejected[reason] += 1
            report.reject(path, reason, message)

    def _select(self, found: list[_Found], report: _Reporter) -> list[_Found]:
        """Newest first, one file per (workload, rank), at most max_files."""
        found.sort(key=lambda f: f.st.st_mtime_ns, reverse=True)
        chosen: dict[tuple[str, int], _Found] = {}
        for item in found:
            slot = (item.workload, item.rank)
            if slot in chosen:
                self._reject_once(item.path, "duplicate_rank", f"rank {item.rank} of {item.workload} already "
                                  f"has the newer dump {chosen[slot].path}", report)
            elif len(chosen) >= self.max_files:
                self._reject_once(item.path, "too_many_files", f"more than flight.max_files={self.max_files} "
                                  "dump files; the most recently written are read", report)
            else:
                chosen[slot] = item
        return list(chosen.values())

    # --- reading one file -------------------------------------------------------------------------

    def _read(self, root: DumpDir, item: _Found, prior: Prior) -> tuple[Summary, os.stat_result]:
        """The summary of the file's current version, and its fstat. Raises Rejected, Vanished or ParserDied."""
        if not stat.S_ISREG(item.st.st_mode):
            raise refusal(item.st.st_mode)  # not even opened: opening a device or a FIFO can do things
        if item.st.st_size > self.max_file_bytes:
            raise Rejected("too_large", f"{item.st.st_size} bytes, over flight.max_file_bytes="
                           f"{self.max_file_bytes}")
        data, st = root.read(item.folder, item.name, self.max_file_bytes)
        return self._parser.summarize(data, prior), st

    def _update(self, root: DumpDir, item: _Found, now: float, report: _Reporter) -> None:
        slot = (item.workload, item.rank)
        state = self._states.get(slot)
        if state is not None and state.path == item.path and state.key == item.key:
            return  # unchanged since the last read
        if self._failed.get(item.path) == item.key:
            return  # this version was rejected already, and counted
        retry = self._retries.get(item.path)
        if retry is not None and retry.key != item.key:
            retry = None  # a new version: a fresh set of tries
        if retry is not None and now < retry.at:
            return  # the parser died on it: wait before the next try
        try:
            summary, st = self._read(root, item, state.prior if state is not None else Prior())
        except Vanished:
            return  # replaced or removed since the listing: the next pass sees what is there
        except ParserDied as died:
            self.parser_deaths += 1
            deaths = 1 if retry is None else retry.deaths + 1
            if deaths < PARSER_TRIES:
                delay = PARSER_RETRY_AFTER * 2 ** (deaths - 1)
                self._retries[item.path] = _Retry(item.key, deaths, now + delay)
                log.warning("flight: %s: %s; reading it again in %gs (try %d of %d)", item.path, died, delay,
                            deaths + 1, PARSER_TRIES)
                return
            self._retries.pop(item.path, None)
            self._reject(item, Rejected("parser_died", f"{died}; it died on all {PARSER_TRIES} tries"), report)
            return
        except Exception as error:  # whatever a file provokes, it is a bad file, not a broken source
            if isinstance(error, Rejected):
                rejected = error
            else:
                log.debug("flight: reading %s failed", item.path, exc_info=error)
                rejected = Rejected("corrupt", f"reading it failed ({error.__class__.__name__})")
            if rejected.reason in MAYBE_PARTIAL and now - item.st.st_mtime < PARTIAL_WRITE_GRACE:
                return  # probably still being written: try again next pass, count nothing yet
            self._retries.pop(item.path, None)
            self._reject(item, rejected, report)
            return
        self._retries.pop(item.path, None)
        if state is None:  # keyed by rank, not path: a rank whose file is renamed keeps its counters
            state = self._states[slot] = _RankState(item.workload, item.rank)
        state.absorb(summary, st.st_mtime, item.path, _key(st))
        self._failed.pop(item.path, None)

    def _reject(self, item: _Found, rejected: Rejected, report: _Reporter) -> None:
        self._failed[item.path] = item.key
        self.rejected[rejected.reason] += 1
        report.reject(item.path, rejected.reason, str(rejected))

    # --- the collection -------------------------------------------------------------------------

    def collect(self) -> Batch:
        now = self._clock()
        report = _Reporter()
        seen: set[str] = set()
        chosen: list[_Found] = []
        root = self._open()
        if root is not None:
            with root:
                chosen = self._select(self._scan(root, report, seen), report)
                # a dump not rewritten within stale_after is a rank gone (its file may stay): not read, no series
                if self.stale_after:
                    chosen = [item for item in chosen if now - item.st.st_mtime <= self.stale_after]
                chosen = self._live(chosen)
                for item in chosen:
                    self._update(root, item, now, report)
        kept = {(item.workload, item.rank) for item in chosen}
        for slot in [s for s in self._states if s not in kept]:
            del self._states[slot]  # gone, or beyond max_files: no ghost series
        for known in (self._failed, self._retries, self._withheld, self._ended):
            for path in [p for p in known if p not in seen]:
                del known[path]
        self._over &= seen
        batch = self._render(report)
        report.finish()
        return batch

    def _live(self, chosen: list[_Found]) -> list[_Found]:
        """The dumps not written before their rank's process ended; the others end their rank's series and state
        (not read) until their file changes."""
        if not chosen:
            return chosen
        ends = self._rank_ends()
        live = []
        for item in chosen:
            if self._ended.get(item.path) == item.key:
                continue
            end = ends.get((item.workload, str(item.rank)))
            if end is not None and item.st.st_mtime <= end:
                self._ended[item.path] = item.key
                log.info("flight: %s rank %d ended; its dump %s is not read until it is written again",
                         item.workload, item.rank, item.path)
                continue
            self._ended.pop(item.path, None)
            live.append(item)
        return live

    def _rank_ends(self) -> dict[tuple[str, str], float]:
        if self.rank_ends is None:
            return {}
        try:
            return self.rank_ends()
        except Exception:  # the dumps are this source's; what ingest knows of the processes is extra
            log.exception("flight: asking which ranks ended failed")
            return {}

    def _render(self, report: _Reporter) -> Batch:
        batch = Batch()
        by_workload: dict[str, dict[int, RankDump]] = {}
        for state in sorted(self._states.values(), key=lambda s: (s.workload, s.rank)):
            if state.dump is not None:
                by_workload.setdefault(state.workload, {})[state.rank] = RankDump(state.dump, state.written)
        gaps = [(workload, gap) for workload, dumps in sorted(by_workload.items())
                for gap in missing_ranks(dumps, self.grace)]
        room = self.max_series - _OWN_SERIES
        shown = gaps[:max(room, 0)]
        if len(gaps) - len(shown) != self._gaps_cut:
            self._gaps_cut = len(gaps) - len(shown)
            if self._gaps_cut:
                log.warning("flight: %d missing-rank series left out: flight.max_series=%d is reached",
                            self._gaps_cut, self.max_series)
        room -= len(shown)
        exported, withheld = self._within(room)
        for state in exported:
            state.render(batch)
        for workload, gap in shown:
            batch.add(c.COLLECTIVE_MISSING_RANK, (workload, gap.pg, str(gap.rank), str(gap.seq), gap.op), 1)
        for state in withheld:
            if self._withheld.get(state.path) != state.key:
                self._withheld[state.path] = state.key
                self.rejected["too_many_series"] += 1
                report.reject(state.path, "too_many_series",
                              f"its {state.series} series do not fit in flight.max_series={self.max_series} "
                              "with those of more recently written dumps; not exported while that lasts")
        troubles: list[tuple[object, ...]] = [
            ("rank_missing", workload, gap.pg, gap.seq,
             f"rank {gap.rank} missing from {gap.op} #{gap.seq} of pg {gap.pg}") for workload, gap in gaps]
        for state in self._states.values():
            oldest = max((state.oldest_inflight(pg) for pg in state.waiting), default=0.0)
            if oldest >= self.hang_after:
                troubles.append(("hang", state.workload, state.rank, state.key,
                                 f"rank {state.rank} waits in a collective for {oldest:.0f}s"))
        self._act_on(troubles, by_workload)
        exported_series = len(shown) + sum(state.series for state in exported)
        batch.add(c.FR_FILES, (), sum(1 for s in self._states.values() if s.dump is not None))
        for reason in REASONS:
            batch.add(c.FR_REJECTED, (reason,), self.rejected[reason])
        batch.add(c.FR_SERIES, (), exported_series + _OWN_SERIES)
        batch.add(c.FR_WITHHELD_FILES, (), len(withheld))
        batch.add(c.FR_PARSER_DEATHS, (), self.parser_deaths)
        return batch

    def _within(self, room: int) -> tuple[list[_RankState], list[_RankState]]:
        """(exported, withheld): the ranks whose series fit in `room`, most recently written dump first; a rank
        that does not fit is passed over and older ones may still fit. Exported ones in (workload, rank) order."""
        exported, withheld = [], []
        for state in sorted(self._states.values(), key=lambda s: (-s.written, s.workload, s.rank)):
            if state.series <= room:
                exported.append(state)
                room -= state.series
            else:
                withheld.append(state)
        exported.sort(key=lambda s: (s.workload, s.rank))
        return exported, withheld

    def _act_on(self, troubles: list[tuple[object, ...]], by_workload: dict[str, dict[int, RankDump]]) -> None:
        """Ask each troubled workload's ranks on this node for captures, once per dump (hang) or gap (missing)."""
        keys = {t[:4] for t in troubles}
        self._troubles &= keys  # a trouble that cleared may be acted on again when it comes back
        if self.on_trouble is None:
            return
        for trouble in troubles:
            if trouble[:4] in self._troubles:
                continue
            self._troubles.add(trouble[:4])
            trigger, workload, detail = str(trouble[0]), str(trouble[1]), str(trouble[4])
            ranks = [str(r) for r in sorted(by_workload.get(workload, {}))]
            try:
                self.on_trouble(workload, ranks, trigger, detail)
            except Exception:  # the dumps' series are what this source owes; a capture is extra
                log.exception("flight: asking %s for captures (%s) failed", workload, trigger)

    def close(self) -> None:
        self._parser.close()
