"""comm_wait: the time a rank is blocked in a collective of torch.distributed: a blocking call (all_reduce,
all_gather, broadcast, barrier, ..., and a pipeline's point-to-point send and recv), or `Work.wait()` on an
asynchronous one (isend, irecv, batch_isend_irecv: what torch.distributed.pipelining's schedules wait on). With gloo
the CPU waits there for the slowest peer, so this is the rank's wait for its peers (plus the transfer). With NCCL a
collective returns once it is enqueued on the GPU: what is timed is the enqueue only. Collectives issued from C++
(DistributedDataParallel's gradient all-reduce, waited for inside backward) are timed by the backward probe."""

from __future__ import annotations

from .base import Probe, compiling

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
               "monitored_barrier", "recv", "recv_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "scatter", "scatter_object_list", "send", "send_object_list")


class CollectivesProbe(Probe):
    name = "comm_wait"
    modules = ("torch.distributed",)

    def install(self, module: Any) -> None:
        from torch.distributed import distributed_c10d

        made: dict[int, Any] = {}  # one wrapper per function: torch.distributed's name and distributed_c10d's are one
        # function, and dynamo's table of the collectives it traces (keyed by that function as it was when
        # torch.distributed._functional_collectives was imported) must find whichever name a job calls

        def wrapper(original: Any) -> Any:
            if id(original) not in made:
                made[id(original)] = self._blocking(original)
            return made[id(original)]

        for owner in (distributed_c10d, module):
            for attribute in COLLECTIVES:
                if hasattr(owner, attribute):
                    self.patch(owner, attribute, wrapper)
        work = getattr(getattr(module, "distributed_c10d", None), "Work", None)
        if work is not None:
            self.patch(work, "wait", self.timed("comm_wait"))

    def _blocking(self, original: Any) -> Any:
        """A collective, timed unless asked for asynchronously (then its Work.wait is)."""
        timed = self.timed("comm_wait")(original)

        def collective(*args: Any, **kwargs: Any) -> Any:
            if compiling() or kwargs.get("async_op"):
                return original(*args, **kwargs)
            return timed(*args, **kwargs)
        return collective

    def uninstrument(self) -> None:
        """Off, the wrappers stay (each calls the collective at once): dynamo's table of the collectives it traces
        as functional ones (torch.distributed._functional_collectives) holds the functions torch.distributed had
        when it was imported, ours when that was after this probe's install; put back, the originals would no
        longer be in it and a torch.compile(fullgraph=True) over a collective would fail."""
        self.on = False
        self.removed()
