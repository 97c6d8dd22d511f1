"""The flight-recorder dump schema (PyTorch's FlightRecorder, dump version 2.x) -> a compact `Dump`.

Only the fields the exporter uses are read, and each is checked for type, so a dump of the wrong
shape is rejected with the field named rather than failing somewhere later. The pickle and JSON forms
differ in small ways that are smoothed out here: JSON writes pg_status values as strings and missing
times as 0, pickle as integers and None.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from .load import Rejected

SUPPORTED_MAJOR = 2
MAX_ENTRIES = 100_000  # PyTorch's default ring buffer holds 2,000
MAX_TENSORS = 4_096  # per entry and direction
MAX_DIMS = 16
# c10::toString(ScalarType) -> bytes per element
DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1, "Bits8": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "Float4_e2m1fn_x2": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "Bits16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "UInt32": 4, "QInt32": 4,
    "Long": 8, "Double": 8, "UInt64": 8, "ComplexFloat": 8,
    "ComplexDouble": 16,
}
_OP = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(slots=True)
class Entry:
    record_id: int
    pg: str  # process-group name, the same on every rank
    seq: int  # collective_seq_id, or p2p_seq_id for point-to-point operations
    is_p2p: bool
    op: str  # profiling_name without the backend prefix: all_reduce, broadcast, send, ...
    created_ns: int
    finished: bool  # retired, or its end event was seen
    duration_s: float | None
    bytes: int | None  # the larger of the input and output buffers; None for an unknown dtype
    inflight: bool = False  # set by parse(): enqueued and not yet completed


@dataclass(slots=True)
class Group:
    name: str
    desc: str = ""
    ranks: frozenset[int] | None = None  # from pg_config; gloo does not record membership
    enqueued: int | None = None  # from pg_status; None where the dump has none
    started: int | None = None
    completed: int | None = None


@dataclass(slots=True)
class Dump:
    version: str
    entries: list[Entry]
    groups: dict[str, Group] = field(default_factory=dict)


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise Rejected("bad_schema", f"{where}: missing field {key!r}") from None


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where)
    if type(value) is not int:
        raise Rejected("bad_schema", f"{where}.{key}: expected an integer, got {type(value).__name__}")
    return value


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = _field(obj, key, where)
    if not isinstance(value, str):
        raise Rejected("bad_schema", f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def _int_text(value: Any, where: str) -> int:
    """pg_status values: integers in pickles, decimal strings in JSON."""
    if type(value) is int:
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value):
        return int(value)
    raise Rejected("bad_schema", f"{where}: expected an integer, got {value!r:.40}")


def check_version(raw: Any) -> str:
    if not isinstance(raw, str) or not re.fullmatch(r"\d{1,4}\.\d{1,4}", raw):
        raise Rejected("unknown_version", f"dump version {raw!r:.40} is not MAJOR.MINOR")
    if int(raw.split(".")[0]) != SUPPORTED_MAJOR:
        raise Rejected("unknown_version", f"dump version {raw} is not supported (reads {SUPPORTED_MAJOR}.x)")
    return raw


def op_name(profiling_name: str) -> str:
    """`nccl:all_reduce` -> all_reduce; `nccl:send 0->1` -> send; anything odd -> other."""
    name = profiling_name.partition(":")[2] or profiling_name
    name = name.split(" ", 1)[0].strip("_").lower()
    return name if _OP.match(name) else "other"


def _buffer_bytes(sizes: Any, dtypes: Any, where: str) -> int | None:
    if not isinstance(sizes, list | tuple) or not isinstance(dtypes, list | tuple):
        raise Rejected("bad_schema", f"{where}: sizes and dtypes must be lists")
    if len(sizes) != len(dtypes) or len(sizes) > MAX_TENSORS:
        raise Rejected("bad_schema", f"{where}: {len(sizes)} sizes for {len(dtypes)} dtypes")
    total = 0
    known = True
    for shape, dtype in zip(sizes, dtypes, strict=True):
        if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
            raise Rejected("bad_schema", f"{where}: a tensor shape is not a list of at most {MAX_DIMS} sizes")
        count = 1
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise Rejected("bad_schema", f"{where}: tensor size {dim!r:.20} is not a natural number")
            count *= dim
        width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if width is None:
            known = False
        else:
            total += count * width
    return total if known else None


def _entry(raw: Any, i: int) -> Entry:
    where = f"entries[{i}]"
    if not isinstance(raw, dict):
        raise Rejected("bad_schema", f"{where}: expected a mapping, got {type(raw).__name__}")
    pg = _field(raw, "process_group", where)
    if not isinstance(pg, list | tuple) or len(pg) != 2 or not all(isinstance(p, str) for p in pg):
        raise Rejected("bad_schema", f"{where}.process_group: expected (name, description)")
    is_p2p = raw.get("is_p2p", False)
    if not isinstance(is_p2p, bool):
        raise Rejected("bad_schema", f"{where}.is_p2p: expected a boolean")
    state = _str(raw, "state", where)
    retired = raw.get("retired", False)
    if not isinstance(retired, bool):
        raise Rejected("bad_schema", f"{where}.retired: expected a boolean")
    duration = raw.get("duration_ms")
    if duration is not None:
        if isinstance(duration, bool) or not isinstance(duration, int | float) or not duration >= 0:
            raise Rejected("bad_schema", f"{where}.duration_ms: expected a non-negative number")
        duration = duration / 1000.0
    in_bytes = _buffer_bytes(_field(raw, "input_sizes", where), _field(raw, "input_dtypes", where), where)
    out_bytes = _buffer_bytes(_field(raw, "output_sizes", where), _field(raw, "output_dtypes", where), where)
    return Entry(
        record_id=_int(raw, "record_id", where),
        pg=pg[0],
        seq=_int(raw, "p2p_seq_id" if is_p2p else "collective_seq_id", where),
        is_p2p=is_p2p,
        op=op_name(_str(raw, "profiling_name", where)),
        created_ns=_int(raw, "time_created_ns", where),
        finished=retired or state == "completed",
        duration_s=duration,
        bytes=None if in_bytes is None or out_bytes is None else max(in_bytes, out_bytes),
    )


def _ranks(text: Any, where: str) -> frozenset[int] | None:
    """pg_config ranks: the string "[0, 1, 2]" (a literal, never evaluated as code)."""
    if not isinstance(text, str):
        raise Rejected("bad_schema", f"{where}: expected a string like '[0, 1]'")
    try:
        ranks = ast.literal_eval(text) if len(text) < 1_000_000 else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        ranks = None
    if not isinstance(ranks, list | tuple) or not all(type(r) is int for r in ranks):
        raise Rejected("bad_schema", f"{where}: expected a list of ranks, got {text!r:.40}")
    return frozenset(ranks) or None


def parse(data: Any) -> Dump:
    """A loaded dump (pickle or JSON) -> Dump; raises Rejected naming what is wrong."""
    if not isinstance(data, dict):
        raise Rejected("bad_schema", f"a dump is a mapping, got {type(data).__name__}")
    if "version" not in data:
        raise Rejected("unknown_version", "the dump has no version field")
    version = check_version(data["version"])
    raw_entries = data.get("entries", [])  # JSON leaves the key out when there are none
    if not isinstance(raw_entries, list):
        raise Rejected("bad_schema", "dump.entries: expected a list")
    if len(raw_entries) > MAX_ENTRIES:
        raise Rejected("bad_schema", f"dump.entries: {len(raw_entries)} entries, more than {MAX_ENTRIES}")
    entries = [_entry(raw, i) for i, raw in enumerate(raw_entries)]

    groups: dict[str, Group] = {}
    pg_ids: dict[int, str] = {}
    for raw, entry in zip(raw_entries, entries, strict=True):
        group = groups.get(entry.pg)
        if group is None:
            group = groups[entry.pg] = Group(entry.pg, desc=str(raw["process_group"][1]))
        pg_id = raw.get("pg_id")
        if type(pg_id) is int:
            pg_ids.setdefault(pg_id, entry.pg)

    config = data.get("pg_config", {})
    if not isinstance(config, dict):
        raise Rejected("bad_schema", "dump.pg_config: expected a mapping")
    for name, info in config.items():
        if name == "":  # gloo records no membership: a single placeholder keyed ''
            continue
        where = f"pg_config[{name!r:.40}]"
        if not isinstance(name, str) or not isinstance(info, dict):
            raise Rejected("bad_schema", f"{where}: expected a mapping")
        group = groups.setdefault(name, Group(name))
        desc = info.get("desc")
        if isinstance(desc, str) and desc:
            group.desc = desc
        group.ranks = _ranks(_field(info, "ranks", where), f"{where}.ranks")

    status = data.get("pg_status", {})
    if not isinstance(status, dict):
        raise Rejected("bad_schema", "dump.pg_status: expected a mapping")
    for key, values in status.items():
        where = f"pg_status[{key!r:.40}]"
        if not isinstance(values, dict):
            raise Rejected("bad_schema", f"{where}: expected a mapping")
        pg_id = _int_text(key, where)
        name = pg_ids.get(pg_id, str(pg_id))
        group = groups.setdefault(name, Group(name))
        group.enqueued = _int_text(_field(values, "last_enqueued_collective", where), where)
        group.started = _int_text(_field(values, "last_started_collective", where), where)
        group.completed = _int_text(_field(values, "last_completed_collective", where), where)
    _settle_progress(entries, groups)
    return Dump(version, entries, groups)


def _settle_progress(entries: list[Entry], groups: dict[str, Group]) -> None:
    """Fill what pg_status left out from the entries, then mark the entries still in flight.

    A collective is in flight while its sequence number is past the group's last completed one: that
    is the watchdog's own view, and it also covers the ops of a coalesced group, which are never
    retired one by one. Point-to-point ops have their own sequence, so their own state decides.
    """
    for group in groups.values():
        if group.enqueued is None:
            seqs = [e.seq for e in entries if e.pg == group.name and not e.is_p2p]
            done = [e.seq for e in entries if e.pg == group.name and not e.is_p2p and e.finished]
            group.enqueued = max(seqs, default=-1)
            group.completed = max(done, default=-1)
    for entry in entries:
        if entry.is_p2p:
            entry.inflight = not entry.finished
        else:
            completed = groups[entry.pg].completed
            entry.inflight = entry.seq > completed if completed is not None else not entry.finished
