"""The metric catalog follows the naming rules, and the generated references are fresh."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT
from goodput_mixin.docs import config_markdown, metrics_markdown

from exporter.core.catalog import Kind
from exporter.sources import CATALOG

UNITS = ("seconds", "bytes", "watts", "joules", "celsius", "hertz", "ratio", "bytes_per_second", "flops")


def test_names_follow_prometheus_conventions() -> None:
    for metric in CATALOG.values():
        name = metric.name
        assert re.fullmatch(r"goodput_[a-z0-9_]+", name), name
        assert name.endswith("_total") == (metric.kind is Kind.COUNTER), name
        assert name.endswith("_info") == (metric.kind is Kind.INFO), name
        base = name.removesuffix("_total")
        if metric.unit:
            assert metric.unit in UNITS and base.endswith("_" + metric.unit), name
        else:
            assert not any(base.endswith("_" + unit) for unit in UNITS), name
        for label in metric.labels:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", label), (name, label)
            assert label not in ("job", "instance"), name
        assert metric.help.endswith("."), name


def test_every_per_gpu_metric_has_gpu_and_uuid() -> None:
    for metric in CATALOG.values():
        if metric.name.startswith("goodput_gpu_"):
            assert metric.labels[:2] == ("gpu", "uuid"), metric.name


def test_metrics_doc_is_fresh() -> None:
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == metrics_markdown(), "run: goodput-exporter metrics-doc > docs/metrics.md"
    printed = subprocess.run([sys.executable, "-m", "exporter", "metrics-doc"], capture_output=True,
                             text=True, check=True).stdout
    assert printed == committed
    for name in CATALOG:
        assert f"`{name}`" in committed


def test_configuration_doc_is_fresh() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == config_markdown(), "run: goodput-exporter config-doc > docs/configuration.md"
