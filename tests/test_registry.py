"""Everything a source needs beyond its own folder is derived from the registry (exporter.sources.SOURCES):
its config section, flags and environment variables, its heading and metrics in the reference, its part of the
chart's values schema, its place in the daemon. These tests read the registry alone and check each of them for
every source, so a source added to the registry gets all of them or fails here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, quick_config
from goodput_mixin.chart import CHART_MANAGED, values_schema
from goodput_mixin.docs import config_markdown, metrics_markdown

from exporter.assemble import build_daemon
from exporter.cli import _serve_parser
from exporter.config import Config, ConfigError, env_name, flag_name, load, settable_keys
from exporter.core import health
from exporter.core.gpus import NodeGpus
from exporter.core.settings import SourceConfig
from exporter.sources import BY_NAME, CATALOG, NAMES, SOURCES
from exporter.sources.base import Node
from exporter.sources.nvml.simulated import SimulatedGpus

SPECS = pytest.mark.parametrize("spec", SOURCES, ids=[spec.name for spec in SOURCES])


def test_the_registry_lists_each_source_once_in_order() -> None:
    assert [spec.name for spec in SOURCES] == list(NAMES)
    assert len(set(NAMES)) == len(NAMES)
    assert list(BY_NAME) == list(NAMES)
    # a source is built after the sources it reads from
    assert NAMES.index("ingest") < NAMES.index("process")


@SPECS
def test_each_source_has_its_config_section(spec) -> None:  # type: ignore[no-untyped-def]
    field = Config.model_fields[spec.name]
    assert field.annotation is spec.settings and issubclass(spec.settings, SourceConfig)
    config = load(None, {}, environ={})
    assert isinstance(config.sources()[spec.name], spec.settings)
    assert list(config.sources()) == list(NAMES)


@SPECS
def test_each_source_has_its_flags_and_environment_variables(spec) -> None:  # type: ignore[no-untyped-def]
    keys = [key for section, key, _ in settable_keys() if section == spec.name]
    assert {"enabled", "interval", "timeout"} <= set(keys)
    options = {option for action in _serve_parser()._actions for option in action.option_strings}
    for key in keys:
        assert flag_name(spec.name, key) in options
    # the interval, the one key every source has with a value to give, set through each layer
    assert getattr(load(None, {spec.name: {"interval": "7s"}}, environ={}), spec.name).interval == 7.0
    environ = {env_name(spec.name, "interval"): "9s"}
    assert getattr(load(None, {}, environ=environ), spec.name).interval == 9.0
    with pytest.raises(ConfigError, match=rf"{spec.name}\.no_such_key: unknown key"):
        load(None, {spec.name: {"no_such_key": 1}}, environ={})


@SPECS
def test_each_source_has_its_docs_title_and_metrics(spec) -> None:  # type: ignore[no-untyped-def]
    assert spec.title and spec.metrics
    assert {metric.source for metric in spec.metrics} == {spec.name}
    reference = metrics_markdown()
    section = reference.split(f"## {spec.title}\n", 1)[1].split("\n## ", 1)[0]
    for metric in spec.metrics:
        assert CATALOG[metric.name] is metric
        assert f"| `{metric.name}` |" in section
    configuration = config_markdown()
    for key in ("enabled", "interval", "timeout"):
        row = f"| `{spec.name}.{key}` | `{flag_name(spec.name, key)}` | `{env_name(spec.name, key)}` |"
        assert row in configuration


@SPECS
def test_each_source_has_its_chart_values(spec) -> None:  # type: ignore[no-untyped-def]
    generated = values_schema()["properties"]["config"]["properties"][spec.name]
    committed = json.loads((ROOT / "helm" / "goodput-exporter" / "values.schema.json").read_text())
    assert committed["properties"]["config"]["properties"][spec.name] == generated
    managed = CHART_MANAGED.get(spec.name, set())
    assert managed == set(spec.chart_managed) and managed <= set(spec.settings.model_fields)
    assert set(generated["properties"]) == set(spec.settings.model_fields) - managed


def test_the_catalog_is_every_source_s_metrics_and_the_exporter_s_own() -> None:
    expected = [m.name for spec in SOURCES for m in spec.metrics] + [m.name for m in health.METRICS]
    assert list(CATALOG) == expected
    assert {m.source for m in health.METRICS} == {"exporter"}


@SPECS
def test_each_source_builds_into_a_source_of_its_name(spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = quick_config(kubelet={"socket_path": str(tmp_path / "kubelet.sock")})
    node = Node(config=config, gpu_backend=SimulatedGpus(1), gpus=NodeGpus())
    for earlier in SOURCES[:SOURCES.index(spec)]:  # what the sources built before it leave on the node
        earlier.build(node, getattr(config, earlier.name)).close()
    source = spec.build(node, getattr(config, spec.name))
    try:
        assert source.name == spec.name
        assert callable(source.start) and callable(source.collect) and callable(source.close)
    finally:
        source.close()


def test_the_daemon_runs_exactly_the_enabled_sources_in_registry_order() -> None:
    config = quick_config(host={"enabled": False}, dcgm={"enabled": True})
    daemon = build_daemon(config, backend=SimulatedGpus(1))
    expected = [name for name in NAMES if getattr(config, name).enabled]
    assert list(daemon.runners) == expected and "host" not in expected and "dcgm" in expected


def test_the_registry_is_read_without_building_any_source() -> None:
    # the config layer and the generators import the registry; heavy modules load only when a source is built
    code = ("import sys, exporter.config; "
            "print(sorted(m for m in ('grpc', 'fastapi', 'uvicorn', 'psutil', 'exporter.sources.kubelet.source', "
            "'exporter.sources.nvml.library') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
