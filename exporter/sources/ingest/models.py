"""The wire format of POST /v1/events, validated strictly: nothing half-applied, nothing guessed."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..catalog import PHASES
from ..launcher import MAX_RANK, WORKLOAD_PATTERN

MAX_SECONDS = 86_400.0  # a step or phase longer than a day is a bug in the reporter, not data
Workload = Annotated[str, Field(pattern=WORKLOAD_PATTERN)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANK)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=10**12)]
Phase = Literal["compute", "data_wait", "comm_wait", "checkpoint", "startup", "other"]
assert set(Phase.__args__) == set(PHASES)  # type: ignore[attr-defined]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    workload: Workload
    rank: Rank


class StepEvent(_Event):
    type: Literal["step"]
    duration_seconds: Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
    tokens: Count = 0
    samples: Count = 0


class PhaseEvent(_Event):
    type: Literal["phase"]
    phase: Phase
    seconds: Seconds


class LifecycleEvent(_Event):
    type: Literal["lifecycle"]
    event: Literal["start", "restart", "end"]


Event = Annotated[StepEvent | PhaseEvent | LifecycleEvent, Field(discriminator="type")]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    events: list[Event]
