"""Bytes of a dump file -> Dump: what the flight source does with every new version of a file."""

from __future__ import annotations

import gc

from .load import load_bytes
from .schema import Dump, parse


def read_dump(data: bytes) -> Dump:
    """Raises Rejected. The cyclic garbage collector is paused meanwhile: unpickling a dump builds
    tens of thousands of containers, none of them in cycles, and the collector's repeated passes over
    them would cost more than the parse itself (PyTorch's torchfrtrace pauses it for the same reason)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        _, raw = load_bytes(data)
        return parse(raw)
    finally:
        if was_enabled:
            gc.enable()
