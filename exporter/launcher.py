"""Which workload and rank a process is, from the variables its launcher set.

One definition, used by the training client (the identity it declares when none is given) and by the
process source (the identity it reads from a GPU process's environment), so that both name a job
the same way:

    workload  TORCHELASTIC_RUN_ID (torchrun; its placeholder "none" is ignored), else SLURM_JOB_ID,
              else MASTER_ADDR:MASTER_PORT (a rendezvous every rank of one job shares)
    rank      RANK (global rank, torchrun and torch.distributed), else SLURM_PROCID

No dependencies beyond the standard library: training jobs import it through the client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

WORKLOAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$"  # what POST /v1/events accepts
MAX_RANK = 1_000_000
NO_RUN_ID = "none"  # torchrun's --rdzv-id when none was given: shared by unrelated jobs, not a name
VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "SLURM_PROCID")

_WORKLOAD = re.compile(WORKLOAD_PATTERN)


def valid_workload(name: str) -> bool:
    return _WORKLOAD.match(name) is not None


def workload_from(env: Mapping[str, str]) -> str | None:
    """The workload the launcher variables name, or None (absent, or not a valid workload name)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != NO_RUN_ID:
        name = run_id
    elif env.get("SLURM_JOB_ID"):
        name = env["SLURM_JOB_ID"]
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        name = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
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
