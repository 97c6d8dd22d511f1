"""Checks shared by the chart and kustomize tests: Kubernetes' schemas for core objects (kubernetes-validate,
strict) and, for the Prometheus Operator's objects (no schema ships for CRDs), the fields its CRDs require."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

OPERATOR_API = "monitoring.coreos.com/v1"
OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the package has schemas for.
KUBE_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_core(obj: dict[str, Any]) -> list[str]:
    """Errors of one core object against the strict schemas of every version in KUBE_VERSIONS."""
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {exc.message} "
                          f"at {'.'.join(str(p) for p in exc.path)}")
    return errors


def _endpoint_problems(where: str, endpoint: dict[str, Any]) -> list[str]:
    problems = []
    if not (endpoint.get("port") or endpoint.get("targetPort")):
        problems.append(f"{where}: no port")
    for key in ("interval", "scrapeTimeout"):
        if key in endpoint and not _DURATION.match(str(endpoint[key])):
            problems.append(f"{where}.{key}: {endpoint[key]!r} is not a Prometheus duration")
    if "honorLabels" in endpoint and not isinstance(endpoint["honorLabels"], bool):
        problems.append(f"{where}.honorLabels: not a boolean")
    for list_key in ("relabelings", "metricRelabelings"):
        for i, relabel in enumerate(endpoint.get(list_key, [])):
            if relabel.get("action", "replace") == "replace" and "targetLabel" not in relabel:
                problems.append(f"{where}.{list_key}[{i}]: replace without targetLabel")
    return problems


def operator_problems(obj: dict[str, Any]) -> list[str]:
    """What the operator's CRDs (monitoring.coreos.com/v1) require of a ServiceMonitor, PodMonitor or
    PrometheusRule, written out by hand: its required fields, their types, and the rule fields Prometheus needs."""
    kind = obj.get("kind")
    problems = []
    if obj.get("apiVersion") != OPERATOR_API:
        problems.append(f"apiVersion {obj.get('apiVersion')!r}, want {OPERATOR_API}")
    if kind not in OPERATOR_KINDS:
        return [*problems, f"kind {kind!r} is not a Prometheus Operator kind"]
    name = obj.get("metadata", {}).get("name", "")
    if not _DNS_NAME.match(name) or len(name) > 253:
        problems.append(f"metadata.name {name!r} is not a DNS subdomain")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "no spec"]
    if kind in ("ServiceMonitor", "PodMonitor"):
        # selector is required by both CRDs; endpoints are what makes a monitor scrape anything
        if not isinstance(spec.get("selector"), dict) or not spec["selector"].get("matchLabels"):
            problems.append("spec.selector.matchLabels missing")
        key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        endpoints = spec.get(key)
        if not isinstance(endpoints, list) or not endpoints:
            problems.append(f"spec.{key} missing or empty")
        for i, endpoint in enumerate(endpoints or []):
            problems += _endpoint_problems(f"spec.{key}[{i}]", endpoint)
    else:
        groups = spec.get("groups")
        if not isinstance(groups, list) or not groups:
            return [*problems, "spec.groups missing or empty"]
        names = [g.get("name") for g in groups]
        if len(set(names)) != len(names) or not all(names):
            problems.append(f"group names missing or repeated: {names}")
        for group in groups:
            for i, rule in enumerate(group.get("rules") or []):
                where = f"group {group.get('name')} rule {i}"
                if ("record" in rule) == ("alert" in rule):
                    problems.append(f"{where}: needs exactly one of record and alert")
                if not isinstance(rule.get("expr"), str | int) or rule.get("expr") == "":
                    problems.append(f"{where}: expr missing")
                if "for" in rule and not _DURATION.match(str(rule["for"])):
                    problems.append(f"{where}: for {rule['for']!r} is not a duration")
                for key in ("labels", "annotations"):
                    if key in rule and not all(isinstance(v, str) for v in rule[key].values()):
                        problems.append(f"{where}: {key} values must be strings")
            if not group.get("rules"):
                problems.append(f"group {group.get('name')}: no rules")
    return problems
