"""The generated Prometheus rules: fresh, valid for promtool, every rule unit-tested, every metric real."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from conftest import ROOT, promtool
from goodput_mixin.rules.render import rule_files
from goodput_mixin.rules.settings import RulesSettings
from goodput_mixin.rules.verdict import LAYERS, WALK

from exporter.core.catalog import Kind
from exporter.sources import CATALOG

RULES = ROOT / "rules"
TESTS = sorted((RULES / "tests").glob("*.test.yml"))
_METRIC = re.compile(r"\b(goodput_[a-z0-9_]+)\b")
_RECORDED = re.compile(r"\b([a-z_]+:goodput_[a-z0-9_]+(?::[a-z0-9_]+)?)\b")


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
    """Each file in a promtool of its own, two at a time, the largest first: one promtool runs its files one after
    the other, on one core (50 s of the suite's time when it ran them all)."""
    assert TESTS

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                              cwd=RULES / "tests")

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, sorted(TESTS, key=lambda p: -p.stat().st_size)))
    failed = [r.stdout + r.stderr for r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)


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
        # a figure no operation over time made (workload:goodput_lifetime_ratio, of the counters' totals) names none
        level, metric, *operations = rule["record"].split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level) and metric.startswith("goodput_"), rule["record"]
        assert len(operations) <= 1 and all(operations), rule["record"]


def test_settings_shape_the_rules(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    # the SLO alerts' short windows are at least the short window: named with it
    settings.write_text("windows: [10m, 6h]\nnode_label: node\nmemory_predict_horizon: 2h\n"
                        "inference_slo_fast_windows: [10m, 1h]\n")
    out = tmp_path / "out"
    assert cli("--settings", str(settings), "--out", str(out)).returncode == 0
    text = (out / "goodput-recording.rules.yml").read_text()
    assert "rate(goodput_gpu_idle_seconds_total[10m])" in text and "by (cluster, node)" in text
    assert "avg_over_time(gpu:goodput_gpu_idle_ratio:rate10m[6h])" in text
    assert "workload:goodput_tokens_drop_ratio:rate10m_vs_6h" in text and ", 7200)" in text
    # no node as `instance` (gpu_instance_id is another label); a serving target's own instance (its address) is not
    # the node: TGI yields to vLLM's series on the same target only
    targets = text.replace("unless on (cluster, job, instance, namespace, pod, container)", "")
    assert "[5m]" not in text and not re.search(r"\binstance\b", targets)
    result = subprocess.run([promtool(), "check", "rules", str(out / "goodput-recording.rules.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_settings_are_refused_with_the_key_named(tmp_path: Path) -> None:
    for text, needle in (("windows: [1h, 5m]\n", "windows"), ("window: [5m, 1h]\n", "window: unknown key"),
                         ("node_label: 'no-dash'\n", "node_label"), ("memory_predict_window: soon\n", "soon"),
                         ("wasted_progress_window: 1m\n", "wasted_progress_window")):
        settings = tmp_path / "settings.yaml"
        settings.write_text(text)
        result = cli("--settings", str(settings), "--out", str(tmp_path / "out"))
        assert result.returncode == 2 and needle in result.stderr, (text, result.stderr)
        assert not (tmp_path / "out").exists()


# --- inference objectives: each threshold is a bucket bound, per engine and per model ----------------------------


def render(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`rules` with the settings `text`, into tmp_path/out."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    settings = tmp_path / "settings.yaml"
    settings.write_text(text)
    return cli("--settings", str(settings), "--out", str(tmp_path / "out"))


def test_an_objective_that_is_no_bucket_bound_is_refused_with_the_bounds_named(tmp_path: Path) -> None:
    result = render(tmp_path, "inference_slo: {ttft_seconds: 0.3}\n")
    assert result.returncode == 2, result.stderr
    assert "inference_slo" in result.stderr and "vllm:time_to_first_token_seconds" in result.stderr
    assert re.search(r"nearest bounds: [^;]*\b0\.25, 0\.5\b", result.stderr), result.stderr
    assert not (tmp_path / "out").exists()


def test_an_override_gives_one_model_its_own_objectives(tmp_path: Path) -> None:
    model = "meta-llama/Llama-3.1-70B-Instruct"
    # TGI keeps its own objective (inference_slo_engines) under a list of overrides
    result = render(tmp_path, f'inference_slo_overrides:\n  - {{model: "{model}", engine: vllm, ttft_seconds: 2.5, '
                              'target: 0.995}\n')
    assert result.returncode == 0, result.stderr
    path = tmp_path / "out" / "goodput-recording.rules.yml"
    slo = [rule for g in yaml.safe_load(path.read_text())["groups"]
           if g["name"].startswith("goodput.inference_slo_objectives.") for rule in g["rules"]]

    def expr(record: str, **labels: str) -> str:
        (found,) = [r["expr"] for r in slo if r["record"] == record and r.get("labels") == labels]
        return found

    met = "workload:goodput_inference_slo_met_requests:rate5m"
    budget = "workload:goodput_inference_slo_error_budget:ratio"
    own = expr(met, engine="vllm", objective="ttft", model=model)
    assert f'model_name="{model}"' in own and r'le=~"2\\.5|' in own  # then the bounds below it
    default = expr(met, engine="vllm", objective="ttft")
    assert r'model_name!~"meta\\-llama/Llama\\-3\\.1\\-70B\\-Instruct"' in default
    assert r'le=~"1|1\\.0|0\\.75|' in default
    assert f'model="{model}"' in expr(budget, engine="vllm", model=model) and expr(
        budget, engine="vllm", model=model).endswith("* 0.005")
    assert "model!~" in expr(budget, engine="vllm") and expr(budget, engine="vllm").endswith("* 0.01")
    sglang = expr(met, engine="sglang", objective="ttft")  # the override names vLLM only
    assert "!~" not in sglang and model not in sglang
    assert [r for r in slo if r.get("labels", {}).get("model") == model and r["labels"]["engine"] != "vllm"] == []

    # and Prometheus reads it so: the model at its bucket 2.5, another at the default 1.0, neither counted twice
    def series(name: str, served: str, per_minute: int, le: str = "") -> dict[str, str]:
        bound = f',le="{le}"' if le else ""
        return {"series": f'{name}{{namespace="serve",model_name="{served}",engine="0"{bound}}}',
                "values": f"0+{per_minute}x15"}

    def sample(name: str, served: str, value: float, **labels: str) -> dict:
        inner = ",".join(f'{k}="{v}"' for k, v in {"namespace": "serve", "model": served, "engine": "vllm",
                                                    **labels}.items())
        return {"labels": f"{name}{{{inner}}}", "value": value}

    ttft, attainment = "vllm:time_to_first_token_seconds", "workload:goodput_inference_slo_attainment_ratio:rate5m"
    case = {"interval": "1m", "input_series": [
        series(f"{ttft}_bucket", model, 15, "1.0"), series(f"{ttft}_bucket", model, 45, "2.5"),
        series(f"{ttft}_count", model, 60),
        series(f"{ttft}_bucket", "qwen3-8b", 30, "1.0"), series(f"{ttft}_bucket", "qwen3-8b", 60, "2.5"),
        series(f"{ttft}_count", "qwen3-8b", 60)],
        "promql_expr_test": [
            {"expr": attainment, "eval_time": "10m", "exp_samples": [
                sample(attainment, model, 0.75, objective="ttft"),  # le="2.5": 45/60
                sample(attainment, "qwen3-8b", 0.5, objective="ttft")]},  # le="1.0": 30/60
            {"expr": budget, "eval_time": "10m", "exp_samples": [
                sample(budget, model, 0.005), sample(budget, "qwen3-8b", 0.01)]}]}
    (tmp_path / "out" / "override.test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["goodput-recording.rules.yml"], "evaluation_interval": "1m", "tests": [case]}))
    check = subprocess.run([promtool(), "test", "rules", "override.test.yml"], capture_output=True, text=True,
                           cwd=tmp_path / "out")
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_threshold_of_one_engine_is_accepted_for_that_engine_only(tmp_path: Path) -> None:
    tgi_only = 0.14778918800354002  # TGI's 18th duration bound, 0.0001 * 1.5**18: no bound of vLLM's or SGLang's
    result = render(tmp_path / "tgi", f"inference_slo_engines: {{tgi: {{tpot_seconds: {tgi_only!r}}}}}\n")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "tgi" / "out" / "goodput-recording.rules.yml").read_text()
    assert r'tgi_request_mean_time_per_token_duration_bucket{le=~"0\\.14778918800354002|0\\.1|' in text
    result = render(tmp_path / "all", f"inference_slo: {{tpot_seconds: {tgi_only!r}}}\n")
    assert result.returncode == 2 and "vllm:request_time_per_output_token_seconds" in result.stderr, result.stderr
    assert re.search(r"nearest bounds: [^;]*\b0\.1, 0\.15\b", result.stderr), result.stderr


def alert_rules() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


def test_alerts_follow_the_conventions() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)) == 31
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


# --- the funnel's verdict on the alerts of a workload (issue 20) ----------------------------------------------------


def firing_cases() -> list[tuple[str, dict, dict]]:
    """(alert name, expected labels, expected annotations) of every alert the promtool tests expect to fire."""
    out = []
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                out += [(check["alertname"], alert.get("exp_labels", {}), alert.get("exp_annotations", {}))
                        for alert in check.get("exp_alerts") or []]
    return out


def test_an_alert_on_a_training_workload_carries_its_verdict_and_the_diagnose_command() -> None:
    """Every alert that fires naming a training workload (a served model's alerts name an engine: the funnel walks
    phases, which serving does not report) has both annotations, and no other alert has them; the promtool tests
    expect them rendered, the verdict as layer/reason from the recorded verdict (some case shows a real one)."""
    annotated = {rule["alert"] for rule in alert_rules() if "verdict" in rule["annotations"]}
    verdicts = {f"{layer}/{reason}" for layer, reason in WALK} | {f"{LAYERS[-1]}/none", "unknown"}
    rendered = set()
    for name, labels, notes in firing_cases():
        training = "workload" in labels and "engine" not in labels
        assert (name in annotated) == training, name
        if training:
            assert notes["diagnose"] == f"goodput-exporter diagnose --workload {labels['workload']}", name
            assert notes["verdict"] in verdicts, (name, notes["verdict"])
            rendered.add(notes["verdict"])
    assert annotated and rendered - {"unknown"}, "no promtool case renders a verdict"


def test_the_verdict_annotation_asks_for_the_alerts_own_cluster_and_workload() -> None:
    settings = RulesSettings(cluster_label="k8s_cluster")
    alerts = yaml.safe_load(rule_files(settings)["goodput-alerts.rules.yml"])
    verdicts = {rule["annotations"]["verdict"] for group in alerts["groups"] for rule in group["rules"]
                if "verdict" in rule["annotations"]}
    assert len(verdicts) == 1
    (verdict,) = verdicts
    assert 'workload:goodput_bottleneck:info{k8s_cluster=%q,workload=%q}" $labels.k8s_cluster $labels.workload' \
        in verdict


def test_the_step_shift_window_shapes_its_rule() -> None:
    recording = rule_files(RulesSettings(step_shift_window="30m"))["goodput-recording.rules.yml"]
    (group,) = [g for g in yaml.safe_load(recording)["groups"] if g["name"] == "goodput.step_shift"]
    assert [rule["labels"]["kind"] for rule in group["rules"]] == ["straggler", "regression"]
    for rule in group["rules"]:
        assert rule["record"] == "workload:goodput_step_time_shift:info"
        assert 'increase(goodput_step_time_shifts_total{direction="up"}[30m])' in rule["expr"]


# --- one store, many clusters (issue 21) ------------------------------------------------------------------------

_AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|group|topk|bottomk|quantile|stddev|stdvar|count_values)\s*"
                          r"(?:(by|without)\s*\(([^)]*)\))?\s*\(")
_LABEL_DROPPING = re.compile(r"\b(vector|absent|absent_over_time|scalar)\s*\(")


def _cluster_losses(text: str, cluster: str) -> list[str]:
    """What in a rule file would merge two clusters' series: an aggregation over everything or by labels without
    the cluster's, a join `on` labels without it, a function that makes a series without labels."""
    out = []
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            name, expr = rule.get("record") or rule.get("alert"), rule["expr"]
            for m in _AGGREGATION.finditer(expr):
                labels = {label.strip() for label in (m.group(3) or "").split(",")}
                if m.group(2) is None or (m.group(2) == "by" and cluster not in labels):
                    out.append(f"{name}: {m.group(0)}")
                if m.group(2) == "without" and cluster in labels:
                    out.append(f"{name}: {m.group(0)}")
            out += [f"{name}: {m.group(0)}" for m in re.finditer(r"\bon\s*\(([^)]*)\)", expr)
                    if cluster not in {label.strip() for label in m.group(1).split(",")}]
            out += [f"{name}: {m.group(0)}" for m in _LABEL_DROPPING.finditer(expr)]
    return out


def test_every_aggregation_and_join_keeps_the_cluster_apart() -> None:
    """A ruler that reads many clusters from one store (vmalert, Thanos, Mimir) computes each cluster's figures
    apart only if no rule merges two clusters' series; the check finds the ones that did (GoodputCollectiveHang
    joined `on (instance, workload, rank)`, and two clusters' pods can share an address)."""
    assert _cluster_losses("groups: [{name: g, rules: [{record: r, expr: 'sum by (instance) (x) and on (workload) y'"
                           "}, {alert: A, expr: 'count(x) or vector(0)'}]}]", "cluster") == [
        "r: sum by (instance) (", "r: on (workload)", "A: count(", "A: vector("]
    for settings in (RulesSettings(), RulesSettings(cluster_label="k8s_cluster", global_view=True)):
        for name, text in rule_files(settings).items():
            assert _cluster_losses(text, settings.cluster_label) == [], name


def test_a_global_view_names_the_cluster_and_pages_on_a_silent_one(tmp_path: Path) -> None:
    """global_view (off by default): every alert's description starts with its cluster, and GoodputClusterNotReporting
    fires when a cluster seen in the last hour has sent nothing for 10 minutes (a silence of 8 minutes is not yet
    one), not for a cluster that still reports nor one gone for over an hour; promtool runs it on the rendered
    files."""
    default = yaml.safe_load(rule_files(RulesSettings())["goodput-alerts.rules.yml"])
    assert "GoodputClusterNotReporting" not in {r["alert"] for g in default["groups"] for r in g["rules"]}
    result = render(tmp_path, "global_view: true\n")
    assert result.returncode == 0, result.stderr
    alerts = yaml.safe_load((tmp_path / "out" / "goodput-alerts.rules.yml").read_text())
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        assert rule["annotations"]["description"].startswith(
            "Cluster {{ $labels.cluster }}: " if rule["alert"] != "GoodputClusterNotReporting" else "No goodput"), rule
    assert (ROOT / "docs" / "runbooks" / "cluster-not-reporting.md").is_file()

    def info(cluster: str, values: str) -> dict[str, str]:
        return {"series": f'goodput_exporter_build_info{{cluster="{cluster}",instance="n1:9445",version="1"}}',
                "values": values}

    (silent,) = [r for g in alerts["groups"] for r in g["rules"] if r["alert"] == "GoodputClusterNotReporting"]

    def fired(cluster: str) -> dict[str, dict[str, str]]:
        return {"exp_labels": {"severity": "critical", "cluster": cluster},
                "exp_annotations": {k: v.replace("{{ $labels.cluster }}", cluster)
                                    for k, v in silent["annotations"].items()}}

    # c1 stops at 30m; c2 reports throughout; c3 stops at 5m: silent from 15m, and over an hour at 80m
    case = {"interval": "1m",
            "input_series": [info("c1", "1x30"), info("c2", "1x100"), info("c3", "1x5")],
            "alert_rule_test": [
                {"eval_time": "38m", "alertname": "GoodputClusterNotReporting", "exp_alerts": [fired("c3")]},
                {"eval_time": "50m", "alertname": "GoodputClusterNotReporting",
                 "exp_alerts": [fired("c1"), fired("c3")]},
                {"eval_time": "80m", "alertname": "GoodputClusterNotReporting", "exp_alerts": [fired("c1")]},
                {"eval_time": "100m", "alertname": "GoodputClusterNotReporting", "exp_alerts": []}]}
    (tmp_path / "out" / "global.test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["goodput-alerts.rules.yml"], "evaluation_interval": "1m", "tests": [case]}))
    check = subprocess.run([promtool(), "test", "rules", "global.test.yml"], capture_output=True, text=True,
                           cwd=tmp_path / "out")
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_objective_declared_unjudged_quiets_the_unmeasured_alert_per_engine_and_model(tmp_path: Path) -> None:
    """`unjudged` per engine (inference_slo_engines or an override naming only the engine), undone for one model, and
    declared for one model of an engine that judges it: the alert leaves out exactly those (promtool runs the TGI and
    Triton cases in tests/test_serving_corpus.py)."""
    result = render(tmp_path, "inference_slo_overrides:\n  - {engine: tgi, unjudged: [ttft]}\n"
                              "  - {engine: triton, unjudged: [tpot]}\n"
                              "  - {model: llama-trt, engine: triton, unjudged: []}\n"
                              "  - {model: old-llm, engine: vllm, unjudged: [tpot]}\n")
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load((tmp_path / "out" / "goodput-alerts.rules.yml").read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "GoodputInferenceSLOUnmeasured"]
    for record in ("requests", "unjudged_requests"):
        assert f'unless workload:goodput_inference_slo_{record}:rate5m{{objective="ttft", engine="tgi"}}' in expr
        assert (f'unless workload:goodput_inference_slo_{record}:rate5m{{objective="tpot", engine="triton", '
                f'model!~"llama\\\\-trt"}}') in expr
        assert (f'unless workload:goodput_inference_slo_{record}:rate5m{{objective="tpot", engine="vllm", '
                'model="old-llm"}') in expr
    assert expr.count("unless workload") == 6, expr
    shipped = [r["expr"] for r in alert_rules() if r["alert"] == "GoodputInferenceSLOUnmeasured"]
    assert shipped and "engine=" not in shipped[0]  # nothing declared by default: the alert as before
