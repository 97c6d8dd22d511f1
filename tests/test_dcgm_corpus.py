"""Real dcgm-exporter outputs, gathered from public sources (tests/dcgm_corpus/PROVENANCE.md), served to the
real daemon by a real HTTP server: what comes out for each GPU and MIG GPU instance is what the sample
says, as read by hand into tests/dcgm_corpus/expected.json.

One daemon (the nvml source off, so the GPUs are labelled by dcgm-exporter's own `gpu`) reads one
server; each test swaps the body served and waits for two fresh fetches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LiveServer, live_server, quick_config, series, value, wait_for
from dcgm_exporter_server import DcgmExporterServer, dcgm_exporter

from exporter.sources.dcgm.api import FIELD_NAMES, RATIO_FIELDS
from exporter.sources.dcgm.source import METRICS

CORPUS = Path(__file__).parent / "dcgm_corpus"
EXPECTED: dict[str, dict] = json.loads((CORPUS / "expected.json").read_text())  # type: ignore[type-arg]
FIELD_BY_NAME = {name: field_id for field_id, name in FIELD_NAMES.items()}
DCGM_METRICS = sorted({metric.name for metric in METRICS.values()})


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[DcgmExporterServer, LiveServer]]:
    with dcgm_exporter() as exporter:
        config = quick_config(nvml={"enabled": False}, flight={"enabled": False}, host={"enabled": False},
                              dcgm={"enabled": True, "mode": "exporter", "exporter_url": exporter.url,
                                    "interval": "100ms", "timeout": "1s"})
        with live_server(config) as live:
            yield exporter, live


def expected_series(sample: dict) -> dict[tuple[str, str, str, str], float]:  # type: ignore[type-arg]
    """(metric, gpu, uuid, gpu_instance_id) -> value, for every profiling field the daemon maps."""
    out = {}
    for entity in sample["entities"]:
        for field, number in entity["fields"].items():
            field_id = FIELD_BY_NAME.get(field.upper())
            if field_id is None or number == "blank" or (field_id in RATIO_FIELDS and number > 1):
                continue
            key = (METRICS[field_id].name, entity["gpu"], entity["uuid"], entity["gpu_instance_id"] or "")
            out[key] = float(number)
    return out


def read(rig: tuple[DcgmExporterServer, LiveServer], name: str) -> str:
    exporter, live = rig
    exporter.body = (CORPUS / name).read_text()
    seen = exporter.requests
    # a fetch may have begun before the swap; the next one reads the new body, and the one after that
    # begins only once its collection is published (a source's collections run one at a time)
    wait_for(lambda: exporter.requests >= seen + 3)
    return live.metrics()


def test_the_corpus_has_what_the_issue_asks_for() -> None:
    assert len(EXPECTED) >= 10
    assert {path.name for path in CORPUS.glob("*.txt")} == set(EXPECTED)
    provenance = (CORPUS / "PROVENANCE.md").read_text()
    for name in EXPECTED:
        assert name in provenance, f"{name} has no provenance"
    with_mig = [n for n, s in EXPECTED.items() if any(e["gpu_instance_id"] for e in s["entities"])]
    all_mig = [n for n, s in EXPECTED.items() if s["entities"] and all(e["gpu_instance_id"] for e in s["entities"])]
    assert len(with_mig) >= 3 and all_mig


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_output_gives_its_gpus_and_mig_instances(rig: tuple[DcgmExporterServer, LiveServer],
                                                          name: str) -> None:
    sample = EXPECTED[name]
    text = read(rig, name)
    got = {(metric, s["gpu"], s["uuid"], s.get("gpu_instance_id", "")): value(text, metric, **s)
           for metric in DCGM_METRICS for s in series(text, metric)}
    want = expected_series(sample)
    assert got == pytest.approx(want, rel=1e-12)
    up = value(text, "goodput_exporter_source_up", source="dcgm")
    if want:
        assert up == 1
        # a GPU in MIG mode comes out once per GPU instance per field, each with its gpu_instance_id
        instances = {(e["uuid"], e["gpu_instance_id"]) for e in sample["entities"] if e["gpu_instance_id"]}
        for uuid, instance in instances:
            assert any(k[2] == uuid and k[3] == instance for k in got), (uuid, instance)
    else:  # nothing usable: the source is down and says why
        assert up == 0
        assert not sample["profiling_fields"]
        wait_for(lambda: value(rig[1].metrics(), "goodput_exporter_source_errors_total", source="dcgm",
                               reason="dcgm_exporter_no_fields"))
