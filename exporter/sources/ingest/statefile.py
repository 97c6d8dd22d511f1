"""The ingest source's state file: what must outlive a daemon restart (each rank's time accounting, so that a
job restarted while the daemon was down is still charged its downtime and redone steps), as JSON under
`ingest.state_dir`, replaced atomically.

It is rewritten at each collect of the source in which something changed, before what it holds is published, so
that no counter a scrape has seen can go down after a daemon restart, however the daemon stopped. A missing file
starts fresh (logged). A file that cannot be parsed or is not what this version wrote is counted
(`corrupt`), logged, kept beside as `<name>.corrupt` for a look, and replaced by the next write; one that cannot be
read is counted `unreadable`; a write that fails is counted `unwritable` and retried at the next one. None of them
stops the daemon.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from .files import remove_partials, set_aside, write_whole

log = logging.getLogger(__name__)

FILE_NAME = "ingest-state.json"
VERSION = 1
ERROR_REASONS = ("corrupt", "unreadable", "unwritable")


class StateFile:
    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / FILE_NAME
        self.errors: Counter[str] = Counter()
        self._failing = False  # the last write failed: log the next failure at debug, the recovery at info

    def load(self) -> list[dict[str, Any]]:
        """The accounts the file holds (each a dict with workload, rank and account); [] when there is none or it
        is unusable."""
        remove_partials(self.path)  # left by a daemon killed mid-write
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            log.info("ingest: no state file at %s; restart accounting starts fresh", self.path)
            return []
        except OSError as exc:
            self.errors["unreadable"] += 1
            log.error("ingest: cannot read the state file %s (%s); restart accounting starts fresh", self.path, exc)
            return []
        try:
            payload = json.loads(data)  # not UTF-8 JSON: a ValueError, like any other corruption
            if not isinstance(payload, dict) or payload.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} state file")
            accounts = payload["accounts"]
            if not isinstance(accounts, list) or not all(isinstance(item, dict) for item in accounts):
                raise ValueError("accounts is not a list of objects")
            return accounts
        except (ValueError, KeyError, RecursionError) as exc:
            self.quarantine(f"{exc.__class__.__name__}: {exc}")
            return []

    def quarantine(self, problem: str, partly: bool = False) -> None:
        """Count and log a corrupt file, and keep it aside for a look: moved when nothing of it is used (the next
        write replaces it), copied when the rest of it was (`partly`)."""
        self.errors["corrupt"] += 1
        aside = set_aside(self.path, partly)
        log.error("ingest: the state file %s is corrupt (%s), kept as %s; %s", self.path, problem, aside,
                  "the rest of it is used" if partly else "restart accounting starts fresh")

    def save(self, accounts: list[dict[str, Any]]) -> bool:
        """Write atomically: a daemon killed mid-write leaves the previous file whole. Not synced to disk (it is
        written every collect): after a power loss the file may be empty, which loads as corrupt and starts
        fresh."""
        data = json.dumps({"version": VERSION, "accounts": accounts}, separators=(",", ":"), allow_nan=False)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(self.path, data)
        except OSError as exc:
            self.errors["unwritable"] += 1
            (log.debug if self._failing else log.error)(
                "ingest: cannot write the state file %s (%s); restart accounting will not survive a daemon restart",
                self.path, exc)
            self._failing = True
            return False
        if self._failing:
            log.info("ingest: the state file %s is written again", self.path)
            self._failing = False
        return True
