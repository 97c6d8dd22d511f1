"""Aggregate the per-operation traces of ByteDance's straggler study into what a training client reports per step.

Run by hand, once, outside the test suite: it needs pyarrow (not a dependency of this project; a throwaway venv does):

    python -m venv /tmp/pa && /tmp/pa/bin/pip install pyarrow
    /tmp/pa/bin/python tests/straggler_traces/convert.py <StragglerAnalysis>/data tests/straggler_traces

For each trace (AR, SE, ST) it writes <name>.csv, one row per (rank, step), and <name>.json, the study's figures
(result-<name>.json's blocking_slowdown and its decompositions). PROVENANCE.md beside this file says where the
traces come from and what each column means.

A rank's step, per the study's traces: from the step's start (start_ts 0, the first op of any rank) to its end (the
last op of any rank: synchronous training, every rank's step lasts that long, and it equals the study's
step_t_base). Its seconds are split into exclusive phases by walking its ops' timeline (ops overlap: a batched
send+recv, the clip inside the optimizer), each instant counted once, for the first class that covers it:
    compute     forward-compute, backward-compute, optimizer (and what it nests, optimizer-clip-main-grad)
    collective  grads-reduce-scatter, params-all-gather, *-grads-all-reduce: the data-parallel and embedding
                collectives (transfer plus the wait for the last rank)
    p2p         forward/backward send/recv: the pipeline's blocking transfers (transfer plus the wait for the peer)
    other       gc (the rank's own CPU time)
The rest of the step, covered by no op (the pipeline's bubbles between ops, the tail after the rank's last op), is
written nowhere: the replay leaves it unreported, so the daemon counts it `untracked`.
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq  # type: ignore[import-not-found]

TRACES = ("AR", "SE", "ST")
CLASSES = {
    "forward-compute": "compute", "backward-compute": "compute", "optimizer": "compute",
    "optimizer-clip-main-grad": "compute",
    "grads-reduce-scatter": "collective", "params-all-gather": "collective",
    "embedding-grads-all-reduce": "collective", "layernorm-grads-all-reduce": "collective",
    "forward-send": "p2p", "forward-recv": "p2p", "backward-send": "p2p", "backward-recv": "p2p",
    "gc": "other",
}
ORDER = ("compute", "collective", "p2p", "other")  # who owns an instant that several ops cover
COLUMNS = ("rank", "pipeline_stage", "data_parallel_rank", "step", "step_seconds", *(f"{c}_seconds" for c in ORDER))


def exclusive(ops: list[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds per class, each instant counted once for the first class of ORDER covering it."""
    cuts = sorted({t for start, end, _ in ops for t in (start, end)})
    out = dict.fromkeys(ORDER, 0.0)
    for lo, hi in itertools.pairwise(cuts):
        mid = (lo + hi) / 2
        covering = {cls for start, end, cls in ops if start <= mid < end}
        for cls in ORDER:
            if cls in covering:
                out[cls] += hi - lo
                break
    return out


def convert(src: Path, dst: Path, name: str) -> None:
    table = pq.read_table(src / f"trace-{name}.parquet").to_pydict()
    ops: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    role: dict[int, tuple[int, int]] = {}
    step_end: dict[int, float] = defaultdict(float)
    for i, optype in enumerate(table["optype"]):
        rank, step = table["rank"][i], table["step"][i]
        start = float(table["start_ts"][i])
        end = start + float(table["duration"][i])
        ops[(rank, step)].append((start, end, CLASSES[optype]))
        role[rank] = (table["stage"][i], table["dp_rank"][i])
        step_end[step] = max(step_end[step], end)
    with (dst / f"{name}.csv").open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(COLUMNS)
        for (rank, step) in sorted(ops):
            phases = exclusive(ops[(rank, step)])
            out.writerow([rank, *role[rank], step, f"{step_end[step]:.6f}", *(f"{phases[c]:.6f}" for c in ORDER)])
    result = json.loads((src / f"result-{name}.json").read_text())
    keep = ("job_meta", "blocking_slowdown", "blocking_decompose_by_dp_rank", "blocking_decompose_by_stage",
            "step_t_base", "step_t_noblk")
    (dst / f"{name}.json").write_text(json.dumps({k: result[k] for k in keep}, indent=1, sort_keys=True) + "\n")


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    for name in TRACES:
        convert(src, dst, name)


if __name__ == "__main__":
    main()
