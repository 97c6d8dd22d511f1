"""checkpoint_save and checkpoint_restore: torch.save and torch.load, and torch.distributed.checkpoint's save, load
and async_save (its blocking part: the call, until it returns the future). The frameworks' own saves are covered by
their probes (Trainer and Lightning save more than torch.save writes).

A process the launcher restarted (TORCHELASTIC_RESTART_COUNT, SLURM_RESTART_COUNT) that loads, before its first
optimizer step, a checkpoint dict holding a step number under one of RESUME_KEYS resumed from that step: its steps
count on from there, and the daemon charges the steps it redoes as wasted progress."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# the keys under which training scripts commonly keep the number of the last optimizer step in a checkpoint dict
# (nanoGPT's iter_num, Megatron's iteration, Lightning's and HF's global_step)
RESUME_KEYS = ("global_step", "step", "iteration", "iter_num")


class CheckpointProbe(Probe):
    name = "checkpoint"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        from torch import serialization as module

        for owner in (module, torch):
            self.patch(owner, "save", self.timed("checkpoint_save"))
            self.patch(owner, "load", self._load)

    def _load(self, original: Any) -> Any:
        """torch.load, timed; and in a process the launcher restarted, the step its checkpoint holds."""
        timed = self.timed("checkpoint_restore")(original)
        probe = self

        def load(*args: Any, **kwargs: Any) -> Any:
            result = timed(*args, **kwargs)
            if isinstance(result, dict):
                probe.guarded(probe.loaded, result)
            return result
        return load

    def loaded(self, state: dict[Any, Any]) -> None:
        for key in RESUME_KEYS:
            step = state.get(key)
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                self.recorder.checkpoint_loaded(step)
                return


class DistributedCheckpointProbe(Probe):
    name = "distributed_checkpoint"
    modules = ("torch.distributed.checkpoint",)

    def install(self, module: Any) -> None:
        from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

        for owner in (module, state_dict_saver):
            for attribute in ("save", "async_save", "save_state_dict"):
                if hasattr(owner, attribute):
                    self.patch(owner, attribute, self.timed("checkpoint_save"))
        for owner in (module, state_dict_loader):
            for attribute in ("load", "load_state_dict"):
                if hasattr(owner, attribute):
                    self.patch(owner, attribute, self.timed("checkpoint_restore"))
