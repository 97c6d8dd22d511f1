"""bench/run.py, the generator of bench/results.md: every section from one registry, each marked with the commit and
date it came from; --only reruns some and keeps the others from the file, as they were."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def run() -> Iterator[ModuleType]:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import run as module
        yield module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_every_section_is_a_module_with_its_own_name(run: ModuleType) -> None:
    names = [run.name_of(section) for _, section in run.SECTIONS]
    assert len(set(names)) == len(names) and "__main__" not in names
    assert {"daemon_cost", "idle_cpu", "nvml_calls", "idle_accuracy", "rules_scale"} <= set(names)
    for name in names:
        assert (ROOT / "bench" / f"{name}.py").is_file(), name


def test_only_keeps_the_other_sections_with_their_commits(run: ModuleType, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(name: str):  # type: ignore[no-untyped-def]
        def section() -> str:
            calls.append(name)
            return f"## {name.title()}\n\n{name} figures, run {len(calls)}\n\n### A part of {name}"
        section.__module__ = name
        return section

    monkeypatch.setattr(run, "SECTIONS", [("First", fake("first")), ("Second", fake("second"))])
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results.md")
    monkeypatch.setattr(run, "commit", lambda: "abc123")
    monkeypatch.setattr(sys, "argv", ["run.py"])
    run.main()
    whole = (tmp_path / "results.md").read_text()
    assert "from commit `abc123`" in whole and "every section below comes from that run" in whole
    assert calls == ["first", "second"]
    monkeypatch.setattr(run, "commit", lambda: "def456")
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "second"])
    run.main()
    text = (tmp_path / "results.md").read_text()
    assert calls == ["first", "second", "second"]
    assert "first figures, run 1" in text and "second figures, run 3" in text and "run 2" not in text
    assert "### A part of first" in text  # a kept section whole, its sub-headings included
    assert "from several runs" in text
    parts = run.read_parts(text)
    assert [(p.name, p.commit) for p in parts.values()] == [("first", "abc123"), ("second", "def456")]
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", "third"])
    with pytest.raises(SystemExit, match="unknown section"):
        run.main()


def test_a_file_from_before_the_markers_keeps_its_sections_by_heading(run: ModuleType) -> None:
    text = ("# Benchmark results\n\nWritten on a day.\n\n## Scrape latency, side by side\n\nrows\n\n"
            "## Daemon CPU and memory\n\nmore rows\n\n## Idle fraction: integrated\n\nerrors\n")
    parts = run.read_parts(text)
    assert set(parts) == {"daemon_cost", "idle_accuracy"}
    assert "## Daemon CPU and memory" in parts["daemon_cost"].text  # up to the next section's heading
    assert parts["idle_accuracy"].commit == "unknown"
