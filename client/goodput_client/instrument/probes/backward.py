"""comm_wait inside backward(): the wait for the gradients' collectives that a data-parallel wrapper issues from the
autograd engine, where no Python collective is called.

DistributedDataParallel launches each bucket's all-reduce from C++ as its gradients become ready (overlapped with the
rest of the backward pass) and, in a callback the autograd engine runs once the graph is done, waits for all of them:
that wait, the part of the all-reduce not hidden behind compute, is the rank's exposed communication. FSDP2
(`fully_shard`) waits for its last reduce-scatters in such a callback too. With gloo the CPU blocks there until the
slowest rank has sent its gradients, so a rank three times slower than its peers makes each of them wait there for
most of the step; before this probe that time was the step's compute.

How it is measured: at the start of each backward() of a multi-process job, a pre-hook on the graph's root queues an
engine callback. Callbacks run in the order queued, after every node of the graph has run, so this one runs first,
when the backward computation is done and the data-parallel wrapper's own callback has yet to wait. From then to
the return of backward() is the exposed wait, reported as comm_wait, less the phases other probes reported
meanwhile (a Work.wait that FSDP's callback calls is already comm_wait). Nothing the job computes is touched: the
hook returns nothing, the callback reads a clock, and a communication hook the job registered on its DDP model
runs as before (this probe registers none).

With NCCL the wait is the GPU's, not the CPU's (DDP's callback only makes the stream wait), so what is timed here is
near 0 and the GPU-side wait is read from the flight recorder's durations (docs/instrument.md).
"""

from __future__ import annotations

import time

from .base import Probe, compiling

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_perf = time.perf_counter


class BackwardProbe(Probe):
    name = "backward"
    modules = ("torch.autograd",)

    def install(self, autograd: Any) -> None:
        self._engine = autograd.Variable._execution_engine
        self._parallel = False  # the process group, once it has more than one rank (then for good)
        # the backward() being timed (one at a time: a backward() inside another, as a reentrant activation
        # checkpoint's recomputation runs, is not timed on its own): the engine callback queued, and when it ran with
        # the recorder's phase total then
        self._active = self._queued = self._ran = False
        self._done_at = self._reported_at = 0.0
        self.patch(autograd, "backward", self._wrap)

    def _wrap(self, original: Any) -> Any:
        probe = self
        recorder = self.recorder

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if (probe._active or not probe.on or compiling() or recorder.depth or not recorder.live
                    or not probe._multi_rank()):
                return original(tensors, *args, **kwargs)
            handle = probe.guarded(probe._arm, tensors)
            if handle is None:
                return original(tensors, *args, **kwargs)
            try:
                return original(tensors, *args, **kwargs)
            finally:
                probe.guarded(probe._report, handle)
        return backward

    def _multi_rank(self) -> bool:
        if self._parallel:
            return True
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
        self._parallel = dist.get_world_size() > 1
        return self._parallel

    def _arm(self, tensors: Any) -> Any:
        """A pre-hook on the root of this backward's graph that queues the timing callback; None when there is no
        graph to hook (a tensor that needs no gradient: the call raises as without the probe)."""
        root = tensors if not isinstance(tensors, (tuple, list)) else (tensors[0] if tensors else None)
        node = getattr(root, "grad_fn", None)
        if node is None:
            return None
        handle = node.register_prehook(self._queue)
        self._active, self._queued, self._ran = True, False, False
        return handle

    def _queue(self, *_: Any) -> None:
        if not self._queued:
            self._queued = True
            self._engine.queue_callback(self._done)

    def _done(self) -> None:  # the graph has run; the wrappers' own callbacks are next
        self._done_at, self._reported_at, self._ran = _perf(), self.recorder.reported, True

    def _report(self, handle: Any) -> None:
        self._active = False
        handle.remove()
        if not self._ran:
            return
        end = _perf()
        recorder = self.recorder
        waited = (end - self._done_at) - (recorder.reported - self._reported_at)
        if waited > 0.0 and recorder.depth == 0:
            recorder.phase("comm_wait", waited)
