"""The ingest source's state: what must outlive a daemon restart (each rank's time accounting and step totals, so that
a job restarted while the daemon was down is still charged its downtime and redone steps, and every counter of a rank
continues), under `ingest.state_dir`, as two files:

* `ingest-state.json`, a snapshot of every rank's account, replaced atomically (written beside, renamed over);
* `ingest-state.journal`, what changed since that snapshot: a header line naming the snapshot's generation, then one
  JSON line per changed rank per save (its counters and the step history added since its last line) or per rank
  forgotten. The journal's space is allocated ahead (`posix_fallocate`, zeros) when it is started, and each save
  writes into it in place: a full disk does not stop the saves until that space is used up.

A save writes only the ranks that changed (a few hundred bytes each), so its cost follows what changed, not every
rank's whole history. When the journal has grown past the snapshot's size (at least JOURNAL_MIN), the next save
writes a new snapshot of everything and starts a new journal. On load the journal's lines are applied in order up to
the first that is not whole (a daemon killed mid-write); a journal of another generation is ignored (a daemon
killed between a new snapshot and its journal: the snapshot holds everything).

Each save happens before what it holds is published; a rank whose save failed keeps showing what was saved last, and
one never saved shows no counter until its first save succeeds (`IngestState`), so that no counter a scrape has seen
can go down after a daemon restart, however the daemon stopped, even on a disk full from the start. A missing file
starts fresh (logged). A snapshot that cannot be parsed or is not what this version wrote is counted (`corrupt`),
logged, kept beside as `<name>.corrupt` for a look, and replaced by the next write; one that cannot be read is counted
`unreadable`; a write that fails is counted `unwritable` and retried at the next save. None of them stops the daemon.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

from .files import remove_partials, set_aside, write_whole

log = logging.getLogger(__name__)

FILE_NAME = "ingest-state.json"
JOURNAL_NAME = "ingest-state.journal"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: a snapshot without a journal, written by earlier releases
ERROR_REASONS = ("corrupt", "unreadable", "unwritable")
JOURNAL_MIN = 256 * 1024  # bytes: the least journal space allocated, and written before a new snapshot
JOURNAL_FLOOR = 16 * 1024  # bytes: on a disk too full for JOURNAL_MIN, halved down to this before giving up


class StateFile:
    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / FILE_NAME
        self.journal_path = Path(directory) / JOURNAL_NAME
        self.errors: Counter[str] = Counter()
        self.generation = 0  # of the snapshot on disk (0: none written or read)
        self._snapshot_bytes = 0
        self._fd: int | None = None  # the journal, open for writing in place
        self._offset = 0  # where its next line goes
        self._allocated = 0  # its bytes allocated ahead
        self._header = 0  # its header line's bytes
        self._failing = False  # the last write failed: log the next failure at debug, the recovery at info

    @property
    def wants_snapshot(self) -> bool:
        """Whether the next save must be a whole snapshot: no usable journal, or one grown past the snapshot."""
        return self._fd is None or self._offset > max(JOURNAL_MIN, self._snapshot_bytes)

    @property
    def journaled(self) -> bool:
        """Whether the journal holds changes after the snapshot."""
        return self._fd is not None and self._offset > self._header

    # --- reading ---

    def load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the snapshot's accounts, each {workload, rank, account}; the journal's lines after it, each {w, r, a}
        or {w, r, drop}); ([], []) when there is none or the snapshot is unusable."""
        remove_partials(self.path)  # left by a daemon killed mid-write
        remove_partials(self.journal_path)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            log.info("ingest: no state file at %s; restart accounting starts fresh", self.path)
            return [], []
        except OSError as exc:
            self.errors["unreadable"] += 1
            log.error("ingest: cannot read the state file %s (%s); restart accounting starts fresh", self.path, exc)
            return [], []
        try:
            payload = json.loads(data)  # not UTF-8 JSON: a ValueError, like any other corruption
            if not isinstance(payload, dict) or payload.get("version") not in READABLE_VERSIONS:
                raise ValueError(f"not a version {VERSION} state file")
            accounts = payload["accounts"]
            if not isinstance(accounts, list) or not all(isinstance(item, dict) for item in accounts):
                raise ValueError("accounts is not a list of objects")
            generation = payload.get("generation", 0)
            if not isinstance(generation, int):
                raise ValueError("generation is not a whole number")
        except (ValueError, KeyError, RecursionError) as exc:
            self.quarantine(f"{exc.__class__.__name__}: {exc}")
            return [], []
        self.generation, self._snapshot_bytes = generation, len(data)
        return accounts, self._read_journal(generation)

    def _read_journal(self, generation: int) -> list[dict[str, Any]]:
        try:
            data = self.journal_path.read_bytes()
        except OSError:
            return []
        lines = data.split(b"\n")
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("generation") != generation or generation == 0:
            log.info("ingest: the state journal %s is not the snapshot's (generation %s); the snapshot alone is used",
                     self.journal_path, generation)
            return []
        records = []
        offset = self._header = len(lines[0]) + 1
        for line in lines[1:-1]:  # the last piece has no newline: zeros allocated ahead, or a line cut short
            try:
                record = json.loads(line)
            except ValueError:
                break
            if not isinstance(record, dict):
                break
            records.append(record)
            offset += len(line) + 1
        try:  # go on writing it in place (its space is still allocated, which matters on a full disk)
            self._fd = os.open(self.journal_path, os.O_RDWR)
            self._offset, self._allocated = offset, len(data)
        except OSError:
            self._fd = None
        return records

    def quarantine(self, problem: str, partly: bool = False) -> None:
        """Count and log a corrupt file, and keep it aside for a look: moved when nothing of it is used (the next
        write replaces it), copied when the rest of it was (`partly`)."""
        self.errors["corrupt"] += 1
        aside = set_aside(self.path, partly)
        log.error("ingest: the state file %s is corrupt (%s), kept as %s; %s", self.path, problem, aside,
                  "the rest of it is used" if partly else "restart accounting starts fresh")

    # --- writing ---

    def save(self, accounts: list[dict[str, Any]]) -> bool:
        """Write a whole snapshot (atomically: a daemon killed mid-write leaves the previous one whole) and start a new
        journal after it. Not synced to disk (it is written every collect): after a power loss the file may be
        empty, which loads as corrupt and starts fresh."""
        generation = self.generation + 1
        data = json.dumps({"version": VERSION, "generation": generation, "accounts": accounts},
                          separators=(",", ":"), allow_nan=False)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(self.path, data)
        except OSError as exc:
            return self._failed(self.path, exc)
        self.generation, self._snapshot_bytes = generation, len(data)
        self._start_journal()
        return self._written()

    def append(self, records: list[dict[str, Any]]) -> bool:
        """Write what changed into the journal's space, after its last line. False (counted): not written, the next
        save tries again (a whole snapshot when the journal's space is used up)."""
        if self._fd is None:
            return False
        data = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records).encode()
        try:
            if self._offset + len(data) > self._allocated:
                self._allocate(self._offset + len(data))  # past the space allocated ahead: may fail on a full disk
            os.pwrite(self._fd, data, self._offset)
        except OSError as exc:
            return self._failed(self.journal_path, exc)
        self._offset += len(data)
        return self._written()

    def _start_journal(self) -> None:
        """A new journal for the snapshot just written, its space allocated ahead; on failure (counted) the next save
        writes a snapshot again."""
        self.close()
        header = json.dumps({"generation": self.generation}).encode() + b"\n"
        partial = self.journal_path.with_name(f".{self.journal_path.name}.new")
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            self._failed(self.journal_path, exc)
            return
        try:
            os.pwrite(fd, header, 0)
            self._fd, self._offset, self._allocated = fd, len(header), len(header)
            self._header = len(header)
            size = max(JOURNAL_MIN, self._snapshot_bytes) + len(header)
            while True:
                try:
                    self._allocate(size)
                    break
                except OSError:
                    if size <= JOURNAL_FLOOR:
                        break  # written as it goes, as far as the disk allows
                    size //= 2
            os.replace(partial, self.journal_path)
        except OSError as exc:
            self.close()
            partial.unlink(missing_ok=True)
            self._failed(self.journal_path, exc)

    def _allocate(self, size: int) -> None:
        assert self._fd is not None
        os.posix_fallocate(self._fd, 0, size)
        self._allocated = max(self._allocated, size)

    def _failed(self, path: Path, exc: OSError) -> bool:
        self.errors["unwritable"] += 1
        (log.debug if self._failing else log.error)(
            "ingest: cannot write the state file %s (%s); until it is written again each rank's counters show what "
            "was saved last, and those of ranks never saved are withheld", path, exc)
        self._failing = True
        return False

    def _written(self) -> bool:
        if self._failing:
            log.info("ingest: the state file %s is written again", self.path)
            self._failing = False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
