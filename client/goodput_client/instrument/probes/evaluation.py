"""eval in plain loops: an evaluation is a `torch.no_grad()` or `torch.inference_mode()` block, the outermost one,
entered between optimizer steps (not inside one, nor inside another phase), in which at least one module's forward
pass runs. The whole block counts as eval, the waits for its batches included; a block with no forward pass (a
gradient clipping, a metric update) leaves its time to the step. While such a block is open a global forward
pre-hook watches for the first forward pass; outside them nothing watches module calls. Trainer and Lightning are
timed by their own probes, exactly."""

from __future__ import annotations

import time

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_perf = time.perf_counter


class EvalProbe(Probe):
    name = "eval"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        from torch.nn.modules import module as nn_module

        self._register = nn_module.register_module_forward_pre_hook
        self._grad_enabled = torch.is_grad_enabled
        self._stack: list[tuple[bool, float, Any, list[bool]] | None] = []
        for owner in (torch.no_grad, torch.inference_mode):
            self.patch(owner, "__enter__", self._entering)
            self.patch(owner, "__exit__", self._exiting)

    def _entering(self, original: Any) -> Any:
        probe = self
        recorder = self.recorder

        def __enter__(self: object) -> Any:
            if not probe.on:
                return original(self)
            try:
                enabled = probe._grad_enabled()
            except Exception as exc:
                probe.failed(exc)
                return original(self)
            result = original(self)
            if probe.on and recorder.live:
                probe.guarded(probe.opened, enabled)
            return result
        return __enter__

    def _exiting(self, original: Any) -> Any:
        probe = self
        recorder = self.recorder

        def __exit__(self: object, *args: Any) -> Any:
            result = original(self, *args)
            if probe.on and probe._stack and recorder.live:
                probe.guarded(probe.closed)
            return result
        return __exit__

    def opened(self, enabled: bool = True) -> None:
        """A block opens; `enabled`: whether gradients were on just before it. Only such a block can be an
        evaluation: reentrant activation checkpointing (torch.utils.checkpoint use_reentrant=True, DeepSpeed's,
        fairscale's) runs the training forward under no_grad inside an autograd.Function's forward, where
        gradients are already off."""
        if not self.recorder.grad_off_enter(enabled):
            self._stack.append(None)
            return
        seen = [False]

        def forward(module: object, args: object) -> None:
            seen[0] = True

        self._stack.append((True, _perf(), self._register(forward), seen))

    def closed(self) -> None:
        entry = self._stack.pop()
        if entry is None:
            self.recorder.grad_off_exit(False, 0.0, False)
            return
        _, started, handle, seen = entry
        handle.remove()
        if seen[0]:
            self.evaluated(_perf() - started)
        else:
            self.recorder.grad_off_exit(True, 0.0, False)

    def evaluated(self, seconds: float) -> None:
        """A block that ran a forward pass ends: an evaluation of `seconds`."""
        self.recorder.grad_off_exit(True, seconds, True)

    def removed(self) -> None:
        for entry in getattr(self, "_stack", ()):
            if entry is not None:
                entry[2].remove()
        self._stack = []
        self.recorder.held = None
        self.recorder.grad_off = 0
