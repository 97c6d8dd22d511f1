"""Pod labels on goodput_gpu_pod_info, from a real HTTP(S) server speaking the Kubernetes API's pod list,
next to the real gRPC pod-resources server, through the real daemon."""

from __future__ import annotations

import logging
import statistics
import time

import pytest
from apiserver import FORBIDDEN, ApiPod, ApiServer, self_signed
from conftest import ManualClock, live_server, quick_config, series, value, wait_for
from kubelet_server import KubeletServer, gpu_pod

from exporter.config import ConfigError, load
from exporter.sources.kubelet.podlabels import (
    STALE_AFTER_INTERVALS,
    PodLabeler,
    PodLabelsClient,
    PodLabelsError,
    in_cluster_url,
    parse,
    prometheus_label,
)
from exporter.sources.nvml.simulated import SimulatedGpus

POD_INFO = "goodput_gpu_pod_info"
UP = "goodput_kubelet_pod_labels_up"
TEAM, APP = "label_team", "label_app_kubernetes_io_name"


def uuids(sim: SimulatedGpus) -> list[str]:
    return [sim.device_uuid(sim.device_handle(i)) for i in range(sim.count)]


def config(kubelet: KubeletServer, api: ApiServer, **overrides: str) -> object:
    return quick_config(kubelet={
        "enabled": True, "socket_path": kubelet.path, "interval": "100ms", "timeout": "1s",
        "pod_labels": "team,app.kubernetes.io/name", "node_name": "node-a", "api_url": api.url,
        "api_token_file": api.token_file, "api_ca_file": api.ca_file, **overrides})


def labelled(text: str) -> dict[str, tuple[str, str]]:
    """pod -> (label_team, label_app_kubernetes_io_name) on its pod_info series."""
    return {s["pod"]: (s.get(TEAM, ""), s.get(APP, "")) for s in series(text, POD_INFO)}


def errors(text: str, reason: str) -> float:
    return value(text, "goodput_exporter_source_errors_total", source="kubelet", reason=reason) or 0


def test_labels_of_this_nodes_pods_join_the_pod_info_series_over_https() -> None:
    sim = SimulatedGpus(4, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, ApiServer(tls=True) as api:
        kubelet.set_pods([gpu_pod("train-0", "ml", u[0]), gpu_pod("train-1", "ml", u[1]),
                          gpu_pod("bare", "research", u[2])])
        api.set_pods([
            ApiPod("train-0", "ml", labels={"team": "vision", "app.kubernetes.io/name": "llm", "tier": "gold"}),
            ApiPod("train-1", "ml", labels={"team": "speech"}),
            ApiPod("bare", "research"),  # no labels at all
            ApiPod("other-node", "ml", node="node-b", labels={"team": "x"}),
        ])
        with live_server(config(kubelet, api), backend=sim) as live:
            text = live.metrics_when(UP, 1)
            wait_for(lambda: labelled(live.metrics()) == {
                "train-0": ("vision", "llm"), "train-1": ("speech", ""), "bare": ("", "")})
            text = live.metrics()
            info = {s["pod"]: s for s in series(text, POD_INFO)}
            # only the allow-listed labels, spelled as kube-state-metrics spells them
            assert set(info["train-0"]) == {"gpu", "uuid", "mig_uuid", "pod", "namespace", "container", TEAM, APP}
            assert info["train-0"]["uuid"] == u[0] and info["bare"]["uuid"] == u[2]
            assert value(text, "goodput_exporter_source_up", source="kubelet") == 1
            assert not [s for s in series(text, "goodput_exporter_source_errors_total")
                        if s["reason"].startswith("pod_labels_")]
        path, query, headers = api.requests[0]
        assert path == "/api/v1/pods"
        assert query["fieldSelector"] == ["spec.nodeName=node-a"]
        assert query["resourceVersion"] == ["0"]  # from the watch cache, not etcd
        assert headers["Authorization"] == "Bearer good-token"
        assert "as=PartialObjectMetadataList" in headers["Accept"]


def test_a_server_without_metadata_only_lists_still_gives_labels() -> None:
    with ApiServer() as api:
        api.metadata_only = False  # answers a full PodList whatever the Accept header asks
        api.set_pods([ApiPod("p", "ns", labels={"team": "a"}), ApiPod("q", "ns", node="node-b")])
        client = PodLabelsClient(api.url, "node-a", ("team", "absent"), api.token_file, "", 2.0, 2**20)
        try:
            assert client.list().labels == {("ns", "p"): ("a", "")}
        finally:
            client.close()


def test_pod_churn_changes_and_removes_labels_with_no_ghosts() -> None:
    sim = SimulatedGpus(4, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, ApiServer() as api, live_server(config(kubelet, api), backend=sim) as live:
        kubelet.set_pods([gpu_pod("a", "ml", u[0]), gpu_pod("b", "ml", u[1])])
        api.set_pods([ApiPod("a", "ml", labels={"team": "one"}), ApiPod("b", "ml", labels={"team": "two"})])
        wait_for(lambda: labelled(live.metrics()) == {"a": ("one", ""), "b": ("two", "")})
        # a's label changes; b loses its label; c arrives, known to the API before the kubelet lists it
        api.set_pods([ApiPod("a", "ml", labels={"team": "uno", "app.kubernetes.io/name": "x"}),
                      ApiPod("b", "ml"), ApiPod("c", "ml", labels={"team": "three"})])
        kubelet.set_pods([gpu_pod("a", "ml", u[0]), gpu_pod("b", "ml", u[1]), gpu_pod("c", "ml", u[2])])
        wait_for(lambda: labelled(live.metrics()) == {"a": ("uno", "x"), "b": ("", ""), "c": ("three", "")})
        text = live.metrics()
        assert len(series(text, POD_INFO)) == 3  # the old label set left no series behind
        # a ends: the kubelet forgets it first, the API a moment later
        kubelet.set_pods([gpu_pod("b", "ml", u[1]), gpu_pod("c", "ml", u[2])])
        wait_for(lambda: labelled(live.metrics()) == {"b": ("", ""), "c": ("three", "")})
        api.set_pods([ApiPod("b", "ml"), ApiPod("c", "ml", labels={"team": "three"})])
        # a new pod of the same name on another GPU, with other labels: never the old pod's labels
        api.set_pods([ApiPod("b", "ml"), ApiPod("c", "ml", labels={"team": "three"}),
                      ApiPod("a", "ml", labels={"team": "reborn"})])
        kubelet.set_pods([gpu_pod("b", "ml", u[1]), gpu_pod("c", "ml", u[2]), gpu_pod("a", "ml", u[3])])
        wait_for(lambda: labelled(live.metrics()) == {"a": ("reborn", ""), "b": ("", ""), "c": ("three", "")})
        assert {s["uuid"] for s in series(live.metrics(), POD_INFO) if s["pod"] == "a"} == {u[3]}
        kubelet.set_pods([])
        api.set_pods([])
        wait_for(lambda: series(live.metrics(), POD_INFO) == [])
        assert value(live.metrics(), UP) == 1


def test_wrong_token_and_missing_rbac_are_counted_and_say_what_to_fix(caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedGpus(2, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, ApiServer() as api:
        kubelet.set_pods([gpu_pod("a", "ml", u[0])])
        api.set_pods([ApiPod("a", "ml", labels={"team": "one"})])
        api.write_token("stale-token")
        with caplog.at_level(logging.WARNING), live_server(config(kubelet, api), backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), "pod_labels_unauthorized") >= 1)
            text = live.metrics_when(UP, 0)
            # the mapping keeps working, without labels; the source itself is up
            assert labelled(text) == {"a": ("", "")}
            assert value(text, "goodput_exporter_source_up", source="kubelet") == 1
            assert any("401" in r.getMessage() and "api_token_file" in r.getMessage() for r in caplog.records)

            api.write_token("good-token")  # the kubelet rotates the token: read again on every call
            wait_for(lambda: labelled(live.metrics()) == {"a": ("one", "")})
            assert value(live.metrics(), UP) == 1

            api.forbidden = True  # the ClusterRole binding is removed
            wait_for(lambda: errors(live.metrics(), "pod_labels_forbidden") >= 1)
            text = live.metrics_when(UP, 0)
            assert labelled(text) == {"a": ("", "")}
            forbidden = [r.getMessage() for r in caplog.records if "403" in r.getMessage()]
            assert forbidden and FORBIDDEN in forbidden[0]
            assert 'resources: ["pods"], verbs: ["get", "list"]' in forbidden[0]
            assert live.client.get("/readyz").status_code == 200


def test_unreachable_then_malformed_then_oversize_leave_the_mapping_and_count_each() -> None:
    sim = SimulatedGpus(2, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet:
        kubelet.set_pods([gpu_pod("a", "ml", u[0]), gpu_pod("b", "ml", u[1])])
        api = ApiServer().start()
        api.set_pods([ApiPod("a", "ml", labels={"team": "one"})])
        try:
            with live_server(config(kubelet, api, api_max_bytes="65536"), backend=sim) as live:
                wait_for(lambda: labelled(live.metrics()) == {"a": ("one", ""), "b": ("", "")})
                for reason, breaks, heals in [
                    ("pod_labels_unreachable", api.stop, api.restart),
                    ("pod_labels_malformed", lambda: setattr(api, "malformed", b'{"kind": "PodList", "items": ['),
                     lambda: setattr(api, "malformed", None)),
                    ("pod_labels_malformed", lambda: setattr(api, "malformed", b'{"kind": "Status", "items": 7}'),
                     lambda: setattr(api, "malformed", None)),
                    ("pod_labels_oversize", lambda: setattr(api, "padding", 70_000),
                     lambda: setattr(api, "padding", 0)),
                    ("pod_labels_http_error", lambda: setattr(api, "status", 500),
                     lambda: setattr(api, "status", None)),
                ]:
                    before = errors(live.metrics(), reason)
                    breaks()
                    wait_for(lambda reason=reason, before=before: errors(live.metrics(), reason) > before)
                    text = live.metrics_when(UP, 0)
                    assert labelled(text) == {"a": ("", ""), "b": ("", "")}, reason  # no stale labels
                    assert value(text, "goodput_exporter_source_up", source="kubelet") == 1, reason
                    heals()
                    wait_for(lambda: labelled(live.metrics()) == {"a": ("one", ""), "b": ("", "")})
                    assert value(live.metrics(), UP) == 1
        finally:
            api.stop()


def test_a_hanging_api_server_blocks_neither_scrapes_nor_the_mapping() -> None:
    sim = SimulatedGpus(2, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, ApiServer() as api:
        kubelet.set_pods([gpu_pod("a", "ml", u[0])])
        api.set_pods([ApiPod("a", "ml", labels={"team": "one"})])
        with live_server(config(kubelet, api, timeout="500ms"), backend=sim) as live:
            wait_for(lambda: labelled(live.metrics()) == {"a": ("one", "")})
            hang = 5.0
            api.delay = hang  # far past the 500 ms the call is given
            wait_for(lambda: errors(live.metrics(), "pod_labels_timeout") >= 1)
            live.metrics_when(UP, 0)
            # meanwhile the kubelet's answers keep flowing: a pod arrives and is mapped without waiting
            kubelet.set_pods([gpu_pod("a", "ml", u[0]), gpu_pod("b", "ml", u[1])])
            wait_for(lambda: labelled(live.metrics()) == {"a": ("", ""), "b": ("", "")})
            durations = []
            for _ in range(20):
                started = time.monotonic()
                text = live.metrics()
                durations.append(time.monotonic() - started)
            # a scrape that waited on the API call would take its 500 ms at least
            assert statistics.median(durations) < 0.5, durations
            assert max(durations) < hang / 2, durations
            assert value(text, "goodput_exporter_source_up", source="kubelet") == 1
            assert (value(text, "goodput_exporter_source_errors_total", source="kubelet", reason="timeout")
                    or 0) == 0  # the source's own collections never ran long
            api.delay = 0.0
            wait_for(lambda: labelled(live.metrics()) == {"a": ("one", ""), "b": ("", "")})


def test_a_certificate_the_ca_file_does_not_vouch_for_is_refused() -> None:
    with ApiServer(tls=True) as api:
        api.set_pods([ApiPod("p", "ns", labels={"team": "a"})])
        other_ca, _ = self_signed(api.dir, "other")
        client = PodLabelsClient(api.url, "node-a", ("team",), api.token_file, other_ca, 2.0, 2**20)
        try:
            with pytest.raises(PodLabelsError) as refused:
                client.list()
            assert refused.value.reason == "tls", refused.value
            assert not api.requests  # the token never left
            good = PodLabelsClient(api.url, "node-a", ("team",), api.token_file, api.ca_file, 2.0, 2**20)
            assert good.list().labels == {("ns", "p"): ("a",)}
            good.close()
        finally:
            client.close()


def test_one_failed_refresh_keeps_the_labels_until_they_are_stale() -> None:
    with ApiServer() as api:
        api.set_pods([ApiPod("p", "ns", labels={"team": "a"})])
        clock = ManualClock()
        client = PodLabelsClient(api.url, "node-a", ("team",), api.token_file, "", 2.0, 2**20)
        labeler = PodLabeler(client, interval=10.0, clock=clock)  # driven by hand: never started
        try:
            labeler.refresh()
            assert labeler.current() == ({("ns", "p"): ("a",)}, [])
            api.malformed = b"<html>gateway timeout</html>"
            clock.advance(10.0)
            labeler.refresh()
            assert labeler.current() == ({("ns", "p"): ("a",)}, ["pod_labels_malformed"])
            assert labeler.current()[1] == []  # each failure is counted once
            clock.advance(STALE_AFTER_INTERVALS * 10.0 - 10.0 + 0.1)  # past the last answer's grace
            assert labeler.current() == (None, [])
            api.malformed = None
            labeler.refresh()
            assert labeler.current() == ({("ns", "p"): ("a",)}, [])
        finally:
            client.close()


def test_off_by_default_and_the_api_is_never_called() -> None:
    sim = SimulatedGpus(2, seed=3)
    u = uuids(sim)
    with KubeletServer() as kubelet, ApiServer() as api:
        kubelet.set_pods([gpu_pod("a", "ml", u[0])])
        api.set_pods([ApiPod("a", "ml", labels={"team": "one"})])
        with live_server(config(kubelet, api, pod_labels=""), backend=sim) as live:
            wait_for(lambda: len(series(live.metrics(), POD_INFO)) == 1)
            text = live.metrics()
            assert set(series(text, POD_INFO)[0]) == {"gpu", "uuid", "mig_uuid", "pod", "namespace", "container"}
            assert value(text, UP) is None
        assert api.requests == []
    assert load(None, {}, environ={}).kubelet.pod_labels == ""


def test_outside_a_pod_with_no_api_url_the_reason_says_so() -> None:
    client = PodLabelsClient("", "node-a", ("team",), "", "", 1.0, 2**20)
    with pytest.raises(PodLabelsError) as missing:
        client.list()
    assert missing.value.reason == "not_in_cluster"
    assert in_cluster_url({}) is None
    assert in_cluster_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://10.96.0.1:443"
    assert in_cluster_url({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://[fd00::1]:443"


def test_label_names_are_sanitized_like_kube_state_metrics_and_checked() -> None:
    assert prometheus_label("team") == "label_team"
    assert prometheus_label("app.kubernetes.io/name") == "label_app_kubernetes_io_name"
    assert prometheus_label("Team-Name") == "label_Team_Name"
    ok = load(None, {"kubelet": {"enabled": True, "pod_labels": " team , example.com/owner", "node_name": "n-1"}},
              environ={})
    assert ok.kubelet.pod_labels.replace(" ", "") == "team,example.com/owner"
    env = load(None, None, environ={"GOODPUT_KUBELET_ENABLED": "true", "GOODPUT_KUBELET_POD_LABELS": "team",
                                    "GOODPUT_KUBELET_NODE_NAME": "gpu-node-7"})
    assert env.kubelet.node_name == "gpu-node-7"
    for bad, says in [({"pod_labels": "team"}, "node_name"),  # no node name to list the pods of
                      ({"pod_labels": "a.b,a_b", "node_name": "n"}, "label_a_b"),
                      ({"pod_labels": "has space", "node_name": "n"}, "not a Kubernetes label name"),
                      ({"pod_labels": "-team", "node_name": "n"}, "not a Kubernetes label name"),
                      ({"pod_labels": ",".join(f"l{i}" for i in range(33)), "node_name": "n"}, "at most 32"),
                      ({"node_name": "Node_1"}, "node name"),
                      ({"api_url": "10.0.0.1:443"}, "http"),
                      ({"api_max_bytes": "10"}, "api_max_bytes")]:
        with pytest.raises(ConfigError, match=says):
            load(None, {"kubelet": {"enabled": True, **bad}}, environ={})


def test_impossible_names_and_values_are_skipped_and_counted() -> None:
    body = (b'{"kind": "PodList", "items": ['
            b'{"metadata": {"name": "ok", "namespace": "ns", "labels": {"team": "a"}}},'
            b'{"metadata": {"name": "Bad_Name", "namespace": "ns", "labels": {"team": "b"}}},'
            b'{"metadata": {"name": "long", "namespace": "ns", "labels": {"team": "' + b"v" * 64 + b'"}}},'
            b'{"metadata": {"name": "num", "namespace": "ns", "labels": {"team": 7}}}]}')
    answer = parse(body, ("team",))
    assert answer.labels == {("ns", "ok"): ("a",), ("ns", "long"): ("",), ("ns", "num"): ("",)}
    assert answer.invalid == 3
    for bad in (b"[]", b'{"items": [1]}', b'{"items": {}}', b"\xff\xfe", b"[" * 100_000):
        with pytest.raises(PodLabelsError) as malformed:
            parse(bad, ("team",))
        assert malformed.value.reason == "malformed", bad[:20]
