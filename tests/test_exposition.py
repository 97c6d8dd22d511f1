"""The renderer against prometheus-client's own parsers (text and strict OpenMetrics)."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from exporter import catalog as c
from exporter.exposition import OPENMETRICS, TEXT, Batch, Renderer, format_value, join

AWKWARD = ['quote"d', "back\\slash", "new\nline", "bad-\udcff-bytes", "ünïcode"]


def test_awkward_label_values_render_and_parse_back() -> None:
    batch = Batch()
    for i, command in enumerate(AWKWARD):
        batch.add(c.HOST_PROC_THREADS, (str(i), command), i)
    renderer = Renderer()
    text = renderer.render(batch, TEXT).decode()
    parsed = {s.labels["pid"]: s.labels["command"] for f in text_parse(text) for s in f.samples}
    assert parsed["0"] == 'quote"d' and parsed["1"] == "back\\slash" and parsed["2"] == "new\nline"
    assert parsed["3"] == "bad-?-bytes"  # undecodable bytes replaced, never a crash
    assert parsed["4"] == "ünïcode"
    om = join([renderer.render(batch, OPENMETRICS)], OPENMETRICS).decode()
    assert len(next(iter(om_parse(om))).samples) == len(AWKWARD)


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
        batch.add(c.GPU_UP, ("0",), 1)
    except ValueError as exc:
        assert "expected labels ('gpu', 'uuid')" in str(exc)
    else:
        raise AssertionError("a series with missing labels was accepted")
