"""The generated parts of the Helm chart (helm/goodput-exporter/) and the plain manifests under deploy/.

`python -m goodput_mixin.chart` (`make helm`) writes:
- files/rules/*.rules.yml and files/dashboards/*.json inside the chart, from the same generators that write
  rules/ and dashboards/ (a chart cannot read files outside its folder); the PrometheusRule and the dashboard
  ConfigMaps are built from them;
- values.schema.json, whose `config` part is derived from the daemon's settings model, so that a key the daemon
  does not know, or one the chart sets itself, fails `helm install` instead of the pod (and its
  `nodeProblemDetector.config` part from the health check's settings, HealthConfig);
- files/node-problem-detector/goodput-health-monitor.json, a copy of deploy/node-problem-detector/'s custom plugin
  monitor (the one source, written by hand), for the ConfigMap of `nodeProblemDetector.enabled`;
- with --deploy, deploy/base/ and deploy/prometheus-operator/: the chart rendered with its default values (and
  with the Prometheus Operator objects on), for kustomize users. That step needs helm-python-sdk (test extra).

Tests fail when any of these files differs from what this module writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml
from pydantic import BaseModel, BeforeValidator

from exporter.config import Config
from exporter.core.settings import parse_duration
from exporter.health.command import DURATIONS as HEALTH_DURATIONS
from exporter.health.command import HealthConfig
from exporter.sources import SOURCES

from .dashboards import render as render_dashboards
from .rules.render import rule_files, to_yaml
from .rules.settings import RulesSettings

ROOT = Path(__file__).resolve().parents[2]  # the source tree: helm/ and deploy/ live there
CHART = ROOT / "helm" / "goodput-exporter"
DEPLOY = ROOT / "deploy"
# node-problem-detector's custom plugin monitor: written by hand in deploy/, copied into the chart.
NPD_MONITOR = "node-problem-detector/goodput-health-monitor.json"
RELEASE = "goodput-exporter"
NAMESPACE = "goodput-exporter"

# Daemon settings the chart derives from its own values (mounts, downward API, RBAC, capabilities): setting them
# in `config` as well would be overridden by the chart's environment variables, so the schema rejects them.
CHART_MANAGED: dict[str, set[str]] = {
    "web": {"listen_address"},
    **{spec.name: set(spec.chart_managed) for spec in SOURCES if spec.chart_managed},
}


def _is_duration(field: Any) -> bool:
    return any(isinstance(m, BeforeValidator) and m.func is parse_duration for m in field.metadata)


def _field_schema(field: Any) -> dict[str, Any]:
    annotation = field.annotation
    schema: dict[str, Any]
    if _is_duration(field):
        schema = {"type": ["string", "number"], "description": "duration: 500ms, 1s, 2m, 1h, or seconds"}
    elif get_origin(annotation) is Literal:
        schema = {"enum": list(get_args(annotation))}
    elif get_origin(annotation) is list:
        (item,) = get_args(annotation)
        items: dict[str, Any] = ({"type": "string"} if item is str else
                                 _model_schema(item) if isinstance(item, type) and issubclass(item, BaseModel) else {})
        schema = {"type": "array", "items": items}
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        schema = _model_schema(annotation)
    elif annotation is bool:
        schema = {"type": "boolean"}
    elif annotation is int:
        schema = {"type": "integer"}
    elif annotation == int | None:
        schema = {"type": ["integer", "null"]}
    elif annotation is float:
        schema = {"type": "number"}
    elif annotation is str:
        schema = {"type": "string"}
    else:
        raise TypeError(f"no JSON schema for {annotation!r}")
    for meta in field.metadata:  # pydantic's ge=/le= constraints (annotated-types' Ge, Le)
        if isinstance(getattr(meta, "ge", None), int | float):
            schema["minimum"] = meta.ge
        if isinstance(getattr(meta, "le", None), int | float):
            schema["maximum"] = meta.le
    if field.description and "description" not in schema:
        schema["description"] = field.description
    return schema


def _model_schema(model: type[BaseModel], skip: set[str] | None = None) -> dict[str, Any]:
    properties = {name: _field_schema(field) for name, field in model.model_fields.items()
                  if name not in (skip or set())}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def config_schema() -> dict[str, Any]:
    """JSON schema of the chart's `config` value: the daemon's YAML settings less the chart-managed keys."""
    sections: dict[str, Any] = {}
    for name, field in Config.model_fields.items():
        model = field.default_factory().__class__  # type: ignore[misc]
        section = _model_schema(model, CHART_MANAGED.get(name))
        if name == "simulate":  # `simulate: 8` is short for `simulate: {gpus: 8}`
            section = {"oneOf": [{"type": "integer", "minimum": 0}, section]}
        sections[name] = section
    return {"type": "object", "additionalProperties": False, "properties": sections,
            "description": "Daemon settings (docs/configuration.md) less the keys the chart manages."}


# Health check settings the chart's node-problem-detector ConfigMap does not take: the monitor's args set the mode.
HEALTH_CHART_MANAGED = {"mode"}
_HEALTH_TYPES: dict[Any, dict[str, Any]] = {bool: {"type": "boolean"}, int: {"type": "integer"},
                                            float: {"type": "number"}, str: {"type": "string"}}


def health_config_schema() -> dict[str, Any]:
    """JSON schema of `nodeProblemDetector.config`: the settings `goodput-exporter health --config` reads (its flags'
    names with underscores), less the mode."""
    hints = get_type_hints(HealthConfig)
    properties: dict[str, Any] = {}
    for field in dataclasses.fields(HealthConfig):
        if field.name in HEALTH_CHART_MANAGED:
            continue
        if field.name in HEALTH_DURATIONS:
            properties[field.name] = {"type": ["string", "number"],
                                      "description": "duration: 500ms, 1s, 2m, 1h, or seconds"}
        else:
            properties[field.name] = dict(_HEALTH_TYPES[hints[field.name]])
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "description": "Health check settings (goodput-exporter health --help) written as health.yaml, less "
                           "the mode."}


def _object(properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if description:
        schema["description"] = description
    return schema


def _open(description: str = "") -> dict[str, Any]:
    """A value passed through to Kubernetes as is (its own schema applies there)."""
    schema: dict[str, Any] = {"type": "object"}
    if description:
        schema["description"] = description
    return schema


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LIST = {"type": "array", "items": {"type": "object"}}
_DURATION = {"type": "string", "pattern": r"^(([0-9]+(ms|s|m|h))+)?$",
             "description": "Prometheus duration (30s, 1m); empty: Prometheus' global setting"}
_PROBE = _object({key: {"type": "integer", "minimum": 0 if key == "initialDelaySeconds" else 1}
                  for key in ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold",
                              "successThreshold")})
_ABS_PATH = {"type": "string", "pattern": "^/"}


def _monitor(kind: str) -> dict[str, Any]:
    return _object({
        "enabled": _BOOL, "labels": _STRMAP, "interval": _DURATION, "scrapeTimeout": _DURATION,
        "honorLabels": _BOOL,
        "nodeLabel": {"type": "boolean", "description": "name the node in instance and node (not the pod IP:port)"},
        "relabelings": _LIST, "metricRelabelings": _LIST,
    }, f"a {kind} for the Prometheus Operator")


def values_schema() -> dict[str, Any]:
    """values.schema.json: closed at every level the chart owns, open where values pass to Kubernetes as is."""
    properties: dict[str, Any] = {
        "image": _object({
            "repository": {"type": "string", "minLength": 1}, "tag": _STR,
            "digest": {"type": "string", "pattern": "^(sha256:[0-9a-f]{64})?$"},
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        }),
        "imagePullSecrets": {"type": "array", "items": _object({"name": _STR})},
        "nameOverride": _STR, "fullnameOverride": _STR, "commonLabels": _STRMAP,
        "serviceAccount": _object({"create": _BOOL, "name": _STR, "annotations": _STRMAP}),
        "nodeSelector": _STRMAP, "tolerations": _LIST, "affinity": _open(), "priorityClassName": _STR,
        "runtimeClassName": _STR,
        "nvidia": _object({"visibleDevices": _STR, "driverCapabilities": _STR},
                          "environment for the NVIDIA container runtime"),
        "podAnnotations": _STRMAP, "podLabels": _STRMAP, "updateStrategy": _open(),
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
        "resources": _open("container resources (requests, limits)"),
        "podSecurityContext": _open(), "securityContext": _open("container securityContext; see values.yaml"),
        "hostPID": _BOOL, "sysPtrace": _BOOL, "hostProc": _object({"enabled": _BOOL}),
        "hostSys": _object({"enabled": _BOOL}), "hostNetwork": _BOOL,
        "config": config_schema(),
        "extraArgs": {"type": "array", "items": _STR}, "extraEnv": _LIST,
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "livenessProbe": _PROBE, "readinessProbe": _PROBE,
        "ingest": _object({"enabled": _BOOL, "hostDir": _ABS_PATH, "publishClient": _BOOL,
                           "stateHostDir": {"type": "string", "pattern": "^(/.*)?$"},  # "": in memory only
                           "captureHostDir": {"type": "string", "pattern": "^(/.*)?$"}}),  # "": no captures
        "flight": _object({"enabled": _BOOL, "hostDir": _ABS_PATH}),
        "instrumentExample": _object({"enabled": _BOOL, "image": _STR,
                                      "command": {"type": "array", "items": _STR, "minItems": 1}}),
        "kubelet": _object({
            "enabled": _BOOL, "podResourcesHostDir": _ABS_PATH,
            "podLabels": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True},
        }),
        "dcgm": _object({"enabled": _BOOL, "mode": {"enum": ["bindings", "exporter"]}, "exporterUrl": _STR,
                         "hostengine": _STR}),
        "service": _object({"enabled": _BOOL, "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                            "clusterIP": _STR, "labels": _STRMAP, "annotations": _STRMAP}),
        "serviceMonitor": _monitor("ServiceMonitor"), "podMonitor": _monitor("PodMonitor"),
        "prometheusRule": _object({"enabled": _BOOL, "labels": _STRMAP}),
        "dashboards": _object({"enabled": _BOOL, "label": {"type": "string", "minLength": 1}, "labelValue": _STR,
                               "namespace": _STR, "annotations": _STRMAP}),
        "nodeProblemDetector": _object({"enabled": _BOOL, "namespace": _STR, "exporterPath": _ABS_PATH,
                                        "config": health_config_schema()},
                                       "a ConfigMap of node-problem-detector's custom plugin monitor"),
    }
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "goodput-exporter chart values",
            **_object(properties)}


def chart_files() -> dict[str, str]:
    """Path inside the chart -> content, for every file this module writes there."""
    files = {f"files/rules/{name}": text for name, text in rule_files(RulesSettings()).items()}
    files.update({f"files/dashboards/{name}": text for name, text in render_dashboards().items()})
    files[f"files/{NPD_MONITOR}"] = (DEPLOY / NPD_MONITOR).read_text()
    files["values.schema.json"] = json.dumps(values_schema(), indent=2) + "\n"
    return files


# ---- plain manifests for kustomize (deploy/) ----

DEPLOY_HEADER = ("# Generated by `make helm` (python -m goodput_mixin.chart --deploy) from helm/goodput-exporter\n"
                 "# with {values}. Do not edit: change the chart and regenerate.\n")
# Labels of Helm's bookkeeping, meaningless without Helm.
_HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def drop_helm_labels(node: Any) -> None:
    if isinstance(node, dict):
        labels = node.get("labels")
        if isinstance(labels, dict):
            for key in _HELM_LABELS:
                labels.pop(key, None)
        for value in node.values():
            drop_helm_labels(value)
    elif isinstance(node, list):
        for value in node:
            drop_helm_labels(value)


def render_chart(values: dict[str, Any] | None = None, name: str = RELEASE,
                 namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` gives it (helm-python-sdk)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=name, namespace=namespace)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every object of a render, NOTES.txt and empty documents left out."""
    objects = []
    for path in sorted(rendered):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return objects


def _dump(objects: list[dict[str, Any]], values: str) -> str:
    for obj in objects:
        drop_helm_labels(obj)
    body = "---\n".join(to_yaml(obj) for obj in objects)
    return DEPLOY_HEADER.format(values=values) + body


_FILE_OF_KIND = {"ServiceAccount": "serviceaccount.yaml", "DaemonSet": "daemonset.yaml", "Service": "service.yaml",
                 "ConfigMap": "dashboards.yaml", "ServiceMonitor": "servicemonitor.yaml",
                 "PrometheusRule": "prometheusrule.yaml"}
_OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")


def deploy_files() -> dict[str, str]:
    """Path under deploy/ -> content: the base (core objects) and the Prometheus Operator overlay."""
    rendered = render_chart({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}})
    by_file: dict[str, list[dict[str, Any]]] = {}
    for obj in manifests(rendered):
        if obj["kind"] not in _FILE_OF_KIND:
            raise ValueError(f"no file under deploy/ for a {obj['kind']}")
        folder = "prometheus-operator" if obj["kind"] in _OPERATOR_KINDS else "base"
        obj["metadata"].pop("namespace", None)  # the kustomization sets it
        by_file.setdefault(f"{folder}/{_FILE_OF_KIND[obj['kind']]}", []).append(obj)
    files = {path: _dump(objects, "its default values" if path.startswith("base/") else
                         "serviceMonitor.enabled=true, prometheusRule.enabled=true")
             for path, objects in sorted(by_file.items())}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        # hostPath volumes (and hostPID when enabled) are outside the baseline Pod Security Standard
        "pod-security.kubernetes.io/enforce": "privileged"}}}
    files["base/namespace.yaml"] = _dump([namespace], "the release namespace")
    base = sorted(p.removeprefix("base/") for p in files if p.startswith("base/"))
    files["base/kustomization.yaml"] = _dump([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NAMESPACE,
        "resources": base}], "the base's files")
    operator = sorted(p.removeprefix("prometheus-operator/") for p in files if p.startswith("prometheus-operator/"))
    files["prometheus-operator/kustomization.yaml"] = _dump([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NAMESPACE,
        "resources": ["../base", *operator]}], "the base plus the Prometheus Operator objects")
    files["kustomization.yaml"] = _dump([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["base"]}],
        "the base (deploy/prometheus-operator adds the ServiceMonitor and PrometheusRule)")
    return files


def write(files: dict[str, str], folder: Path) -> list[Path]:
    written = []
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m goodput_mixin.chart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deploy", action="store_true",
                        help="also render the chart into deploy/base and deploy/prometheus-operator")
    args = parser.parse_args(argv)
    paths = write(chart_files(), CHART)
    if args.deploy:
        paths += write(deploy_files(), DEPLOY)
    for path in paths:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
