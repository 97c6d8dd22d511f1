"""What one dump adds to a rank's counters, given what the rank's earlier dumps already showed.

A dump is a ring buffer: successive dumps overlap, so each op must be counted once however many dumps
show it, entries that left the buffer between two reads are lost, and a restarted process starts
its record ids again. `summarize` works that out in the parser process, entry by entry; the daemon
only merges the small `Summary` into the rank's counters.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .metrics import COLLECTIVE_BUCKETS
from .schema import Dump, Entry, Group

Key = tuple[str, str]  # (process group, op)


@dataclass(frozen=True, slots=True)
class Prior:
    """What earlier dumps of the rank showed, as far as counting needs it."""

    counted_to: int = -1  # highest record_id counted in ops and bytes
    last_seen: tuple[int, int] | None = None  # (record_id, time_created_ns) of that entry
    timed: frozenset[int] = frozenset()  # record_ids whose durations are counted


@dataclass(slots=True)
class Summary:
    version: str
    groups: dict[str, Group]
    inflight: list[Entry]  # the entries still in flight; everything else is counted below
    restarted: bool  # a new process or a flight-recorder reset: the rank's counters start again
    ops: dict[Key, int] = field(default_factory=dict)  # what this dump adds
    bytes: dict[Key, int] = field(default_factory=dict)
    durations: dict[Key, list[int]] = field(default_factory=dict)  # observations per bucket, +Inf last
    duration_sums: dict[Key, float] = field(default_factory=dict)
    lost: int = 0
    prior: Prior = field(default_factory=Prior)  # to pass with the rank's next dump


def continues(dump: Dump, prior: Prior) -> bool:
    """False when the dump comes from a new process, or a flight-recorder reset."""
    if prior.last_seen is None or not dump.entries:
        return True
    record_id, created = prior.last_seen
    for entry in dump.entries:
        if entry.record_id == record_id:
            return entry.created_ns == created
    first = min(dump.entries, key=lambda e: e.record_id)
    return first.record_id > record_id and first.created_ns >= created


def summarize(dump: Dump, prior: Prior) -> Summary:
    restarted = not continues(dump, prior)
    if restarted:
        prior = Prior()
    summary = Summary(dump.version, dump.groups, [e for e in dump.entries if e.inflight], restarted)
    ops, sizes, durations, sums = summary.ops, summary.bytes, summary.durations, summary.duration_sums
    counted_to, already_timed = prior.counted_to, prior.timed
    timed = set()
    for entry in dump.entries:
        key = (entry.pg, entry.op)
        if entry.record_id > counted_to:
            ops[key] = ops.get(key, 0) + 1
            sizes[key] = sizes.get(key, 0) + (entry.bytes or 0)
        if entry.duration_s is not None:
            timed.add(entry.record_id)
            if entry.record_id not in already_timed:
                counts = durations.get(key)
                if counts is None:
                    counts = durations[key] = [0] * (len(COLLECTIVE_BUCKETS) + 1)
                counts[bisect.bisect_left(COLLECTIVE_BUCKETS, entry.duration_s)] += 1
                sums[key] = sums.get(key, 0.0) + entry.duration_s
    last_seen = prior.last_seen
    if dump.entries:
        newest = max(dump.entries, key=lambda e: e.record_id)
        first = min(e.record_id for e in dump.entries)
        if counted_to >= 0 and first > counted_to + 1:
            summary.lost = first - counted_to - 1
        counted_to = max(counted_to, newest.record_id)
        last_seen = (newest.record_id, newest.created_ns)
    summary.prior = Prior(counted_to, last_seen, frozenset(timed))
    return summary
