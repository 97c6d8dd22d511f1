"""Files the ingest source keeps on disk (the state file, the capture index): written whole or not at all, and set
aside when corrupt."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def remove_partials(path: Path) -> None:
    """Delete the partial copies of `path` a process killed mid-write left beside it."""
    for stale in path.parent.glob(f".{path.name}.*"):
        stale.unlink(missing_ok=True)


def write_whole(path: Path, text: str, *, mode: int | None = None, sync: bool = False) -> None:
    """Replace `path` with `text` atomically: written beside it as `.<name>.<random>`, then renamed over it, so
    that a process killed mid-write leaves the previous file whole. `mode`: the file's permissions (else 0600);
    `sync`: flushed to disk before the rename. Raises OSError; no partial copy is left."""
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def set_aside(path: Path, partly: bool) -> Path:
    """Keep a corrupt file as `<name>.corrupt` for a look: moved when nothing of it is used (the next write replaces
    it), copied when the rest of it is (`partly`). Returns where it is now (`path` itself when it could not be
    moved or copied)."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        if partly:
            shutil.copyfile(path, aside)
        else:
            os.replace(path, aside)
    except OSError:
        return path
    return aside
