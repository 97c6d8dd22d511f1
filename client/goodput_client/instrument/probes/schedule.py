"""target: the job's last step, from an LR schedule that carries its horizon. A OneCycleLR's `total_steps` is the
number of its steps, one per optimizer step in the usual loop (it raises past them), so the job ends at that step. A
framework's max_steps (the transformers and lightning probes), GOODPUT_TARGET_STEPS and an explicit
Telemetry.target win over it. Other schedules are left alone: a LinearLR's total_iters is as often a warm-up's
length as the run's, a cosine's T_max a cycle's."""

from __future__ import annotations

from ...telemetry import TARGET_SCHEDULE
from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class ScheduleProbe(Probe):
    name = "target"
    modules = ("torch.optim.lr_scheduler",)

    def install(self, module: Any) -> None:
        probe = self

        def make(original: Any) -> Any:
            def __init__(scheduler: Any, *args: Any, **kwargs: Any) -> None:
                original(scheduler, *args, **kwargs)
                probe.guarded(probe.built, scheduler)
            return __init__

        self.patch(module.OneCycleLR, "__init__", make)

    def built(self, scheduler: Any) -> None:
        if not self.on:
            return
        total = getattr(scheduler, "total_steps", None)
        if isinstance(total, int) and total > 0:
            self.recorder.target(total, TARGET_SCHEDULE)
