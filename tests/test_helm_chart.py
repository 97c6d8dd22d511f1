"""The Helm chart, rendered and linted by Helm's own library (helm-python-sdk): its generated files are fresh,
every rendered core object passes Kubernetes' strict schemas (1.28 and the newest the validator ships), the
Prometheus Operator objects carry what the operator requires, the security defaults hold, each option adds
exactly the privilege it needs, the PrometheusRule holds the groups of rules/, and bad values are refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from conftest import ROOT
from goodput_mixin.chart import CHART, chart_files, manifests
from k8s_checks import KUBE_VERSIONS, OPERATOR_KINDS, operator_problems, validate_core
from test_health_npd import CONFIG as NPD_MONITOR
from test_health_npd import check_plugin_monitor

from exporter.config import ConfigError, env_name, load, read_file, settable_keys
from exporter.health.command import HealthConfig, load_config
from exporter.sources import CATALOG

RELEASE, NAMESPACE = "gpx", "monitoring"
# Value combinations the tests render; each must give valid objects.
COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                                           "interval": "15s", "scrapeTimeout": "5s", "honorLabels": True}},
    "pod-monitor": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}, "service": {"enabled": False}},
    "prometheus-rule": {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "tolerations": {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoExecute"},
                                    {"operator": "Exists"}],
                    "nodeSelector": None, "runtimeClassName": "nvidia", "priorityClassName": "system-node-critical"},
    "dcgm-exporter": {"dcgm": {"enabled": True}},
    "instrument-example": {"instrumentExample": {"enabled": True}},
    "dcgm-embedded": {"dcgm": {"enabled": True, "mode": "bindings", "hostengine": "embedded"}},
    "host-pid": {"hostPID": True, "sysPtrace": True},
    "pod-labels": {"kubelet": {"podLabels": ["team", "app.kubernetes.io/name"]}},
    "non-root": {"kubelet": {"enabled": False}, "ingest": {"enabled": False}, "hostProc": {"enabled": False}},
    "config": {"config": {"log": {"format": "json"}, "nvml": {"interval": "2s"}, "simulate": 2},
               "extraArgs": ["--log.level", "debug"], "podAnnotations": {"a": "b"}},
    "node-problem-detector": {"nodeProblemDetector": {"enabled": True, "namespace": "kube-system"},
                              "serviceMonitor": {"enabled": True}},
    "everything": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                   "prometheusRule": {"enabled": True}, "hostPID": True, "sysPtrace": True,
                   "kubelet": {"podLabels": ["team"]}, "dcgm": {"enabled": True}, "hostNetwork": True,
                   "dashboards": {"namespace": "grafana", "label": "dash", "labelValue": "yes"}},
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(str(CHART)) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    return manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE))


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (main,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return main


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return only(objects, "DaemonSet")["spec"]["template"]["spec"]


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


def test_generated_files_are_fresh() -> None:
    fresh = chart_files()
    for rel, text in fresh.items():
        assert (CHART / rel).read_text() == text, f"helm/goodput-exporter/{rel} is stale: run `make helm`"
    on_disk = {str(p.relative_to(CHART)) for p in (CHART / "files").rglob("*") if p.is_file()}
    assert on_disk == {rel for rel in fresh if rel.startswith("files/")}, "files/ holds files nobody generates"


def test_app_version_is_the_package_version(chart: helm.Chart) -> None:
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == package
    assert container(render(chart, {}))["image"] == f"ghcr.io/goodput-exporter/goodput-exporter:{package}"


@pytest.mark.parametrize("combination", ["defaults", "node-problem-detector"])
def test_lint_finds_nothing(combination: str) -> None:
    report = helm.lint(str(CHART), COMBINATIONS[combination] or None, strict=True)
    assert report["errors"] == []
    # "icon is recommended" (info) is all Helm may say: the project has no icon
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_every_object_is_valid(chart: helm.Chart, combination: str) -> None:
    objects = render(chart, COMBINATIONS[combination])
    assert objects
    problems = []
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            problems += [f"{obj['kind']}: {p}" for p in operator_problems(obj)]
        else:
            problems += validate_core(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert not problems
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(set(names)) == len(names), f"duplicate objects: {names}"


def test_the_validators_can_fail() -> None:
    """The checks above are not vacuous: an unknown field and a monitor without a port are caught."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
               "spec": {"ports": [{"port": 1}], "clusterIp": "None"}}
    assert len(validate_core(service)) == 2  # both versions
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"},
               "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"interval": "30 s"}]}}
    assert operator_problems(monitor) == ["spec.endpoints[0]: no port",
                                          "spec.endpoints[0].interval: '30 s' is not a Prometheus duration"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "x"},
            "spec": {"groups": [{"name": "g", "rules": [{"record": "a", "alert": "B", "expr": "1"}]}]}}
    assert operator_problems(rule) == ["group g rule 0: needs exactly one of record and alert"]


def test_the_cli_validator_accepts_the_default_render(chart: helm.Chart, tmp_path: Path) -> None:
    """The same check through kubernetes-validate's own command line, as the issue names it."""
    path = tmp_path / "default.yaml"
    path.write_text(yaml.safe_dump_all(render(chart, {})))
    for version in KUBE_VERSIONS:
        result = subprocess.run([Path(sys.executable).parent / "kubernetes-validate", "--strict", "-k", version,
                                 str(path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "INFO" in result.stdout and "ERROR" not in result.stdout


def test_default_objects(chart: helm.Chart) -> None:
    objects = render(chart, {})
    kinds = sorted(o["kind"] for o in objects)
    dashboards = len(list((ROOT / "dashboards").glob("*.json")))  # one ConfigMap each
    assert kinds == ["ConfigMap"] * dashboards + ["DaemonSet", "Service", "ServiceAccount"]
    # no Prometheus Operator object unless asked for, no RBAC unless a feature needs it
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ClusterRole", "ClusterRoleBinding", "Role",
                "RoleBinding"} & set(kinds)


def test_security_defaults(chart: helm.Chart) -> None:
    objects = render(chart, {})
    spec = pod_spec(objects)
    security = container(objects)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # root, for the kubelet's socket and the root-owned ingest directory, but with no capability
    assert (security["runAsUser"], security["runAsNonRoot"]) == (0, False)
    assert spec["hostPID"] is False and spec["hostNetwork"] is False
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert "runtimeClassName" not in spec
    # an exporter takes no GPU away from the jobs
    resources = container(objects)["resources"]
    assert not any("nvidia.com" in key for part in resources.values() for key in part)
    assert resources["limits"]["memory"] and resources["requests"]["cpu"]


def test_non_root_where_no_feature_needs_root(chart: helm.Chart) -> None:
    objects = render(chart, COMBINATIONS["non-root"])
    security = container(objects)["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (65532, 65532, True)
    volumes = {v["name"] for v in pod_spec(objects)["volumes"]}
    assert volumes == {"tmp", "flight", "host-sys"}  # the fabric source's sysfs is readable without root
    env = env_of(objects)
    assert env["GOODPUT_KUBELET_ENABLED"] == "false" and env["GOODPUT_INGEST_ENABLED"] == "false"
    assert env["GOODPUT_FABRIC_SYSFS_PATH"] == "/host/sys"
    assert "GOODPUT_HOST_PROC_PATH" not in env
    # kubelet on again: root again
    security = container(render(chart, {"ingest": {"enabled": False}}))["securityContext"]
    assert security["runAsUser"] == 0


def test_a_user_given_uid_wins(chart: helm.Chart) -> None:
    values = {"securityContext": {"runAsUser": 1000, "readOnlyRootFilesystem": True,
                                  "capabilities": {"drop": ["ALL"]}}}
    security = container(render(chart, values))["securityContext"]
    assert security["runAsUser"] == 1000 and "runAsNonRoot" not in security


def test_host_pid_and_ptrace_are_opt_in(chart: helm.Chart) -> None:
    objects = render(chart, COMBINATIONS["host-pid"])
    assert pod_spec(objects)["hostPID"] is True
    assert container(objects)["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    only_pid = render(chart, {"hostPID": True})
    assert pod_spec(only_pid)["hostPID"] is True
    assert "add" not in container(only_pid)["securityContext"]["capabilities"]


def test_dcgm(chart: helm.Chart) -> None:
    env = env_of(render(chart, {}))
    assert env["GOODPUT_DCGM_ENABLED"] == "false"
    objects = render(chart, COMBINATIONS["dcgm-exporter"])
    env = env_of(objects)
    assert env["GOODPUT_DCGM_ENABLED"] == "true" and env["GOODPUT_DCGM_MODE"] == "exporter"
    assert env["GOODPUT_DCGM_EXPORTER_URL"] == "http://$(NODE_IP):9400/metrics"
    # $(NODE_IP) is expanded by the kubelet only from a variable defined before it
    names = [e["name"] for e in container(objects)["env"]]
    assert names.index("NODE_IP") < names.index("GOODPUT_DCGM_EXPORTER_URL")
    assert "add" not in container(objects)["securityContext"]["capabilities"]
    objects = render(chart, COMBINATIONS["dcgm-embedded"])
    assert env_of(objects)["GOODPUT_DCGM_HOSTENGINE"] == "embedded"
    security = container(objects)["securityContext"]
    assert security["capabilities"]["add"] == ["SYS_ADMIN"] and security["runAsUser"] == 0
    security = container(render(chart, {**COMBINATIONS["dcgm-embedded"], **COMBINATIONS["non-root"]}))[
        "securityContext"]
    assert security["runAsUser"] == 0, "the embedded engine needs root even when nothing else does"


def test_pod_labels_bring_the_one_cluster_role_they_need(chart: helm.Chart) -> None:
    objects = render(chart, COMBINATIONS["pod-labels"])
    role = only(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = only(objects, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert pod_spec(objects)["serviceAccountName"] == account
    assert pod_spec(objects)["automountServiceAccountToken"] is True
    env = env_of(objects)
    assert env["GOODPUT_KUBELET_POD_LABELS"] == "team,app.kubernetes.io/name"
    assert env["GOODPUT_KUBELET_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # labels asked for but the kubelet source off: nothing to grant
    kinds = {o["kind"] for o in render(chart, {"kubelet": {"enabled": False, "podLabels": ["team"]}})}
    assert "ClusterRole" not in kinds


def test_the_daemon_accepts_what_the_chart_configures(chart: helm.Chart, tmp_path: Path) -> None:
    """Every GOODPUT_* variable and the config file of a render load with the daemon's own config loader (it
    rejects unknown variables and keys), and say what the values asked for."""
    for name in ("everything", "config", "dcgm-embedded", "non-root"):
        objects = render(chart, COMBINATIONS[name])
        environ = {k: (v if isinstance(v, str) else "node-1") for k, v in env_of(objects).items()}
        environ = {k: v.replace("$(NODE_IP)", "10.0.0.1") for k, v in environ.items()}
        args = container(objects)["args"]
        assert args[0] == "serve"
        path = None
        if "--config" in args:
            path = tmp_path / f"{name}.yaml"
            (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]]
            path.write_text(config_map["data"]["config.yaml"])
            assert args[args.index("--config") + 1] == "/etc/goodput-exporter/config.yaml"
            mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
            assert mounts["/etc/goodput-exporter"] == "config"
        config = load(path, environ=environ)
        assert config.web.listen_address == "0.0.0.0:9445"
        assert config.kubelet.enabled == (name != "non-root")
    config = load(tmp_path / "config.yaml", environ={})
    assert (config.log.format, config.nvml.interval, config.simulate.gpus) == ("json", 2.0, 2)
    known = {env_name(s, k) for s, k, _ in settable_keys()}
    assert {k for k in env_of(render(chart, COMBINATIONS["everything"])) if k.startswith("GOODPUT_")} <= known
    with pytest.raises(ConfigError):  # the loader used above does refuse what it does not know
        load(None, environ={"GOODPUT_KUBELET_BOGUS": "1"})
    assert read_file(tmp_path / "config.yaml")["nvml"] == {"interval": "2s"}


def test_probes_ports_and_service(chart: helm.Chart) -> None:
    objects = render(chart, {})
    main = container(objects)
    assert main["ports"] == [{"name": "metrics", "containerPort": 9445, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = only(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    other = render(chart, {"port": 9500})
    assert container(other)["ports"][0]["containerPort"] == 9500
    assert env_of(other)["GOODPUT_WEB_LISTEN_ADDRESS"] == "0.0.0.0:9500"


def test_host_mounts(chart: helm.Chart) -> None:
    objects = render(chart, {})
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    assert volumes["ingest"]["hostPath"] == {"path": "/run/goodput-exporter", "type": "DirectoryOrCreate"}
    assert not mounts["ingest"].get("readOnly"), "the daemon creates ingest.sock there"
    assert volumes["flight"]["hostPath"]["path"] == "/run/goodput-exporter/flight" and mounts["flight"]["readOnly"]
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc" and mounts["host-proc"]["mountPath"] == "/host/proc"
    assert mounts["host-proc"]["readOnly"]
    assert volumes["host-sys"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    assert mounts["host-sys"] == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    no_sys = render(chart, {"hostSys": {"enabled": False}})
    assert "host-sys" not in {v["name"] for v in pod_spec(no_sys)["volumes"]}
    assert "GOODPUT_FABRIC_SYSFS_PATH" not in env_of(no_sys)
    env = env_of(objects)
    assert env["GOODPUT_FABRIC_SYSFS_PATH"] == "/host/sys"
    assert env["GOODPUT_INGEST_SOCKET_PATH"] == "/run/goodput-exporter/ingest.sock"
    assert env["GOODPUT_FLIGHT_DIR"] == "/run/goodput-exporter/flight"
    assert env["GOODPUT_KUBELET_SOCKET_PATH"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert env["GOODPUT_HOST_PROC_PATH"] == "/host/proc"
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    # the restart accounting outlives the pod: a host directory, written by the daemon
    assert volumes["ingest-state"]["hostPath"] == {"path": "/var/lib/goodput-exporter", "type": "DirectoryOrCreate"}
    assert mounts["ingest-state"]["mountPath"] == env["GOODPUT_INGEST_STATE_DIR"] == "/var/lib/goodput-exporter"
    assert not mounts["ingest-state"].get("readOnly")
    in_memory = render(chart, {"ingest": {"stateHostDir": ""}})
    assert "ingest-state" not in {v["name"] for v in pod_spec(in_memory)["volumes"]}
    assert "GOODPUT_INGEST_STATE_DIR" not in env_of(in_memory)
    # captures are off unless a host directory is named; then jobs and daemon share it at the same path
    assert "ingest-captures" not in volumes and "GOODPUT_INGEST_CAPTURE_DIR" not in env
    capturing = render(chart, {"ingest": {"captureHostDir": "/var/lib/goodput-exporter/captures"}})
    spec = pod_spec(capturing)
    volume = next(v for v in spec["volumes"] if v["name"] == "ingest-captures")
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "ingest-captures")
    assert volume["hostPath"] == {"path": "/var/lib/goodput-exporter/captures", "type": "DirectoryOrCreate"}
    assert mount["mountPath"] == env_of(capturing)["GOODPUT_INGEST_CAPTURE_DIR"] == volume["hostPath"]["path"]


def test_gpu_node_scheduling(chart: helm.Chart) -> None:
    spec = pod_spec(render(chart, {}))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    values = COMBINATIONS["tolerations"]
    spec = pod_spec(render(chart, values))
    assert spec["tolerations"] == values["tolerations"] and "nodeSelector" not in spec
    assert spec["runtimeClassName"] == "nvidia" and spec["priorityClassName"] == "system-node-critical"
    # Helm merges maps with the defaults: a default key is dropped with null
    gke = {"nodeSelector": {"nvidia.com/gpu.present": None, "cloud.google.com/gke-accelerator": "nvidia-l4"}}
    assert pod_spec(render(chart, gke))["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}


def test_monitors(chart: helm.Chart) -> None:
    objects = render(chart, COMBINATIONS["service-monitor"])
    monitor = only(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["interval"], endpoint["scrapeTimeout"], endpoint["honorLabels"]) == (
        "metrics", "15s", "5s", True)
    assert endpoint["relabelings"][-2:] == [
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": label}
        for label in ("instance", "node")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= only(objects, "Service")["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    objects = render(chart, COMBINATIONS["pod-monitor"])
    monitor = only(objects, "PodMonitor")
    assert "Service" not in {o["kind"] for o in objects}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is False
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    # empty interval: Prometheus' global one
    (endpoint,) = only(render(chart, {"podMonitor": {"enabled": True, "interval": "", "nodeLabel": False}}),
                       "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert "interval" not in endpoint
    assert not {"instance", "node"} & {r.get("targetLabel") for r in endpoint["relabelings"]}
    with pytest.raises(helm.HelmRenderError, match=r"serviceMonitor\.enabled needs service\.enabled"):
        chart.render({"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}, name=RELEASE,
                     namespace=NAMESPACE)


# The labels the Prometheus Operator gives every target of a ServiceMonitor or PodMonitor before the monitor's own
# relabelings run (job from jobLabel, instance from the address).
OPERATOR_TARGET_LABELS = ("namespace", "service", "pod", "container", "endpoint", "job", "instance")


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitor_target_labels_leave_the_exported_labels_alone(chart: helm.Chart, kind: str) -> None:
    """A target label named like a label of our series (namespace, pod and container on goodput_gpu_pod_info)
    would make Prometheus rename the series' one exported_<name>, and the rules' joins would find nothing."""
    exported = {label for metric in CATALOG.values() for label in metric.labels}
    key = {"ServiceMonitor": "endpoints", "PodMonitor": "podMetricsEndpoints"}[kind]
    section = {"ServiceMonitor": "serviceMonitor", "PodMonitor": "podMonitor"}[kind]
    assert exported & set(OPERATOR_TARGET_LABELS), "the clash this test guards against is gone: update the test"
    (endpoint,) = only(render(chart, {section: {"enabled": True}}), kind)["spec"][key]
    labels = set(OPERATOR_TARGET_LABELS)
    for rule in endpoint["relabelings"]:  # replace and labeldrop, the two actions the chart uses
        if rule["action"] == "replace":
            if all(source in labels or source.startswith("__meta_") for source in rule["sourceLabels"]):
                labels.add(rule["targetLabel"])
        elif rule["action"] == "labeldrop":
            labels = {label for label in labels if not re.fullmatch(rule["regex"], label)}
        else:
            pytest.fail(f"relabel action {rule['action']} not modelled here")
    assert not labels & exported, f"{kind} target labels {labels & exported} clash with exported labels"
    assert {"exporter_namespace", "exporter_pod", "node"} <= labels


def test_the_prometheus_rule_holds_the_groups_of_rules_dir(chart: helm.Chart) -> None:
    rule = only(render(chart, COMBINATIONS["prometheus-rule"]), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    shipped = [group for path in sorted((ROOT / "rules").glob("*.rules.yml"))
               for group in yaml.safe_load(path.read_text())["groups"]]
    assert [g["name"] for g in rule["spec"]["groups"]] == [g["name"] for g in shipped]
    for ours, theirs in zip(rule["spec"]["groups"], shipped, strict=True):
        assert ours == theirs, f"group {theirs['name']} differs from rules/"
    assert sum(len(g["rules"]) for g in shipped) > 20


def test_dashboards_config_maps(chart: helm.Chart) -> None:
    shipped = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}
    maps = [o for o in render(chart, {}) if o["kind"] == "ConfigMap"]  # no config: dashboards only
    assert len(maps) == len(shipped) == 7
    seen = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == NAMESPACE
        ((key, text),) = config_map["data"].items()
        seen[key] = json.loads(text)
        # an object must stay under 1 MiB (etcd's request limit); leave room for growth
        assert len(json.dumps(config_map).encode()) < 512 * 1024
    assert sorted(seen) == [f"goodput-{name}" for name in shipped]
    assert list(seen.values()) == list(shipped.values())
    custom = [o for o in render(chart, COMBINATIONS["everything"]) if o["kind"] == "ConfigMap"]
    assert {(o["metadata"]["namespace"], o["metadata"]["labels"]["dash"]) for o in custom} == {("grafana", "yes")}
    assert not [o for o in render(chart, {"dashboards": {"enabled": False}}) if o["kind"] == "ConfigMap"]


def test_notes_say_how_to_check(chart: helm.Chart) -> None:
    notes = chart.render({}, name=RELEASE, namespace=NAMESPACE)["goodput-exporter/templates/NOTES.txt"]
    assert f"kubectl -n {NAMESPACE} get daemonset,pods -l app.kubernetes.io/instance={RELEASE}" in notes
    assert "/readyz" in notes and "goodput_exporter_source_up" in notes
    assert "No ServiceMonitor or PodMonitor" in notes
    monitored = chart.render(COMBINATIONS["service-monitor"], name=RELEASE, namespace=NAMESPACE)
    assert '(labels {"release":"kube-prometheus-stack"})' in monitored["goodput-exporter/templates/NOTES.txt"]


@pytest.mark.parametrize(("values_yaml", "expected"), [
    ("port: '9445'\n", "at '/port': got string, want integer"),
    ("hostPID: yes please\n", "at '/hostPID': got string, want boolean"),
    ("tolerations: {key: nvidia.com/gpu}\n", "at '/tolerations': got object, want array"),
    ("serviceMonitor:\n  enable: true\n", "at '/serviceMonitor': additional properties 'enable' not allowed"),
    ("hostPid: true\n", "additional properties 'hostPid' not allowed"),
    ("config:\n  nvml:\n    intervall: 2s\n", "at '/config/nvml': additional properties 'intervall' not allowed"),
    ("config:\n  kubelet:\n    enabled: true\n",
     "at '/config/kubelet': additional properties 'enabled' not allowed"),
    ("config:\n  log:\n    level: verbose\n", "at '/config/log/level'"),
    ("nodeProblemDetector:\n  config:\n    dryrun: true\n",
     "at '/nodeProblemDetector/config': additional properties 'dryrun' not allowed"),
    ("nodeProblemDetector:\n  config:\n    mode: slurm\n",  # the monitor's args set it
     "at '/nodeProblemDetector/config': additional properties 'mode' not allowed"),
    ("nodeProblemDetector:\n  exporterPath: goodput-exporter\n", "at '/nodeProblemDetector/exporterPath'"),
])
def test_bad_values_files_are_refused_naming_the_key(chart: helm.Chart, tmp_path: Path, values_yaml: str,
                                                     expected: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values_yaml)
    with pytest.raises(helm.HelmValuesError) as raised:
        chart.render(yaml.safe_load(path.read_text()), name=RELEASE, namespace=NAMESPACE)
    assert expected in str(raised.value)
    assert "values don't meet the specifications of the schema" in str(raised.value)


def test_the_shipped_values_file_passes_its_schema(chart: helm.Chart) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert render(chart, values) == render(chart, {})
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]) == set(values), "values.yaml and values.schema.json name other keys"


# ---- node-problem-detector (nodeProblemDetector.enabled) ----

NPD_MAP = f"{RELEASE}-goodput-exporter-node-problem-detector"
NODE_LOCAL = f"{RELEASE}-goodput-exporter-node-local"
MONITOR_KEY = "goodput-health-monitor.json"


def npd_objects(objects: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The node-problem-detector ConfigMap and the node-local Service of a render (None where absent)."""
    maps = [o for o in objects if o["kind"] == "ConfigMap" and MONITOR_KEY in o.get("data", {})]
    services = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == NODE_LOCAL]
    assert len(maps) <= 1 and len(services) <= 1
    return (maps[0] if maps else None), (services[0] if services else None)


def test_no_node_problem_detector_objects_by_default(chart: helm.Chart) -> None:
    assert npd_objects(render(chart, {})) == (None, None)
    assert npd_objects(render(chart, COMBINATIONS["everything"])) == (None, None)
    notes = chart.render({}, name=RELEASE, namespace=NAMESPACE)["goodput-exporter/templates/NOTES.txt"]
    assert "node-problem-detector" not in notes


def test_the_node_problem_detector_config_map(chart: helm.Chart, tmp_path: Path) -> None:
    """The ConfigMap holds deploy/'s monitor as shipped (it passes the checks test_health_npd makes of NPD's format)
    and the health.yaml its rule names, which the health command loads: mounted at the directory of the rule's
    --config, NPD runs `health --mode npd` reading the exporter of its own node through the node-local Service."""
    objects = render(chart, COMBINATIONS["node-problem-detector"])
    config_map, service = npd_objects(objects)
    assert config_map is not None and service is not None
    assert config_map["metadata"]["name"] == NPD_MAP and config_map["metadata"]["namespace"] == "kube-system"
    assert config_map["data"][MONITOR_KEY] == NPD_MONITOR.read_text(), "the chart's monitor is deploy/'s"
    monitor = json.loads(config_map["data"][MONITOR_KEY])
    check_plugin_monitor(monitor)
    (rule,) = monitor["rules"]
    assert rule["path"] == "/usr/local/bin/goodput-exporter"
    args = rule["args"]
    assert args[:3] == ["health", "--mode", "npd"]
    config_path = Path(args[args.index("--config") + 1])
    assert config_path == Path("/etc/goodput-exporter/health.yaml")
    assert set(config_map["data"]) == {MONITOR_KEY, config_path.name}, "one mount: both files in one directory"
    # the health command reads that file as NPD runs it (its own loader refuses an unknown key)
    local = tmp_path / config_path.name
    local.write_text(config_map["data"][config_path.name])
    settings = load_config([*args[1:args.index("--config")], "--config", str(local)], environ={})
    assert settings.mode == "npd"
    assert settings.daemon_url == f"http://{NODE_LOCAL}.{NAMESPACE}.svc:9445"
    assert settings.state_file == HealthConfig.state_file == "/var/lib/goodput-exporter/health-state.json"
    # ... which the daemon reads through its ingest state mount, at the same path
    assert Path(settings.state_file).parent == Path(env_of(objects)["GOODPUT_INGEST_STATE_DIR"])
    # the Service reaches the exporter pod of the caller's node, on the metrics port
    assert service["spec"]["internalTrafficPolicy"] == "Local" and service["spec"]["type"] == "ClusterIP"
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["metadata"]["namespace"] == NAMESPACE
    # ... and the ServiceMonitor does not scrape the pods a second time through it
    selector = only(objects, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= service["metadata"]["labels"].items()
    metrics = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] != NODE_LOCAL)
    assert selector.items() <= metrics["metadata"]["labels"].items()
    notes = chart.render(COMBINATIONS["node-problem-detector"], name=RELEASE,
                         namespace=NAMESPACE)["goodput-exporter/templates/NOTES.txt"]
    assert f"--config.custom-plugin-monitor={config_path.parent}/{MONITOR_KEY}" in notes
    assert f"kube-system/{NPD_MAP}" in notes and f"mount it at {config_path.parent}," in notes
    assert "Warning" not in notes


def test_node_problem_detector_values(chart: helm.Chart, tmp_path: Path) -> None:
    """exporterPath changes the rule's path and nothing else; a daemon_url of one's own replaces the Service;
    health settings pass through to the command; a state file the daemon cannot see is warned about."""
    values = {"nodeProblemDetector": {"enabled": True, "exporterPath": "/opt/venv/bin/goodput-exporter",
                                      "config": {"daemon_url": "http://127.0.0.1:9445", "dry_run": True,
                                                 "xid_hold": "30m"}}}
    objects = render(chart, values)
    config_map, service = npd_objects(objects)
    assert config_map is not None and service is None
    assert config_map["metadata"]["namespace"] == NAMESPACE
    monitor = json.loads(config_map["data"][MONITOR_KEY])
    check_plugin_monitor(monitor)
    shipped = json.loads(NPD_MONITOR.read_text())
    assert monitor["rules"][0].pop("path") == "/opt/venv/bin/goodput-exporter"
    shipped["rules"][0].pop("path")
    assert monitor == shipped
    local = tmp_path / "health.yaml"
    local.write_text(config_map["data"]["health.yaml"])
    settings = load_config(["--mode", "npd", "--config", str(local)], environ={})
    assert (settings.daemon_url, settings.dry_run, settings.xid_hold) == ("http://127.0.0.1:9445", True, 1800.0)
    assert settings.state_file == "/var/lib/goodput-exporter/health-state.json"  # values.yaml's, kept by the merge
    notes = chart.render({**values, "ingest": {"enabled": False}}, name=RELEASE,
                         namespace=NAMESPACE)["goodput-exporter/templates/NOTES.txt"]
    assert "Warning: the daemon does not see /var/lib/goodput-exporter/health-state.json" in notes


def test_the_health_settings_schema_is_the_commands() -> None:
    """values.schema.json's nodeProblemDetector.config names every setting of the health command but the mode."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["nodeProblemDetector"]["properties"]["config"]
    assert set(config["properties"]) == {f for f in HealthConfig.__dataclass_fields__} - {"mode"}
    assert config["additionalProperties"] is False
