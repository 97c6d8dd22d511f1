"""Settings of the `ingest` source: the events API training jobs report to."""

from __future__ import annotations

import os
from typing import Annotated

from goodput_client.contract import DEFAULT_SOCKET, MAX_CAPTURE_STEPS
from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from ...core.settings import Duration, SourceConfig, loopback_address
from .changepoint import DEFAULT_MIN_RATIO, DEFAULT_THRESHOLD, DEFAULT_WARMUP, MAX_WARMUP

CAPTURE_TRIGGERS = ("step_time_shift", "hang", "rank_missing")


class IngestConfig(SourceConfig):
    socket_path: str = Field(
        DEFAULT_SOCKET,
        description="Unix socket training jobs send events to (share it with pods through a hostPath).")
    listen_address: Annotated[str, BeforeValidator(str)] = Field(
        "", description="Also accept events on this loopback TCP address (HOST:PORT); empty: off.")
    token_file: str = Field(
        "", description="File holding a bearer token that event requests must present; empty: no token.")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="Largest request body accepted.")
    max_batch_events: int = Field(10_000, ge=1, description="Most events in one request.")

    # --- the events server's connections (as the web server's: see exporter/core/http.py) ---
    max_connections: int = Field(
        1024, ge=1, le=1_000_000, description="Most connections the events server keeps open (a rank's client keeps "
        "one). A connection over it closes the oldest idle one of the sender (uid; TCP address) holding the most, or "
        "is answered 503 when none is idle.")
    keep_alive_timeout: Duration = Field(
        5.0, description="A connection to the events server that has not sent a whole request this long after it "
        "opened or after its last response is closed (the client opens a new one for its next batch).")
    max_header_bytes: int = Field(
        65_536, ge=1024, le=2**30, description="Largest request line and headers the events server accepts; a "
        "larger request is answered 431 and its connection closed.")
    shutdown_timeout: Duration = Field(
        5.0, description="On SIGTERM, how long event requests in progress get to finish before their connections "
        "are cut.")
    listen_retry_interval: Duration = Field(
        30.0, description="When listen_address cannot be bound (the port is taken), it is tried again after 1s, then "
        "twice as long each time up to this; meanwhile /readyz answers 503 naming it, and events are accepted on "
        "the Unix socket.")

    max_workloads: int = Field(32, ge=1, description="Live workloads kept on this node; more are rejected.")
    max_ranks: int = Field(
        512, ge=1, description="Live (workload, rank) pairs kept on this node; more are rejected.")
    max_models: int = Field(
        64, ge=1,
        description="Live (workload, model) pairs of inference requests kept on this node; more are rejected.")
    state_dir: str = Field(
        "", description="Directory of the state files that keep each rank's restart accounting (downtime, redone "
        "steps, lifetime counters) across daemon restarts, a kill -9 included: a snapshot (ingest-state.json) and a "
        "journal of what changed since (ingest-state.journal, its space allocated ahead: at least 256 KiB, or the "
        "snapshot's size), so that a full disk costs nothing; empty: kept in memory only. The chart mounts a hostPath "
        "here.")
    restart_window: Duration = Field(
        21_600.0, gt=0, description="A rank's accounting (elapsed, phases, downtime, redone steps, model FLOPs) stays "
        "published this long after its last event, after its other series went: one that reports again within it "
        "continues its counters, the gap counted as downtime when it restarted; later, it starts over.")
    step_history: int = Field(
        2000, ge=1, le=1_000_000, description="Step numbers per rank whose first duration is remembered, to charge "
        "the steps a restart redoes; older redone steps are counted without their seconds.")
    idle_timeout: Duration = Field(
        600.0, description="A rank (or a workload's model) that reports nothing for this long has its series "
        "removed.")

    # --- who may write which workload (the README's Security section) ---
    trusted_uids: list[str] = Field(
        [], description="Uids (numbers, comma-separated in a flag or variable) that may send events for any "
        "workload, besides root (uid 0), which always may: e.g. a relay that reports for other users' jobs. Any "
        "other sender on the Unix socket may write only the workloads it owns: those it sent the first event of "
        "and whose series are still live.")
    owner_by_cgroup: bool = Field(
        True, description="A workload belongs to the pod, Slurm job or container of its first sender as well as to "
        "its uid, where the daemon can read the sender's /proc/PID/cgroup: events from another pod, job or "
        "container of the same uid are refused. Turn off for jobs that report one workload from several pods on "
        "one node.")
    max_workloads_per_uid: int = Field(
        8, ge=1, description="Live workloads one uid may own on this node (all TCP senders count as one uid; "
        "trusted uids only count against ingest.max_workloads); more are rejected.")
    max_ranks_per_uid: int = Field(
        128, ge=1, description="Live (workload, rank) pairs in the workloads one uid owns on this node (all TCP "
        "senders count as one uid; trusted uids only count against ingest.max_ranks); more are rejected.")
    max_models_per_uid: int = Field(
        16, ge=1, description="Live (workload, model) pairs of inference requests in the workloads one uid owns on "
        "this node (all TCP senders count as one uid; trusted uids only count against ingest.max_models); more are "
        "rejected.")

    shift_threshold: float = Field(
        DEFAULT_THRESHOLD, gt=0, le=1000,
        description="Step-time change detector: the CUSUM decision threshold, in robust standard "
        "deviations of the rank's step time; higher finds fewer, larger shifts later.")
    shift_min_ratio: float = Field(
        DEFAULT_MIN_RATIO, gt=0, lt=1,
        description="Step-time change detector: the smallest shift reported, relative to the "
        "baseline (0.06: 6% slower or faster).")
    shift_warmup: int = Field(
        DEFAULT_WARMUP, ge=5, le=MAX_WARMUP,
        description="Step-time change detector: steps that set a rank's first baseline; no "
        "shift is reported before.")
    capture_dir: str = Field(
        "", description="Directory (absolute) where ranks write the captures the daemon asks them for: profiler "
        "traces and flight-recorder dumps, one directory per capture, DIR/<workload>/<id>, and DIR/index.json "
        "listing them (`goodput-exporter captures` prints it). Training pods must see it at the same path. Empty: "
        "captures are off.")
    client_dir: str = Field(
        "", description="Directory (absolute) the daemon publishes the training client it ships into at start, for "
        "goodput-instrument with no install in the jobs' images: DIR/<version>/ holds goodput-instrument's "
        "sitecustomize and the goodput_client package, and DIR/current points at the version published last (a "
        "version written whole, then renamed into place). Training pods mount DIR read-only and set "
        "PYTHONPATH=DIR/current. Empty: not published.")
    capture_workloads: list[str] = Field(
        [], description="Workloads that opted in to captures: glob patterns of workload names (comma-separated in a "
        "flag or variable), e.g. llama-*; empty: none.")
    capture_steps: int = Field(
        10, ge=1, le=MAX_CAPTURE_STEPS, description="Training steps a capture's profiler trace covers.")
    capture_interval: Duration = Field(
        1800.0, description="Least time between two captures of one workload; a rank that answered that it cannot "
        "capture (captures disabled, no profiler) is not asked again for this long.")
    capture_max_per_hour: int = Field(
        6, ge=1, le=10_000, description="Most captures this node starts in any hour, over all workloads.")
    capture_max_bytes: int = Field(
        2 * 2**30, ge=2**20, description="Disk budget of capture_dir: beyond it the oldest finished captures are "
        "deleted (whole).")
    capture_timeout: Duration = Field(
        600.0, description="A capture's rank that has not answered this long after the request is counted expired.")
    capture_triggers: list[str] = Field(
        list(CAPTURE_TRIGGERS), description="What starts a capture (comma-separated in a flag or variable): "
        "step_time_shift (a rank of the workload got slower), hang (a collective hung), rank_missing (a rank "
        "missing from a collective).")

    @field_validator("capture_dir", "client_dir")
    @classmethod
    def _check_absolute_dir(cls, value: str, info: ValidationInfo) -> str:
        if value and not os.path.isabs(value):
            why = {"capture_dir": "ranks are sent it and must find it",
                   "client_dir": "pods mount it at the path they are given"}[info.field_name]
            raise ValueError(f"{value!r} is not an absolute path: {why}")
        return value.rstrip("/") or value

    @field_validator("capture_workloads")
    @classmethod
    def _check_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or any(ch.isspace() for ch in pattern):
                raise ValueError(f"{pattern!r} is not a workload name pattern (e.g. llama-*)")
        return list(dict.fromkeys(value))

    @field_validator("capture_triggers")
    @classmethod
    def _check_triggers(cls, value: list[str]) -> list[str]:
        unknown = [trigger for trigger in value if trigger not in CAPTURE_TRIGGERS]
        if unknown:
            raise ValueError(f"unknown trigger(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(CAPTURE_TRIGGERS)}")
        return list(dict.fromkeys(value))

    @field_validator("trusted_uids", mode="before")
    @classmethod
    def _uids_as_text(cls, value: object) -> object:
        """A YAML list of numbers is as good as one of strings."""
        if not isinstance(value, list):
            return value
        return [str(item) if isinstance(item, int) and not isinstance(item, bool) else item for item in value]

    @field_validator("trusted_uids")
    @classmethod
    def _check_uids(cls, value: list[str]) -> list[str]:
        for uid in value:
            if not uid.isascii() or not uid.isdigit() or int(uid) >= 2**32 - 1:
                raise ValueError(f"{uid!r} is not a uid (a whole number below 4294967295)")
        return list(dict.fromkeys(str(int(uid)) for uid in value))

    @field_validator("listen_address")
    @classmethod
    def _check_loopback(cls, value: str) -> str:
        return loopback_address(value)
