"""Model FLOPs of a plain loop's step, with GOODPUT_FLOPS=measure: one optimizer step (the second: the first pays
one-off costs) runs under torch.utils.flop_counter.FlopCounterMode, which counts the FLOPs of every matrix
multiplication and convolution, forward and backward; the steps after it carry that figure. The measured step runs
slower (every operator goes through the counter's Python dispatch), once. Off by default."""

from __future__ import annotations

import contextlib

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class FlopsProbe(Probe):
    name = "flops"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        if not self.recorder.settings.measure_flops:
            self.on = False
            return
        from torch.optim import optimizer

        self._mode: Any = None
        self._counted = 0
        self._handle = optimizer.register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer: object, args: object, kwargs: object) -> None:
        self.guarded(self.after_step, optimizer)

    def after_step(self, optimizer: object) -> None:
        recorder = self.recorder
        primary = recorder.primary() if recorder.primary is not None else None
        if primary is not optimizer or recorder.stepping is not None:
            return
        if self._mode is not None:  # the measured step ends here
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
            self._flops = float(mode.get_total_flops())
            recorder.flops_source, recorder.flops_provider = self.measured, self
            self._counted = -1  # done: no other step is measured
            return
        self._counted += 1
        if self._counted == 1 and recorder.flops_source is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()

    def measured(self) -> float | None:
        """The measured step's FLOPs, for each step after it (the recorder's flops_source)."""
        return self._flops

    def removed(self) -> None:
        if self.recorder.flops_provider is self:
            self.recorder.flops_source = self.recorder.flops_provider = None
        # the hook stays registered (it returns at once once off): see OptimizerProbe
        mode = getattr(self, "_mode", None)
        if mode is not None:
            self._mode = None
            with contextlib.suppress(Exception):  # leaving the counter is all that is left to do
                mode.__exit__(None, None, None)
