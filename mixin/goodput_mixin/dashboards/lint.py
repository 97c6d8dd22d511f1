"""The dashboard conventions as checks (Grafana dashboard-linter's rules, as they apply here), and the helpers
the tests use to read queries out of dashboard JSON: variables substituted, PromQL parsed, selectors found."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import promql_parser

from exporter.core.catalog import Kind
from exporter.sources import CATALOG

from .kit import LEVELS

DATASOURCE_UID = "${datasource}"
# Stand-ins for Grafana's built-in variables when a query is parsed; the rate check looks for RATE_SENTINEL.
RATE_SENTINEL_SECONDS = 1337
RATE_SENTINEL = f"{RATE_SENTINEL_SECONDS}s"
BUILTINS = {"__rate_interval": RATE_SENTINEL, "__interval": "15s", "__range": "1h", "__range_s": "3600",
            "__interval_ms": "15000"}
RATE_FUNCTIONS = {"rate", "irate", "increase"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")
# Recording-rule levels whose series keep the node label (the others aggregate it away).
_NODE_LEVELS = ("gpu", "node", "port", "interface", "link", "workload_node")


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: dict[str, str]  # label -> value, for =~ and = matchers
    in_rate: bool  # inside rate(), irate() or increase()


def panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data (rows skipped, panels inside collapsed rows included)."""
    for panel in model.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def targets(model: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(model):
        for target in panel.get("targets", []):
            yield panel, target


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace `$var` and `${var}` with values[var] (Grafana's built-ins default to BUILTINS)."""
    known = {**BUILTINS, **values}

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in known:
            raise KeyError(f"unknown variable ${name} in {expr!r}")
        return known[name]

    return _VARIABLE.sub(one, expr)


def variable_names(model: dict[str, Any]) -> list[str]:
    return [v["name"] for v in model.get("templating", {}).get("list", [])]


def query_values(model: dict[str, Any], value: str = ".*") -> dict[str, str]:
    """Every query variable of the dashboard set to `value` (".*" is what Grafana sends for All)."""
    return {v["name"]: value for v in model.get("templating", {}).get("list", []) if v["type"] == "query"}


def parse(expr: str) -> promql_parser.Expr:
    return promql_parser.parse(expr)


def selectors(expr: str) -> list[Selector]:
    """Vector selectors of a substituted PromQL expression, with whether each sits inside a rate function."""
    found: list[Selector] = []
    rate_depth = [0]

    def pre(node: object) -> None:
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS:
            rate_depth[0] += 1
        if isinstance(node, promql_parser.VectorSelector):
            matchers = {m.name: m.value for m in node.matchers.matchers if m.name != "__name__"}
            found.append(Selector(node.name or "", matchers, rate_depth[0] > 0))

    def post(node: object) -> None:
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS:
            rate_depth[0] -= 1

    promql_parser.walk(parse(expr), pre, post)
    return found


def rate_ranges(expr: str) -> list[float | None]:
    """The range in seconds of every rate(), irate() and increase() in a substituted expression (None where the
    argument is no range selector, e.g. a subquery)."""
    out: list[float | None] = []

    def pre(node: object) -> None:
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS:
            for arg in node.args:
                if isinstance(arg, promql_parser.MatrixSelector):
                    out.append(arg.range.total_seconds())
                else:
                    out.append(None)

    promql_parser.walk(parse(expr), pre)
    return out


def variable_selectors(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(variable name, PromQL selector) of every label_values() query variable."""
    out = []
    for variable in model.get("templating", {}).get("list", []):
        if variable["type"] != "query":
            continue
        query = variable["query"] if isinstance(variable["query"], str) else variable["query"].get("query", "")
        match = _LABEL_VALUES.match(query)
        out.append((variable["name"], match.group("selector") if match else query))
    return out


def _is_counter(name: str) -> bool:
    metric = CATALOG.get(name)
    if metric is not None:
        return metric.kind is Kind.COUNTER
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base != name and base in CATALOG and CATALOG[base].kind is Kind.HISTOGRAM


def _has_label(name: str, label: str, node_label: str) -> bool:
    """Whether series of `name` carry `label`: catalog labels for raw metrics (node_label from the scrape), the
    rule's level for recording rules. The cluster label is on every series (an external or target label)."""
    if ":" in name:
        level = name.split(":", 1)[0]
        if label == node_label:
            return level in _NODE_LEVELS
        return label in level.split("_")
    if label == node_label:
        return True
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    metric = CATALOG.get(name) or CATALOG.get(base)
    return metric is not None and label in metric.labels


def _datasource_refs(node: object, path: str = "") -> Iterator[tuple[str, object]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield f"{path}.{key}", value
            yield from _datasource_refs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _datasource_refs(value, f"{path}[{index}]")


def lint(model: dict[str, Any], node_label: str = "instance", cluster_label: str = "cluster") -> list[str]:
    """Problems with the conventions, each naming the dashboard and panel; empty when it follows them."""
    uid = model.get("uid", "")
    problems: list[str] = []
    say = problems.append
    levels = {level.uid: level for level in LEVELS}
    if uid not in levels:
        say(f"{uid!r}: not one of the stable uids {sorted(levels)}")
    if "goodput" not in model.get("tags", []):
        say(f"{uid}: no 'goodput' tag")
    variables = {v["name"]: v for v in model.get("templating", {}).get("list", [])}
    source = variables.get("datasource")
    if not source or source["type"] != "datasource" or source.get("query") != "prometheus":
        say(f"{uid}: no Prometheus datasource variable named 'datasource'")
    if "cluster" not in variables:
        say(f"{uid}: no 'cluster' variable")
    for path, ref in _datasource_refs(model):
        if not isinstance(ref, dict) or ref.get("uid") != DATASOURCE_UID:
            say(f"{uid}: {path} is {ref!r}, not the $datasource variable")
    for name, _ in variable_selectors(model):
        if not str(variables[name]["query"]).startswith("label_values("):
            say(f"{uid}: variable {name} is not a label_values() query")
    filters = {"node": node_label, "workload": "workload"}
    level = levels.get(uid)
    following = [lv for lv in LEVELS if level and lv.number == level.number + 1]
    for lv in following:
        links = [lk for lk in model.get("links", []) if lk.get("url") == f"/d/{lv.uid}"]
        if not links or not all(lk.get("includeVars") and lk.get("keepTime") for lk in links):
            say(f"{uid}: no link down to {lv.uid} carrying variables and time range")
    values = query_values(model)
    for panel in panels(model):
        title = f"{uid} / {panel.get('title') or '(untitled)'}"
        if not panel.get("title"):
            say(f"{title}: no title")
        if not panel.get("description"):
            say(f"{title}: no description")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            say(f"{title}: no unit")
        if not panel.get("targets"):
            say(f"{title}: no query")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if not all(refs) or len(set(refs)) != len(refs):
            say(f"{title}: refIds {refs} are not unique and non-empty")
        for target in panel.get("targets", []):
            problems += _lint_query(title, target.get("expr", ""), values, filters, node_label, cluster_label)
    return problems


def _lint_query(title: str, expr: str, values: dict[str, str], filters: dict[str, str], node_label: str,
                cluster_label: str) -> list[str]:
    problems: list[str] = []
    try:
        text = substitute(expr, values)
        found = selectors(text)
        ranges = rate_ranges(text)
    except (KeyError, ValueError, SyntaxError) as exc:  # promql_parser raises ValueError on bad PromQL
        return [f"{title}: {exc}"]
    if any(r != RATE_SENTINEL_SECONDS for r in ranges):
        problems.append(f"{title}: a rate function without $__rate_interval in {expr!r}")
    for sel in found:
        if _is_counter(sel.name) and not sel.in_rate:
            problems.append(f"{title}: counter {sel.name} used without rate() or increase()")
        if sel.matchers.get(cluster_label) != ".*":
            problems.append(f"{title}: {sel.name} is not filtered by $cluster ({cluster_label})")
        for variable, label in filters.items():
            if variable in values and _has_label(sel.name, label, node_label) and sel.matchers.get(label) != ".*":
                problems.append(f"{title}: {sel.name} is not filtered by ${variable} ({label})")
    return problems
