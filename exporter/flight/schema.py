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
from math import prod
from operator import itemgetter, mul
from typing import Any

from .load import Rejected

SUPPORTED_MAJOR = 2
MAX_ENTRIES = 100_000  # PyTorch's default ring buffer holds 2,000
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


def _buffer_bytes(sizes: Any, dtypes: Any) -> int | None:
    """Bytes of a list of tensors (shapes x dtype widths); None for a dtype of unknown width."""
    if type(sizes) not in _LISTS or type(dtypes) not in _LISTS or len(sizes) != len(dtypes):
        raise TypeError("sizes and dtypes must be lists of one length")
    try:
        total = sum(map(mul, map(prod, sizes), map(DTYPE_BYTES.__getitem__, dtypes)))
    except KeyError:  # a dtype of unknown width: the shapes must still be sizes
        if type(sum(map(prod, sizes))) is not int:
            raise TypeError("tensor sizes must be natural numbers") from None
        return None
    if type(total) is not int or total < 0:
        raise TypeError("tensor sizes must be natural numbers")
    return total


_LISTS = (list, tuple)
width = DTYPE_BYTES.__getitem__
_FIELDS = itemgetter("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
                     "time_created_ns", "state", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
_OP_NAMES: dict[str, str] = {}


def _op(profiling_name: str) -> str:
    op = _OP_NAMES.get(profiling_name)
    if op is None:
        op = op_name(profiling_name)
        if len(_OP_NAMES) < 4096:
            _OP_NAMES[profiling_name] = op
    return op


def _entries(raw_entries: list[Any]) -> list[Entry]:
    """Every entry of the dump. One quick check per entry covers every type the exporter relies on;
    an entry that fails it is looked at field by field, for an error that names the field."""
    out = []
    append = out.append
    for i, raw in enumerate(raw_entries):
        try:
            (record_id, pg, collective_seq, p2p_seq, profiling_name, created, state,
             in_sizes, in_dtypes, out_sizes, out_dtypes) = _FIELDS(raw)
            is_p2p = raw.get("is_p2p", False)
            retired = raw.get("retired", False)
            duration = raw.get("duration_ms")
            # bytes of the inputs and outputs, inline (the hot loop): shapes x dtype widths
            if len(in_sizes) != len(in_dtypes) or len(out_sizes) != len(out_dtypes):
                raise TypeError
            nbytes: int | None = max(sum(map(mul, map(prod, in_sizes), map(width, in_dtypes))),
                                     sum(map(mul, map(prod, out_sizes), map(width, out_dtypes))))
        except KeyError:
            nbytes = _unknown_width(raw, i)
        except (TypeError, AttributeError, ValueError, OverflowError):
            _explain(raw, i)
            raise AssertionError("unreachable") from None
        if not (type(record_id) is int and type(collective_seq) is int and type(p2p_seq) is int
                and type(created) is int and type(profiling_name) is str and type(state) is str
                and type(pg) in _LISTS and len(pg) == 2 and type(pg[0]) is str and type(pg[1]) is str
                and type(is_p2p) is bool and type(retired) is bool and type(in_sizes) in _LISTS
                and type(out_sizes) in _LISTS and type(nbytes) in (int, type(None)) and (nbytes or 0) >= 0
                and (duration is None or (type(duration) in (int, float) and duration >= 0))):
            _explain(raw, i)
        append(Entry(
            record_id, pg[0], p2p_seq if is_p2p else collective_seq, is_p2p, _op(profiling_name), created,
            retired or state == "completed", None if duration is None else duration / 1000.0, nbytes))
    return out


def _unknown_width(raw: Any, i: int) -> None:
    """An entry with a dtype of unknown width (or a missing field): no bytes, if it is otherwise sound."""
    _explain_sizes(raw, f"entries[{i}]")
    try:
        _FIELDS(raw)
    except KeyError:
        _explain(raw, i)
    return None


def _explain(raw: Any, i: int) -> None:
    """Raise Rejected naming what is wrong with entry i."""
    where = f"entries[{i}]"
    if not isinstance(raw, dict):
        raise Rejected("bad_schema", f"{where}: expected a mapping, got {type(raw).__name__}")
    for key in ("record_id", "collective_seq_id", "p2p_seq_id", "time_created_ns"):
        _int(raw, key, where)
    _str(raw, "profiling_name", where)
    _str(raw, "state", where)
    pg = _field(raw, "process_group", where)
    if not isinstance(pg, list | tuple) or len(pg) != 2 or not all(isinstance(p, str) for p in pg):
        raise Rejected("bad_schema", f"{where}.process_group: expected (name, description)")
    for key in ("is_p2p", "retired"):
        if not isinstance(raw.get(key, False), bool):
            raise Rejected("bad_schema", f"{where}.{key}: expected a boolean")
    duration = raw.get("duration_ms")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int | float)
                                 or not duration >= 0):
        raise Rejected("bad_schema", f"{where}.duration_ms: expected a non-negative number")
    _explain_sizes(raw, where)
    raise Rejected("bad_schema", f"{where}: unexpected field types")


def _explain_sizes(raw: dict[str, Any], where: str) -> None:
    for direction in ("input", "output"):
        sizes = _field(raw, f"{direction}_sizes", where)
        dtypes = _field(raw, f"{direction}_dtypes", where)
        try:
            _buffer_bytes(sizes, dtypes)
        except (TypeError, ValueError, OverflowError) as exc:
            raise Rejected("bad_schema", f"{where}.{direction}_sizes: {exc}") from None


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
    entries = _entries(raw_entries)

    groups: dict[str, Group] = {}
    pg_ids: dict[int, str] = {}
    for raw in raw_entries:
        name, desc = raw["process_group"]
        if name not in groups:
            groups[name] = Group(name, desc=desc)
            pg_id = raw.get("pg_id")
            if type(pg_id) is int:
                pg_ids.setdefault(pg_id, name)

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
