"""The renderer against prometheus-client's own parsers (text and strict OpenMetrics)."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from exporter.core.exposition import OPENMETRICS, TEXT, Batch, Renderer, format_value, join
from exporter.sources.host import metrics as c
from exporter.sources.ingest import metrics as ingest_metrics
from exporter.sources.nvml import metrics as nvml_metrics

AWKWARD = ['quote"d', "back\\slash", "new\nline", "bad-\udcff-bytes", "ünïcode"]


def test_awkward_label_values_render_and_parse_back() -> None:
    batch = Batch()
    for i, command in enumerate(AWKWARD):
        batch.add(c.HOST_PROC_THREADS, (str(i), command), i)
    renderer = Renderer()
    text = renderer.render(batch, TEXT).decode()
    parsed = {s.labels["pid"]: s.labels["command"] for f in text_parse(text) for s in f.samples}
    assert parsed["0"] == 'quote"d' and parsed["1"] == "back\\slash" and parsed["2"] == "new\nline"
    assert parsed["3"] == "bad-%FF-bytes"  # undecodable bytes written out as %XX, never a crash
    assert parsed["4"] == "ünïcode"
    om = join([renderer.render(batch, OPENMETRICS)], OPENMETRICS).decode()
    assert len(next(iter(om_parse(om))).samples) == len(AWKWARD)


def test_values_differing_only_in_undecodable_bytes_stay_apart() -> None:
    """Two process names that differ only in bytes that are not UTF-8 (as /proc gives them, surrogate-escaped): two
    series, each value parsed back by prometheus-client's text and OpenMetrics parsers, no duplicate."""
    batch = Batch()
    names = [b"job-\xff".decode("utf-8", "surrogateescape"), b"job-\xfe".decode("utf-8", "surrogateescape"), "job-?"]
    for i, command in enumerate(names):
        batch.add(c.HOST_PROC_THREADS, ("7", command), i)
    renderer = Renderer()
    text = renderer.render(batch, TEXT).decode()
    parsed = sorted(s.labels["command"] for f in text_parse(text) for s in f.samples)
    assert parsed == ["job-%FE", "job-%FF", "job-?"]
    om = join([renderer.render(batch, OPENMETRICS)], OPENMETRICS).decode()
    assert sorted(s.labels["command"] for f in om_parse(om) for s in f.samples) == parsed


def test_values() -> None:
    assert format_value(True) == "1"
    assert format_value(3) == "3"
    assert format_value(2.0) == "2"
    assert format_value(0.25) == "0.25"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("inf")) == "+Inf"
    assert format_value(1e20) == "1e+20"


def test_label_count_is_enforced() -> None:
    batch = Batch()
    try:
        batch.add(nvml_metrics.GPU_UP, ("0",), 1)
    except ValueError as exc:
        assert "expected labels ('gpu', 'uuid')" in str(exc)
    else:
        raise AssertionError("a series with missing labels was accepted")


def test_histograms_in_both_formats() -> None:
    batch = Batch()
    buckets = len(ingest_metrics.STEP_BUCKETS) + 1
    batch.add(ingest_metrics.STEP_DURATION, ("llama", "0"), ([0] * 5 + [2] * (buckets - 5), 0.7))
    renderer = Renderer()
    text = renderer.render(batch, TEXT).decode()
    (family,) = text_parse(text)
    assert family.type == "histogram"
    by_le = {s.labels.get("le"): s.value for s in family.samples if s.name.endswith("_bucket")}
    assert by_le["0.1"] == 0 and by_le["0.25"] == 2 and by_le["+Inf"] == 2
    om = join([renderer.render(batch, OPENMETRICS)], OPENMETRICS).decode()
    (om_family,) = om_parse(om)
    assert om_family.type == "histogram" and om_family.unit == "seconds"
    assert [s.value for s in om_family.samples if s.name.endswith("_count")] == [2]
