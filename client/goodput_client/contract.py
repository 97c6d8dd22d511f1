"""The wire contract between a training process and the node's goodput-exporter daemon.

This module is the one place it is written: the client builds its requests with it, and the daemon
takes its validation's names and limits from it. Standard library only, and nothing imported at
module level, so that both sides (and a training image) can import it for free.

    POST EVENTS_PATH, Content-Type: application/json, optionally Authorization: Bearer <token>
    {"events": [event, ...]}            applied all or nothing: one invalid event rejects the batch

    {"type": "step", "workload": W, "rank": R, "duration_seconds": S, "tokens": N, "samples": N}
    {"type": "phase", "workload": W, "rank": R, "phase": P, "seconds": S}
    {"type": "lifecycle", "workload": W, "rank": R, "event": E}

    W matches WORKLOAD_PATTERN; 0 <= R < MAX_RANK; P in PHASES; E in LIFECYCLE_EVENTS;
    0 <= seconds <= MAX_SECONDS; 0 < duration_seconds <= MAX_SECONDS; 0 <= N <= MAX_COUNT;
    finite numbers only, no other keys.
"""

from __future__ import annotations

EVENTS_PATH = "/v1/events"
CONTENT_TYPE = "application/json"
EVENT_TYPES = ("step", "phase", "lifecycle")
PHASES = ("compute", "data_wait", "comm_wait", "checkpoint", "startup", "other")
FALLBACK_PHASE = "other"  # where the client records a phase name it does not know
LIFECYCLE_EVENTS = ("start", "restart", "end")
MAX_SECONDS = 86_400.0  # a step or phase longer than a day is a bug in the reporter, not data
MAX_COUNT = 10**12  # tokens, samples
MIN_DURATION = 1e-9  # a step's duration is positive: shorter ones are sent as this
WORKLOAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$"
MAX_RANK = 1_000_000

DEFAULT_SOCKET = "/run/goodput-exporter/ingest.sock"  # the daemon's ingest.socket_path default
SOCKET_ENV = "GOODPUT_INGEST_SOCKET_PATH"  # the same setting, as the daemon and the client read it
# Flight-recorder dump names: <prefix><rank>. PyTorch's own default (c10d's DebugInfoWriter, which NCCL's
# dump on timeout uses: $XDG_CACHE_HOME/torch/comm_lib_trace_rank_<rank> unless TORCH_FR_DUMP_TEMP_FILE names
# another prefix) is what the client writes; the daemon's flight.prefixes reads it and the older name.
FLIGHT_DUMP_PREFIX = "comm_lib_trace_rank_"
FLIGHT_DUMP_PREFIX_LEGACY = "nccl_trace_rank_"  # PyTorch's earlier default, and this client's before
FLIGHT_DUMP_PREFIXES = (FLIGHT_DUMP_PREFIX, FLIGHT_DUMP_PREFIX_LEGACY)  # the daemon's flight.prefixes default

Event = dict[str, object]


def step_event(workload: str, rank: int, duration_seconds: float, tokens: int = 0, samples: int = 0) -> Event:
    return {"type": "step", "workload": workload, "rank": rank,
            "duration_seconds": max(duration_seconds, MIN_DURATION), "tokens": int(tokens), "samples": int(samples)}


def phase_event(workload: str, rank: int, phase: str, seconds: float) -> Event:
    return {"type": "phase", "workload": workload, "rank": rank, "phase": phase, "seconds": max(0.0, seconds)}


def lifecycle_event(workload: str, rank: int, event: str) -> Event:
    return {"type": "lifecycle", "workload": workload, "rank": rank, "event": event}


def batch_body(events: list[Event]) -> dict[str, list[Event]]:
    return {"events": events}


def encode(body: dict[str, list[Event]]) -> bytes:
    """The request body as sent: compact UTF-8 JSON. NaN and infinities raise ValueError here rather
    than reach the daemon, which would reject the whole batch."""
    import json  # here, not at import time: `import goodput_client` stays cheap

    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
