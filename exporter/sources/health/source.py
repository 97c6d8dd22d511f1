"""Reads the health check's state file at each collection; a missing file is no error (the check has not run)."""

from __future__ import annotations

from ...core.exposition import Batch
from ...core.source import Source
from ...health import state
from . import metrics as c


class HealthSource(Source):
    name = "health"

    def __init__(self, state_file: str) -> None:
        self.state_file = state_file

    def collect(self) -> Batch:
        batch = Batch()
        data = state.read(self.state_file)
        if data.get("last_run") is None:
            return batch
        for key, count in sorted(data.get("counts", {}).items()):
            action, reason, dry_run = ([*key.split("|"), "", "", ""])[:3]
            batch.add(c.ACTIONS, (action, reason, dry_run), float(count))
        batch.add(c.PENDING, (), 1.0 if data.get("pending") else 0.0)
        batch.add(c.LAST_RUN, (), float(data["last_run"]))
        return batch
