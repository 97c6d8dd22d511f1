"""deploy/examples/scale-out/, checked by the tools that will run it: promtool checks the Prometheus agent's config
in agent mode, `vmagent -dryRun` its config and arguments, `vmalert -dryRun` the shipped rules with the example's
arguments, and Prometheus and VictoriaMetrics parse theirs. Both agents scrape with deploy/examples/prometheus.yml's
job, whose relabeling makes the labels the rules use, and Grafana's data source is the kind the dashboards ask for.
Nothing is started beyond those checks: the whole module takes seconds."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import ROOT
from goodput_mixin.rules.settings import RulesSettings

from exporter.sources import CATALOG

SCALE_OUT = ROOT / "deploy" / "examples" / "scale-out"
AGENT, VMAGENT = SCALE_OUT / "prometheus-agent.yml", SCALE_OUT / "vmagent.yml"
ARGS, DATASOURCE = SCALE_OUT / "args.yml", SCALE_OUT / "grafana-datasource.yml"
PROMETHEUS_EXAMPLE = ROOT / "deploy" / "examples" / "prometheus.yml"
RULES = sorted((ROOT / "rules").glob("*.rules.yml"))
DOC = ROOT / "docs" / "scale-out.md"
SETTINGS = RulesSettings()
PACKAGE = {"prometheus": "prometheus", "promtool": "prometheus", "vmagent": "victoria-metrics",
           "vmalert": "victoria-metrics", "victoria-metrics": "victoria-metrics"}


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: Debian's {PACKAGE[name]} package has it (`make deps` installs it)")
    return path


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def args(program: str) -> list[str]:
    return list(load(ARGS)[program])


def flags(program: str) -> dict[str, list[str]]:
    """-name=value arguments by name (a flag may repeat)."""
    out: dict[str, list[str]] = {}
    for arg in args(program):
        name, _, value = arg.lstrip("-").partition("=")
        out.setdefault(name, []).append(value)
    return out


def flag(program: str, name: str) -> str:
    (value,) = flags(program)[name]
    return value


def local(program: str, tmp_path: Path, replace: dict[str, Path] | None = None) -> list[str]:
    """The program's arguments with their absolute paths moved here: a file of this folder (or `replace`'s copy of
    it), rules/ for vmalert's rule glob, and anything else (data directories) under tmp_path."""
    out = []
    for arg in args(program):
        name, eq, value = arg.partition("=")
        if eq and value.startswith("/"):
            base = Path(value).name
            if value.startswith("/etc/vmalert/rules/"):
                value = str(ROOT / "rules" / base)
            elif (SCALE_OUT / base).is_file():
                value = str((replace or {}).get(base, SCALE_OUT / base))
            else:
                value = str(tmp_path / base.lstrip("."))
        out.append(f"{name}{eq}{value}")
    return out


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def without_kubernetes_discovery(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The config with kubernetes_sd_configs swapped for an empty file of targets: Debian builds Prometheus without
    Kubernetes discovery, so its promtool rejects the real thing."""
    config = copy.deepcopy(config)
    (directory / "targets.json").write_text("[]")
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")
        job["file_sd_configs"] = [{"files": [str(directory / "targets.json")]}]
    return config


def host(url: str) -> str:
    return urlsplit(url).netloc


def seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, duration
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


# --- each file checked by its tool ----------------------------------------------------------------------------

def test_promtool_checks_the_agent_config_in_agent_mode(tmp_path: Path) -> None:
    config = without_kubernetes_discovery(load(AGENT), tmp_path)
    path = tmp_path / "prometheus-agent.yml"
    path.write_text(yaml.safe_dump(config))
    result = run([binary("promtool"), "check", "config", "--agent", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # --agent holds the file to what an agent accepts: a rule file, fine for a server, is refused
    path.write_text(yaml.safe_dump({**config, "rule_files": ["rules/*.yml"]}))
    refused = run([binary("promtool"), "check", "config", "--agent", str(path)])
    assert refused.returncode != 0 and "not allowed in agent mode" in refused.stdout + refused.stderr


def test_prometheus_parses_the_agent_arguments(tmp_path: Path) -> None:
    argv = local("prometheus-agent", tmp_path)
    assert "--enable-feature=agent" in argv
    assert Path(flag("prometheus-agent", "config.file")).name == AGENT.name
    # --version exits after parsing: an unknown flag or a malformed value fails first
    result = run([binary("prometheus"), *argv, "--version"])
    assert result.returncode == 0, result.stderr


def test_vmagent_dry_run_checks_its_config_and_arguments(tmp_path: Path) -> None:
    argv = local("vmagent", tmp_path)
    assert Path(flag("vmagent", "promscrape.config")).name == VMAGENT.name
    assert "promscrape.config.strictParse" not in flags("vmagent")  # a misspelt field stays an error
    result = run([binary("vmagent"), *argv, "-dryRun", "-loggerLevel=ERROR"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmalert_dry_run_checks_the_shipped_rules_with_the_example_arguments(tmp_path: Path) -> None:
    argv = local("vmalert", tmp_path)
    (rule_glob,) = [a.partition("=")[2] for a in argv if a.startswith("-rule=")]
    assert sorted(Path(rule_glob).parent.glob(Path(rule_glob).name)) == RULES  # the glob takes every shipped file
    result = run([binary("vmalert"), *argv, "-dryRun", "-loggerLevel=ERROR"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_victoria_metrics_parses_its_arguments(tmp_path: Path) -> None:
    # -version exits after parsing, before any directory is made
    result = run([binary("victoria-metrics"), *local("victoria-metrics", tmp_path), "-version"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert not list(tmp_path.iterdir())


# --- the pieces fit together ----------------------------------------------------------------------------------

def test_vmalert_reads_and_writes_the_store_and_adds_no_labels() -> None:
    vmalert = flags("vmalert")
    store = "victoria-metrics.monitoring.svc" + flag("victoria-metrics", "httpListenAddr")
    for name in ("datasource.url", "remoteWrite.url", "remoteRead.url"):
        (url,) = vmalert[name]
        assert host(url) == store, name
    # recorded series and alerts keep the labels their expressions give them: an -external.label would replace
    # `cluster` or add a label the raw series lack (docs/scale-out.md, "The cluster label")
    assert "external.label" not in vmalert
    example = load(PROMETHEUS_EXAMPLE)
    (alertmanagers,) = example["alerting"]["alertmanagers"]
    assert [host(url) for url in vmalert["notifier.url"]] == alertmanagers["static_configs"][0]["targets"]
    assert flag("vmalert", "evaluationInterval") == example["global"]["evaluation_interval"]


def test_both_agents_write_to_the_store_and_deduplicate_at_the_scrape_interval() -> None:
    agent, vmagent = load(AGENT), load(VMAGENT)
    (remote_write,) = agent["remote_write"]
    assert remote_write["url"] == flag("vmagent", "remoteWrite.url")
    assert host(remote_write["url"]) == "victoria-metrics.monitoring.svc" + flag("victoria-metrics", "httpListenAddr")
    interval = agent["global"]["scrape_interval"]
    assert {job["scrape_interval"] for job in agent["scrape_configs"]} == {interval}
    assert seconds(flag("victoria-metrics", "dedup.minScrapeInterval")) == seconds(interval)
    assert set(vmagent) == {"global", "scrape_configs"}  # vmagent's strict parse refuses remote_write
    assert set(agent) == {"global", "scrape_configs", "remote_write"}  # an agent runs no rules


def test_both_agents_scrape_with_the_prometheus_examples_job_and_label_the_cluster_externally() -> None:
    agent, vmagent = load(AGENT), load(VMAGENT)
    # an HA pair may mix the two agents only if they write the same series
    assert agent["global"] == vmagent["global"] and agent["scrape_configs"] == vmagent["scrape_configs"]
    # one label, the cluster's; a replica label would keep an HA pair's series apart and defeat deduplication
    assert agent["global"]["external_labels"] == {SETTINGS.cluster_label: "my-cluster"}
    (example,) = load(PROMETHEUS_EXAMPLE)["scrape_configs"]
    expected = copy.deepcopy(example)
    expected["relabel_configs"] = [rule for rule in example["relabel_configs"]
                                   if rule.get("target_label") != SETTINGS.cluster_label]
    assert len(expected["relabel_configs"]) == len(example["relabel_configs"]) - 1
    assert agent["scrape_configs"] == [expected]


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabeling, for the actions the examples use (keep, drop, replace); None: the target is dropped."""
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        assert action in {"keep", "drop", "replace"}, action
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            replacement = re.sub(r"\$\{?(\d+)\}?", lambda m: r"\g<" + m.group(1) + ">",
                                 rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return labels


def discovered(app: str, port_name: str) -> dict[str, str]:
    """A few of the labels Kubernetes discovery (role pod) gives a container port of a DaemonSet pod on node
    gpu-node-7 (names as Prometheus documents them)."""
    return {"__address__": "10.0.7.12:9445", "__meta_kubernetes_namespace": "goodput-exporter",
            "__meta_kubernetes_pod_name": f"{app}-x7k2p", "__meta_kubernetes_pod_node_name": "gpu-node-7",
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
            "__meta_kubernetes_pod_container_port_name": port_name}


def series_labels(config: dict[str, Any], meta: dict[str, str]) -> dict[str, str] | None:
    """The labels the store receives on the series of this target: its relabeled labels, job and instance as
    Prometheus and vmagent set them, and the external labels where the series has none of that name."""
    (job,) = config["scrape_configs"]
    target = relabel({"job": job["job_name"], **meta}, job["relabel_configs"])
    if target is None:
        return None
    target.setdefault("instance", target["__address__"])
    labels = {name: value for name, value in target.items() if not name.startswith("__")}
    return {**config["global"]["external_labels"], **labels}


def rule_grouping_labels() -> set[str]:
    """Every label named in a by/on/ignoring/group_left/group_right of the shipped rules."""
    found: set[str] = set()
    for path in RULES:
        for group in load(path)["groups"]:
            for rule in group["rules"]:
                for match in re.finditer(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)",
                                         rule["expr"]):
                    found |= {label.strip() for label in match.group(1).split(",") if label.strip()}
    return found


@pytest.mark.parametrize("path", [AGENT, VMAGENT], ids=lambda p: p.name)
def test_relabeling_gives_the_labels_the_rules_group_and_join_by(path: Path) -> None:
    config = load(path)
    labels = series_labels(config, discovered("goodput-exporter", "metrics"))
    assert labels == {"job": SETTINGS.exporter_job, "instance": "gpu-node-7", "node": "gpu-node-7",
                      "cluster": "my-cluster", "exporter_namespace": "goodput-exporter",
                      "exporter_pod": "goodput-exporter-x7k2p"}
    # only the exporter's pods, only their port named metrics
    assert series_labels(config, discovered("something-else", "metrics")) is None
    assert series_labels(config, discovered("goodput-exporter", "debug")) is None
    # the node and cluster labels of the rules settings come from the scrape, and the rules use both
    assert {SETTINGS.node_label, SETTINGS.cluster_label} <= set(labels) & rule_grouping_labels()
    # GoodputExporterDown selects the job by name
    alerts = [rule for group in load(ROOT / "rules" / "goodput-alerts.rules.yml")["groups"] for rule in group["rules"]]
    (down,) = [rule for rule in alerts if rule["alert"] == "GoodputExporterDown"]
    assert f'up{{job="{labels["job"]}"}}' in down["expr"]
    # no scrape label shadows one of the exporter's own (it would rename that to exported_<name>)
    ours = {label for metric in CATALOG.values() for label in metric.labels}
    assert set(labels) & ours == set()


def test_relabel_helper_follows_prometheus_semantics() -> None:
    rules = [{"source_labels": ["a", "b"], "regex": "x;(.*)", "target_label": "c", "replacement": "${1}-z"},
             {"source_labels": ["a"], "action": "drop", "regex": "y"}]
    assert relabel({"a": "x", "b": "q"}, rules) == {"a": "x", "b": "q", "c": "q-z"}
    assert relabel({"a": "xx", "b": "q"}, rules[:1]) == {"a": "xx", "b": "q"}  # regexes match the whole value
    assert relabel({"a": "y"}, rules) is None


def test_grafana_data_source_is_the_one_the_dashboards_ask_for() -> None:
    config = load(DATASOURCE)
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    # the dashboards' variable lists the data sources of its type and starts on the default one
    assert source["isDefault"] is True
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", source["uid"])
    assert host(source["url"]) == host(flag("vmalert", "datasource.url"))
    assert seconds(source["jsonData"]["timeInterval"]) == seconds(load(AGENT)["global"]["scrape_interval"])
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
        assert variable["query"] == source["type"], path.name
        # every panel, target and query variable reads the variable: no uid is hard-coded
        assert datasource_refs(dashboard) == {(source["type"], "${" + variable["name"] + "}")}, path.name


def datasource_refs(node: Any) -> set[tuple[str, str]]:
    if isinstance(node, list):
        return {ref for item in node for ref in datasource_refs(item)}
    if not isinstance(node, dict):
        return set()
    refs = {ref for key, value in node.items() if key != "datasource" for ref in datasource_refs(value)}
    if isinstance(node.get("datasource"), dict):
        refs.add((node["datasource"].get("type"), node["datasource"].get("uid")))
    return refs


# --- the docs -------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", [DOC, SCALE_OUT / "README.md", ROOT / "deploy" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_links_of_the_docs_resolve(path: Path) -> None:
    text = path.read_text()
    anchors = {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        if file:
            assert (path.parent / file).exists(), f"{path.name}: {target}"
        else:
            assert anchor in anchors, f"{path.name}: {target}"


def test_the_doc_names_every_example_file_and_the_sections_filled_from_measurements() -> None:
    text = DOC.read_text()
    for file in sorted(p.name for p in SCALE_OUT.iterdir() if p.suffix == ".yml"):
        assert f"scale-out/{file}" in text, file
    headings = set(re.findall(r"^## (.+)$", text, re.M))
    assert {"Where the engines differ", "Sizing"} <= headings
    assert "tests/test_rules_equivalence.py" in text and "Backend cost per GPU" in text
