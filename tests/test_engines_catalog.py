"""The serving engines' catalog (mixin/goodput_mixin/rules/engines.py) against its table in docs/ and the real
expositions under tests/serving_corpus/: what the rules read is what the docs say and what engines expose."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT
from goodput_mixin.rules.engines import ENGINES
from prometheus_client.parser import text_string_to_metric_families

DOC = (ROOT / "docs" / "inference-engines.md").read_text()
REAL = sorted((ROOT / "tests" / "serving_corpus").glob("*.prom"))


def _section(engine: str) -> str:
    match = re.search(rf"^## .*\(`{engine}`, read at ([^)]+)\)$(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert match, f"docs/inference-engines.md has no section for {engine}"
    assert match.group(1) == ENGINES[engine].version
    return match.group(2)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_native_series_is_in_the_docs_table_as_catalogued(engine: str) -> None:
    rows = [line for line in _section(engine).splitlines() if line.startswith("| ")]
    for signal, natives in ENGINES[engine].signals.items():
        for native in natives:
            # a family read once per label value (Triton's gauges) has a row per value: `name{match}`
            key = f"`{native.name}{{{native.match}}}`" if native.match else f"`{native.name}`"
            (row,) = [r for r in rows if key in r]
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells[0] in (signal, "↳") and cells[2] == native.kind, row
            assert cells[3] == (", ".join(f"`{label}`" for label in native.labels) or "—"), row
            if native.buckets:
                assert cells[4].endswith(f"({len(native.buckets)})"), row


def _families(path) -> dict[str, tuple[str, set[frozenset[str]], set[float]]]:  # type: ignore[no-untyped-def]
    """name as catalogued -> (type, label-name sets, bucket bounds) of the real exposition's series."""
    out: dict[str, tuple[str, set[frozenset[str]], set[float]]] = {}
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("# ...")) + "\n"
    for family in text_string_to_metric_families(text):
        labels: set[frozenset[str]] = set()
        bounds: set[float] = set()
        for sample in family.samples:
            labels.add(frozenset(k for k in sample.labels if k not in ("le", "quantile")))
            if sample.name.endswith("_bucket") and sample.labels.get("le") != "+Inf":
                bounds.add(float(sample.labels["le"]))
        # prometheus_client's parser adds `_total` to every counter; keep it only where the text has it (C++ and Rust
        # exporters write none)
        name = family.name + ("_total" if family.type == "counter" and f"{family.name}_total" in text else "")
        if family.type == "unknown" and family.samples and family.samples[0].name.endswith("_bucket"):
            name = family.samples[0].name.removesuffix("_bucket")
        out[name] = (family.type, labels, bounds)
    return out


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_expositions_agree_with_the_catalog(path) -> None:  # type: ignore[no-untyped-def]
    """Each real paste's series of a catalogued name: same type, the catalogued labels (a version may have fewer:
    vLLM's `engine` came in 0.8.3), buckets among the catalogued bounds or the older lists its note names."""
    engine = ENGINES[path.name.split("_", 1)[0]]
    seen = _families(path)
    matched = 0
    for natives in engine.signals.values():
        for native in natives:
            if native.name not in seen:
                continue
            matched += 1
            kind, labels, bounds = seen[native.name]
            assert kind in (native.kind, "unknown"), (native.name, kind)  # unknown: the excerpt lost its TYPE line
            for names in labels:
                assert names <= set(native.labels) | {"model"}, (native.name, names)
            if bounds and not bounds <= set(native.buckets):
                # an older bucket list: the note says which
                assert all(repr(b) in native.note or f"{b:g}" in native.note for b in bounds - set(native.buckets)), \
                    (native.name, sorted(bounds - set(native.buckets)))
    assert matched, f"{path.name} has none of {engine.name}'s catalogued series"
