"""The wire format of POST /v1/events, validated strictly: nothing half-applied, nothing guessed.

The names, phases, lifecycle events and limits are the training client's wire contract
(`goodput_client.contract`), imported, never restated.
"""

from __future__ import annotations

from typing import Annotated, Literal

from goodput_client.contract import LIFECYCLE_EVENTS, MAX_COUNT, MAX_RANK, MAX_SECONDS, PHASES, WORKLOAD_PATTERN
from pydantic import BaseModel, ConfigDict, Field

Workload = Annotated[str, Field(pattern=WORKLOAD_PATTERN)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANK)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Phase = Literal[PHASES]  # type: ignore[valid-type]


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
    event: Literal[LIFECYCLE_EVENTS]  # type: ignore[valid-type]


Event = Annotated[StepEvent | PhaseEvent | LifecycleEvent, Field(discriminator="type")]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    events: list[Event]
