"""Run a function right after a module is imported (a post-import hook), without importing it ourselves.

A finder at the front of sys.meta_path answers for the watched names only: it asks the rest of sys.meta_path
for the module's spec and wraps the loader so that, once the module's code has run, the hooks get the module.
A module already imported gets its hooks at once. Standard library only, and cheap to import: this runs at the start of
every interpreter.
"""

from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.RLock()
_finding = threading.local()


class _Loader:
    """The module's own loader, and the hooks once it has run (duck-typed: importlib.abc costs an import)."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # the loader stays the original one for everyone who looks at the module afterwards
        try:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        except AttributeError:
            pass
        _fire(self._name, module)

    def __getattr__(self, name: str) -> object:  # get_source, is_package, ... of the original
        return getattr(self._loader, name)


class _Finder:
    """At the front of sys.meta_path, answering for the watched names only."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks or getattr(_finding, "name", None) == fullname:
            return None
        _finding.name = fullname
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _finding.name = None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)  # type: ignore[assignment]  # a Loader by its methods
        return spec


_FINDER = _Finder()


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)  # each hook catches its own errors (probes.base)


def when_imported(name: str, hook: Hook) -> None:
    """Call `hook(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        hook(module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(hook)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
