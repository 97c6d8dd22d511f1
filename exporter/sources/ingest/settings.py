"""Settings of the `ingest` source: the events API training jobs report to."""

from __future__ import annotations

from typing import Annotated

from goodput_client.contract import DEFAULT_SOCKET
from pydantic import BeforeValidator, Field, field_validator

from ...core.settings import Duration, SourceConfig, loopback_address


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
    max_workloads: int = Field(32, ge=1, description="Live workloads kept on this node; more are rejected.")
    max_ranks: int = Field(
        512, ge=1, description="Live (workload, rank) pairs kept on this node; more are rejected.")
    max_models: int = Field(
        64, ge=1,
        description="Live (workload, model) pairs of inference requests kept on this node; more are rejected.")
    state_dir: str = Field(
        "", description="Directory of the state file that keeps each rank's restart accounting (downtime, redone "
        "steps, lifetime counters) across daemon restarts; empty: kept in memory only. The chart mounts a hostPath "
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

    @field_validator("listen_address")
    @classmethod
    def _check_loopback(cls, value: str) -> str:
        return loopback_address(value)
