"""goodput-instrument CMD [ARGS...]: run CMD with goodput's automatic instrumentation loaded at the start of every
Python interpreter it starts (torchrun and its ranks, accelerate launch, srun, python, Lightning's subprocesses):
the directory of a `sitecustomize` is put first on PYTHONPATH, and CMD replaces this process (same PID, signals and
exit status). The settings are GOODPUT_* environment variables (`goodput-instrument --help`)."""

from __future__ import annotations

import os
import sys

USAGE = """usage: goodput-instrument COMMAND [ARGS...]

Runs COMMAND with goodput-exporter's automatic training instrumentation: every Python process it starts reports
its optimizer steps, DataLoader waits, checkpoints, compilation, evaluation and collectives to the node's
goodput-exporter daemon, with no change to the job. Examples:

    goodput-instrument torchrun --nproc-per-node 8 train.py
    goodput-instrument python train.py
    goodput-instrument accelerate launch train.py
    srun goodput-instrument python train.py

Environment (all optional):
    GOODPUT_INGEST_SOCKET_PATH      the daemon's events socket (default /run/goodput-exporter/ingest.sock)
    GOODPUT_INSTRUMENT=0            load nothing
    GOODPUT_INSTRUMENT_PROBES_OFF   probes to leave out, comma-separated: steps, data_wait, checkpoint,
                                    distributed_checkpoint, comm_wait, compile, eval, flops, transformers, lightning
    GOODPUT_FLOPS=measure           count one step's model FLOPs with FlopCounterMode (for MFU; plain loops)
    GOODPUT_FLOPS_DTYPE             the data type those FLOPs run in (default bf16)
    GOODPUT_FLIGHT_DIR              the node's flight-recorder directory (default /run/goodput-exporter/flight)
    GOODPUT_FLIGHT_INTERVAL         seconds between flight-recorder dumps (default 30)
    GOODPUT_WORKLOAD, GOODPUT_RANK  the job's name and rank where no launcher variable gives them
"""


def autoload_dir() -> str:
    """The directory holding the sitecustomize that boots the instrumentation."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "autoload")


def environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with the autoload directory first on PYTHONPATH (once)."""
    here = autoload_dir()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {**env, "PYTHONPATH": os.pathsep.join([here, *parts])}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE) if args else sys.stderr.write(USAGE)
        return 0 if args else 2
    if args[0] == "--":
        args = args[1:]
    try:
        os.execvpe(args[0], args, environment(dict(os.environ)))
    except OSError as exc:
        sys.stderr.write(f"goodput-instrument: cannot run {args[0]!r}: {exc.strerror}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
