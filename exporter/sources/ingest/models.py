"""The wire format of POST /v1/events (step, phase, lifecycle, role, target, request and capture events), validated
strictly: nothing half-applied, nothing guessed. An empty batch is valid: a rank polling for capture requests.

Strict, with one exception: a whole number written as a float (`5.0`) is an integer, as JSON has it (JSON Schema
counts 5.0 as an integer too); `5.5`, `"5"` and `true` are not. The responses' bodies are modelled too, for the
OpenAPI schema the events server serves.

The names, phases, lifecycle events and limits are the training client's wire contract
(`goodput_client.contract`), imported, never restated.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

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
    MAX_DEADLINE,
    MAX_ELAPSED,
    MAX_FLOPS,
    MAX_RANK,
    MAX_ROLE_INDEX,
    MAX_SECONDS,
    MODEL_PATTERN,
    WIRE_PHASES,
    WORKLOAD_PATTERN,
)
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticKnownError


def _whole(value: Any) -> Any:
    """5.0 -> 5 (what JSON means by it), 5.5 refused as lax mode would; anything else is left for the strict
    integer check to accept or refuse."""
    if type(value) is float and math.isfinite(value):
        if not value.is_integer():
            raise PydanticKnownError("int_from_float")
        return int(value)
    return value


WHOLE = BeforeValidator(_whole)  # after the bounds: they stay the integer's own (and JSON Schema's minimum...)
Workload = Annotated[str, Field(pattern=WORKLOAD_PATTERN)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANK), WHOLE]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT), WHOLE]
Phase = Literal[WIRE_PHASES]  # type: ignore[valid-type]
Elapsed = Annotated[float, Field(ge=0.0, le=MAX_ELAPSED, allow_inf_nan=False)]
StepNumber = Annotated[int, Field(ge=1, le=MAX_COUNT), WHOLE]
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
    resumed_from_step: Annotated[int, Field(ge=0, le=MAX_COUNT), WHOLE] | None = None
    run: Workload | None = None  # the launch of the job, where the workload names the job across its runs


RoleIndex = Annotated[int, Field(ge=0, lt=MAX_ROLE_INDEX), WHOLE]


class RoleEvent(_Event):
    """The rank's role in its job's parallelism: its pipeline stage and its pipeline's (replica's) index."""

    type: Literal["role"]
    pipeline_stage: RoleIndex
    data_parallel_rank: RoleIndex


class TargetEvent(_Event):
    """Where the job's training ends, where the job knows it: the global number of its last step, and the Unix time
    by which its owner needs it finished. Either may be absent (not known); each replaces the rank's last one whole."""

    type: Literal["target"]
    target_steps: StepNumber | None = None
    deadline: Annotated[float, Field(gt=0.0, le=MAX_DEADLINE, allow_inf_nan=False)] | None = None


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


Event = Annotated[StepEvent | PhaseEvent | LifecycleEvent | RoleEvent | TargetEvent | RequestEvent | CaptureEvent,
                  Field(discriminator="type")]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    events: list[Event]


# --- the responses ---

class CaptureRequest(BaseModel):
    """A capture the daemon asks the rank to make: profile `steps` steps and dump its flight recorder into `dir`,
    then answer with capture events."""

    id: str
    workload: str
    rank: int
    kinds: list[Literal[CAPTURE_KINDS]]  # type: ignore[valid-type]
    steps: int
    dir: str


class Accepted(BaseModel):
    """200: every event was applied."""

    accepted: int = Field(description="Events applied: all of the batch's.")
    captures: list[CaptureRequest] | None = Field(
        None, description="Capture requests waiting for the ranks that sent events or named themselves in the "
        "query string; absent when none.")


class Problem(BaseModel):
    at: str = Field(description="Where in the body, e.g. events.3.step.duration_seconds.")
    problem: str


class Refused(BaseModel):
    """Any 4xx: the request was refused whole and nothing of it was applied."""

    error: str = Field(description="What was wrong, and what to do about it.")
    details: list[Problem] | None = Field(None, description="The invalid fields (422), the first 20.")
