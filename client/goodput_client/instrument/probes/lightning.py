"""PyTorch Lightning Trainer: a callback added to every Trainer times its validation runs as eval, exactly (from
on_validation_start to on_validation_end, the sanity check's included), and reads the global step at the start of
training and the optimizer steps the fit ends at (the job's target); Trainer.save_checkpoint is checkpoint_save.
Both `lightning` and `pytorch_lightning` are watched."""

from __future__ import annotations

import contextlib

from ...telemetry import TARGET_FRAMEWORK
from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class LightningProbe(Probe):
    name = "lightning"
    modules = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")

    def install(self, module: Any) -> None:
        package = module.__name__.split(".trainer", 1)[0]  # lightning.pytorch, pytorch_lightning
        import importlib

        callback_base = importlib.import_module(f"{package}.callbacks").Callback
        probe = self

        class GoodputInstrumentCallback(callback_base):  # type: ignore[misc,valid-type]
            def __init__(self) -> None:
                self._eval: list[float | None] = []

            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                probe.guarded(probe.train_starts, trainer)

            def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
                if probe.on:
                    self._eval.append(probe.start())

            def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
                if probe.on and self._eval:
                    probe.finish("eval", self._eval.pop())

        def make(original: Any) -> Any:
            def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
                original(trainer, *args, **kwargs)
                probe.guarded(lambda: trainer.callbacks.append(GoodputInstrumentCallback()))
            return __init__

        self.patch(module.Trainer, "__init__", make)
        self.patch(module.Trainer, "save_checkpoint", self.timed("checkpoint_save"))

    def train_starts(self, trainer: Any) -> None:
        self.recorder.activate("lightning Trainer.fit")
        self.recorder.resumed(int(trainer.global_step or 0))
        with contextlib.suppress(Exception):  # no target is no failure of the probe
            self.target(trainer)

    def target(self, trainer: Any) -> None:
        """The optimizer steps the fit ends at: Lightning's estimate (max_steps, or max_epochs times the optimizer
        steps of an epoch, whichever ends it first; infinite when neither bounds it), else max_steps."""
        steps = trainer.estimated_stepping_batches
        if not (isinstance(steps, (int, float)) and 0 < steps < float("inf")):
            steps = trainer.max_steps
        if isinstance(steps, (int, float)) and 0 < steps < float("inf"):
            self.recorder.target(int(steps), TARGET_FRAMEWORK)
