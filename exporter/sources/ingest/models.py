"""The wire format of POST /v1/events (step, phase, lifecycle, request and capture events), validated strictly:
nothing half-applied, nothing guessed. An empty batch is valid: a rank polling for capture requests.

The names, phases, lifecycle events and limits are the training client's wire contract
(`goodput_client.contract`), imported, never restated.
"""

from __future__ import annotations

from typing import Annotated, Literal

from goodput_client.contract import (
    CAPTURE_ID_PATTERN,
    CAPTURE_KINDS,
    CAPTURE_RESULTS,
    DEFAULT_FLOPS_DTYPE,
    FINISH_REASONS,
    FLOPS_DTYPES,
    ITL_BUCKETS,
    LIFECYCLE_EVENTS,
    MAX_CAPTURE_MESSAGE,
    MAX_COUNT,
    MAX_ELAPSED,
    MAX_FLOPS,
    MAX_RANK,
    MAX_SECONDS,
    MODEL_PATTERN,
    WIRE_PHASES,
    WORKLOAD_PATTERN,
)
from pydantic import BaseModel, ConfigDict, Field

Workload = Annotated[str, Field(pattern=WORKLOAD_PATTERN)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANK)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Phase = Literal[WIRE_PHASES]  # type: ignore[valid-type]
Elapsed = Annotated[float, Field(ge=0.0, le=MAX_ELAPSED, allow_inf_nan=False)]
StepNumber = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Flops = Annotated[float, Field(ge=0.0, le=MAX_FLOPS, allow_inf_nan=False)]
Dtype = Literal[FLOPS_DTYPES]  # type: ignore[valid-type]
Model = Annotated[str, Field(pattern=MODEL_PATTERN)]
Objective = Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
ItlCounts = Annotated[list[Count], Field(min_length=len(ITL_BUCKETS) + 1, max_length=len(ITL_BUCKETS) + 1)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    workload: Workload
    rank: Rank


class _Timed(_Event):
    elapsed_seconds: Elapsed | None = None  # the sender's time since its start, at the end of the event's span


class StepEvent(_Timed):
    type: Literal["step"]
    duration_seconds: Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
    tokens: Count = 0
    samples: Count = 0
    step: StepNumber | None = None
    flops: Flops | None = None
    dtype: Dtype = DEFAULT_FLOPS_DTYPE


class PhaseEvent(_Timed):
    type: Literal["phase"]
    phase: Phase
    seconds: Seconds


class LifecycleEvent(_Timed):
    type: Literal["lifecycle"]
    event: Literal[LIFECYCLE_EVENTS]  # type: ignore[valid-type]
    started_at: Annotated[float, Field(gt=0.0, le=1e11, allow_inf_nan=False)] | None = None
    resumed_from_step: Annotated[int, Field(ge=0, le=MAX_COUNT)] | None = None


class RequestEvent(_Event):
    """One finished request of an inference server; every key but queue_seconds is required."""

    type: Literal["request"]
    model: Model
    ttft_seconds: Seconds | None
    tpot_seconds: Seconds | None
    e2e_seconds: Seconds
    queue_seconds: Seconds | None = None
    prompt_tokens: Count
    output_tokens: Count
    itl_counts: ItlCounts
    itl_sum: Seconds
    finish_reason: Literal[FINISH_REASONS]  # type: ignore[valid-type]
    ttft_objective_seconds: Objective
    tpot_objective_seconds: Objective


MAX_PATH = 4096


class CaptureEvent(_Event):
    """A rank's answer to one kind of a capture request: what it wrote, or why it did not."""

    type: Literal["capture"]
    id: Annotated[str, Field(pattern=CAPTURE_ID_PATTERN)]
    kind: Literal[CAPTURE_KINDS]  # type: ignore[valid-type]
    result: Literal[CAPTURE_RESULTS]  # type: ignore[valid-type]
    path: Annotated[str, Field(max_length=MAX_PATH)] = ""  # written: the file, inside the request's dir
    bytes: Count = 0  # as the rank saw it; the daemon reads the size from disk
    message: Annotated[str, Field(max_length=MAX_CAPTURE_MESSAGE)] = ""


Event = Annotated[StepEvent | PhaseEvent | LifecycleEvent | RequestEvent | CaptureEvent,
                  Field(discriminator="type")]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    events: list[Event]
