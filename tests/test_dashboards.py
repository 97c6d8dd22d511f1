"""The committed dashboards: fresh, valid against Grafana's own schema, following the conventions, every query
parsing and naming only metrics the catalog declares and recording rules rules/ ships."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import promtool
from goodput_mixin.dashboards import render
from goodput_mixin.dashboards.kit import LEVELS
from goodput_mixin.dashboards.lint import (
    lint,
    panels,
    query_values,
    selectors,
    substitute,
    targets,
    variable_selectors,
)
from goodput_mixin.rules.recording import STEP_SHIFT
from goodput_mixin.rules.verdict import CANDIDATE, HEALTHY, LAYERS, VERDICT, order

from exporter.core.catalog import Kind
from exporter.sources import CATALOG

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "dashboards"
SCHEMA = ROOT / "tests" / "grafana_schema" / "dashboard.schema.json"


def committed() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(FOLDER.glob("*.json"))}


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    """The schema generated from npm's @grafana/schema (make dashboard-schema: a pinned npm install and
    ts-json-schema-generator; `make test` runs it first, this runs it where it has not been)."""
    if not SCHEMA.exists():
        subprocess.run(["make", "-s", "dashboard-schema"], cwd=ROOT, check=True)
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_committed_json_is_what_the_generator_writes() -> None:
    fresh = render()
    on_disk = {path.name: path.read_text() for path in sorted(FOLDER.glob("*.json"))}
    assert sorted(on_disk) == sorted(fresh), "dashboards/ has other files than the generator writes"
    stale = [name for name in fresh if on_disk[name] != fresh[name]]
    assert not stale, f"stale: {stale}; run `make dashboards`"


def test_one_dashboard_per_level_with_stable_uids() -> None:
    models = committed()
    assert [m["uid"] for m in models.values()] == [level.uid for level in LEVELS]
    assert len({m["uid"] for m in models.values()}) == 7


@pytest.mark.parametrize("name", sorted(render()))
def test_validates_against_the_grafana_schema(name: str, validator: jsonschema.Draft7Validator) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(committed()[name])]
    assert not errors


def test_the_schema_is_strict(validator: jsonschema.Draft7Validator) -> None:
    """The schema rejects what Grafana's model does not have, so a pass above means something."""
    model = committed()["1-cluster.json"]
    bad_panel = copy.deepcopy(model)
    bad_panel["panels"][1]["colour"] = "red"
    bad_type = copy.deepcopy(model)
    bad_type["panels"][1]["gridPos"]["w"] = "wide"
    bad_variable = copy.deepcopy(model)
    bad_variable["templating"]["list"][1]["auto_min"] = "10s"  # what the SDK writes on every variable
    for broken in (bad_panel, bad_type, bad_variable):
        assert list(validator.iter_errors(broken))


@pytest.mark.parametrize("name", sorted(render()))
def test_follows_the_conventions(name: str) -> None:
    assert lint(committed()[name]) == []


def _seeded(mutate: Any) -> list[str]:
    model = copy.deepcopy(committed()["2-collectives.json"])
    mutate(model)
    return lint(model)


def _target(model: dict[str, Any], title: str) -> dict[str, Any]:
    return next(t for p, t in targets(model) if p["title"] == title)


@pytest.mark.parametrize(("mutate", "problem"), [
    (lambda m: m["panels"][1].update(datasource={"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}),
     "not the $datasource variable"),
    (lambda m: m["templating"]["list"].pop(0), "no Prometheus datasource variable"),
    (lambda m: m["panels"][1]["fieldConfig"]["defaults"].pop("unit"), "no unit"),
    (lambda m: m["panels"][1].pop("description"), "no description"),
    (lambda m: m.update(uid="abc123"), "not one of the stable uids"),
    (lambda m: m.update(tags=[]), "no 'goodput' tag"),
    (lambda m: m.update(links=[]), "no link down to goodput-host"),
    (lambda m: _target(m, "Collective bytes by op").update(
        expr=_target(m, "Collective bytes by op")["expr"].replace("$__rate_interval", "5m")),
     "without $__rate_interval"),
    (lambda m: _target(m, "In-flight collectives").update(
        expr='goodput_collective_inflight{cluster=~"$cluster", instance=~"$node"}'), "not filtered by $workload"),
    (lambda m: _target(m, "In-flight collectives").update(
        expr='goodput_collective_inflight{instance=~"$node", workload=~"$workload"}'), "not filtered by $cluster"),
    (lambda m: _target(m, "In-flight collectives").update(
        expr='goodput_collective_operations_total{cluster=~"$cluster", instance=~"$node", workload=~"$workload"}'),
     "used without rate()"),
    (lambda m: _target(m, "In-flight collectives").update(expr="sum(goodput_collective_inflight"), "In-flight"),
    (lambda m: _target(m, "In-flight collectives").update(refId=""), "refIds"),
])
def test_lint_finds_each_broken_convention(mutate: Any, problem: str) -> None:
    problems = _seeded(mutate)
    assert any(problem in p for p in problems), problems


def _names_in(model: dict[str, Any]) -> set[str]:
    values = query_values(model)
    names = {s.name for _, t in targets(model) for s in selectors(substitute(t["expr"], values))}
    names |= {s.name for _, sel in variable_selectors(model) for s in selectors(substitute(sel, values))}
    return names


def known_names() -> set[str]:
    names = set(CATALOG)
    for metric in CATALOG.values():
        if metric.kind is Kind.HISTOGRAM:
            names |= {f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count"}
    rules = yaml.safe_load((ROOT / "rules" / "goodput-recording.rules.yml").read_text())
    names |= {rule["record"] for group in rules["groups"] for rule in group["rules"]}
    return names


def test_every_query_and_variable_parses() -> None:
    count = 0
    for model in committed().values():
        values = query_values(model, "x")  # a plain value too: `=~"x"` must parse as well as `.*`
        for panel, target in targets(model):
            assert selectors(substitute(target["expr"], values)), f"{panel['title']}: no selector"
            count += 1
        for name, selector in variable_selectors(model):
            assert selectors(substitute(selector, values)), f"variable {name}"
    assert count > 60


def test_every_name_a_panel_uses_exists() -> None:
    known = known_names()
    used = set().union(*(_names_in(m) for m in committed().values()))
    assert not sorted(used - known)
    # the panels cover the recording rules that say most: goodput, badput, idle, straggler, lag, memory, tokens
    for rule in ("workload:goodput_ratio:rate5m", "workload:goodput_badput_ratio:rate5m",
                 "gpu:goodput_gpu_idle_ratio:rate5m", "cluster:goodput_gpu_idle_while_allocated_ratio:rate5m",
                 "workload_rank:goodput_straggler_ratio:rate5m", "workload_pg_rank:goodput_collective_lag:behind_max",
                 "gpu:goodput_gpu_memory_exhaustion_ratio:predict_linear1h", "workload:goodput_tokens:rate5m"):
        assert rule in used, rule


def test_an_unknown_name_is_caught() -> None:
    model = copy.deepcopy(committed()["4-memory.json"])
    next(targets(model))[1]["expr"] = 'goodput_gpu_memory_usd_bytes{cluster=~"$cluster"}'
    assert "goodput_gpu_memory_usd_bytes" in _names_in(model) - known_names()


def test_the_dcgm_activity_ratios_have_panels() -> None:
    used = _names_in(committed()["5-kernels.json"])
    assert {"goodput_gpu_sm_active_ratio", "goodput_gpu_tensor_active_ratio", "goodput_gpu_dram_active_ratio"} <= used


def test_each_level_links_down_to_the_next() -> None:
    models = list(committed().values())
    for upper, lower in itertools.pairwise(models):
        links = [link for link in upper["links"] if link.get("url") == f"/d/{lower['uid']}"]
        assert links and links[0]["includeVars"] and links[0]["keepTime"], upper["uid"]
    assert not [link for link in models[-1]["links"] if link.get("url")]


# --- the funnel's verdict first, step-time changes (issue 20) -------------------------------------------------------


def _first_panel(model: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in model["panels"] if p["type"] != "row")


def _row_of_first_panel(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels of the dashboard's first row (from its top to the next row)."""
    panels = model["panels"][1:] if model["panels"][0]["type"] == "row" else model["panels"]
    return list(itertools.takewhile(lambda p: p["type"] != "row", panels))


def _names_of(model: dict[str, Any], panel: dict[str, Any]) -> set[str]:
    values = query_values(model)
    return {s.name for t in panel["targets"] for s in selectors(substitute(t["expr"], values))}


def _layer_colors(panel: dict[str, Any]) -> dict[str, str]:
    (override,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "layer"]
    properties = {p["id"]: p["value"] for p in override["properties"]}
    assert properties["custom.cellOptions"] == {"type": "color-background"}
    (mapping,) = properties["mappings"]
    return {text: result["color"] for text, result in mapping["options"].items()}


def test_the_cluster_dashboard_opens_on_the_verdict_per_workload() -> None:
    model = committed()["1-cluster.json"]
    assert model["panels"][0] == {**model["panels"][0], "type": "row", "title": "Verdict"}
    panel = _first_panel(model)
    assert panel["type"] == "table" and {VERDICT, CANDIDATE} <= _names_of(model, panel)
    (keep,) = [t["options"]["include"]["names"] for t in panel["transformations"] if t["id"] == "filterFieldsByName"]
    assert keep[:3] == ["workload", "layer", "reason"]
    # every layer has its own colour
    colors = _layer_colors(panel)
    assert sorted(colors) == sorted(LAYERS) and len(set(colors.values())) == len(LAYERS)
    # a click opens the Workload dashboard on the row's workload, with the time range, data source and cluster
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    assert link["url"].startswith(f"/d/{LEVELS[5].uid}?") and "var-workload=${__data.fields.workload}" in link["url"]
    assert all(part in link["url"] for part in ("${__url_time_range}", "${datasource:queryparam}",
                                                "${cluster:queryparam}"))


def test_the_workload_dashboard_opens_on_its_verdict_with_the_failing_checks_beside_it() -> None:
    model = committed()["6-workload.json"]
    first = _row_of_first_panel(model)
    assert _first_panel(model)["title"] == "Verdict" and _names_of(model, first[0]) == {VERDICT}
    assert _layer_colors(first[0]) == _layer_colors(_first_panel(committed()["1-cluster.json"]))
    checks = [p for p in first if _names_of(model, p) == {CANDIDATE}]
    assert checks and checks[0]["options"]["sortBy"] == [{"displayName": "walk step", "desc": False}]
    assert STEP_SHIFT in set().union(*(_names_of(model, p) for p in first))


def test_the_workload_dashboard_shows_step_time_changes() -> None:
    model = committed()["6-workload.json"]
    values = query_values(model)
    found = [s for _, t in targets(model) for s in selectors(substitute(t["expr"], values))]
    windows = {s.matchers.get("window") for s in found if s.name == "goodput_step_time_seconds"}
    assert windows == {"1m", "1h"}
    assert {"goodput_step_time_baseline_seconds", "goodput_step_time_shifts_total"} <= {s.name for s in found}
    (shifts,) = [p for p in panels(model) if p["title"] == "Step-time shifts"]
    assert shifts["fieldConfig"]["defaults"]["custom"]["drawStyle"] == "bars"


def test_the_verdict_query_lists_the_jobs_held_back_earliest_first(tmp_path: Path) -> None:
    """The cluster dashboard's verdict query, run by promtool on the inputs of the verdict's own tests, gives each
    workload its verdict valued by the place in the walk of the check that decided it (healthy last), which the table
    sorts on."""
    model = committed()["1-cluster.json"]
    (target,) = _first_panel(model)["targets"]
    expr = substitute(target["expr"], query_values(model))
    cases = []
    for case in yaml.safe_load((ROOT / "rules" / "tests" / "verdict.test.yml").read_text())["tests"]:
        checks = [t for t in case["promql_expr_test"] if t["expr"] == VERDICT]
        for check in checks:
            samples = []
            for sample in check["exp_samples"]:
                reason = re.search(r'reason="([^"]+)"', sample["labels"]).group(1)
                # the decided check's series keep the candidate's name; healthy's is computed (no name)
                name = "" if reason == HEALTHY[1] else CANDIDATE
                samples.append({"labels": sample["labels"].replace(VERDICT, name, 1), "value": order(reason)})
            cases.append({"interval": case["interval"], "input_series": case["input_series"],
                          "promql_expr_test": [{"expr": expr, "eval_time": check["eval_time"],
                                                "exp_samples": samples}]})
    assert len(cases) >= 2 and {s["value"] for c in cases for s in c["promql_expr_test"][0]["exp_samples"]} >= {
        1, order(HEALTHY[1])}
    tests = tmp_path / "verdict_query.test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(ROOT / "rules" / "goodput-recording.rules.yml")],
                                     "evaluation_interval": "1m", "tests": cases}))
    result = subprocess.run([promtool(), "test", "rules", str(tests)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
