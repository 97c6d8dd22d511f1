"""Counting a library's calls: what a source asks the GPU driver (NVML) or DCGM for, call by call, so that the
exporter's cost on a node is a number (goodput_exporter_library_calls_total), on the real backend as on the
simulated one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any


class CountedCalls:
    """Stands in for `backend`: each of its methods called through this object is counted by name (`calls`), then
    called. Attributes that are not callable are the backend's, read through. `names` renames methods for
    `by_function` (a backend method -> the library function it calls)."""

    def __init__(self, backend: Any, names: Mapping[str, str] | None = None) -> None:
        self._backend = backend
        self._names = dict(names or {})
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:  # only for names not set on the instance: each method once
        attr = getattr(self._backend, name)
        if name.startswith("_") or not callable(attr):
            return attr
        wrapped = self._counted(name, attr)
        setattr(self, name, wrapped)
        return wrapped

    def _counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def counted(*args: Any) -> Any:
            calls[name] += 1
            return method(*args)

        counted.__name__ = name
        return counted

    def by_function(self) -> dict[str, int]:
        """Calls so far by library function (the backend method's name where `names` has none)."""
        out: Counter[str] = Counter()
        for name, count in dict.copy(self.calls).items():  # one C call: the collecting thread adds to it
            out[self._names.get(name, name)] += count
        return dict(out)
