"""The process source: which workload and rank each GPU's processes belong to, with no change to the job.

For every GPU-holding PID (from the NVML source), in order of precedence:

1. declared: the (workload, rank) the process itself reported to the ingest API over the Unix socket
   (the kernel names the sending PID; see exporter/ingest/peer.py);
2. environment: its launcher variables in /proc/PID/environ (exporter/launcher.py: the same rules the
   training client uses when it declares nothing);
3. cgroup: the Slurm job of its cgroup, when its environment cannot be read.

Permissions: NVML reports host PIDs, so in a pod this needs hostPID; reading another user's environ
needs root or CAP_SYS_PTRACE. Without them processes are counted as invisible or denied in
goodput_attribution_processes and logged once each; the source stays up. A process that is gone from
NVML's list is gone from /metrics at the next collection.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source
from ..ingest.peer import pid_namespace_is_hosts
from ..ingest.state import IGNORED_REASONS, Declarations
from . import metrics as c
from .procenv import Outcome, read_identity

log = logging.getLogger(__name__)

DECLARED = "declared"
STATES = (DECLARED, *(o.value for o in Outcome))


class ProcessSource(Source):
    name = "process"

    def __init__(self, table: NodeGpus, proc_path: str = "/proc",
                 declared: Callable[[], Declarations] | None = None) -> None:
        self.table = table
        self.proc = Path(proc_path)
        self._declared = declared or (lambda: Declarations({}, {}))
        self._logged: dict[int, str] = {}  # pid -> what was last logged about it
        # the kernel names a sender by its PID in the daemon's namespace; NVML by the host's
        self.trust_peer_pids, why = pid_namespace_is_hosts(proc_path)
        if declared is not None and not self.trust_peer_pids:
            log.warning("process: the exporter is not in the host's PID namespace (%s): declarations over the "
                        "events socket are not bound to GPU processes; run it with hostPID", why)

    def _note(self, pid: int, key: str, level: int, message: str, *args: object) -> None:
        if self._logged.get(pid) != key:
            self._logged[pid] = key
            log.log(level, message, *args)

    def collect(self) -> Batch:
        table = self.table.holders()
        declarations = self._declared()
        declared = declarations.claims if self.trust_peer_pids else {}
        states: Counter[str] = Counter()
        rows: set[tuple[str, str, str, str]] = set()
        for pid, holders in table.items():
            claim = declared.get(pid)
            found = read_identity(self.proc, pid)
            if claim is not None:
                workload, rank = claim
                states[DECLARED] += 1
                if found.workload is not None and (found.workload, _rank(found.rank)) != (workload, rank):
                    self._note(pid, f"conflict:{workload}:{rank}", logging.INFO,
                               "process: PID %d declared workload %s rank %s; its launcher environment says "
                               "%s rank %s; the declaration wins", pid, workload, rank, found.workload,
                               _rank(found.rank) or "?")
            elif found.workload is not None:
                workload, rank = found.workload, _rank(found.rank)
                states[found.outcome] += 1
            else:
                states[found.outcome] += 1
                if found.outcome in (Outcome.DENIED, Outcome.INVISIBLE):
                    self._note(pid, found.outcome, logging.INFO,
                               "process: cannot read GPU process %d (%s): attribution needs hostPID and root or "
                               "CAP_SYS_PTRACE", pid, found.outcome)
                continue
            for holder in holders:
                rows.add((holder.gpu, holder.uuid, workload, rank))
        for pid in [p for p in self._logged if p not in table]:
            del self._logged[pid]
        batch = Batch()
        for row in sorted(rows, key=lambda r: (int(r[0]) if r[0].isdigit() else 0, r)):
            batch.add(c.GPU_WORKLOAD_INFO, row, 1)
        for state in STATES:
            batch.add(c.ATTRIBUTION_PROCESSES, (state,), states[state])
        for reason in IGNORED_REASONS:
            batch.add(c.DECLARATIONS_IGNORED, (reason,), declarations.ignored.get(reason, 0))
        return batch


def _rank(rank: int | None) -> str:
    return "" if rank is None else str(rank)
