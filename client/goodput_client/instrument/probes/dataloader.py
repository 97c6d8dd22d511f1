"""data_wait, samples and tokens: each `next()` on a DataLoader's iterator (with worker processes or without) is a
wait for data; the batch it returns counts its samples (the first dimension of its first tensor, or of
`input_ids`) and tokens (the elements of `input_ids`, where the batch is a mapping holding one)."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class DataLoaderProbe(Probe):
    name = "data_wait"
    modules = ("torch",)

    def install(self, torch: Any) -> None:
        from torch.utils.data import dataloader as module

        self._tensor = torch.Tensor
        probe = self

        def make(original: Any) -> Any:
            def __next__(self: object) -> Any:
                if not probe.on:
                    return original(self)
                started = probe.start()
                try:
                    batch = original(self)
                except BaseException:
                    probe.finish("data_wait", started)
                    raise
                if started is not None:
                    outermost = probe.recorder.depth == 1  # a batch of training, not of an evaluation's loop
                    probe.finish("data_wait", started)
                    if outermost:
                        probe.guarded(probe.count, batch)
                return batch
            return __next__

        self.patch(module._BaseDataLoaderIter, "__next__", make)

    def count(self, batch: Any) -> None:
        tensor = self._tensor
        samples = tokens = 0
        if type(batch) in (tuple, list):  # the commonest: (inputs, targets)
            first = batch[0] if batch else None
            if isinstance(first, tensor) and first.dim():
                self.recorder.batch(int(first.shape[0]), 0)
                return
        if isinstance(batch, tensor):
            samples = batch.shape[0] if batch.dim() else 1
        elif isinstance(batch, dict) or hasattr(batch, "keys"):
            ids = batch.get("input_ids") if hasattr(batch, "get") else None
            if isinstance(ids, tensor):
                tokens = ids.numel()
                samples = ids.shape[0] if ids.dim() else 1
            else:
                for item in batch.values():
                    if isinstance(item, tensor) and item.dim():
                        samples = item.shape[0]
                        break
        elif isinstance(batch, (list, tuple)):
            for item in batch:
                if isinstance(item, tensor) and item.dim():
                    samples = item.shape[0]
                    break
        self.recorder.batch(int(samples), int(tokens))
