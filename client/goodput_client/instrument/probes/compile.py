"""compile: the time torch.compile's dynamo spends compiling, from its own compile-start and compile-end callbacks
(a graph compiled on first call, and each recompilation)."""

from __future__ import annotations

from .base import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class CompileProbe(Probe):
    name = "compile"
    modules = ("torch._dynamo.callback",)

    def install(self, module: Any) -> None:
        handler = module.callback_handler
        self._handler = handler
        self._started: list[float | None] = []
        probe = self

        def start(*args: Any) -> None:
            if probe.on:
                probe._started.append(probe.start())

        def end(*args: Any) -> None:
            if probe.on and probe._started:
                probe.finish("compile", probe._started.pop())

        self._callbacks: tuple[Any, Any] | None = (start, end)
        handler.register_start_callback(start)
        handler.register_end_callback(end)

    # the callbacks stay registered once off (they return at once): a failing one is removed while dynamo iterates
    # over them otherwise
