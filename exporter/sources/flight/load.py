"""Bytes of one dump -> plain Python data. Never executes anything the file asks for.

PyTorch writes a dump as a pickle (`_dump_fr_trace`, the NCCL dump-on-timeout files) or as JSON
(`_dump_fr_trace_json`); the format is told by the first byte, not by the file name. Pickles are read
by an unpickler that refuses every global and persistent id: without a global nothing can be called,
so only dicts, lists, tuples, strings, bytes, numbers, booleans and None come out. PyTorch's own
dumps need nothing more.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any


class Rejected(Exception):
    """A dump that cannot be used; `reason` labels goodput_flight_recorder_rejected_total."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


# Reasons a file can be rejected for, in the order the reference lists them.
REASONS = (
    "empty", "truncated", "corrupt", "unsafe", "bad_schema", "unknown_version", "too_large", "parser_died",
    "symlink", "not_regular", "unreadable", "bad_name", "duplicate_rank", "too_many_files", "too_many_series",
)
# A file in one of these states may still be being written: retried before it is counted.
MAYBE_PARTIAL = frozenset({"empty", "truncated"})


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise Rejected("unsafe", f"the pickle asks to load {module}.{name}; only plain data is accepted")

    def persistent_load(self, pid: Any) -> Any:
        raise Rejected("unsafe", "the pickle refers to a persistent object; only plain data is accepted")


def _is_pickle(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5  # PROTO opcode, protocol 2-5


def load_pickle(data: bytes) -> Any:
    # A buffered reader: the C unpickler then reads ahead in large chunks (through peek) instead of
    # calling read() for every opcode, which makes a bare BytesIO three times slower.
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=max(len(data), 1))  # type: ignore[arg-type]
    try:
        return _PlainUnpickler(stream).load()
    except Rejected:
        raise
    except RecursionError:
        raise Rejected("corrupt", "the pickle nests too deeply") from None
    except MemoryError:
        raise
    except Exception as exc:  # garbage makes the unpickler raise many kinds (ValueError, KeyError, ...)
        # every complete pickle ends with the STOP opcode: without it the file was cut short
        if not data.endswith(b"."):
            raise Rejected("truncated", "the pickle ends early (still being written?)") from None
        raise Rejected("corrupt", f"not a readable pickle ({exc.__class__.__name__})") from None


def load_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        if not data.rstrip().endswith(b"}"):
            raise Rejected("truncated", "the JSON ends early (still being written?)") from None
        raise Rejected("corrupt", "the JSON dump is not UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise Rejected("corrupt", "the JSON nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        if not text.rstrip().endswith("}"):  # a complete dump is one object
            raise Rejected("truncated", "the JSON ends early (still being written?)") from None
        raise Rejected("corrupt", f"not valid JSON ({exc.__class__.__name__})") from None


def load_bytes(data: bytes) -> tuple[str, Any]:
    """-> (format, data) with format "pickle" or "json"; raises Rejected."""
    if not data or (len(data) < 64 and not data.strip()):
        raise Rejected("empty", "the file is empty (still being written?)")
    if _is_pickle(data):
        return "pickle", load_pickle(data)
    if data.lstrip()[:1] == b"{":
        return "json", load_json(data)
    raise Rejected("corrupt", "neither a pickle nor a JSON object")
