"""The probes' common interface, in the manner of OpenTelemetry's instrumentors: one probe per library (or per
part of PyTorch), each with `instrument()` and `uninstrument()`, found through one registry (`probes.PROBES`).

A probe patches a function or a class attribute of the library it watches (`patch`) and keeps the original to
put back. Everything a probe does around the library's own call runs under `guard`: an exception there is caught,
logged once, and turns that probe off (its patches removed), while the library's call itself runs exactly as it
would without the probe, its result and its exceptions unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..recorder import Recorder

LOGGER = "goodput_client.instrument"


_is_compiling: Callable[[], bool] | None = None


def compiling() -> bool:
    """torch.compiler.is_compiling() (False for a torch without it): True while dynamo traces. A patch that dynamo
    traces into must call the original at once, before any code of ours (a thread id, a clock) that dynamo cannot
    put in a graph: torch.compile(fullgraph=True) over a collective would raise. Looked up on the first call (a
    probe is installed while torch is still importing, before torch.compiler is there)."""
    global _is_compiling
    check = _is_compiling
    if check is None:
        torch = sys.modules.get("torch")
        compiler = getattr(torch, "compiler", None)
        if compiler is None:
            return False
        found = getattr(compiler, "is_compiling", None)
        check = _is_compiling = found if callable(found) else _never
    return check()


def _never() -> bool:
    return False


class Probe:
    """One library's instrumentation. Subclasses name the modules they need (`modules`: the probe is installed once
    the first of them is imported) and implement `install()`; `patch()` records what to put back."""

    name = "probe"
    modules: tuple[str, ...] = ("torch",)

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.on = False
        self._installed: set[str] = set()  # the modules installed for (once each, even after a failure)
        self._patches: list[tuple[object, str, object]] = []

    def instrument(self, module: object) -> None:
        """Install the probe (called when its module is imported); a failure here leaves it off, logged once."""
        name = getattr(module, "__name__", "")
        if name in self._installed:
            return
        self._installed.add(name)
        try:
            self.on = True
            self.install(module)
        except Exception as exc:  # an unexpected version of the library: this probe only is off
            self.failed(exc)

    def install(self, module: object) -> None:
        raise NotImplementedError

    def uninstrument(self) -> None:
        """Put back every patched attribute; the probe reports nothing more."""
        self.on = False
        patches, self._patches = self._patches, []
        for owner, attribute, original in reversed(patches):
            with contextlib.suppress(Exception):  # a read-only attribute now: the patch stays and checks self.on
                setattr(owner, attribute, original)
        self.removed()

    def removed(self) -> None:
        """Undo what is not a patched attribute (a registered hook)."""

    def patch(self, owner: object, attribute: str, make: object) -> None:
        """Replace `owner.attribute` with `make(original)`."""
        original = getattr(owner, attribute)
        replacement = make(original)  # type: ignore[operator]
        # its name, qualified name, docstring, and __wrapped__: what inspect.signature, LightningCLI (which reads
        # Trainer.__init__'s docstring), help() and jsonargparse read
        with contextlib.suppress(AttributeError, TypeError):
            functools.update_wrapper(replacement, original)
        setattr(owner, attribute, replacement)
        self._patches.append((owner, attribute, original))

    # --- around a library's call: the probe's own code, guarded ----------------------------------------

    def start(self) -> float | None:
        try:
            return self.recorder.begin()
        except Exception as exc:
            self.failed(exc)
            return None

    def finish(self, name: str, started: float | None) -> None:
        if started is None:
            return
        try:
            self.measure_end(name, started)
        except Exception as exc:
            recorder = self.recorder
            recorder.depth = max(0, recorder.depth - 1)  # the phase this probe opened is closed, unreported
            self.failed(exc)

    def measure_end(self, name: str, started: float) -> None:
        """A phase this probe timed ends now."""
        self.recorder.end(name, started)

    def timed(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A patch maker: the call, timed as phase `name` (its outermost call only)."""
        probe = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def timed_call(*args: Any, **kwargs: Any) -> Any:
                if compiling() or not probe.on:
                    return original(*args, **kwargs)
                started = probe.start()
                try:
                    return original(*args, **kwargs)
                finally:
                    probe.finish(name, started)
            return timed_call
        return make

    def guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, the probe's own code, when the probe is on (None when off): an exception there is the
        probe's failure (logged once, the probe off) and gives None; the library's call around it goes on."""
        if not self.on:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            self.failed(exc)
            return None

    def failed(self, exc: BaseException) -> None:
        """An exception in this probe's own code: logged once, and the probe turned off for the process."""
        if not self.on:
            return
        self.on = False
        import logging  # here: an interpreter that never fails a probe does not load it

        logging.getLogger(LOGGER).warning("goodput-instrument: probe %r turned off after an error: %s: %s", self.name,
                                          exc.__class__.__name__, exc)
        with contextlib.suppress(Exception):  # already off; nothing more to do
            self.uninstrument()
