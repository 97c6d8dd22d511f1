"""Reads what a GPU process's launcher left in /proc/PID/environ and /proc/PID/cgroup.

environ is readable only with ptrace access to the process (same user, or root / CAP_SYS_PTRACE),
and only for processes in our PID namespace (hostPID in a pod). It is the environment the process was
exec'd with: variables a process sets or changes after exec (os.environ[...] = ... in Python) are not
visible there, so a job that sets RANK itself must declare it through the client instead. cgroup is
world-readable, so when environ is refused a Slurm job id can still come from the job's cgroup
(slurmstepd puts every task under .../job_<id>/step_<n>/...). Nothing else is guessed.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from goodput_client.launcher import VARIABLES, rank_from, valid_workload, workload_from

MAX_ENVIRON_BYTES = 1 << 20  # the kernel caps argv+envp well below this on default settings
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


class Outcome(StrEnum):
    """What reading one process gave; the values label goodput_attribution_processes{state}."""

    ENVIRONMENT = "environment"  # workload from the launcher variables
    CGROUP = "cgroup"  # environ unreadable or silent; workload from the Slurm cgroup
    UNATTRIBUTED = "unattributed"  # readable, but no launcher variable names a workload
    DENIED = "denied"  # environ refused (no ptrace access) and the cgroup names no job
    INVISIBLE = "invisible"  # not in our PID namespace (no hostPID), or gone


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    outcome: Outcome
    workload: str | None = None
    rank: int | None = None


def parse_environ(data: bytes, truncated: bool = False, names: Collection[str] = VARIABLES) -> dict[str, str]:
    """NUL-separated NAME=value pairs -> those among `names` (the launcher variables by default; others are
    not kept).

    `truncated`: the read stopped at MAX_ENVIRON_BYTES, so the last item may be cut short and is
    dropped. A name given twice keeps its first value, as getenv() in glibc and os.environ do."""
    out: dict[str, str] = {}
    items = data.split(b"\0")
    if truncated and not data.endswith(b"\0"):
        items = items[:-1]
    for item in items:
        name, sep, value = item.partition(b"=")
        if sep:
            key = name.decode("ascii", errors="replace")
            if key in names and key not in out:
                out[key] = value.decode("utf-8", errors="replace")
    return out


class Invisible(Exception):
    """The process is not in our PID namespace, or is gone."""


def read_environ(proc: Path, pid: int, names: Collection[str] = VARIABLES) -> dict[str, str] | None:
    """The variables among `names` that `pid` was exec'd with; None when its environ may not be read (no
    ptrace access). Raises Invisible for a process that is gone or not in our PID namespace."""
    try:
        with open(proc / str(pid) / "environ", "rb") as handle:
            data = handle.read(MAX_ENVIRON_BYTES + 1)
    except FileNotFoundError:
        raise Invisible(pid) from None
    except (PermissionError, ProcessLookupError):
        return None
    except OSError:  # e.g. ESRCH while the process exits
        raise Invisible(pid) from None
    return parse_environ(data[:MAX_ENVIRON_BYTES], truncated=len(data) > MAX_ENVIRON_BYTES, names=names)


def slurm_job_from_cgroup(text: str) -> str | None:
    for line in text.splitlines():
        match = _SLURM_CGROUP.search(line.rpartition(":")[2])
        if match is not None and valid_workload(match.group(1)):
            return match.group(1)
    return None


def read_identity(proc: Path, pid: int) -> ProcessIdentity:
    """The launcher identity of `pid` under the procfs mounted at `proc`. Never raises for a process
    that is gone, invisible or not ours to read: the outcome says which."""
    base = proc / str(pid)
    try:
        env = read_environ(proc, pid)
    except Invisible:
        return ProcessIdentity(Outcome.INVISIBLE)
    if env is not None:
        workload = workload_from(env)
        if workload is not None:
            return ProcessIdentity(Outcome.ENVIRONMENT, workload, rank_from(env))
    try:
        cgroup = (base / "cgroup").read_text(errors="replace")
    except FileNotFoundError:
        return ProcessIdentity(Outcome.INVISIBLE)
    except OSError:
        cgroup = ""
    job = slurm_job_from_cgroup(cgroup)
    if job is not None:
        rank = rank_from(env) if env is not None else None
        return ProcessIdentity(Outcome.CGROUP, job, rank)
    return ProcessIdentity(Outcome.UNATTRIBUTED if env is not None else Outcome.DENIED)
