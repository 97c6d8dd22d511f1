"""checkpoint_save and checkpoint_restore: torch.save and torch.load, and torch.distributed.checkpoint's save, load
and async_save (its blocking part: the call, until it returns the future). The frameworks' own saves are covered by
their probes (Trainer and Lightning save more than torch.save writes)."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class CheckpointProbe(Probe):
    name = "checkpoint"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        from torch import serialization as module

        for owner in (module, torch):
            self.patch(owner, "save", self.timed("checkpoint_save"))
            self.patch(owner, "load", self.timed("checkpoint_restore"))


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
