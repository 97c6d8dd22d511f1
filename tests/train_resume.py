"""A 2-rank CPU training job (gloo) that checkpoints, crashes and is restarted by torchrun, resuming from its
checkpoint; instrumented with goodput_client. Run by tests/test_restart_accounting.py under
`torchrun --max-restarts=1`, in a venv holding only PyTorch and goodput-client.

Steps are numbered 1..STEPS. Each step (`with telemetry.step()`) holds data_wait (the loader wrapped by
`telemetry.data_wait`), compute and comm_wait phases. After every CHECKPOINT_EVERY-th step the rank saves
model, optimizer and step number (`checkpoint_save`), and then names it in a `latest` file, as Megatron does.
A process that finds a checkpoint creates its Telemetry with `resumed_from_step=<its step>` and loads it in
`checkpoint_restore`. Between steps a short sleep ("logging") that no phase covers makes `untracked` non-zero.

On the first attempt (TORCHELASTIC_RESTART_COUNT 0) rank CRASH_RANK raises inside step CRASH_STEP's compute
phase: both ranks completed (and reported) steps 1..CRASH_STEP-1, the last checkpoint holds step
CRASH_STEP-1 rounded down to a multiple of CHECKPOINT_EVERY, and the second attempt redoes the steps between.
The other rank, waiting for the crashed one in its all-reduce, fails there (gloo sees the peer gone) or is
stopped by torchrun's SIGTERM, whichever comes first.

Each process writes its own timing log, JSON lines in $OUT_DIR/rank-<rank>-attempt-<attempt>.json:
    {"event": "telemetry", "started_at": ..., "resumed_from_step": R|null, ...}  at Telemetry creation
    {"event": "restored", "step": R}                   after the checkpoint_restore phase
    {"event": "step", "step": n, "duration": s}        per completed step: perf_counter around its `with` block
    {"event": "checkpoint", "step": n}                 after a checkpoint_save phase
    {"event": "close", "elapsed": e, "last_event_wall": w, "last_step": n, "finished": bool, "error": str|null}
        as the process exits, just before the client's close() sends its last event ("end"): e is the
        perf_counter time since Telemetry creation, w = started_at + e (the wall time of that last event,
        to the microseconds between this hook and the client's own reading).

Environment: SOCKET (the daemon's), OUT_DIR; optional STEPS, CHECKPOINT_EVERY, CRASH_STEP, COMPUTE_SECONDS,
LOGGING_SECONDS, and GATE: a path the restarted workers wait for before creating their Telemetry (each first
writes rank-<rank>-attempt-<attempt>.waiting), so that a test can restart the daemon while the job is down.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from goodput_client import Telemetry
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("STEPS", "14"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "4"))
CRASH_RANK = 1
CRASH_STEP = int(os.environ.get("CRASH_STEP", "11"))
COMPUTE_SECONDS = float(os.environ.get("COMPUTE_SECONDS", "0.08"))  # the model is tiny: make steps measurable
LOGGING_SECONDS = float(os.environ.get("LOGGING_SECONDS", "0.02"))
ITEM_SECONDS = 0.002  # the input pipeline's time per sample (data_wait)


class Numbers(Dataset):
    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(ITEM_SECONDS)
        return torch.full((16,), float(self.first + index))


class Log:
    def __init__(self, path: Path) -> None:
        self.out = path.open("a", encoding="utf-8")

    def write(self, **record: object) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()  # line by line: whatever happens later, what was written stays


def terminated(signum: int, frame: object) -> None:
    """torchrun stops the surviving workers of a failed attempt with SIGTERM (SIGKILL 30 s later). Python's
    default action for SIGTERM ends the process at once, without atexit: the client's close() would not run,
    and the events still queued (at most flush_interval's worth) and its "end" would never reach the daemon,
    which would then count the downtime from the last event it got. A job that shuts down cleanly on SIGTERM,
    as this one does, turns it into SystemExit so that `finally` blocks and atexit handlers (the client's
    close() among them) run; the signal is ignored from then on, so that a second one cannot cut that short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def init_process_group(attempt: int) -> None:
    """gloo over torchrun's store, each attempt's keys apart. torchrun --standalone hands every attempt the same
    agent store (MASTER_ADDR:MASTER_PORT) and leaves the failed attempt's keys in it (PyTorch 2.13): gloo's
    full-mesh connect would read the dead peers' addresses from there and fail ("Connection refused")."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"/worker/attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def checkpoint_files(rank: int) -> tuple[Path, Path]:
    folder = Path(os.environ["OUT_DIR"]) / "checkpoints"
    folder.mkdir(exist_ok=True)
    return folder / f"rank-{rank}.pt", folder / f"rank-{rank}.latest"


def main() -> None:
    signal.signal(signal.SIGTERM, terminated)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out_dir = Path(os.environ["OUT_DIR"])
    init_process_group(attempt)
    rank = dist.get_rank()
    log = Log(out_dir / f"rank-{rank}-attempt-{attempt}.json")
    checkpoint, latest = checkpoint_files(rank)
    resumed = int(latest.read_text()) if latest.exists() else None  # the step the checkpoint holds
    gate = os.environ.get("GATE")
    if attempt > 0 and gate:
        (out_dir / f"rank-{rank}-attempt-{attempt}.waiting").touch()
        deadline = time.monotonic() + 300  # never left behind for good by a test that failed
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} never appeared")
            time.sleep(0.02)

    # flush_interval small and a flush after each step: every step is with the daemon before the crash
    telemetry = Telemetry(socket_path=os.environ["SOCKET"], flush_interval=0.05, resumed_from_step=resumed)
    created = time.perf_counter()
    log.write(event="telemetry", started_at=telemetry.started_at, resumed_from_step=resumed, attempt=attempt,
              workload=telemetry.workload, rank=telemetry.rank, pid=os.getpid())
    progress: dict[str, object] = {"last_step": resumed or 0, "finished": False, "error": None}

    def closing() -> None:
        # registered after the Telemetry's own atexit handler, so it runs just before the client's close()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elapsed = time.perf_counter() - created
        log.write(event="close", elapsed=elapsed, last_event_wall=telemetry.started_at + elapsed, **progress)

    atexit.register(closing)

    try:
        model = torch.nn.Linear(16, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        step = 0
        if resumed is not None:
            with telemetry.phase("checkpoint_restore"):
                state = torch.load(checkpoint, weights_only=True)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                step = int(state["step"])
            assert step == resumed, (step, resumed)
            log.write(event="restored", step=step)
        loader = DataLoader(Numbers(step * 4, (STEPS - step) * 4), batch_size=4, num_workers=0)
        batches = iter(telemetry.data_wait(loader))
        dist.barrier()  # start the loop together (untracked: no phase covers it)
        while step < STEPS:
            number = step + 1  # the client numbers it the same: resumed_from_step + the steps since
            started = time.perf_counter()
            with telemetry.step() as current:
                batch = next(batches)
                current.tokens, current.samples = batch.numel(), len(batch)
                with telemetry.phase("compute"):
                    if attempt == 0 and rank == CRASH_RANK and number == CRASH_STEP:
                        raise RuntimeError(f"simulated crash of rank {rank} in step {number}")
                    loss = model(batch).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    time.sleep(COMPUTE_SECONDS)
                with telemetry.phase("comm_wait"):
                    for param in model.parameters():
                        dist.all_reduce(param.grad)
                optimizer.step()
            duration = time.perf_counter() - started
            step = progress["last_step"] = number
            log.write(event="step", step=number, duration=duration)
            telemetry.flush()
            if number % CHECKPOINT_EVERY == 0:
                with telemetry.phase("checkpoint_save"):
                    partial = checkpoint.with_suffix(".partial")
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": number},
                               partial)
                    os.replace(partial, checkpoint)
                    latest.write_text(str(number))
                log.write(event="checkpoint", step=number)
            time.sleep(LOGGING_SECONDS)  # "logging": no phase covers it, so it is untracked
        progress["finished"] = True
        dist.destroy_process_group()
    except BaseException as exc:
        progress["error"] = f"{exc.__class__.__name__}: {exc}"
        raise


if __name__ == "__main__":
    sys.exit(main())
