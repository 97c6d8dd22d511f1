"""deploy/examples/: the Prometheus config checked by promtool with the shipped rules, then run by a live
Prometheus on the targets its Kubernetes discovery would find, scraping a live exporter; the Alertmanager
config checked by amtool, every shipped alert routed by its severity, and the inhibitions proven on a live
Alertmanager."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, free_port, live_server, promtool, quick_config, wait_for
from goodput_mixin.rules.settings import RulesSettings
from kubelet_server import KubeletServer, gpu_pod

from exporter.sources import CATALOG
from exporter.sources.nvml.simulated import SimulatedGpus

EXAMPLES = ROOT / "deploy" / "examples"
PROMETHEUS = EXAMPLES / "prometheus.yml"
ALERTMANAGER = EXAMPLES / "alertmanager.yml"
RULES = sorted((ROOT / "rules").glob("*.rules.yml"))
SETTINGS = RulesSettings()
NAMESPACE, APP = "goodput-exporter", "goodput-exporter"
RECEIVER_OF = {"critical": "page", "warning": "ticket", "info": "none"}


def binary(*names: str) -> str:
    for name in names:
        if path := shutil.which(name):
            return path
    pytest.fail(f"{names[0]} not found: `make test` installs Debian's prometheus and prometheus-alertmanager")


def shipped_alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load((ROOT / "rules" / "goodput-alerts.rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def scrape_job() -> dict[str, Any]:
    (job,) = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    return job


def layout(directory: Path) -> Path:
    """prometheus.yml with the shipped rule files where its rule_files expect them (relative to it)."""
    shutil.copy(PROMETHEUS, directory / "prometheus.yml")
    (directory / "rules").mkdir()
    for path in RULES:
        shutil.copy(path, directory / "rules" / path.name)
    return directory / "prometheus.yml"


# --- Prometheus ---------------------------------------------------------------------------------------------

def test_scrape_job_fits_the_rules_and_the_catalog() -> None:
    job = scrape_job()
    assert job["job_name"] == SETTINGS.exporter_job  # GoodputExporterDown selects up{job=...}
    targets = {rule["target_label"] for rule in job["relabel_configs"] if "target_label" in rule}
    assert {SETTINGS.node_label, SETTINGS.cluster_label} <= targets
    # no target label may shadow one of the exporter's own (pod, namespace, container of goodput_gpu_pod_info,
    # the label_* pod labels): it would rename the scraped one to exported_<name>
    ours = {label for metric in CATALOG.values() for label in metric.labels}
    assert targets & ours == set() and not [t for t in targets if t.startswith("label_")]
    assert not job.get("honor_labels", False)


def pod_targets(name: str, namespace: str, node: str, app: str, ports: dict[str, int]) -> list[dict[str, Any]]:
    """What Prometheus' Kubernetes discovery (role pod) makes of a running pod: one target per container port,
    at the pod's IP, with these __meta_kubernetes_* labels (names as Prometheus documents them)."""
    return [{"targets": [f"127.0.0.1:{port}"], "labels": {
        "__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_node_name": node, "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_host_ip": "127.0.0.1", "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_uid": f"uid-{name}",
        "__meta_kubernetes_pod_controller_kind": "DaemonSet", "__meta_kubernetes_pod_controller_name": app,
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
        "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name": "true",
        "__meta_kubernetes_pod_container_name": "exporter", "__meta_kubernetes_pod_container_init": "false",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_number": str(port),
        "__meta_kubernetes_pod_container_port_protocol": "TCP"}} for port_name, port in ports.items()]


@contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_kubernetes_discovery_asks_for_the_exporter_pods_only() -> None:
    # Debian's Prometheus is built without Kubernetes discovery (its promtool rejects kubernetes_sd_configs),
    # so this part is checked as data: the pods of the exporter's namespace that carry its name label
    (sd,) = scrape_job()["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and sd["namespaces"] == {"names": [NAMESPACE]}
    assert sd["selectors"] == [{"role": "pod", "label": f"app.kubernetes.io/name={APP}"}]


def with_file_discovery(config_path: Path, targets: list[dict[str, Any]]) -> dict[str, Any]:
    """The example config with kubernetes_sd_configs swapped for a file of the targets it would discover."""
    config = yaml.safe_load(config_path.read_text())
    job = config["scrape_configs"][0]
    del job["kubernetes_sd_configs"]
    (config_path.parent / "targets.json").write_text(json.dumps(targets))
    job["file_sd_configs"] = [{"files": [str(config_path.parent / "targets.json")]}]
    return config


@contextmanager
def running_prometheus(config_path: Path, config: dict[str, Any], unused_port: int
                       ) -> Iterator[tuple[httpx.Client, Callable[[str], list[dict[str, Any]]]]]:
    """Prometheus on `config` (written to config_path), with only timing and Alertmanager's address changed so that
    the first scrapes come within seconds; yields its API client and an instant query (empty until it answers)."""
    for job in config["scrape_configs"]:
        job.update(scrape_interval="1s", scrape_timeout="1s")
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{unused_port}"]}]
    config_path.write_text(yaml.safe_dump(config))
    port, directory = free_port(), config_path.parent
    with process([binary("prometheus"), f"--config.file={config_path}", f"--storage.tsdb.path={directory / 'data'}",
                  f"--web.listen-address=127.0.0.1:{port}"], directory / "prometheus.log") as proc, httpx.Client(
                      base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

        def query(expr: str) -> list[dict[str, Any]]:
            assert proc.poll() is None, (directory / "prometheus.log").read_text()[-3000:]
            try:
                response = client.get("/api/v1/query", params={"query": expr})
            except httpx.TransportError:
                return []
            return response.json()["data"]["result"] if response.status_code == 200 else []

        yield client, query


def test_promtool_checks_the_config_with_discovery_swapped_for_a_file(tmp_path: Path) -> None:
    config_path = layout(tmp_path)
    config_path.write_text(yaml.safe_dump(with_file_discovery(config_path, [])))
    result = subprocess.run([promtool(), "check", "config", str(config_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in RULES:  # the rule_files glob takes every shipped file, and promtool checked each
        assert f"Checking {tmp_path / 'rules' / path.name}" in result.stdout, result.stdout
    assert f"SUCCESS: {len(RULES)} rule files found" in result.stdout
    assert result.stdout.count("SUCCESS") == 2 + len(RULES), result.stdout


def test_live_prometheus_labels_the_exporter_by_node_and_keeps_its_pod_labels(tmp_path: Path) -> None:
    unused_port = free_port()
    config_path = layout(tmp_path)
    gpus = SimulatedGpus(2)
    with KubeletServer() as kubelet, live_server(quick_config(
            kubelet={"enabled": True, "socket_path": kubelet.path, "interval": "100ms"}), backend=gpus) as live:
        kubelet.set_pods([gpu_pod("trainer-0", "team-a", "0")])
        port = int(live.url.rsplit(":", 1)[1])
        config = with_file_discovery(config_path, [
            *pod_targets("goodput-exporter-x7k2p", NAMESPACE, "gpu-node-7", APP, {"metrics": port, "debug": 1}),
            *pod_targets("someone-else", NAMESPACE, "gpu-node-7", "not-the-exporter", {"metrics": unused_port})])
        with running_prometheus(config_path, config, unused_port) as (client, query):
            info = wait_for(lambda: query('goodput_gpu_pod_info{job="goodput-exporter"}'), timeout=30)
            targets = client.get("/api/v1/targets").json()["data"]["activeTargets"]
            up = query('up{job="goodput-exporter"}')
            gpu_up = query("goodput_gpu_up")
            rules = client.get("/api/v1/rules").json()["data"]["groups"]

    # one target, the exporter pod's port named metrics, labelled by node, cluster and exporter pod
    assert [t["labels"] for t in targets] == [{
        "job": "goodput-exporter", "instance": "gpu-node-7", "node": "gpu-node-7", "cluster": "my-cluster",
        "exporter_namespace": NAMESPACE, "exporter_pod": "goodput-exporter-x7k2p"}]
    assert [r["value"][1] for r in up] == ["1"]
    assert sorted(r["metric"]["gpu"] for r in gpu_up) == ["0", "1"]
    assert all("namespace" not in r["metric"] and "pod" not in r["metric"] for r in gpu_up)
    # the workload's pod and namespace on goodput_gpu_pod_info are the kubelet's, not the exporter's
    (series,) = info
    labels = series["metric"]
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("trainer-0", "team-a", "trainer")
    assert not [name for name in labels if name.startswith("exported_")]
    # every rule group of the shipped files is loaded
    shipped = [g["name"] for path in RULES for g in yaml.safe_load(path.read_text())["groups"]]
    assert sorted(g["name"] for g in rules) == sorted(shipped)


SERVING = EXAMPLES / "serving-engines.yml"


def test_serving_engines_job_joins_a_served_model_to_the_gpus_of_its_pod(tmp_path: Path) -> None:
    """serving-engines.yml merged into prometheus.yml, on a live Prometheus: the exporter's pod and a vLLM-format
    engine (the demo's simulated one) in pod serve/vllm-0, to which the kubelet assigned GPU 1. The engine's
    annotated port is scraped once, labelled with its pod and namespace, and the rules find the model's GPU."""
    unused_port, engine_port = free_port(), free_port()
    config_path = layout(tmp_path)
    gpus = SimulatedGpus(2)
    engine = yaml.safe_load(SERVING.read_text())["scrape_configs"][0]
    assert engine["kubernetes_sd_configs"] == [{"role": "pod"}]
    with KubeletServer() as kubelet, live_server(quick_config(
            kubelet={"enabled": True, "socket_path": kubelet.path, "interval": "100ms"}), backend=gpus) as live, \
            process([sys.executable, "-m", "goodput_mixin.demo.simserve", "--port", str(engine_port)],
                    tmp_path / "engine.log"):
        kubelet.set_pods([gpu_pod("vllm-0", "serve", "1", container="vllm")])
        port = int(live.url.rsplit(":", 1)[1])
        config = with_file_discovery(config_path, pod_targets(
            "goodput-exporter-x7k2p", NAMESPACE, "gpu-node-7", APP, {"metrics": port}))
        # what discovery makes of the engine's pod: a target per container port (the API port and another), at the
        # pod's IP, with its annotations and labels
        served = pod_targets("vllm-0", "serve", "gpu-node-7", "vllm", {"http": 1, "grpc": 2})
        for target in served:
            target["labels"].update({
                "__meta_kubernetes_pod_annotation_goodput_exporter_io_serving_engine": "vllm",
                "__meta_kubernetes_pod_annotation_goodput_exporter_io_metrics_port": str(engine_port),
                "__meta_kubernetes_pod_label_app_kubernetes_io_instance": "llama"})
        (tmp_path / "engines.json").write_text(json.dumps(served))
        del engine["kubernetes_sd_configs"]
        engine["file_sd_configs"] = [{"files": [str(tmp_path / "engines.json")]}]
        config["scrape_configs"].append(engine)
        with running_prometheus(config_path, config, unused_port) as (_, query):
            (info,) = wait_for(lambda: query("workload:goodput_inference_gpu:info"), timeout=60)
            up = query('up{job="serving-engines"}')
            running = query("server:goodput_inference_requests_running:sum")
    assert [(r["metric"]["namespace"], r["metric"]["pod"], r["value"][1]) for r in up] == [("serve", "vllm-0", "1")]
    (server,) = running
    assert {k: server["metric"][k] for k in ("namespace", "pod", "model", "engine", "cluster")} == {
        "namespace": "serve", "pod": "vllm-0", "model": "demo/llama-3-8b", "engine": "vllm", "cluster": "my-cluster"}
    labels = info["metric"]
    assert {k: labels.get(k) for k in ("namespace", "model", "engine", "instance", "uuid")} == {
        "namespace": "serve", "model": "demo/llama-3-8b", "engine": "vllm", "instance": "gpu-node-7",
        "uuid": gpus.uuid(1)}


# --- Alertmanager -------------------------------------------------------------------------------------------

def test_amtool_checks_the_config() -> None:
    result = subprocess.run([binary("amtool"), "check-config", str(ALERTMANAGER)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def route(*labels: str) -> str:
    result = subprocess.run([binary("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("alert", shipped_alerts(), ids=lambda rule: rule["alert"])
def test_every_shipped_alert_reaches_the_receiver_its_severity_names(alert: dict[str, Any]) -> None:
    severity = alert["labels"]["severity"]
    assert severity in RECEIVER_OF, f"{alert['alert']}: severity {severity} has no route"
    labels = [f"alertname={alert['alert']}", f"severity={severity}", "cluster=c1", "workload=w1", "instance=node-1"]
    assert route(*labels) == RECEIVER_OF[severity]


def test_other_severities_and_none() -> None:
    assert route("alertname=Mine", "severity=info") == "none"
    assert route("alertname=Mine") == "ticket"  # not dropped
    assert route("alertname=Mine", "severity=unheard-of") == "ticket"


def test_no_secret_in_the_config() -> None:
    config = yaml.safe_load(ALERTMANAGER.read_text())
    for receiver in config["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            assert "routing_key" not in pagerduty and "service_key" not in pagerduty
            assert pagerduty["routing_key_file"].startswith("/")
    assert "global" not in config or not {"smtp_auth_password", "slack_api_url"} & set(config["global"])


def test_live_alertmanager_inhibits_what_follows_from_a_fault(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    shutil.copy(ALERTMANAGER, config)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "severity": severity, "cluster": "c1", **labels}, "startsAt": now}

    gpu0 = {"instance": "node-1", "gpu": "0", "uuid": "GPU-0"}
    gpu1 = {"instance": "node-1", "gpu": "1", "uuid": "GPU-1"}
    gpu2 = {"instance": "node-1", "gpu": "2", "uuid": "GPU-2"}
    gpu3 = {"instance": "node-1", "gpu": "3", "uuid": "GPU-3"}
    sent = [
        alert("GoodputGPURiskReplace", "critical", reason="row_remap_failure", **gpu2),
        alert("GoodputGPUResetRequired", "critical", reason="row_remap_failure", **gpu2),  # inhibited: to replace
        alert("GoodputGPUResetRequired", "critical", reason="row_remap_pending", **gpu3),
        alert("GoodputGPURiskDrain", "warning", reason="row_remap_pending", **gpu3),  # inhibited: the reset pages
        alert("GoodputGPUXidCritical", "critical", xid="79", **gpu0),
        alert("GoodputGPUThrottled", "warning", **gpu0),            # inhibited: same GPU
        alert("GoodputGPUIdleWhileAllocated", "warning", **gpu0),   # inhibited: same GPU
        alert("GoodputGPUIdleWhileAllocated", "warning", **gpu1),   # not: another GPU
        alert("GoodputExporterSourceFailing", "warning", instance="node-1", source="dcgm"),  # not: no uuid to match
        alert("GoodputCollectiveHang", "critical", workload="w1", rank="3", pg="0", instance="node-2"),
        alert("GoodputDrop", "critical", workload="w1"),            # inhibited: its workload hangs
        alert("GoodputDrop", "critical", workload="w2"),            # not: another workload
    ]
    with process([binary("prometheus-alertmanager", "alertmanager"), f"--config.file={config}",
                  f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                  "--cluster.listen-address="], tmp_path / "alertmanager.log") as proc, httpx.Client(
                      base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()[-3000:]
            try:
                return client.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=20)
        assert client.post("/api/v2/alerts", json=sent).status_code == 200

        def inhibited() -> dict[tuple[str, str], bool] | None:
            got = client.get("/api/v2/alerts").json()
            if len(got) < len(sent):
                return None
            state = {(a["labels"]["alertname"], a["labels"].get("uuid") or a["labels"].get("workload", "")):
                     bool(a["status"]["inhibitedBy"]) for a in got}
            return state if any(state.values()) else None

        state = wait_for(inhibited, timeout=15)
    assert state == {
        ("GoodputGPURiskReplace", "GPU-2"): False,
        ("GoodputGPUResetRequired", "GPU-2"): True,
        ("GoodputGPUResetRequired", "GPU-3"): False,
        ("GoodputGPURiskDrain", "GPU-3"): True,
        ("GoodputGPUXidCritical", "GPU-0"): False,
        ("GoodputGPUThrottled", "GPU-0"): True,
        ("GoodputGPUIdleWhileAllocated", "GPU-0"): True,
        ("GoodputGPUIdleWhileAllocated", "GPU-1"): False,
        ("GoodputExporterSourceFailing", ""): False,
        ("GoodputCollectiveHang", "w1"): False,
        ("GoodputDrop", "w1"): True,
        ("GoodputDrop", "w2"): False,
    }
