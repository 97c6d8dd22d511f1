"""The health command's state file: JSON, replaced whole (written aside, then renamed), so a reader (the daemon's
`health` source) never sees half of it. Concurrent runs (slurmd never overlaps its own) are serialised by a lock
file beside it.

    {"counts": {"drain|row_remap_pending|false": 1, ...},   # every decision, by action, reason, dry_run
     "pending": {"since": T, "deadline": T, "reason": "...", "saves": {"w/0": T}} | null,
     "last_drain": T | null,                                 # when this node was last drained by the command
     "seen": {"<uuid>": {"xid": {"79": 2}}},
     "recent": [{"uuid": ..., "gpu": ..., "reason": "xid_79", "level": 2, "until": T, "evidence": ...}],
     "last_run": T}
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def empty() -> dict[str, Any]:
    return {"counts": {}, "pending": None, "last_drain": None, "seen": {}, "recent": [], "last_run": None}


def count_key(action: str, reason: str, dry_run: bool) -> str:
    return f"{action}|{reason}|{'true' if dry_run else 'false'}"


def read(path: str | Path) -> dict[str, Any]:
    """The state, or an empty one when the file is absent or unreadable (never raises)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return empty()
    if not isinstance(data, dict):
        return empty()
    return {**empty(), **data}


def write(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, sort_keys=True))
    os.replace(partial, path)


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    lock = Path(str(path) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
