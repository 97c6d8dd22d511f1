"""Steps: one per optimizer step, through PyTorch's global optimizer-step hooks (those Kineto's on-demand traces use),
so every torch.optim optimizer counts, whoever calls its step(): the loop, GradScaler.step, accelerate's and
Lightning's wrappers. Under gradient accumulation a step is an optimizer step. A step that GradScaler skips (inf or
NaN gradients) calls no optimizer step and is not counted. With several optimizers, the first to step is the one
counted, until it is gone or replaced (another steps twice in a row: recorder.Recorder._counts). Building the first
optimizer is where training starts (the recorder activates)."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class OptimizerProbe(Probe):
    name = "steps"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        from torch.optim import optimizer as module

        recorder = self.recorder
        probe = self

        def before(optimizer: object, args: object, kwargs: object) -> None:
            probe.guarded(probe.began, optimizer)

        def after(optimizer: object, args: object, kwargs: object) -> None:
            probe.guarded(probe.ended, optimizer)

        self._handles = [module.register_optimizer_step_pre_hook(before),
                         module.register_optimizer_step_post_hook(after)]

        def make(original: Any) -> Any:
            def __init__(self: object, *args: Any, **kwargs: Any) -> None:
                original(self, *args, **kwargs)
                if recorder.state == "waiting" or recorder.forked:
                    probe.guarded(probe.built, self)
            return __init__

        self.patch(module.Optimizer, "__init__", make)

    def built(self, optimizer: object) -> None:
        """An optimizer was built: training starts (in a forked child: it says it is not measured)."""
        if self.recorder.forked:
            self.recorder.forked_trains()
        else:
            self.recorder.activate(f"{type(optimizer).__name__} built")

    def began(self, optimizer: object) -> None:
        self.recorder.step_begins(optimizer)

    def ended(self, optimizer: object) -> None:
        self.recorder.step_ends(optimizer)

    def removed(self) -> None:
        self.recorder.stepping = None  # a step this probe saw begin is not waited for

    # the global hooks stay registered once off (they return at once): removing one while PyTorch iterates over
    # them, as a hook that fails would, raises into the job's optimizer.step()
