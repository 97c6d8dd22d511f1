"""The rank's role in a pipeline built with torch.distributed.pipelining: its stage, and which pipeline (model
replica) it belongs to, sent once as the rank's role so that the straggler rules compare it with the ranks of its own
stage (a last stage slower by construction is not a straggler; one rank slower than its stage's peers is).

The stage is the rank's place in its pipeline group (its stage_index; with an interleaved schedule, where a rank holds
several stages, its index in the group). The replica is numbered from the group's lowest global rank: groups of
consecutive ranks ([0, 1], [2, 3]) are replicas 0 and 1, and strided groups ([0, 2], [1, 3], as Megatron lays them out)
are numbered by their first rank. A job that knows better says so with `Telemetry.role()` or GOODPUT_PIPELINE_STAGE and
GOODPUT_DATA_PARALLEL_RANK."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class PipelineProbe(Probe):
    name = "pipeline"
    modules = ("torch.distributed.pipelining.stage",)

    def install(self, module: Any) -> None:
        probe = self

        def make(original: Any) -> Any:
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                original(self, *args, **kwargs)
                probe.guarded(probe.built, self)
            return __init__

        self.patch(module._PipelineStageBase, "__init__", make)

    def built(self, stage: Any) -> None:
        import torch.distributed as dist

        group = getattr(stage, "group", None)
        ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else \
            list(range(dist.get_world_size()))
        place = ranks.index(dist.get_rank()) if dist.get_rank() in ranks else int(stage.stage_index)
        consecutive = ranks == list(range(ranks[0], ranks[0] + len(ranks)))
        replica = ranks[0] // len(ranks) if consecutive else ranks[0]
        self.recorder.role(place, replica)
