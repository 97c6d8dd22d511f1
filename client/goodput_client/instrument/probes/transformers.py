"""Hugging Face Trainer: training starts at Trainer.train (its global step then, when it resumed from a checkpoint,
is where the steps count on from; its TrainerState.max_steps, where the training ends, is the job's target);
Trainer.evaluate is eval, exactly; Trainer._save_checkpoint (the model's safetensors, the optimizer, the scheduler and
the trainer state) is checkpoint_save and _load_from_checkpoint is checkpoint_restore; each step's model FLOPs are
what the Trainer counts itself (its `floating_point_ops` of each micro-batch, 6 x parameters x tokens, which it sums
into `total_flos`), summed over the step's micro-batches."""

from __future__ import annotations

from ...telemetry import TARGET_FRAMEWORK
from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class TransformersProbe(Probe):
    name = "transformers"
    modules = ("transformers.trainer",)

    def install(self, module: Any) -> None:
        trainer_class = module.Trainer
        for attribute, phase in (("evaluate", "eval"), ("_save_checkpoint", "checkpoint_save"),
                                 ("_load_from_checkpoint", "checkpoint_restore")):
            if hasattr(trainer_class, attribute):
                self.patch(trainer_class, attribute, self.timed(phase))
        self.patch(trainer_class, "train", self._train)
        self._flops = 0.0
        if hasattr(trainer_class, "floating_point_ops"):
            self.patch(trainer_class, "floating_point_ops", self._counting)
        self._callback_class = self._make_callback(module)

    def _train(self, original: Any) -> Any:
        probe = self

        def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            probe.guarded(probe.starting, trainer)
            return original(trainer, *args, **kwargs)
        return train

    def starting(self, trainer: Any) -> None:
        """Before Trainer.train: the callback that reads the global step at the start, and the FLOPs source."""
        if not any(isinstance(c, self._callback_class) for c in trainer.callback_handler.callbacks):
            trainer.add_callback(self._callback_class())
        self._flops = 0.0

        def flops() -> float | None:
            counted, self._flops = self._flops, 0.0
            return counted if counted > 0 else None

        self.recorder.flops_source, self.recorder.flops_provider = flops, self

    def _counting(self, original: Any) -> Any:
        """Trainer.floating_point_ops, called once per micro-batch of training: its figures, summed per step."""
        probe = self

        def floating_point_ops(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(trainer, *args, **kwargs)
            probe.guarded(probe.add_flops, result)
            return result
        return floating_point_ops

    def add_flops(self, result: Any) -> None:
        self._flops += float(result)

    def _make_callback(self, module: Any) -> type:
        probe = self

        class GoodputInstrumentCallback(module.TrainerCallback):  # type: ignore[misc,name-defined]
            """goodput-instrument's: the global step at the start of training."""

            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                probe.guarded(probe.train_begins, state.global_step, getattr(state, "max_steps", None))

        return GoodputInstrumentCallback

    def train_begins(self, global_step: int | None, max_steps: int | None = None) -> None:
        self.recorder.activate("transformers.Trainer.train")
        self.recorder.resumed(int(global_step or 0))
        if isinstance(max_steps, int) and max_steps > 0:  # the Trainer's own: args.max_steps, or epochs x steps each
            self.recorder.target(max_steps, TARGET_FRAMEWORK)

    def removed(self) -> None:
        if self.recorder.flops_provider is self:
            self.recorder.flops_source = self.recorder.flops_provider = None
