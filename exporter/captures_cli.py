"""`goodput-exporter captures`: list the captures the daemon asked ranks for, newest first, from the index it keeps
in ingest.capture_dir. It reads the file only: it works beside a running daemon, or after one stopped."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import ConfigError, load
from .sources.ingest.captures import INDEX_NAME, IndexProblem, read_index


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput-exporter captures",
        description="List the captures (profiler traces, flight-recorder dumps) the daemon asked ranks for, newest "
        "first. Exit 0 (also when there are none), 2 when the directory or its index cannot be read.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--dir", metavar="DIR", help="the capture directory (default: ingest.capture_dir of the "
                       "config)")
    where.add_argument("--config", metavar="FILE", help="YAML config file to take ingest.capture_dir from (also "
                       "GOODPUT_CONFIG and GOODPUT_INGEST_CAPTURE_DIR)")
    parser.add_argument("--workload", metavar="W", help="only this workload's captures (a glob pattern works)")
    parser.add_argument("--json", action="store_true", help="print JSON: {\"dir\": DIR, \"captures\": [...]}")
    return parser


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # unreachable


def _ranks(capture: dict[str, Any]) -> str:
    ranks = capture.get("ranks") or {}
    written = sum(1 for r in ranks.values() if isinstance(r, dict) and r.get("status") == "written")
    waiting = sum(1 for r in ranks.values() if isinstance(r, dict) and r.get("status") in ("requested", "delivered"))
    return f"{written}/{len(ranks)}" + (f" ({waiting} waiting)" if waiting else "")


def table(captures: list[dict[str, Any]]) -> str:
    header = ("ID", "WORKLOAD", "TRIGGER", "WRITTEN/ASKED", "BYTES", "DIR")
    rows = [header] + [(str(c.get("id", "")), str(c.get("workload", "")), str(c.get("trigger", "")), _ranks(c),
                        _size(_number(c.get("bytes"))), str(c.get("dir", ""))) for c in captures]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
                     for row in rows)


def _directory(args: argparse.Namespace) -> str:
    if args.dir:
        return str(args.dir)
    directory = load(args.config).ingest.capture_dir
    if not directory:
        raise ConfigError("captures are off: ingest.capture_dir is empty (pass --dir DIR or a --config that sets it)")
    return directory


def main(argv: Sequence[str]) -> int:
    """list the captures the daemon asked ranks for (ingest.capture_dir's index)"""
    args = _parser().parse_args(list(argv))
    try:
        directory = _directory(args)
    except ConfigError as exc:
        print(f"goodput-exporter captures: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(directory) or not os.access(directory, os.R_OK | os.X_OK):
        problem = "no such directory" if not os.path.exists(directory) else \
            "not a directory" if not os.path.isdir(directory) else "permission denied"
        print(f"goodput-exporter captures: cannot read the capture directory {directory}: {problem}", file=sys.stderr)
        return 2
    try:
        payload = read_index(Path(directory) / INDEX_NAME)
    except IndexProblem as exc:
        print(f"goodput-exporter captures: {exc}", file=sys.stderr)
        return 2
    captures = [c for c in payload.get("captures", []) if isinstance(c, dict)]
    if args.workload:
        captures = [c for c in captures if fnmatch.fnmatchcase(str(c.get("workload", "")), args.workload)]
    captures.sort(key=lambda c: (_number(c.get("requested_at")), str(c.get("id", ""))), reverse=True)
    if args.json:
        print(json.dumps({"dir": directory, "captures": captures}, indent=1))
    elif not captures:
        print("no captures")
    else:
        print(table(captures))
    return 0
