"""The ingest state file's cost per save at the rank cap: 512 ranks (ingest.max_ranks), each with a full step history
(ingest.step_history = 2000 steps), as a long job leaves them.

Measured through the daemon's own `IngestState.save()` (what each collect of the ingest source runs, every second
under load), on a tmpfs-or-disk temporary directory:

* whole file: every save writes every rank's account, history included (what 38793cd did at each collect in which
  anything changed; here the snapshot this version writes, the same JSON);
* journal, every rank stepped: each of the 512 ranks reported one more step since the last save;
* journal, 8 ranks stepped: 8 of them did (a job on one node among many idle ones).

Bytes are what one save writes; seconds are its wall time (serialising under the state's lock, then the write),
the median of the saves measured. The journal is started anew with a whole snapshot once it has grown past the
snapshot's size, so its amortised cost per save is at most twice the journal's bytes.

    python bench/state_file.py   # prints the markdown section
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "client"))

from exporter.sources.ingest.accounting import Account  # noqa: E402
from exporter.sources.ingest.changepoint import StepTimeDetector  # noqa: E402
from exporter.sources.ingest.state import IngestState, _Rank  # noqa: E402
from exporter.sources.ingest.statefile import StateFile  # noqa: E402

RANKS = 512
WORKLOADS = 16
HISTORY = 2000
SAVES = 20
T0 = 1_790_000_000.0


def _state(directory: str) -> tuple[IngestState, list[tuple[str, str]]]:
    state = IngestState(WORKLOADS, RANKS, 600.0, clock=lambda: T0 + HISTORY, state_file=StateFile(directory),
                        step_history=HISTORY)
    keys = [(f"job-{n % WORKLOADS:02d}", str(n // WORKLOADS)) for n in range(RANKS)]
    for key in keys:
        account = Account(HISTORY, "/".join(key))
        account.session(T0, False, 0.0, T0, None)
        for step in range(1, HISTORY + 1):
            account.phase(T0 + step, "compute", 0.8, step - 0.2)
            account.step(T0 + step, 1.0, step, 1e15, "bf16", float(step), 4096, 8)
        state._ranks[key] = _Rank(account, StepTimeDetector())
    state._dirty |= set(keys)
    return state, keys


def _step(state: IngestState, keys: list[tuple[str, str]]) -> None:
    for key in keys:
        account = state._ranks[key].account
        step = (account.last_step or 0) + 1
        account.phase(T0 + step, "compute", 0.8, step - 0.2)
        account.step(T0 + step, 1.0, step, 1e15, "bf16", float(step), 4096, 8)
        state._dirty.add(key)


def _measure(state: IngestState, before: object, after: object) -> tuple[float, float]:
    """(median bytes, median seconds) of SAVES saves, `before` run ahead of each."""
    sizes, seconds = [], []
    for _ in range(SAVES):
        before()  # type: ignore[operator]
        written = _written(state)
        start = time.perf_counter()
        state.save()
        seconds.append(time.perf_counter() - start)
        sizes.append(_written(state) - written)
        after()  # type: ignore[operator]
    return statistics.median(sizes), statistics.median(seconds)


def _written(state: IngestState) -> int:
    files = state.state_file
    assert files is not None
    snapshot = files.path.stat().st_size if files.path.exists() else 0
    return snapshot + files._offset


def measure() -> dict[str, tuple[float, float]]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="goodput-state-") as tmp:
        state, keys = _state(tmp)
        files = state.state_file
        assert files is not None

        def whole() -> None:
            _step(state, keys)
            files.close()  # no journal: the next save writes every account

        snapshots = []

        def snapshot_bytes() -> None:
            snapshots.append(files.path.stat().st_size)

        _, seconds = _measure(state, whole, snapshot_bytes)
        out["whole file (38793cd: every save)"] = (statistics.median(snapshots), seconds)
        state.save()
        out["journal, all 512 ranks stepped"] = _measure(state, lambda: _step(state, keys), lambda: None)
        out["journal, 8 of 512 ranks stepped"] = _measure(state, lambda: _step(state, keys[:8]), lambda: None)
    return out


def state_file_section() -> str:
    figures = measure()
    lines = [
        "## State file: cost per save at 512 ranks",
        "",
        f"`python bench/state_file.py`: {RANKS} ranks, each with {HISTORY} steps of history "
        f"(ingest.max_ranks, ingest.step_history defaults), saved through `IngestState.save()`; median of {SAVES} "
        "saves. The journal starts anew with a whole snapshot once it outgrows the snapshot: its amortised cost is at "
        "most twice its bytes per save.",
        "",
        "| save | bytes written | seconds |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {size:,.0f} | {seconds:.4f} |" for name, (size, seconds) in figures.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(state_file_section())
