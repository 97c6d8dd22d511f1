"""Helpers for the flight-source tests: the generated dumps, NCCL-shaped dumps, rendering."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

from conftest import ROOT

from exporter.config import load
from exporter.core.exposition import TEXT, Renderer
from exporter.sources.flight.source import FlightSource

DUMPS = ROOT / "tests" / "flight" / "dumps"
WRITTEN: dict[str, float] = json.loads((DUMPS / "written.json").read_text())
T0 = 1_790_000_000.0  # the "now" of the NCCL-shaped dumps
SEC = 1_000_000_000


def copy_scenario(scenario: str, root: Path, workload: str | None = None) -> Path:
    """Copy generated dumps to root/<workload>, with each file's original write time restored."""
    target = root / (workload or scenario)
    target.mkdir(parents=True, exist_ok=True)
    for source in sorted((DUMPS / scenario).iterdir()):
        shutil.copyfile(source, target / source.name)
        written = WRITTEN[f"{scenario}/{source.name}"]
        os.utime(target / source.name, (written, written))
    return target


# the stored dumps keep the times they were written at, long past: read them however old (flight.stale_after 0)
AGELESS = "0s"


def source_for(directory: Path, **settings: Any) -> FlightSource:
    settings.setdefault("stale_after", AGELESS)
    return FlightSource(load(None, {"flight": {"dir": str(directory), **settings}}, environ={}).flight)


def render(source: FlightSource) -> str:
    return Renderer().render(source.collect(), TEXT).decode()


def write_dump(path: Path, dump: dict[str, Any], written: float, fmt: str = "pickle") -> None:
    """Write a dump the way PyTorch would (pickle protocol 2, or JSON), dated `written`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(dump, protocol=2) if fmt == "pickle" else json.dumps(dump).encode())
    os.utime(path, (written, written))


def nccl_entry(record_id: int, seq: int, op: str = "all_reduce", *, pg: tuple[str, str] = ("0", "default_pg"),
               pg_id: int = 0, state: str = "completed", retired: bool = True, created: float = T0 - 100,
               duration_ms: float | None = None, input_sizes: list[list[int]] | None = None,
               output_sizes: list[list[int]] | None = None, dtype: str = "Float", p2p: bool = False,
               peer: str = "") -> dict[str, Any]:
    """One entry as ProcessGroupNCCL's flight recorder writes it (dump version 2.10)."""
    inputs = [[1024]] if input_sizes is None else input_sizes
    outputs = inputs if output_sizes is None else output_sizes
    created_ns = int(created * SEC)
    entry: dict[str, Any] = {
        "frames": [{"name": op, "filename": "train.py", "line": 42}],
        "record_id": record_id, "pg_id": pg_id, "process_group": pg,
        "thread_name": "pt_main_thread", "thread_id": "140000000000000",
        "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": record_id + 1,
        "profiling_name": f"nccl:{op}{peer}", "time_created_ns": created_ns,
        "input_sizes": inputs, "input_dtypes": [dtype] * len(inputs),
        "output_sizes": outputs, "output_dtypes": [dtype] * len(outputs),
        "state": state,
        "time_discovered_started_ns": created_ns + 1000 if state in ("started", "completed") else None,
        "time_discovered_completed_ns": created_ns + 2000 if state == "completed" else None,
        "retired": retired, "timeout_ms": 600_000, "is_p2p": p2p,
    }
    if duration_ms is not None:
        entry["duration_ms"] = duration_ms
    return entry


def nccl_dump(entries: list[dict[str, Any]], status: dict[str, tuple[int, int, int]],
              groups: dict[str, tuple[str, list[int]]] | None = None) -> dict[str, Any]:
    """A whole dump: `status` maps pg_id -> (enqueued, started, completed), `groups` pg name ->
    (desc, ranks) as NCCL records them in pg_config."""
    groups = {"0": ("default_pg", [0, 1, 2, 3])} if groups is None else groups
    return {
        "version": "2.10", "comm_lib_version": "2.21.5",
        "pg_config": {name: {"name": name, "desc": desc, "ranks": str(ranks)}
                      for name, (desc, ranks) in groups.items()},
        "pg_status": {pg_id: {"last_enqueued_collective": e, "last_started_collective": s,
                              "last_completed_collective": c} for pg_id, (e, s, c) in status.items()},
        "entries": entries,
        "nccl_comm_state": {"7f3a": {"nccl_version": "2.21.5", "commFailureReason": ""}},
    }
