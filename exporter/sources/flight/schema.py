"""The flight-recorder dump schema (PyTorch's FlightRecorder, dump version 2.x) -> a compact `Dump`.

Only the fields the exporter uses are read, and each is checked for type and range, so a dump of the
wrong shape is rejected with the field named rather than failing somewhere later. Every integer must
fit in 63 bits, tensor shapes must be lists of natural numbers, and the counts of entries, tensors,
dimensions and groups are capped, so no dump costs more to parse than its size warrants. Messages
never echo a value from the file, only its type.

The pickle and JSON forms differ in small ways that are smoothed out here: JSON writes pg_status
values as strings and missing times as 0, pickle as integers and None.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from itertools import chain
from math import prod
from operator import itemgetter, mul
from typing import Any

from .load import Rejected

SUPPORTED_MAJOR = 2
MAX_ENTRIES = 100_000  # PyTorch's default ring buffer holds 2,000
MAX_TENSORS = 4_096  # per entry and direction (coalesced ops carry many)
MAX_DIMS = 16
MAX_SIZE_VALUES = 4_000_000  # tensor dimensions in a whole dump
MAX_GROUPS = 10_000
MAX_NAME = 256  # process-group names and descriptions, profiling names
MAX_RANKS_TEXT = 4_000_000  # pg_config's "[0, 1, ...]" strings in a whole dump
_U63 = 2**63
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
_OP = re.compile(r"[a-z][a-z0-9_]{0,63}")
_RANKS = re.compile(r"\[\s*(?:\d{1,9}(?:\s*,\s*\d{1,9})*)?\s*\]")
_SEQ_TEXT = re.compile(r"-?\d{1,19}")


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
    bytes: int | None  # the larger of the input and output buffers; None for a dtype of unknown width
    inflight: bool = False  # set by parse(): enqueued and not yet completed


@dataclass(slots=True)
class Group:
    name: str
    desc: str = ""
    ranks: frozenset[int] | None = None  # from pg_config (gloo: its '' entry, see _read_config)
    enqueued: int | None = None  # from pg_status, else from the entries
    started: int | None = None  # None where the dump does not say
    completed: int | None = None


@dataclass(slots=True)
class Dump:
    version: str
    entries: list[Entry]
    groups: dict[str, Group] = field(default_factory=dict)


def _show(value: Any) -> str:
    """What a bad value is, without echoing it: its type, and a short prefix of a string."""
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if type(value) is int and -(10**18) < value < 10**18:
        return f"the integer {value}"
    return f"a value of type {type(value).__name__}"


def _bad(where: str, wanted: str, value: Any) -> Rejected:
    return Rejected("bad_schema", f"{where}: expected {wanted}, got {_show(value)}")


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise Rejected("bad_schema", f"{where}: missing field {key!r}") from None


def _natural(value: Any, where: str) -> int:
    if type(value) is not int or not 0 <= value < _U63:
        raise _bad(where, "an integer from 0 to 2**63", value)
    return value


def _name(value: Any, where: str) -> str:
    if type(value) is not str or len(value) > MAX_NAME:
        raise _bad(where, f"a string of at most {MAX_NAME} characters", value)
    return value


def _seq_value(value: Any, where: str) -> int:
    """pg_status values: integers in pickles, decimal strings in JSON; -1 means none yet."""
    if type(value) is str and _SEQ_TEXT.fullmatch(value):
        value = int(value)
    if type(value) is not int or not -1 <= value < _U63:
        raise _bad(where, "a sequence number", value)
    return value


def check_version(raw: Any) -> str:
    if type(raw) is not str or not re.fullmatch(r"\d{1,4}\.\d{1,4}", raw):
        raise Rejected("unknown_version", f"the dump's version is {_show(raw)}, not MAJOR.MINOR")
    if int(raw.split(".")[0]) != SUPPORTED_MAJOR:
        raise Rejected("unknown_version", f"dump version {raw} is not supported (reads {SUPPORTED_MAJOR}.x)")
    return raw


def op_name(profiling_name: str) -> str:
    """`nccl:all_reduce` -> all_reduce; `nccl:send 0->1` -> send; anything odd -> other."""
    name = profiling_name.partition(":")[2] or profiling_name
    name = name.split(" ", 1)[0].strip("_").lower()
    return name if _OP.fullmatch(name) else "other"


_OP_NAMES: dict[str, str] = {}


def _op(profiling_name: str) -> str:
    op = _OP_NAMES.get(profiling_name)
    if op is None:
        op = op_name(profiling_name)
        if len(_OP_NAMES) < 4096:
            _OP_NAMES[profiling_name] = op
    return op


_width = DTYPE_BYTES.__getitem__
_LISTS = (list, tuple)


def tensor_bytes(sizes: Any, dtypes: Any) -> tuple[int | None, int]:
    """(bytes of the tensors, or None for a dtype of unknown width; number of size values).

    Raises ValueError saying what is wrong. Dimensions are checked to be 63-bit natural numbers in C
    (array('q')) before anything multiplies them."""
    if type(sizes) not in _LISTS or type(dtypes) not in _LISTS or len(sizes) != len(dtypes):
        raise ValueError("sizes and dtypes must be lists of one length")
    if len(sizes) > MAX_TENSORS:
        raise ValueError(f"more than {MAX_TENSORS} tensors")
    try:
        if sizes and max(map(len, sizes)) > MAX_DIMS:
            raise ValueError(f"a tensor with more than {MAX_DIMS} dimensions")
        dims = array("q", chain.from_iterable(sizes))
    except (TypeError, OverflowError):
        raise ValueError("a tensor shape must be a list of integers") from None
    if dims and min(dims) < 0:
        raise ValueError("a tensor size is negative")
    try:
        total = sum(map(mul, map(prod, sizes), map(_width, dtypes)))
    except KeyError:
        return None, len(dims)
    except TypeError:
        raise ValueError("dtypes must be names like 'Float'") from None
    if total >= _U63:
        raise ValueError("the tensors are implausibly large")
    return total, len(dims)


_FIELDS = itemgetter("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
                     "time_created_ns", "state", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


def _entries(raw_entries: list[Any]) -> list[Entry]:
    """Every entry of the dump. One quick check per entry covers every field the exporter relies on;
    an entry that fails it is looked at field by field, for an error that names the field."""
    out = []
    append = out.append
    size_values = 0
    for i, raw in enumerate(raw_entries):
        try:
            (record_id, pg, collective_seq, p2p_seq, profiling_name, created, state,
             in_sizes, in_dtypes, out_sizes, out_dtypes) = _FIELDS(raw)
            is_p2p = raw.get("is_p2p", False)
            retired = raw.get("retired", False)
            duration = raw.get("duration_ms")
        except (KeyError, TypeError, AttributeError):
            raise _explain(raw, i) from None
        if not (type(record_id) is int and 0 <= record_id < _U63
                and type(collective_seq) is int and 0 <= collective_seq < _U63
                and type(p2p_seq) is int and 0 <= p2p_seq < _U63
                and type(created) is int and 0 <= created < _U63
                and type(profiling_name) is str and len(profiling_name) <= MAX_NAME and type(state) is str
                and type(pg) in _LISTS and len(pg) == 2 and type(pg[0]) is str and type(pg[1]) is str
                and len(pg[0]) <= MAX_NAME and len(pg[1]) <= MAX_NAME
                and type(is_p2p) is bool and type(retired) is bool
                and (duration is None or (type(duration) in (int, float) and 0 <= duration < 1e12))):
            raise _explain(raw, i)
        try:
            in_bytes, in_values = tensor_bytes(in_sizes, in_dtypes)
            out_bytes, out_values = tensor_bytes(out_sizes, out_dtypes)
        except ValueError as exc:
            raise Rejected("bad_schema", f"entries[{i}] sizes: {exc}") from None
        size_values += in_values + out_values
        if size_values > MAX_SIZE_VALUES:
            raise Rejected("bad_schema", f"more than {MAX_SIZE_VALUES} tensor sizes in one dump")
        append(Entry(
            record_id, pg[0], p2p_seq if is_p2p else collective_seq, is_p2p, _op(profiling_name), created,
            retired or state == "completed", None if duration is None else duration / 1000.0,
            None if in_bytes is None or out_bytes is None else max(in_bytes, out_bytes)))
    return out


def _explain(raw: Any, i: int) -> Rejected:
    """The Rejected naming what is wrong with entry i (which failed the quick check)."""
    where = f"entries[{i}]"
    if not isinstance(raw, dict):
        return _bad(where, "a mapping", raw)
    try:
        for key in ("record_id", "collective_seq_id", "p2p_seq_id", "time_created_ns"):
            _natural(_field(raw, key, where), f"{where}.{key}")
        _name(_field(raw, "profiling_name", where), f"{where}.profiling_name")
        if type(_field(raw, "state", where)) is not str:
            return _bad(f"{where}.state", "a string", raw["state"])
        pg = _field(raw, "process_group", where)
        if type(pg) not in _LISTS or len(pg) != 2:
            return _bad(f"{where}.process_group", "(name, description)", pg)
        _name(pg[0], f"{where}.process_group[0]")
        _name(pg[1], f"{where}.process_group[1]")
        for key in ("is_p2p", "retired"):
            if type(raw.get(key, False)) is not bool:
                return _bad(f"{where}.{key}", "a boolean", raw[key])
        duration = raw.get("duration_ms")
        if duration is not None and not (type(duration) in (int, float) and 0 <= duration < 1e12):
            return _bad(f"{where}.duration_ms", "milliseconds", duration)
        for key in ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes"):
            _field(raw, key, where)
    except Rejected as exc:
        return exc
    return Rejected("bad_schema", f"{where}: unexpected field types")


def _ranks(text: Any, where: str) -> frozenset[int] | None:
    """pg_config ranks: the string "[0, 1, 2]" (read with a pattern, never evaluated)."""
    if type(text) is not str or not _RANKS.fullmatch(text):
        raise _bad(where, "a list of ranks like '[0, 1]'", text)
    return frozenset(map(int, re.findall(r"\d+", text))) or None


def parse(data: Any) -> Dump:
    """A loaded dump (pickle or JSON) -> Dump; raises Rejected naming what is wrong."""
    if not isinstance(data, dict):
        raise _bad("the dump", "a mapping", data)
    if "version" not in data:
        raise Rejected("unknown_version", "the dump has no version field")
    version = check_version(data["version"])
    raw_entries = data.get("entries", [])  # JSON leaves the key out when there are none
    if type(raw_entries) is not list:
        raise _bad("dump.entries", "a list", raw_entries)
    if len(raw_entries) > MAX_ENTRIES:
        raise Rejected("bad_schema", f"dump.entries: {len(raw_entries)} entries, more than {MAX_ENTRIES}")
    entries = _entries(raw_entries)

    groups: dict[str, Group] = {}
    pg_ids: dict[int, str] = {}
    for raw, entry in zip(raw_entries, entries, strict=True):
        if entry.pg not in groups:
            groups[entry.pg] = Group(entry.pg, desc=raw["process_group"][1])
            pg_id = raw.get("pg_id")
            if type(pg_id) is int:
                pg_ids.setdefault(pg_id, entry.pg)
            if len(groups) > MAX_GROUPS:
                raise Rejected("bad_schema", f"more than {MAX_GROUPS} process groups")
    _read_config(data.get("pg_config", {}), groups)
    _read_status(data.get("pg_status", {}), groups, pg_ids)
    _settle_progress(entries, groups)
    return Dump(version, entries, groups)


def _read_config(config: Any, groups: dict[str, Group]) -> None:
    """Each group's member ranks. Gloo keys a single entry '' holding the ranks of the last group it registered
    ('[]' for some): they are the membership of the one group the dump knows, when it knows exactly one (a job with
    only the default group), and are left unread otherwise (which group they belong to cannot be told)."""
    if type(config) is not dict or len(config) > MAX_GROUPS:
        raise _bad("dump.pg_config", f"a mapping of at most {MAX_GROUPS} groups", config)
    text = 0
    for name, info in config.items():
        if name == "":
            ranks = info.get("ranks") if type(info) is dict else None
            if len(config) == 1 and len(groups) == 1 and type(ranks) is str and _RANKS.fullmatch(ranks):
                (only,) = groups.values()
                only.ranks = _ranks(ranks, "pg_config[''].ranks")
            continue
        _name(name, "a pg_config key")
        where = f"pg_config[{name[:40]!r}]"
        if type(info) is not dict:
            raise _bad(where, "a mapping", info)
        ranks = _field(info, "ranks", where)
        text += len(ranks) if type(ranks) is str else 0
        if text > MAX_RANKS_TEXT:
            raise Rejected("bad_schema", f"pg_config: more than {MAX_RANKS_TEXT} characters of ranks")
        group = groups.get(name)
        if group is None:
            if len(groups) >= MAX_GROUPS:
                raise Rejected("bad_schema", f"more than {MAX_GROUPS} process groups")
            group = groups[name] = Group(name)
        desc = info.get("desc")
        if type(desc) is str and 0 < len(desc) <= MAX_NAME:
            group.desc = desc
        group.ranks = _ranks(ranks, f"{where}.ranks")


def _read_status(status: Any, groups: dict[str, Group], pg_ids: dict[int, str]) -> None:
    """pg_status is keyed by the rank-local pg_id; entries map it to the group's global name. A
    status whose id no entry names is left out: ids differ between ranks, names do not, and a guess
    could pin one group's progress on another."""
    if type(status) is not dict or len(status) > MAX_GROUPS:
        raise _bad("dump.pg_status", f"a mapping of at most {MAX_GROUPS} groups", status)
    for key, values in status.items():
        where = "pg_status entry"
        pg_id = _seq_value(key, f"{where} key")
        if type(values) is not dict:
            raise _bad(where, "a mapping", values)
        enqueued = _seq_value(_field(values, "last_enqueued_collective", where), f"{where}.last_enqueued")
        started = _seq_value(_field(values, "last_started_collective", where), f"{where}.last_started")
        completed = _seq_value(_field(values, "last_completed_collective", where), f"{where}.last_completed")
        name = pg_ids.get(pg_id)
        if name is not None:
            group = groups[name]
            group.enqueued, group.started, group.completed = enqueued, started, completed


def _settle_progress(entries: list[Entry], groups: dict[str, Group]) -> None:
    """Fill what pg_status left out from the entries, then mark the entries still in flight.

    A collective is in flight while its sequence number is past the group's last completed one: that
    is the watchdog's own view, and it also covers the ops of a coalesced group, which are never
    retired one by one. That view can lag the entries: a gloo rank's dump taken just after its last
    all_reduce returned has been seen with the op retired and pg_status still one behind (PyTorch 2.13,
    tests/flight/caught). A collective retired is complete, and so is every earlier one of its group
    (a group's collectives complete in order), so the last completed one is at least the last retired.
    Point-to-point ops have their own sequence, so their own state decides.
    """
    enqueued: dict[str, int] = {}
    completed: dict[str, int] = {}
    for e in entries:
        if not e.is_p2p:
            if e.seq > enqueued.get(e.pg, -1):
                enqueued[e.pg] = e.seq
            if e.finished and e.seq > completed.get(e.pg, -1):
                completed[e.pg] = e.seq
    for name, group in groups.items():
        if group.enqueued is None:
            group.enqueued = enqueued.get(name, -1)
            group.completed = completed.get(name, -1)
        elif name in completed and (group.completed is None or completed[name] > group.completed):
            group.completed = completed[name]
            if group.started is not None and 0 <= group.started < group.completed:
                group.started = group.completed  # what completed has started
    for entry in entries:
        if entry.is_p2p:
            entry.inflight = not entry.finished
        else:
            done = groups[entry.pg].completed
            entry.inflight = entry.seq > done if done is not None else not entry.finished
