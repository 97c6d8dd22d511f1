"""The generated Prometheus rules: fresh, valid for promtool, every rule unit-tested, every metric real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT, promtool
from goodput_mixin.rules.render import rule_files
from goodput_mixin.rules.settings import RulesSettings

from exporter.core.catalog import Kind
from exporter.sources import CATALOG

RULES = ROOT / "rules"
TESTS = sorted((RULES / "tests").glob("*.test.yml"))
_METRIC = re.compile(r"\b(goodput_[a-z0-9_]+)\b")
_RECORDED = re.compile(r"\b([a-z_]+:goodput_[a-z0-9_]+:[a-z0-9_]+)\b")


def rules() -> list[dict]:
    out = []
    for path in sorted(RULES.glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", "rules", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_the_committed_rule_files_are_what_the_settings_generate() -> None:
    generated = rule_files(RulesSettings())
    assert sorted(generated) == sorted(p.name for p in RULES.glob("*.rules.yml"))
    for name, text in generated.items():
        assert (RULES / name).read_text() == text, f"rules/{name} is stale: run `make rules`"
    result = cli("--check")
    assert result.returncode == 0, result.stderr


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    assert cli("--out", str(tmp_path)).returncode == 0
    (tmp_path / "goodput-recording.rules.yml").write_text("groups: []\n")
    result = cli("--out", str(tmp_path), "--check")
    assert result.returncode == 1 and "goodput-recording.rules.yml" in result.stderr


def test_promtool_finds_nothing_to_say() -> None:
    for path in sorted(RULES.glob("*.rules.yml")):
        result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout and "WARNING" not in result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    assert TESTS
    result = subprocess.run([promtool(), "test", "rules", *map(str, TESTS)], capture_output=True, text=True,
                            cwd=RULES / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_recording_rule_has_a_unit_test() -> None:
    tested = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested |= {t["expr"] for t in case.get("promql_expr_test", []) if t.get("exp_samples")}
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert recorded - tested == set()


def test_every_name_a_rule_uses_exists() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    exported = set()
    for metric in CATALOG.values():
        exported.add(metric.name)
        if metric.kind is Kind.HISTOGRAM:
            exported |= {f"{metric.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    for rule in rules():
        expr = rule["expr"]
        unknown_recorded = set(_RECORDED.findall(expr)) - recorded
        assert not unknown_recorded, f"{rule.get('record')}: no rule records {unknown_recorded}"
        plain = _RECORDED.sub("", expr)
        unknown = set(_METRIC.findall(plain)) - exported
        assert not unknown, f"{rule.get('record')}: the catalog has no {unknown}"


def test_names_follow_level_metric_operations() -> None:
    for rule in [r for r in rules() if "record" in r]:
        level, metric, operations = rule["record"].split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level) and metric.startswith("goodput_") and operations


def test_settings_shape_the_rules(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("windows: [10m, 6h]\nnode_label: node\nmemory_predict_horizon: 2h\n")
    out = tmp_path / "out"
    assert cli("--settings", str(settings), "--out", str(out)).returncode == 0
    text = (out / "goodput-recording.rules.yml").read_text()
    assert "rate(goodput_gpu_idle_seconds_total[10m])" in text and "by (cluster, node)" in text
    assert "avg_over_time(gpu:goodput_gpu_idle_ratio:rate10m[6h])" in text
    assert "workload:goodput_tokens_drop_ratio:rate10m_vs_6h" in text and ", 7200)" in text
    assert "[5m]" not in text and not re.search(r"\binstance\b", text)  # gpu_instance_id is another label
    result = subprocess.run([promtool(), "check", "rules", str(out / "goodput-recording.rules.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_settings_are_refused_with_the_key_named(tmp_path: Path) -> None:
    for text, needle in (("windows: [1h, 5m]\n", "windows"), ("window: [5m, 1h]\n", "window: unknown key"),
                         ("node_label: 'no-dash'\n", "node_label"), ("memory_predict_window: soon\n", "soon")):
        settings = tmp_path / "settings.yaml"
        settings.write_text(text)
        result = cli("--settings", str(settings), "--out", str(tmp_path / "out"))
        assert result.returncode == 2 and needle in result.stderr, (text, result.stderr)
        assert not (tmp_path / "out").exists()


def alert_rules() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


def test_alerts_follow_the_conventions() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)) == 18
    for rule in alert_rules():
        assert re.fullmatch(r"Goodput([A-Z][a-z0-9]*|GPU|ECC|XID)+", rule["alert"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        notes = rule["annotations"]
        assert "{{" not in notes["summary"], "summaries are static"
        assert "{{ $labels." in notes["description"], "descriptions name what is affected"
        runbook = notes["runbook_url"].rsplit("/", 1)[1]
        assert (ROOT / "docs" / "runbooks" / runbook).is_file(), runbook


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set() and names - silent == set()


def test_runbooks_name_only_series_that_exist() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    exported = {m.name for m in CATALOG.values()}
    for path in sorted((ROOT / "docs" / "runbooks").glob("*.md")):
        text = path.read_text()
        for name in set(_RECORDED.findall(text)):
            assert name in recorded, f"{path.name}: {name}"
        for name in set(_METRIC.findall(_RECORDED.sub("", text))):
            if name.endswith("_"):  # a family written as goodput_gpu_nvlink_*
                assert any(m.startswith(name) for m in exported), f"{path.name}: {name}*"
            else:
                assert name in exported, f"{path.name}: {name}"
