"""Which workload and rank a process is, from the variables its launcher set.

One definition, used by the training client (the identity it declares when none is given) and by the
daemon's process source (the identity it reads from a GPU process's environment), so that both name a
job the same way:

    workload  GOODPUT_JOB (the job's own name, the same in each of its runs: a resubmission under a new run
              id, a new Slurm job, a recreated pod, stays one workload), else the run below
    run       TORCHELASTIC_RUN_ID (torchrun; its placeholder "none" is ignored), else SLURM_JOB_ID,
              else MASTER_ADDR:MASTER_PORT (a rendezvous every rank of one job shares). A loopback
              MASTER_ADDR (localhost, 127.x, ::1: the tutorials' default) is shared by unrelated
              single-node jobs on every node, so it is qualified with the host name:
              HOST/localhost:29500. Two jobs cannot hold one port on one host at once, so this still
              names one job. The host is the one the process runs on as it sees itself: a training
              client in a pod names its pod's host name, the daemon reading a process's environment
              its own (the node's, with hostNetwork).
    rank      RANK (global rank, torchrun and torch.distributed), else SLURM_PROCID

Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping

from .contract import MAX_RANK, WORKLOAD_PATTERN

JOB_ENV = "GOODPUT_JOB"  # the job's identity across its runs
RESTART_COUNTS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")  # set by torchrun's agent, by Slurm on requeue
NO_RUN_ID = "none"  # torchrun's --rdzv-id when none was given: shared by unrelated jobs, not a name
VARIABLES = (JOB_ENV, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "SLURM_PROCID")

_WORKLOAD = re.compile(WORKLOAD_PATTERN)


def valid_workload(name: str) -> bool:
    return _WORKLOAD.match(name) is not None


def is_loopback(address: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 (also bracketed, as in [::1])."""
    host = address.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def job_from(env: Mapping[str, str]) -> str | None:
    """GOODPUT_JOB, where it is a valid workload name; else None."""
    name = env.get(JOB_ENV, "").strip()
    return name if name and valid_workload(name) else None


def workload_from(env: Mapping[str, str], hostname: str | None = None) -> str | None:
    """The workload: GOODPUT_JOB, else the run the launcher variables name; None where neither names a valid one.
    `hostname` qualifies a loopback MASTER_ADDR (default: this host's name)."""
    return job_from(env) or run_from(env, hostname)


def run_from(env: Mapping[str, str], hostname: str | None = None) -> str | None:
    """The run the launcher variables name (this launch of the job), or None (absent, or not a valid workload
    name). `hostname` qualifies a loopback MASTER_ADDR (default: this host's name)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != NO_RUN_ID:
        name = run_id
    elif env.get("SLURM_JOB_ID"):
        name = env["SLURM_JOB_ID"]
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        address = env["MASTER_ADDR"]
        name = f"{address}:{env['MASTER_PORT']}"
        if is_loopback(address):
            host = hostname if hostname is not None else socket.gethostname()
            name = f"{host.partition('.')[0]}/{name}"
    else:
        return None
    return name if valid_workload(name) else None


def rank_from(env: Mapping[str, str]) -> int | None:
    """The global rank the launcher variables name, or None."""
    for variable in ("RANK", "SLURM_PROCID"):
        text = env.get(variable, "")
        if text:
            if text.isascii() and text.isdigit() and int(text) < MAX_RANK:
                return int(text)
            return None  # present but not a rank: do not fall through to another launcher's idea
    return None


def restart_count(env: Mapping[str, str]) -> int:
    """How many times the launcher restarted this process's job (torchrun's TORCHELASTIC_RESTART_COUNT, Slurm's
    SLURM_RESTART_COUNT); 0 when neither says, or says something that is not a count."""
    for name in RESTART_COUNTS:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0
