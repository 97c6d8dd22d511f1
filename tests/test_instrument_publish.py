"""The fleet rollout of goodput-instrument: the daemon publishes the client it ships into a node directory at start
(ingest.client_dir), a pod mounts it read-only with PYTHONPATH pointing at it (the chart's example pod, the example
Kyverno policy), and a write through that mount fails."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import goodput_client
import pytest
import yaml
from conftest import ROOT, live_server, quick_config, wait_for
from goodput_mixin.chart import manifests, render_chart
from kubernetes_validate import validate

from exporter.sources.ingest.publish import CURRENT, KEEP_SECONDS, UnsafeDirectory, publish_client, version_name

POLICY = ROOT / "deploy" / "examples" / "goodput-instrument" / "kyverno-clusterpolicy.yaml"
REPORT = ("import sys, goodput_client.instrument.boot as boot; "
          "print(boot.recorder is not None, sys.modules['goodput_client'].__file__)")


def python_with(path: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env["PYTHONPATH"] = str(path)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd="/")


def test_publishing_writes_one_whole_version_and_points_current_at_it(tmp_path: Path) -> None:
    published = publish_client(str(tmp_path / "client"))
    current = tmp_path / "client" / CURRENT
    assert published.name == version_name() and published.name.startswith(goodput_client.__version__ + "-")
    assert os.readlink(current) == published.name  # relative: it resolves inside any mount of the directory
    assert (published / "sitecustomize.py").is_file()
    assert (published / "goodput_client" / "instrument" / "probes" / "optimizer.py").is_file()
    tag = sys.implementation.cache_tag  # compiled for the daemon's Python only, nothing of the checkout's copied
    assert {p.name.split(".")[-2] for p in published.rglob("*.pyc")} == {tag}
    assert (published / "goodput_client" / "__pycache__" / f"telemetry.{tag}.pyc").is_file()
    assert {p.stat().st_mode & 0o777 for p in published.rglob("*")} == {0o755, 0o644}
    # a pod's interpreter boots the published copy, not the one this venv holds
    result = python_with(current, REPORT)
    assert result.returncode == 0, result.stderr
    booted, where = result.stdout.split()
    assert booted == "True" and Path(where).resolve().is_relative_to(published.resolve())
    # again at the next start: the same version, nothing rewritten; a leftover of an interrupted one is removed
    (tmp_path / "client" / ".publish-interrupted").mkdir()
    before = (published / "sitecustomize.py").stat().st_mtime_ns
    assert publish_client(str(tmp_path / "client")) == published
    assert (published / "sitecustomize.py").stat().st_mtime_ns == before
    assert sorted(p.name for p in (tmp_path / "client").iterdir()) == sorted([CURRENT, published.name])


def test_a_new_version_replaces_current_and_keeps_the_one_before(tmp_path: Path) -> None:
    root = tmp_path / "client"
    older = root / "0.0.9-aaaaaaaaaaaa"
    oldest = root / "0.0.8-bbbbbbbbbbbb"
    recent = root / "0.0.7-dddddddddddd"
    for folder in (older, oldest, recent):
        (folder / "goodput_client").mkdir(parents=True)
    week_ago = time.time() - KEEP_SECONDS - 60
    for folder in (older, oldest):
        os.utime(folder, (week_ago, week_ago))
    root.joinpath(CURRENT).symlink_to(older.name)
    published = publish_client(str(root))
    assert os.readlink(root / CURRENT) == published.name
    assert older.is_dir() and not oldest.exists()  # running pods may still read the one before
    assert recent.is_dir()  # published within the week: a long-running pod may still import from it


def test_a_client_directory_that_is_a_symbolic_link_is_refused_and_nothing_outside_is_touched(tmp_path: Path,
                                                                                             ) -> None:
    """A pod that can write into the socket directory replaces `client` with a link to a folder elsewhere: the
    daemon must neither publish there nor prune what it finds there."""
    elsewhere = tmp_path / "elsewhere"
    victim = elsewhere / "0.0.1-cccccccccccc"
    (victim / "goodput_client").mkdir(parents=True)
    shared = tmp_path / "socket-dir"
    shared.mkdir()
    (shared / "client").symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        publish_client(str(shared / "client"))
    assert sorted(p.name for p in elsewhere.iterdir()) == [victim.name] and (victim / "goodput_client").is_dir()
    # and a version folder inside a real client directory that links elsewhere
    root = shared / "real"
    root.mkdir()
    (root / version_name()).symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory):
        publish_client(str(root))
    assert sorted(p.name for p in elsewhere.iterdir()) == [victim.name]


def test_the_daemon_publishes_at_start(tmp_path: Path) -> None:
    config = quick_config(ingest={"client_dir": str(tmp_path / "client")})
    with live_server(config):
        wait_for(lambda: (tmp_path / "client" / CURRENT).is_symlink())
    assert os.readlink(tmp_path / "client" / CURRENT) == version_name()


@contextmanager
def read_only_bind(source: Path, target: Path) -> Iterator[Path]:
    """`source` bind-mounted read-only at `target`, as the kubelet mounts a hostPath volume with readOnly: true."""
    target.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no bind mount here (needs root and mount privileges): {done.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_a_pod_cannot_change_the_published_client_through_its_read_only_mount(tmp_path: Path) -> None:
    """The node directory as the example pod mounts it (ingest.hostDir, read-only): the client cannot be written,
    even by root in the pod; it still loads from there, and the events socket in it still connects."""
    host = tmp_path / "host"
    publish_client(str(host / "client"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(host / "ingest.sock"))
        server.listen(1)
        with read_only_bind(host, tmp_path / "pod") as pod:
            module = pod / "client" / CURRENT / "goodput_client" / "instrument" / "boot.py"
            for attempt in (lambda: module.write_text("print('changed')"),
                            lambda: (pod / "client" / CURRENT / "sitecustomize.py").unlink(),
                            lambda: (pod / "client" / "evil").mkdir(),
                            lambda: os.replace(pod / "client" / CURRENT, pod / "client" / "moved")):
                with pytest.raises(OSError) as raised:
                    attempt()
                assert raised.value.errno == errno.EROFS
            result = python_with(pod / "client" / CURRENT, REPORT)
            assert result.returncode == 0 and result.stdout.split()[0] == "True", result.stderr
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(pod / "ingest.sock"))  # a socket is no file write: it connects
                accepted, _ = server.accept()
                accepted.close()
    assert "changed" not in (host / "client" / CURRENT / "goodput_client" / "instrument" / "boot.py").read_text()


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_charts_example_pod_uses_what_the_daemon_publishes() -> None:
    objects = manifests(render_chart({"instrumentExample": {"enabled": True}}))
    daemon = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    pod = next(o for o in objects if o["kind"] == "Pod")
    (train,) = pod["spec"]["containers"]
    env, published = _env(train), _env(daemon)["GOODPUT_INGEST_CLIENT_DIR"]
    assert published == "/run/goodput-exporter/client"
    assert env["PYTHONPATH"] == f"{published}/{CURRENT}"
    assert env["GOODPUT_INGEST_SOCKET_PATH"] == _env(daemon)["GOODPUT_INGEST_SOCKET_PATH"]
    mounts = {m["name"]: m for m in train["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert mounts["goodput"] == {"name": "goodput", "mountPath": "/run/goodput-exporter", "readOnly": True}
    assert volumes["goodput"] == "/run/goodput-exporter"
    assert not mounts["goodput-flight"].get("readOnly") and env["GOODPUT_FLIGHT_DIR"] == volumes["goodput-flight"]
    # not rendered unless asked, and the daemon publishes nothing when told not to
    assert not any(o["kind"] == "Pod" for o in manifests(render_chart({})))
    quiet = manifests(render_chart({"ingest": {"publishClient": False}}))
    daemon = next(o for o in quiet if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert "GOODPUT_INGEST_CLIENT_DIR" not in _env(daemon)


def _merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge of the policy's patch, as Kyverno applies it here: maps merge, lists of named
    items merge by name, and the conditional anchor (name): "*" selects every item."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list):
        merged = [dict(item) if isinstance(item, dict) else item for item in base]
        for item in patch:
            if isinstance(item, dict) and item.get("(name)") == "*":
                rest = {k: v for k, v in item.items() if k != "(name)"}
                merged = [_merge(existing, rest) for existing in merged]
                continue
            names = [m.get("name") for m in merged if isinstance(m, dict)]
            if isinstance(item, dict) and item.get("name") in names:
                index = names.index(item["name"])
                merged[index] = _merge(merged[index], item)
            else:
                merged.append(item)
        return merged
    return patch


def _kyverno(rule: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """The rule applied as Kyverno would, its two JMESPath conditions evaluated here (no JMESPath here): the pod
    only when a container requests nvidia.com/gpu, each container only when its env names no PYTHONPATH."""
    gpu = rule["preconditions"]["all"][0]
    assert "containers[].resources.limits.\"nvidia.com/gpu\"" in gpu["key"] and gpu["operator"] == "GreaterThan"
    if not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]):
        return pod
    (each,) = rule["mutate"]["foreach"]
    assert each["list"] == "request.object.spec.containers"
    (condition,) = each["preconditions"]["all"]
    assert (condition["key"], condition["operator"]) == ("PYTHONPATH", "AnyNotIn")
    assert condition["value"] == "{{ element.env[].name || `[]` }}"
    for container in pod["spec"]["containers"]:
        if any(e["name"] == "PYTHONPATH" for e in container.get("env", [])):
            continue
        patch = yaml.safe_load(yaml.safe_dump(each["patchStrategicMerge"]).replace("{{ element.name }}",
                                                                                   container["name"]))
        pod = _merge(pod, patch)
    return pod


def test_the_kyverno_policy_instruments_a_namespaces_pods_as_the_example_pod_is() -> None:
    """Not checked against Kyverno's CRD schema (no copy of it can be installed here from PyPI or npm): its patch,
    applied to a plain training pod, gives a pod that Kubernetes' own schema accepts (--strict), with the same
    environment and mounts as the chart's example pod; a container that sets PYTHONPATH, and a pod without GPUs,
    are left alone; the socket's hostPath is DirectoryOrCreate (a node without the daemon still starts pods)."""
    (policy,) = [doc for doc in yaml.safe_load_all(POLICY.read_text()) if doc]
    assert (policy["apiVersion"], policy["kind"]) == ("kyverno.io/v1", "ClusterPolicy")
    (rule,) = policy["spec"]["rules"]
    selector = rule["match"]["any"][0]["resources"]
    assert selector["kinds"] == ["Pod"] and selector["namespaceSelector"]["matchLabels"]
    own_path = {"name": "PYTHONPATH", "value": "/opt/app"}
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "research"},
             "spec": {"restartPolicy": "Never", "containers": [
                 {"name": "train", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                  "command": ["torchrun", "train.py"], "env": [{"name": "EPOCHS", "value": "3"}],
                  "resources": {"limits": {"nvidia.com/gpu": 1}}},
                 {"name": "tool", "image": "python:3.12", "env": [own_path]}]}}
    mutated = _kyverno(rule, plain)
    validate(mutated, "1.28.0", strict=True)
    example = next(o for o in manifests(render_chart({"instrumentExample": {"enabled": True}})) if o["kind"] == "Pod")
    (want,) = example["spec"]["containers"]
    got, tool = mutated["spec"]["containers"]
    assert _env(got) == {"EPOCHS": "3", **_env(want)}
    assert got["volumeMounts"] == want["volumeMounts"]
    assert tool == plain["spec"]["containers"][1]  # its own PYTHONPATH: left alone
    volumes = {v["name"]: v["hostPath"] for v in mutated["spec"]["volumes"]}
    assert volumes == {v["name"]: {**v["hostPath"], "type": "DirectoryOrCreate"} for v in example["spec"]["volumes"]}
    cpu = {**plain, "spec": {**plain["spec"], "containers": [{"name": "cpu", "image": "python:3.12"}]}}
    assert _kyverno(rule, cpu) == cpu
