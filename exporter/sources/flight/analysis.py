"""The cross-rank check, as `torchfrtrace` does it, over the ranks whose dumps this node holds.

For each process group, the oldest collective still in flight on some rank is found; the member
ranks that have not even enqueued it are missing. Dumps are taken by each rank on its own schedule,
so a rank is called missing only when its own dump was written at least `grace` seconds after the
waiting rank enqueued the collective: a rank whose dump is merely older is not accused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .schema import Dump


@dataclass(frozen=True, slots=True)
class RankDump:
    dump: Dump
    written: float  # Unix time the dump was written (its file's mtime)


@dataclass(frozen=True, slots=True, order=True)
class Missing:
    pg: str
    seq: int
    op: str
    rank: int
    waiting: tuple[int, ...]  # ranks blocked in the collective


def _members(pg: str, dumps: Mapping[int, RankDump]) -> set[int]:
    """Ranks of the group that this node has dumps for: pg_config's membership where the backend
    records it (NCCL), else every local rank whose dump knows the group (gloo)."""
    declared: set[int] = set()
    for rank_dump in dumps.values():
        group = rank_dump.dump.groups.get(pg)
        if group is not None and group.ranks:
            declared |= group.ranks
    if declared:
        return declared & dumps.keys()
    return {rank for rank, d in dumps.items() if pg in d.dump.groups}


def missing_ranks(dumps: Mapping[int, RankDump], grace: float) -> list[Missing]:
    """Missing ranks of the unfinished collectives of each process group.

    Each waiting rank's oldest in-flight collective is checked (normally all waiting ranks wait in
    the same one). A rank whose dump is stale, from a process that died long ago, is not accused:
    its dump was written before the wait began. Nor does it hide a newer hang: every waiting
    sequence number is checked, not only the smallest."""
    found: list[Missing] = []
    pgs = sorted({pg for d in dumps.values() for pg in d.dump.groups})
    for pg in pgs:
        members = _members(pg, dumps)
        if len(members) < 2:
            continue
        progress = {}
        for rank in members:
            group = dumps[rank].dump.groups.get(pg)
            if group is not None and group.enqueued is not None and group.completed is not None:
                progress[rank] = (group.enqueued, group.completed)
        pending = sorted({completed + 1 for enqueued, completed in progress.values() if enqueued > completed})
        for seq in pending:
            waiting = sorted(r for r, (enq, comp) in progress.items() if comp < seq <= enq)
            created = [e for r in waiting for e in dumps[r].dump.entries
                       if e.pg == pg and not e.is_p2p and e.seq == seq]
            if not created:
                continue  # the entry fell out of the ring buffer: nothing to date the wait by
            since = min(e.created_ns for e in created) / 1e9
            op = created[0].op
            for rank in sorted(members - set(waiting)):
                enqueued = progress.get(rank, (-1, -1))[0]
                if enqueued < seq and dumps[rank].written >= since + grace:
                    found.append(Missing(pg, seq, op, rank, tuple(waiting)))
    return found
