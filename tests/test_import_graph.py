"""The packages' import graph, read from the source with `ast` (every import, at any depth, including the lazy
ones inside functions; only `if TYPE_CHECKING:` blocks are left out, as they never run):

- the runtime (exporter) never imports the build tools (goodput_mixin);
- the training client (goodput_client) imports nothing but the standard library and itself (and torch, lazily,
  to dump a job's flight recorder);
- exporter.core knows no source, no config model and no command line: they import it, never the reverse;
- no two packages import each other, directly or around a loop.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import ROOT

TREES = {"exporter": ROOT / "exporter", "goodput_client": ROOT / "client" / "goodput_client",
         "goodput_mixin": ROOT / "mixin" / "goodput_mixin"}


def _module_name(top: str, root: Path, path: Path) -> str:
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, is_package: bool, source: str) -> set[str]:
    """Absolute names of the modules `source` imports (`from a import b` counts as `a.b` and `a`)."""
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking_only(node)
               for stmt in node.body for n in ast.walk(stmt)}
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found |= {f"{prefix}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for top, root in TREES.items():
        for path in sorted(root.rglob("*.py")):
            name = _module_name(top, root, path)
            modules[name] = imports_of(name, path.name == "__init__.py", path.read_text())
    return {name: {i for i in imported if i in modules} | {i for i in imported if i.split(".")[0] not in TREES}
            for name, imported in modules.items()}


def package_of(module: str) -> str:
    """The unit the no-cycle rule is about: exporter.core, each exporter.sources.<name>, exporter.sources (the
    registry and the spec), exporter (the command line, config, assembly), exporter's __init__ (the version),
    goodput_client, goodput_mixin."""
    parts = module.split(".")
    if module == "exporter":  # the package's own __init__: the version, importing nothing
        return "exporter.__init__"
    if parts[0] != "exporter":
        return parts[0]
    if parts[1] == "sources" and len(parts) > 2 and parts[2] not in ("base",):
        return ".".join(parts[:3])
    if parts[1] in ("core", "sources"):
        return ".".join(parts[:2])
    return "exporter"


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_runtime_never_imports_the_build_tools() -> None:
    offending = {m: sorted(i for i in imported if i.startswith("goodput_mixin"))
                 for m, imported in graph().items() if m.startswith("exporter")}
    assert {m: i for m, i in offending.items() if i} == {}


def test_the_client_imports_only_the_standard_library_and_itself() -> None:
    # torch is the job's own framework, imported inside Telemetry.dump_flight_recorder's thread only
    allowed = {"goodput_client", "torch"}
    for module, imported in graph().items():
        if module.startswith("goodput_client"):
            outside = {i for i in imported if i.split(".")[0] not in sys.stdlib_module_names
                       and i.split(".")[0] not in allowed}
            assert outside == set(), module


def test_core_knows_no_source_config_or_command_line() -> None:
    upper = ("exporter.sources", "exporter.config", "exporter.cli", "exporter.assemble", "exporter.client")
    for module, imported in graph().items():
        if module.startswith("exporter.core"):
            assert not [i for i in imported if i.startswith(upper)], module


def test_no_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for module, imported in graph().items():
        source = package_of(module)
        edges.setdefault(source, set())
        for name in imported:
            if name.split(".")[0] in TREES and (target := package_of(name)) != source:
                edges[source].add(target)
    assert "exporter.sources.nvml" in edges and "exporter.core" in edges  # the graph was read
    assert find_cycle(edges) is None, find_cycle(edges)


def test_the_checks_see_what_they_look_for() -> None:
    lazy = "def f():\n    from goodput_mixin.chart import x\nif TYPE_CHECKING:\n    from exporter.sources import y\n"
    assert imports_of("exporter.core.a", False, lazy) == {"goodput_mixin.chart", "goodput_mixin.chart.x"}
    assert imports_of("exporter.sources.nvml.source", False, "from ...core import http\nfrom . import api\n") == {
        "exporter.core", "exporter.core.http", "exporter.sources.nvml", "exporter.sources.nvml.api"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
