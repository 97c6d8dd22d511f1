"""`make bench`: runs every benchmark section and writes bench/results.md from that one run.

Each section is a module of bench/ with `section() -> str` (its markdown, headed `## ...`), listed once in SECTIONS;
a section's name is its module's (`idle_cpu`, `rules_scale`). The file names the commit and the date of the run in
its header, and marks each section with the commit, date and run time it came from:

    python bench/run.py                      # every section (make bench)
    python bench/run.py --only idle_cpu,nvml_calls   # just these; the others are kept from the file as they are
    python bench/run.py --list               # the sections' names

Notes on how the figures got where they are (hand-written, kept across runs) are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adaptive
import attribution
import backend_cost
import changepoint
import client_ingest
import daemon_cost
import dcgm_parse
import fabric_collect
import flight_parse
import forecast_replay
import idle_accuracy
import idle_cpu
import instrument_overhead
import nvml_calls
import rules_scale
import server_limits
import soak
import state_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.md"

# (title, section): the order of bench/results.md. A section is a module's `section()`; its name (for --only) is the
# module's name.
SECTIONS: list[tuple[str, Callable[[], str]]] = [
    ("Scrape latency, CPU and memory beside node_exporter", daemon_cost.section),
    ("Idle CPU, nothing scraping", idle_cpu.section),
    ("NVML calls per GPU per second", nvml_calls.section),
    ("Idle fraction: integrated counter vs gauge", idle_accuracy.section),
    ("Training client and ingest", client_ingest.section),
    ("goodput-instrument overhead per optimizer step", instrument_overhead.section),
    ("Flight-recorder dumps", flight_parse.section),
    ("dcgm-exporter bodies", dcgm_parse.section),
    ("Fabric source", fabric_collect.section),
    ("Rules at cluster scale", rules_scale.section),
    ("Backend cost per GPU", backend_cost.section),
    ("Attribution", attribution.section),
    ("Adaptive intervals", adaptive.section),
    ("Step-time change detector", changepoint.section),
    ("Server limits", server_limits.section),
    ("Ingest state file: cost per save at 512 ranks", state_file.state_file_section),
    ("Soak: RSS under an hour of workload churn", soak.section),
    ("Finish forecast against replayed jobs", forecast_replay.section),
]

_MARK = re.compile(r"^<!-- section: (?P<name>[\w.-]+) \| commit (?P<commit>\S+) \| (?P<date>\S+) \| "
                   r"(?P<seconds>[\d.]+) s -->$")
_MARK_TEXT = "<!-- section: {name} | commit {commit} | {date} | {seconds:.0f} s -->"
# The first heading of each section in a results.md written before sections were marked, to keep them on --only
_LEGACY_HEADINGS = {
    "daemon_cost": "## Scrape latency", "idle_accuracy": "## Idle fraction", "client_ingest": "## Training client",
    "flight_parse": "## Flight-recorder dumps", "dcgm_parse": "## dcgm-exporter bodies",
    "fabric_collect": "## Fabric source", "rules_scale": "## Rules at cluster scale",
    "backend_cost": "## Backend cost per GPU", "attribution": "## Attribution", "adaptive": "## Adaptive intervals",
    "changepoint": "## Step-time change detector", "server_limits": "### Server limits"}


@dataclass
class Part:
    name: str
    title: str
    text: str  # markdown, without its marker
    commit: str
    date: str
    seconds: float


def name_of(section: Callable[[], str]) -> str:
    return section.__module__


def commit() -> str:
    """HEAD's short hash, `-dirty` when tracked files (other than results.md) differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    dirty = [line for line in changed if not line.endswith("bench/results.md")]
    return f"{head}-dirty" if dirty else head


def read_parts(text: str) -> dict[str, Part]:
    """The sections of a results.md, by name: the marked ones; in a file written before sections were marked, the
    ones found by their first heading (commit and date unknown)."""
    parts: dict[str, Part] = {}
    current: Part | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _MARK.match(line)
        if match:
            if current is not None:
                current.text = "\n".join(lines).strip()
            current = Part(match["name"], "", "", match["commit"], match["date"], float(match["seconds"]))
            parts[current.name] = current
            lines = []
        elif current is not None and line.startswith("## Run time of each section"):
            current.text = "\n".join(lines).strip()
            current = None
        elif current is not None:
            lines.append(line)
    if current is not None:
        current.text = "\n".join(lines).strip()
    return parts or _legacy_parts(text)


def _legacy_parts(text: str) -> dict[str, Part]:
    starts = sorted((text.find("\n" + heading), name) for name, heading in _LEGACY_HEADINGS.items()
                    if text.find("\n" + heading) >= 0)
    parts = {}
    for (start, name), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        parts[name] = Part(name, "", text[start:end].strip(), "unknown", "unknown", 0.0)
    return parts


def header(parts: list[Part]) -> list[str]:
    runs = sorted({(part.commit, part.date) for part in parts})
    when = (f"from commit `{runs[0][0]}` on {runs[0][1]}; every section below comes from that run" if len(runs) == 1
            else "from several runs (`bench/run.py --only`; a section marked `unknown` is from before sections named "
            "their commit): each section's commit and date are in *Run time of each section* at the end")
    return [
        "# Benchmark results",
        "",
        f"Written by `make bench` {when}. This machine: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.machine()}. Simulated GPUs "
        "(their own cost is included in the daemon's CPU figures, and shown apart under *CPU split*); every source at "
        "its default interval unless a section says otherwise. How the figures got where they are: "
        "[docs/benchmarks.md](../docs/benchmarks.md).",
    ]


def render(parts: list[Part]) -> str:
    lines = header(parts)
    for part in parts:
        lines += ["", _MARK_TEXT.format(name=part.name, commit=part.commit, date=part.date, seconds=part.seconds),
                  "", part.text]
    lines += ["", "## Run time of each section", "",
              "Wall time of each section in its run (`python bench/run.py --only NAME` runs one).", "",
              "| section | name | commit | date | run time |", "|---|---|---|---|---|"]
    for part in parts:
        took = "unknown" if part.commit == "unknown" else f"{part.seconds:.0f} s"
        lines.append(f"| {part.title} | `{part.name}` | `{part.commit}` | {part.date} | {took} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated section names: run these, keep the others from the file")
    parser.add_argument("--list", action="store_true", help="print the sections' names and titles")
    parser.add_argument("--daemon-only", action="store_true",
                        help="print the daemon's latency, CPU, memory and CPU split (daemon_cost); leave results.md")
    parser.add_argument("--gpus", type=int, nargs="+", default=list(daemon_cost.GPU_COUNTS),
                        help="with --daemon-only: simulated GPU counts (default 8 64)")
    args = parser.parse_args()
    names = {name_of(section): title for title, section in SECTIONS}
    if args.list:
        print("\n".join(f"{name}: {title}" for name, title in names.items()))
        return
    if args.daemon_only:
        print(daemon_cost.section(tuple(args.gpus)))
        return
    wanted = set(args.only.split(",")) if args.only else set(names)
    unknown = wanted - set(names)
    if unknown:
        sys.exit(f"unknown section(s) {', '.join(sorted(unknown))}: choose from {', '.join(names)}")
    kept = read_parts(RESULTS.read_text()) if args.only and RESULTS.exists() else {}
    missing = [name for name in names if name not in wanted and name not in kept]
    if missing:
        sys.exit(f"{RESULTS} has no {', '.join(missing)} to keep: run them too, or `make bench`")
    revision, today = commit(), datetime.date.today().isoformat()
    parts = []
    for title, section in SECTIONS:
        name = name_of(section)
        if name not in wanted:
            part = kept[name]
            part.title = title
            parts.append(part)
            continue
        print(f"{name}: {title} ...", flush=True)
        started = time.monotonic()
        text = section().strip()
        seconds = time.monotonic() - started
        print(f"{name}: {seconds:.0f} s", flush=True)
        parts.append(Part(name, title, text, revision, today, seconds))
    RESULTS.write_text(render(parts))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
