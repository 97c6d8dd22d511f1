"""Records the step-time series in bench/data/ that the change-detector bench and tests replay.

Each series is a real PyTorch training loop on this machine's CPU (one intra-op thread, so that the other
core's load shows as noise, as a shared node's would), timed step by step with the wall clock: forward,
backward and optimizer step, the way a training client times a step. One file per series, one integer
duration in microseconds a line, after a `#` header line that says how it was recorded. Run with
`python bench/record_steps.py` (a few minutes); the files are committed, so the bench and the tests
replay the same data every time.

A series is the noise of a steady job, onto which the bench injects known shifts: one that holds a shift of its
own (another process took the core for a while, which on a small shared machine happens often) would make the
bench count a real shift as a false alarm. So each recording runs LONGER times the steps kept, and keeps the first
stretch of `--steps` consecutive steps in which no median of STEADY_WINDOW consecutive steps strays more than
STEADY_RATIO from the median of the STEADY_BEFORE steps before it (a slow wander stays: it is the noise); when
no stretch is that steady it records again (up to `--tries` times). The header says which try and which stretch.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

DATA = Path(__file__).resolve().parent / "data"
STEPS = 3000
STEADY_WINDOW = 32  # steps: as long as the detector looks at a shift (MIN_RUN)
STEADY_BEFORE = 200  # steps
STEADY_RATIO = 0.05  # how far a window's median may stray from the steps' before it (log units, ~5%)
LONGER = 4  # a recording is this many times the steps kept


def mlp(batch: int) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


def transformer(batch: int) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    vocab, seq, width = 1000, 32, 128
    layer = nn.TransformerEncoderLayer(width, 4, 256, dropout=0.1, batch_first=True)
    model = nn.Sequential(nn.Embedding(vocab, width), nn.TransformerEncoder(layer, 2), nn.Linear(width, vocab))
    tokens = torch.randint(0, vocab, (batch, seq + 1))

    def loss() -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    return model, loss


def cnn(batch: int) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


# name: (model maker, batch, optimizer, checkpoint every N steps or 0, what it is)
SERIES = {
    "mlp-b192": (mlp, 192, "sgd", 0, "MLP 784-512-512-10, batch 192, SGD"),
    "transformer-b4": (transformer, 4, "adamw", 0,
                       "2-layer transformer encoder (width 128, 4 heads, seq 32, vocab 1000), batch 4, AdamW"),
    "cnn-b16": (cnn, 16, "sgd", 0, "2-conv CNN on 32x32x3, batch 16, SGD"),
    "mlp-b128-ckpt": (mlp, 128, "adamw", 100,
                      "MLP 784-512-512-10, batch 128, AdamW, a real checkpoint (torch.save of model and optimizer "
                      "state, fsync) inside every 100th step"),
}


def record(name: str, steps: int) -> list[int]:
    make, batch, optimizer_name, every, _ = SERIES[name]
    torch.manual_seed(0)
    model, loss_fn = make(batch)
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.01) if optimizer_name == "sgd"
                 else torch.optim.AdamW(model.parameters(), lr=1e-3))
    durations = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint.pt"
        for step in range(steps):
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss_fn().backward()
            optimizer.step()
            if every and step % every == every - 1:
                with checkpoint.open("wb") as f:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
                    f.flush()
                    os.fsync(f.fileno())
            durations.append(round((time.perf_counter() - started) * 1e6))
    return durations


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def steady_stretch(durations: list[int], steps: int) -> tuple[int, float]:
    """The first stretch of `steps` steps in which no STEADY_WINDOW-step median strays more than STEADY_RATIO from
    the median of the STEADY_BEFORE steps before it: (its start, the largest stray, in log units); the least
    straying one when none is that steady."""
    logs = [math.log(d) for d in durations]
    strays = [0.0] * len(logs)  # at i: the window starting at i against the steps before it
    for i in range(STEADY_BEFORE, len(logs) - STEADY_WINDOW + 1):
        strays[i] = abs(_median(logs[i:i + STEADY_WINDOW]) - _median(logs[i - STEADY_BEFORE:i]))
    best = (0, math.inf)
    for start in range(0, len(logs) - steps + 1, 100):
        worst = max(strays[max(start, STEADY_BEFORE):start + steps - STEADY_WINDOW + 1])
        if worst <= STEADY_RATIO:
            return start, worst
        best = min(best, (start, worst), key=lambda b: b[1])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(SERIES), help="series to record (default: all)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--tries", type=int, default=10, help="recordings of a series until one is steady")
    args = parser.parse_args()
    torch.set_num_threads(1)
    DATA.mkdir(exist_ok=True)
    for name in args.names:
        best: tuple[float, int, int, list[int]] | None = None  # (strays, try, start, durations)
        for attempt in range(1, args.tries + 1):
            recording = record(name, args.steps * LONGER)
            start, strays = steady_stretch(recording, args.steps)
            print(f"{name}: try {attempt}, steps {start}-{start + args.steps - 1}: a {STEADY_WINDOW}-step median "
                  f"strays {math.expm1(strays):.1%} from the steps before, load {os.getloadavg()[0]:.2f}", flush=True)
            if best is None or strays < best[0]:
                best = (strays, attempt, start, recording[start:start + args.steps])
            if strays <= STEADY_RATIO:
                break
        else:
            print(f"{name}: no steady stretch in {args.tries} tries; keeping the least straying")
        assert best is not None
        strays, attempt, start, durations = best
        header = (f"# {SERIES[name][4]}; {args.steps} steps, wall time per step (forward, backward, optimizer step) "
                  f"in µs, torch {torch.__version__} on CPU, 1 thread, {platform.machine()} "
                  f"({os.cpu_count()} cores, shared), recorded {datetime.date.today()} by bench/record_steps.py, "
                  f"try {attempt}, steps {start}-{start + args.steps - 1} of {args.steps * LONGER} (no "
                  f"{STEADY_WINDOW}-step median more than {math.expm1(strays):.1%} from the median of the "
                  f"{STEADY_BEFORE} steps before it)")
        (DATA / f"{name}.txt").write_text(header + "\n" + "\n".join(map(str, durations)) + "\n")
        ordered = sorted(durations)
        print(f"{name}: median {ordered[len(ordered) // 2] / 1000:.2f} ms, "
              f"p99 {ordered[int(len(ordered) * 0.99)] / 1000:.2f} ms, total {sum(durations) / 1e6:.1f} s")


if __name__ == "__main__":
    main()
