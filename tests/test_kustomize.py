"""deploy/: the plain manifests are the chart rendered (fresh), `kubectl kustomize deploy/` builds them and every
object passes Kubernetes' strict schemas; the Prometheus Operator variant adds a valid ServiceMonitor and the
PrometheusRule of rules/."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml
from conftest import ROOT
from goodput_mixin.chart import NAMESPACE, deploy_files, drop_helm_labels, manifests, render_chart
from k8s_checks import OPERATOR_KINDS, operator_problems, validate_core

DEPLOY = ROOT / "deploy"
# kubectl ships in the machine image (it is not installed by `make deps`); without it only these tests skip.
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on the PATH")


def kustomize(folder: str) -> list[dict[str, Any]]:
    result = subprocess.run([KUBECTL or "kubectl", "kustomize", str(DEPLOY / folder)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


@pytest.fixture(scope="module")
def chart_objects() -> dict[tuple[str, str], dict[str, Any]]:
    values = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    return {key(o): o for o in manifests(render_chart(values))}


def test_the_manifests_are_the_chart_rendered() -> None:
    fresh = deploy_files()
    for rel, text in fresh.items():
        assert (DEPLOY / rel).read_text() == text, f"deploy/{rel} is stale: run `make helm`"
    ours = {str(p.relative_to(DEPLOY)) for folder in ("base", "prometheus-operator")
            for p in (DEPLOY / folder).rglob("*") if p.is_file()}
    assert ours == {rel for rel in fresh if "/" in rel}, "deploy/ holds manifests nobody generates"


@needs_kubectl
def test_kustomize_builds_valid_core_objects(chart_objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    objects = kustomize(".")
    dashboards = len(list((ROOT / "dashboards").glob("*.json")))  # one ConfigMap each
    assert sorted(o["kind"] for o in objects) == ["ConfigMap"] * dashboards + ["DaemonSet", "Namespace", "Service",
                                                                              "ServiceAccount"]
    problems = [p for obj in objects for p in validate_core(obj)]
    assert not problems
    for obj in objects:
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == NAMESPACE
            assert obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
            continue
        assert obj["metadata"]["namespace"] == NAMESPACE
        # the same object as the chart's, less Helm's bookkeeping labels
        chart = chart_objects[key(obj)]
        assert "helm.sh/chart" not in obj["metadata"]["labels"]
        assert obj["metadata"]["labels"].items() < chart["metadata"]["labels"].items()
        drop_helm_labels(chart)
        assert {k: v for k, v in obj.items() if k != "metadata"} == {k: v for k, v in chart.items() if k != "metadata"}
        assert obj["metadata"]["labels"] == chart["metadata"]["labels"]


@needs_kubectl
def test_the_daemon_set_keeps_the_security_defaults() -> None:
    (daemon_set,) = [o for o in kustomize(".") if o["kind"] == "DaemonSet"]
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["seccompProfile"]["type"] == "RuntimeDefault"
    assert daemon_set["spec"]["template"]["spec"]["hostPID"] is False


@needs_kubectl
def test_the_operator_variant_adds_the_monitor_and_the_rules() -> None:
    base = {key(o) for o in kustomize(".")}
    objects = kustomize("prometheus-operator")
    added = [o for o in objects if key(o) not in base]
    assert sorted(o["kind"] for o in added) == ["PrometheusRule", "ServiceMonitor"]
    assert {key(o) for o in objects} >= base
    for obj in added:
        assert obj["kind"] in OPERATOR_KINDS and obj["metadata"]["namespace"] == NAMESPACE
        assert not operator_problems(obj)
    (rule,) = [o for o in added if o["kind"] == "PrometheusRule"]
    shipped = [group for path in sorted((ROOT / "rules").glob("*.rules.yml"))
               for group in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == shipped
    (monitor,) = [o for o in added if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert not [p for o in objects if o["kind"] not in OPERATOR_KINDS for p in validate_core(o)]
